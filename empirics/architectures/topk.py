"""The TopK SAE ``topk`` (SAELens ``topk``, dictionary_learning ``AutoEncoderTopK``, sparsify's
``SparseCoder``; docs/ecosystem.md §1, §3): z = ReLU of the k largest entries of a per token, all others 0
(≤ k non-zeros per token); loss = mse (+ AuxK). The base of the TopK family (batchtopk, matryoshka).

The TopK family computes the same x̂ (and the same gradients) from its ≤ k active latents per token
(:class:`~dictcheck.empirics.kernels.active_latents.ActiveLatents`, ``sparse_decode`` = True by default):
O(B·k·d_in) instead of O(B·d_sae·d_in); ``sparse_decode = False`` selects the dense product z @ W_dec (same
numbers up to rounding, kept as the reference).

AuxK (``aux_coef`` > 0, ``forward(x, dead_mask)``), exactly docs/ecosystem.md §3: k_aux = d_in // 2; per
token the top min(k_aux, n_dead) of the dead latents' ReLU'd pre-activations are decoded WITHOUT b_dec,
ê = z_aux @ W_dec; target e = (x − x̂).detach(); aux = aux_coef · min(n_dead/k_aux, 1) · Σ_t‖e_t − ê_t‖² /
Σ_t‖e_t − ē‖². It is exactly 0 when nothing is dead, when ``dead_mask`` is None, and (Decision) when
Σ_t‖e_t − ē‖² = 0 (no residual variance to explain, e.g. B = 1).

SAELens' ``rescale_acts_by_decoder_norm`` (a folder field): TopK selects on a_d·‖w_d‖ and decodes with
z_d·(1/‖w_d‖), computed as SAELens computes it (so bfloat16 folders round the same way).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dictcheck.empirics.architectures.base import (
    ArchOptions,
    ForeignWeights,
    OptionsContext,
    option,
    register,
    require_int,
    require_real,
)
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.architectures.linear_sae import (
    Encoding,
    LinearSAE,
    LinearSAEArchitecture,
    LinearSAEOptions,
)
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.empirics.kernels.active_latents import ActiveLatents, SelectedPreacts, compiled
from dictcheck.empirics.kernels.topk_select import encoder_topk, row_topk

__all__ = ["TopKOptions", "TopKSAE", "TopK"]


@dataclass(frozen=True)
class TopKOptions(LinearSAEOptions):
    """topk: k active latents per token and the AuxK coefficient."""

    k: int | None = option(None, type=int, help="active latents per token (topk, batchtopk, vasae); active "
                           "blocks per token (bsf-vanilla, bsf-grassmann)")
    aux_coef: float = option(0.0, type=float, help="AuxK coefficient (topk, batchtopk; 0: off)")

    def resolved(self, arch: str, d_sae: int) -> TopKOptions:
        if self.k is None:
            raise ValueError(f"arch {arch!r} needs k, an int in [1, d_sae={d_sae}], got None")
        try:
            k = require_int("k", self.k, 1, d_sae)
        except ValueError:
            raise ValueError(f"arch {arch!r} needs k, an int in [1, d_sae={d_sae}], got {self.k!r}") from None
        return replace(LinearSAEOptions.resolved(self, arch, d_sae), k=k,
                       aux_coef=require_real("aux_coef", self.aux_coef))


class TopKSAE(LinearSAE):
    """The k largest pre-activations per token, ReLU'd; optional AuxK (module docstring). Subclasses of the
    family override :meth:`select` (which entries are active)."""

    arch = "topk"

    def __init__(self, d_in: int, d_sae: int, options: TopKOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(d_in, d_sae, options, dtype=dtype)
        self.k = int(options.k)
        self.aux_coef = float(options.aux_coef)
        self.sparse_decode = True
        self.rescale_acts_by_decoder_norm = False

    def _gathers(self) -> bool:
        """Whether this model decodes from its active latents (:class:`ActiveLatents`) and gives the encoder
        the sparse backward (:class:`SelectedPreacts`): with ``sparse_decode`` and without SAELens'
        decoder-norm rescaling."""
        return self.sparse_decode and not self.rescale_acts_by_decoder_norm

    def _reads_preacts(self) -> bool:
        """Whether the selection needs the dense pre-activation a (AuxK reads it); otherwise a gathering model
        on the CPU reads each row's top entries from the encoder product block by block."""
        return self.aux_coef > 0

    def encoding(self, x: Tensor) -> Encoding:
        """A gathering model (:meth:`_gathers`) returns no dense codes (``ActiveLatents.dense`` builds them on
        request) and, on the CPU when nothing else reads a (:meth:`_reads_preacts`), no a either: its rows'
        top entries come from the encoder product block by block
        (:func:`~dictcheck.empirics.kernels.topk_select.encoder_topk`)."""
        xe = self._encoder_input(x)
        a = None
        if not (self._gathers() and compiled(xe) and not self._reads_preacts()):
            a = self._encoder_affine(xe)
            if self.rescale_acts_by_decoder_norm:  # SAELens (topk): select on a_d·‖w_d‖, in the model dtype
                a = a * self.W_dec.norm(dim=-1)
        act = self._active_latents(a, x, xe)
        return Encoding(None if self._gathers() else act.dense(self.d_sae), a, act)

    def _row_top(self, a: Tensor | None, xe: Tensor, m: int) -> tuple[Tensor, Tensor]:
        """Each token's m largest pre-activations and their latents, descending (no gradient): compiled
        (:mod:`~dictcheck.empirics.kernels.topk_select`) for a gathering model on the CPU, from the encoder
        product when a is None; ``torch.topk`` otherwise (the dense reference)."""
        if a is None:
            return encoder_topk(xe, self.W_enc, self.b_enc, m)
        if self._gathers() and compiled(a):
            return row_topk(a, m)
        return torch.topk(a.detach(), m, dim=-1)

    def select(self, a: Tensor | None, xe: Tensor) -> tuple[Tensor | None, Tensor, Tensor]:
        """(token of each entry or None when every token has the same number, latent, value of a) of the
        active entries, no gradient: per token the k largest a."""
        vals, idx = self._row_top(a, xe, min(self.k, self.d_sae))
        return None, idx, vals

    def _active_latents(self, a: Tensor | None, x: Tensor, xe: Tensor) -> ActiveLatents:
        """The non-zero codes as (latent, value) lists, values ReLU(a) at the entries :meth:`select` picks (a
        None: read from the encoder product; x is the encoder's input, xe = x̃ its centred version). A
        gathering model's selected pre-activations carry the sparse encoder gradient of
        :class:`SelectedPreacts`, otherwise autograd through the dense a."""
        B = xe.shape[0]
        with torch.no_grad():
            rows, idx, vals = self.select(a, xe)
            offsets = None
            if rows is not None:
                offsets = torch.zeros(B, dtype=torch.long, device=xe.device)
                offsets[1:] = torch.cumsum(torch.bincount(rows, minlength=B), 0)[:-1]
        if self._gathers():
            cache: dict = {}
            b_dec = self.b_dec if self.apply_b_dec_to_input else None
            pre = SelectedPreacts.apply(x, b_dec, xe.detach(), self.W_enc, self.b_enc, idx, offsets, vals, cache)
            return ActiveLatents(idx, torch.relu(pre), offsets, cache)
        pre = a.gather(-1, idx) if rows is None else a[rows, idx]
        return ActiveLatents(idx, torch.relu(pre), offsets)

    def reconstruct(self, enc: Encoding) -> Tensor:
        return enc.active.decode(self.W_dec) + self.b_dec if self._gathers() else self.decode(enc.z)

    def unit_codes(self, z: Tensor) -> Tensor:
        """z_d·‖w_d‖, or z itself with ``rescale_acts_by_decoder_norm`` (its codes are of the unit atoms)."""
        return z if self.rescale_acts_by_decoder_norm else super().unit_codes(z)

    def decode(self, z: Tensor) -> Tensor:
        """x̂ = z @ W_dec + b_dec (z·(1/‖w_d‖) first with ``rescale_acts_by_decoder_norm``, as SAELens)."""
        if self.rescale_acts_by_decoder_norm and z.shape[-1] == self.d_sae:
            z = z * (1 / self.W_dec.norm(dim=-1))
        return super().decode(z)

    def aux_loss(self, x: Tensor, x_hat: Tensor, enc: Encoding, dead_mask: Tensor | None) -> Tensor:
        if self.aux_coef > 0 and dead_mask is not None:
            return self.auxk_loss(x, x_hat, enc.a, dead_mask)
        return x.new_zeros(())

    def auxk_loss(self, x: Tensor, x_hat: Tensor, a: Tensor, dead_mask: Tensor) -> Tensor:
        """AuxK loss (docs/ecosystem.md §3), see the module docstring. Exactly 0 when nothing is dead."""
        dead_mask = dead_mask.to(device=a.device, dtype=torch.bool).reshape(-1)
        if dead_mask.numel() != self.d_sae:
            raise ValueError(f"dead_mask has {dead_mask.numel()} entries, expected d_sae = {self.d_sae}")
        zero = a.new_zeros(())
        n_dead = int(dead_mask.sum())
        if n_dead == 0 or self.aux_coef <= 0:
            return zero
        k_aux = max(self.d_in // 2, 1)
        k_eff = min(k_aux, n_dead)
        e = (x - x_hat).detach()
        masked = torch.where(dead_mask, a, torch.full_like(a, -math.inf))
        vals, idx = torch.topk(masked, k_eff, dim=-1)
        aux = ActiveLatents(idx, torch.relu(vals), None)
        e_hat = aux.decode(self.W_dec) if self.sparse_decode else aux.dense(self.d_sae) @ self.W_dec  # no b_dec
        num = (e - e_hat).pow(2).sum()
        den = (e - e.mean(dim=0, keepdim=True)).pow(2).sum()
        scale = self.aux_coef * min(n_dead / k_aux, 1.0)
        if float(den) <= 0:
            return zero
        return scale * num / den

    def wants_dead_mask(self) -> bool:
        """AuxK needs the dead latents: ``aux_coef`` > 0."""
        return self.aux_coef > 0


@register
class TopK(LinearSAEArchitecture):
    """The k largest pre-activations per token, ReLU'd; optional AuxK (docs/ecosystem.md §3)."""

    name = "topk"
    saved_name = "topk"
    reads_foreign = True
    dl_class = "AutoEncoderTopK"
    saelens_training_name = "topk"
    saelens_training_fields = frozenset({"decoder_init_norm", "use_sparse_activations", "aux_loss_coefficient"})
    objective = "mse with k active latents per token (+ AuxK)"
    k_in_cfg = True
    cfg_fields = frozenset({"rescale_acts_by_decoder_norm"})
    Options = TopKOptions
    Model = TopKSAE

    def apply_cfg_fields(self, model: Featurizer, cfg: SaeConfig) -> None:
        """Also SAELens' ``rescale_acts_by_decoder_norm`` (module docstring)."""
        super().apply_cfg_fields(model, cfg)
        rescale = cfg.extra_fields.get("rescale_acts_by_decoder_norm", False)
        if not isinstance(rescale, bool):
            raise ValueError(f"field 'rescale_acts_by_decoder_norm' must be true or false, got {rescale!r}")
        model.rescale_acts_by_decoder_norm = rescale

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        if getattr(options, "aux_coef", 0.0) > 0:
            return "AuxK is normalised by each rank's own residual variance and the ranks' AuxK losses are averaged"
        return None

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        return {"k": ctx.k, "aux_coef": draw(st.sampled_from([0.0, 1 / 32]))}

    def from_dictionary_learning(self, sd: Mapping[str, Tensor]) -> ForeignWeights:
        """AutoEncoderTopK: encoder.weight [dict, act], encoder.bias, decoder.weight [act, dict], b_dec."""
        return {"W_enc": sd["encoder.weight"].T, "b_enc": sd["encoder.bias"], "W_dec": sd["decoder.weight"].T,
                "b_dec": sd["b_dec"]}, {}, {}
