"""Block-sparse featurizers: ``bsf-vanilla``, ``bsf-grassmann``, ``bsf-grouplasso`` (models in
:mod:`dictcheck.empirics.bsf_models`; docs/bsf.md §2–§4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from dictcheck.empirics.architectures.base import (
    ArchOptions,
    Architecture,
    Schema,
    option,
    register,
    require_int,
    require_real,
)
from dictcheck.empirics.bsf_models import init_bsf
from dictcheck.empirics.featurizer import Featurizer

__all__ = ["GATES", "PENALTIES", "BsfOptions", "BsfTopKOptions", "GroupLassoOptions", "BlockSparse", "Vanilla", "Grassmann",
           "GroupLasso"]

GATES = ("shrink", "ste")
#: Where the sh_θ gate's ℓ₂,₁ penalty sits: on the codes ‖z_g‖ (the paper's) or on the contributions
#: ‖W_g z_g‖ (a dictcheck option, docs/bsf.md §3.3 Decision "contribution penalty").
PENALTIES = ("code", "contribution")
DEFAULT_DENOISE = 0.1  # docs/bsf.md §4: snr 0.1
DEFAULT_C_GL = 1e-2  # docs/bsf.md §3.3
DEFAULT_K_TARGET = 16  # docs/bsf.md §3.3 (STE gate)


@dataclass(frozen=True)
class BsfOptions(ArchOptions):
    """Every BSF: the block size q (d_sae = n_b·q) and the denoising level."""

    block_size: int | None = option(None, type=int, help="block size q (d_sae = n_b·q)")
    denoise: float = option(DEFAULT_DENOISE, type=float, help="input-noise level snr of the denoising objective "
                            "(default 0.1; training only)")

    def resolved(self, arch: str, d_sae: int) -> BsfOptions:
        if self.block_size is None:
            raise ValueError(f"arch {arch!r} requires the option block_size (q)")
        q = require_int("block_size", self.block_size, 1)
        if d_sae % q:
            raise ValueError(f"block_size = {q} must divide d_sae = {d_sae}")
        return replace(self, block_size=q, denoise=require_real("denoise", self.denoise))


@dataclass(frozen=True)
class BsfTopKOptions(BsfOptions):
    """Vanilla and Grassmannian BSF: also k, the number of active blocks per token (Π_k)."""

    k: int | None = option(None, type=int, help="active latents per token (topk, batchtopk, vasae); active "
                           "blocks per token (bsf-vanilla, bsf-grassmann)")

    def resolved(self, arch: str, d_sae: int) -> BsfTopKOptions:
        base = BsfOptions.resolved(self, arch, d_sae)
        n_b = d_sae // base.block_size
        if self.k is None:
            raise ValueError(f"arch {arch!r} requires k (number of active blocks per token)")
        try:
            k = require_int("k", self.k, 1, n_b)
        except ValueError:
            raise ValueError(f"arch {arch!r}: k must be an int in [1, n_b={n_b}], got {self.k!r}") from None
        return replace(base, k=k)


@dataclass(frozen=True)
class GroupLassoOptions(BsfOptions):
    """Group-Lasso BSF: the ℓ₂,₁ coefficient and the gate (the paper's shrink, or the STE gate)."""

    c_gl: float = option(DEFAULT_C_GL, type=float, help="group-lasso coefficient c (bsf-grouplasso, default 1e-2)")
    gate: str = option("shrink", type=str, choices=GATES, help="bsf-grouplasso gate (default shrink, the paper's)")
    k_target: int | None = option(None, type=int, help="target active blocks of the STE gate's cold start "
                                  "(bsf-grouplasso --gate ste, default 16)")
    penalty: str = option("code", type=str, choices=PENALTIES, help="bsf-grouplasso shrink gate: ℓ₂,₁ on the codes "
                          "‖z_g‖ (default, the paper's) or on the contributions ‖W_g z_g‖ (docs/bsf.md §3.3)")

    def resolved(self, arch: str, d_sae: int) -> GroupLassoOptions:
        base = BsfOptions.resolved(self, arch, d_sae)
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        out = replace(self, block_size=base.block_size, denoise=base.denoise, c_gl=require_real("c_gl", self.c_gl))
        if self.gate == "shrink":
            if self.k_target is not None:
                raise ValueError("option k_target applies only to gate='ste'")
            return out
        if self.penalty != "code":
            raise ValueError("option penalty='contribution' applies only to gate='shrink'")
        n_b = d_sae // base.block_size
        k_target = require_int("k_target", DEFAULT_K_TARGET if self.k_target is None else self.k_target, 1)
        if k_target > n_b:
            raise ValueError(f"k_target = {k_target} exceeds n_b = {n_b}; pass a smaller k_target")
        return replace(out, k_target=k_target)


class BlockSparse(Architecture):
    """The BSFs: unit-Frobenius or orthonormal blocks, a fixed centring vector, Adam at lr 4e-4."""

    family = "bsf"
    family_title = "block-sparse featurizers (bsf-*; d_sae = n_b·q)"
    fields_key = "bsf"
    #: docs/bsf.md §3: data are centred beforehand; dictcheck centres by a fixed b_dec = the mean of the
    #: first batch (Decision), or not at all.
    b_dec_inits = ("mean", "zero")
    decoder_norm = "unit_frobenius_block"

    def default_lr(self, d_sae: int) -> float:
        return 4e-4  # docs/bsf.md §4: Adam, lr 4e-4 (the authors' code default)

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        n_b, q = _positive_field(fields, "n_b"), _positive_field(fields, "q")
        if n_b * q != d_sae:
            raise ValueError(f"n_b*q = {n_b}*{q} = {n_b * q} != d_sae = {d_sae}")
        return self.block_schema(d_in, d_sae, n_b, q)

    def block_schema(self, d_in: int, d_sae: int, n_b: int, q: int) -> Schema:
        return {"W_enc": ((d_in, d_sae), True), "b_enc": ((d_sae,), True), "W_dec": ((d_sae, d_in), True),
                "b_dec": ((d_in,), False)}

    def decoder_constraint_violation(self, model: Featurizer) -> float:
        """max_g |‖W_g‖_F − 1| over the decoder blocks W_g ∈ R^{D×q}, in float64 (docs/bsf.md §3.1)."""
        with torch.no_grad():
            norms = model.decoder_blocks().detach().to(torch.float64).norm(dim=(1, 2))
        return float((norms - 1.0).abs().max())

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        if float(getattr(options, "denoise", 0.0)) > 0:
            return ("the denoising noise is drawn per rank and scaled by each rank's own batch std "
                    "(use --denoise 0 for exact equivalence)")
        return None

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        opts = options.to_dict()
        k = opts.pop("k", None)
        return init_bsf(self.name, d_in, d_sae, k=k, seed=seed, dtype=dtype, **opts)


def _positive_field(fields: Mapping[str, Any], name: str) -> int:
    v = fields.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"requires positive int metadata.dictcheck.bsf.{name}, got {v!r}")
    return v


@register
class Vanilla(BlockSparse):
    """a = W_encᵀx̃ + b_enc, z = Π_k(a) (the k blocks of largest norm)."""

    name = "bsf-vanilla"
    saved_name = "dictcheck/bsf-vanilla"
    Options = BsfTopKOptions


@register
class Grassmann(BlockSparse):
    """Orthonormal frames W_g = Q of a sign-fixed QR of B_g, tied encoder with a global γ."""

    name = "bsf-grassmann"
    saved_name = "dictcheck/bsf-grassmann"
    decoder_norm = "qr_orthonormal"
    Options = BsfTopKOptions

    def block_schema(self, d_in: int, d_sae: int, n_b: int, q: int) -> Schema:
        return {"B": ((n_b, d_in, q), True), "log_gamma": ((), True), "b_dec": ((d_in,), False)}

    def decoder_constraint_violation(self, model: Featurizer) -> float:
        """max_g ‖W_gᵀW_g − I_q‖_F of the frames W_g (the sign-fixed QR of the raw B_g), in float64
        (docs/bsf.md §3.2: orthonormal frames, W_g a point of the Stiefel manifold)."""
        with torch.no_grad():
            W = model.decoder_blocks().detach().to(torch.float64)
            eye = torch.eye(W.shape[-1], dtype=torch.float64)
            return float((W.transpose(1, 2) @ W - eye).norm(dim=(1, 2)).max())


@register
class GroupLasso(BlockSparse):
    """sh_θ gate with the ℓ₂,₁ penalty on the codes (or, as an option, on the contributions), or the STE gate
    with a block-count penalty."""

    name = "bsf-grouplasso"
    saved_name = "dictcheck/bsf-grouplasso"
    Options = GroupLassoOptions

    def block_schema(self, d_in: int, d_sae: int, n_b: int, q: int) -> Schema:
        return {**super().block_schema(d_in, d_sae, n_b, q), "log_theta": ((), False), "theta_raw": ((n_b,), False)}

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        note = super().ddp_inexactness(options)
        if note is None and getattr(options, "gate", None) == "ste":
            return "the STE gate's cold start (θ, w) is taken from rank 0's first B/P tokens"
        return note
