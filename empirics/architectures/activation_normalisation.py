"""SAELens' run-time input normalisation (``normalize_activations`` in cfg.json), exactly as SAELens 6
computes it at inference (docs/ecosystem.md §1), so that a loaded folder encodes and decodes what
SAELens would:

* ``none``: x' = x.
* ``constant_norm_rescale``: x' = x·c with c = √d_in/‖x‖ per token; the output is divided by c.
* ``layer_norm``: μ = mean(x), σ = std(x − μ) (Bessel-corrected, torch's default), x' = (x − μ)/(σ + 1e-5);
  the output is x̂'·σ + μ (σ without the 1e-5, as SAELens writes it).
* ``expected_average_only_in`` and ``covariance_whitening``: SAELens applies nothing at inference (a hub
  release folds its scaling factor, or the whitening, into the weights when it loads it; a folder on disk
  is used as it is), so neither does dictcheck, and :attr:`ActivationNormalisation.note` says so.

**Decision (what objective (1) means for such a folder).** The dictionary W_dec acts on x', so dictcheck
evaluates objective (1) and every condition of docs/theory.md §3 on the normalised tokens x' (the SAE's
own input space), and the reconstruction metrics on x against the SAE's full output, as SAELens does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["MODES", "ActivationNormalisation"]

MODES = ("none", "constant_norm_rescale", "layer_norm", "expected_average_only_in", "covariance_whitening")
_LN_EPS = 1e-5
_IDENTITY_AT_INFERENCE = ("expected_average_only_in", "covariance_whitening")


@dataclass(frozen=True)
class ActivationNormalisation:
    """One ``normalize_activations`` mode; :meth:`apply` maps tokens (rows) into the SAE's input space and
    returns the per-token state that :meth:`invert` needs to map a reconstruction back."""

    mode: str = "none"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"normalize_activations must be one of {list(MODES)}, got {self.mode!r}")

    @property
    def identity(self) -> bool:
        return self.mode in ("none", *_IDENTITY_AT_INFERENCE)

    @property
    def note(self) -> str | None:
        """What a user should know about this mode (None for ``none``)."""
        if self.mode in _IDENTITY_AT_INFERENCE:
            return (f"normalize_activations = {self.mode}: SAELens applies no normalisation to a folder at inference "
                    "(it folds the factor into the weights only for hub releases), and neither does dictcheck; "
                    "give activations in the space the weights expect")
        if self.mode != "none":
            return (f"normalize_activations = {self.mode}: objective (1) and the conditions are evaluated on the "
                    "normalised tokens (the SAE's input space), the reconstruction metrics on the raw tokens "
                    "against the SAE's output")
        return None

    def apply(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """(x', state) for tokens x (B, d_in)."""
        if self.mode == "constant_norm_rescale":
            coeff = math.sqrt(x.shape[-1]) / x.norm(dim=-1, keepdim=True)
            return x * coeff, (coeff, torch.zeros_like(coeff))
        if self.mode == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            centred = x - mu
            std = centred.std(dim=-1, keepdim=True)
            return centred / (std + _LN_EPS), (std, mu)
        return x, None

    def invert(self, x_hat: Tensor, state: tuple[Tensor, Tensor] | None) -> Tensor:
        """The reconstruction in the raw token space (SAELens' ``run_time_activation_norm_fn_out``)."""
        if state is None:
            return x_hat
        scale, shift = state
        if self.mode == "constant_norm_rescale":
            return x_hat / scale
        return x_hat * scale + shift
