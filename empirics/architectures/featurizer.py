"""The interface every trainable featurizer implements (linear SAEs, bilinear autoencoders, BSFs).

:func:`empirics.training.loop.train` drives any :class:`Featurizer`; :mod:`empirics.architectures`
maps each architecture name to the module that builds it. Layout: tokens are ROWS, ``x`` is
(B, d_in) and codes are (B, d_sae).

One training step, as the loop runs it::

    model.set_step(t)                      # 0-based optimiser step (warm-ups, e.g. Hoyer's s(t))
    out = model(x, dead_mask=...)          # FeaturizerOutput; out.loss is minimised
    out.loss.backward()
    model.project_gradients_()             # e.g. remove the decoder-parallel gradient
    clip_grad_norm_(model.parameters(), c); optimizer.step()
    model.project_parameters_()            # e.g. unit-norm decoder rows / unit-Frobenius blocks

``project_parameters_`` is also called once on a fresh model before the first step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["FeaturizerOutput", "Featurizer"]


@dataclass
class FeaturizerOutput:
    """What :meth:`Featurizer.forward` returns (tensors; scalars are 0-d).

    ``mse`` is the architecture's reconstruction term as it enters ``loss`` (linear SAEs:
    (1/B)Σ_t‖x_t − x̂_t‖²; BSF: the mean over all B·D entries; bilinear: the lifted ‖T − T̂‖²
    per token). ``x_hat`` is the reconstruction in INPUT space, or None where none exists
    (bilinear autoencoders reconstruct the lift xxᵀ). ``codes`` are exactly zero where a latent
    does not fire (used for L0, firing frequencies and dead-latent tracking); a featurizer that
    holds its codes sparsely may pass a zero-argument function instead, which the first read of
    ``codes`` calls (once; the attribute is then that tensor), so a step that never reads them
    never builds the dense (B, d_sae) tensor. ``live_latents``, when not None, lists the latents
    that are non-zero for some token (repeats allowed), which :meth:`fired` then reads instead
    of the codes. ``extra`` holds further per-batch token means (e.g. ``nmse_lifted``,
    ``hoyer_density``) that evaluation averages over tokens and writes to metrics.json under the
    same names; ``extra_tokens`` is the number of tokens those means are over (None: every row
    of the batch; bilinear autoencoders drop zero rows).
    """

    x_hat: Tensor | None
    codes: Tensor
    loss: Tensor
    mse: Tensor
    sparsity_loss: Tensor
    aux_loss: Tensor
    l0: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)
    extra_tokens: int | None = None
    live_latents: Tensor | None = None

    def fired(self, d_sae: int) -> Tensor:
        """(d_sae,) bool: whether each latent is non-zero for some token of the batch (no grad)."""
        with torch.no_grad():
            if self.live_latents is None:
                return (self.codes != 0).reshape(-1, d_sae).any(dim=0)
            out = torch.zeros(d_sae, dtype=torch.bool, device=self.live_latents.device)
            return out.index_fill_(0, self.live_latents.reshape(-1), True)


def _read_codes(out: FeaturizerOutput) -> Tensor:
    codes = out.__dict__["codes"]
    if callable(codes):  # a Tensor is not callable
        codes = out.__dict__["codes"] = codes()
    return codes


def _write_codes(out: FeaturizerOutput, codes: Tensor | Callable[[], Tensor]) -> None:
    out.__dict__["codes"] = codes


# After @dataclass (a property in the class body would become the field's default): the
# generated __init__, replace() and fields() go through it.
FeaturizerOutput.codes = property(_read_codes, _write_codes, doc="(B, d_sae) codes, built at the first read if lazy.")


class Featurizer(torch.nn.Module):
    """Base class: a module with ``arch``, ``d_in``, ``d_sae`` and the hooks of the training loop.

    Subclasses implement :meth:`forward`, :meth:`state_weights` and :meth:`load_state_weights`
    (tensor names and shapes as the architecture's ``weight_schema`` lists them), and override the
    no-op hooks they need. ``arch_options`` holds the resolved options the architecture built the
    model with (set by ``Architecture.build``).
    """

    arch: str
    d_in: int
    d_sae: int
    arch_options: Any = None

    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> FeaturizerOutput:  # pragma: no cover
        raise NotImplementedError

    def wants_dead_mask(self) -> bool:
        """Whether ``forward`` uses ``dead_mask`` (e.g. AuxK); the loop passes it only then."""
        return False

    def set_step(self, step: int) -> None:
        """Called with the 0-based optimiser step before each training forward pass."""

    def project_gradients_(self) -> None:
        """Called after ``backward`` and before gradient clipping and the optimiser step."""

    def project_parameters_(self) -> None:
        """Called after every optimiser step, and once on a fresh model before training."""

    @torch.no_grad()
    def set_centring_(self, b: Tensor | None) -> None:
        """Set the centring vector ``b_dec`` (the training loop's ``b_dec_init`` rule); None leaves it.
        A model without ``b_dec`` accepts only None (ValueError otherwise)."""
        if b is None:
            return
        target = getattr(self, "b_dec", None)
        if not isinstance(target, Tensor):
            raise ValueError(f"arch {self.arch!r} has no centring vector b_dec")
        b = torch.as_tensor(b)
        if tuple(b.shape) != tuple(target.shape):
            raise ValueError(f"b_dec_init has shape {list(b.shape)}, expected {list(target.shape)}")
        if not bool(torch.isfinite(b).all()):
            raise ValueError("b_dec_init has non-finite values")
        target.copy_(b.to(device=target.device, dtype=target.dtype))

    def state_weights(self) -> dict[str, Tensor]:  # pragma: no cover
        """Detached copies of the weights under their save-file names."""
        raise NotImplementedError

    def load_state_weights(self, weights: dict[str, Tensor]) -> None:  # pragma: no cover
        """Inverse of :meth:`state_weights`; ValueError on a missing, extra or misshapen tensor."""
        raise NotImplementedError

    def arch_fields(self) -> dict[str, Any]:
        """JSON fields stored under ``metadata.dictcheck.<family>`` (e.g. BSF ``n_b``, ``q``)."""
        return {}

    def load_arch_fields(self, fields: dict[str, Any]) -> None:
        """Inverse of :meth:`arch_fields` for state that is not a weight (unknown keys ignored)."""

    def firing_metrics(self, fire_counts: Tensor, n_tokens: int) -> dict[str, Any]:
        """Extra metrics from per-latent firing counts over ``n_tokens`` evaluation tokens."""
        return {}
