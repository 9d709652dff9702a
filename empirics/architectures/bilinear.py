"""Bilinear autoencoders: ``bilinear-quadratic``, ``bilinear-atomic``, ``bilinear-compound`` (models in
:mod:`dictcheck.empirics.bilinear_models`; docs/bilinear.md §1–§5, §8)."""

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
from dictcheck.empirics.bilinear_models import ATOMS, HOYER_ON, BilinearAutoencoder
from dictcheck.empirics.featurizer import Featurizer
from dictcheck.theory.bilinear_lifted import DECODERS

__all__ = ["BilinearOptions", "QuadraticOptions", "CompoundOptions", "Bilinear", "Quadratic", "Atomic", "Compound"]

DEFAULT_HOYER_COEF = 0.1
DEFAULT_K_C = 8


@dataclass(frozen=True)
class BilinearOptions(ArchOptions):
    """Every prior: the Hoyer coefficient α_H and the latent tile of the kernel term."""

    hoyer_coef: float = option(DEFAULT_HOYER_COEF, type=float, help="Hoyer density coefficient α_H (default 0.1)")
    tile: int = option(0, type=int, help="latent tile size of the kernel term (default 0: untiled)")

    def resolved(self, arch: str, d_sae: int) -> BilinearOptions:
        return replace(self, hoyer_coef=require_real("hoyer_coef", self.hoyer_coef),
                       tile=require_int("tile", self.tile, 0))


@dataclass(frozen=True)
class QuadraticOptions(BilinearOptions):
    """The quadratic (GLU) prior: also the decoder form."""

    decoder: str = option("symmetric", type=str, choices=DECODERS, help="GLU decoder (bilinear-quadratic; "
                          "asymmetric only to reproduce the workshop code)")

    def resolved(self, arch: str, d_sae: int) -> QuadraticOptions:
        base = BilinearOptions.resolved(self, arch, d_sae)
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {list(DECODERS)}, got {self.decoder!r}")
        return replace(self, hoyer_coef=base.hoyer_coef, tile=base.tile)


@dataclass(frozen=True)
class CompoundOptions(QuadraticOptions):
    """The compound prior W_k = Σ_j C_kj a_j: atoms a_j (u_j u_jᵀ, or GLU u_j v_jᵀ), non-zeros per row of C
    (n_atoms: dense), an L1 on C, what the Hoyer term measures; ``decoder`` applies to GLU atoms only."""

    n_atoms: int | None = option(None, type=int, help="atoms of the compound prior (default 2·d_sae)")
    k_c: int | None = option(None, type=int, help="non-zeros per row of C, compound prior (default min(8, n_atoms); "
                             "n_atoms = dense C)")
    c_l1: float = option(0.0, type=float, help="L1 coefficient on C, compound prior (default 0)")
    atoms: str = option("rank1", type=str, choices=ATOMS, help="compound atoms: rank1 u uᵀ (default) or glu u vᵀ")
    hoyer_on: str = option("latents", type=str, choices=HOYER_ON, help="compound Hoyer term on the composites "
                           "(latents, default) or on the atom activations (atoms)")

    def resolved(self, arch: str, d_sae: int) -> CompoundOptions:
        base = QuadraticOptions.resolved(self, arch, d_sae)
        n_atoms = require_int("n_atoms", 2 * d_sae if self.n_atoms is None else self.n_atoms, 1)
        k_c = require_int("k_c", min(DEFAULT_K_C, n_atoms) if self.k_c is None else self.k_c, 1)
        if k_c > n_atoms:
            raise ValueError(f"k_c must be <= n_atoms = {n_atoms}, got {k_c}")
        if self.atoms not in ATOMS or self.hoyer_on not in HOYER_ON:
            raise ValueError(f"atoms must be one of {list(ATOMS)} and hoyer_on one of {list(HOYER_ON)}, got "
                             f"{self.atoms!r}, {self.hoyer_on!r}")
        if self.atoms == "rank1" and self.decoder != "symmetric":
            raise ValueError("decoder asymmetric needs GLU atoms (atoms glu); rank-1 atoms are symmetric")
        return replace(self, hoyer_coef=base.hoyer_coef, tile=base.tile, n_atoms=n_atoms, k_c=k_c,
                       c_l1=require_real("c_l1", self.c_l1))


class Bilinear(Architecture):
    """Latents xᵀW_jx of normalised tokens, reconstructed in the lift; no centring vector."""

    family = "bilinear"
    family_title = "bilinear autoencoders (bilinear-*)"
    fields_key = "bilinear"
    #: docs/bilinear.md §0: tokens are normalised, there is no centring vector.
    b_dec_inits = ("none",)
    decoder_norm = "none"

    def default_lr(self, d_sae: int) -> float:
        # docs/bilinear.md §8: the workshop trains with Muon at lr 0.03; dictcheck uses the loop's Adam,
        # whose default here is 1e-3 (Decision).
        return 1e-3

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return {"U": ((d_sae, d_in), True)}

    def step_bytes(self, d_in: int, d_sae: int, options: ArchOptions, batch_size: int, elem: int) -> int:
        """The default, plus (untiled) the m × m kernel blocks and their autograd copies, m = d_sae
        (n_atoms for the compound prior)."""
        m = getattr(options, "n_atoms", None) or d_sae
        kernel = 0 if getattr(options, "tile", 0) else 3 * m * m * elem
        return super().step_bytes(d_in, d_sae, options, batch_size, elem) + kernel

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        return ("the Hoyer density is computed per latent over each rank's B/P tokens, and the lifted loss is "
                "normalised by each rank's own count of nonzero tokens")

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        return BilinearAutoencoder(self.name, d_in, d_sae, seed=seed, dtype=dtype, **options.to_dict())


@register
class Quadratic(Bilinear):
    """GLU forms W_j = sym(u_j v_jᵀ) (symmetric decoder by default)."""

    name = "bilinear-quadratic"
    saved_name = "dictcheck/bilinear-quadratic"
    Options = QuadraticOptions

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return {"U": ((d_sae, d_in), True), "V": ((d_sae, d_in), True)}


@register
class Atomic(Bilinear):
    """Rank-one forms W_j = u_j u_jᵀ."""

    name = "bilinear-atomic"
    saved_name = "dictcheck/bilinear-atomic"
    Options = BilinearOptions


@register
class Compound(Bilinear):
    """Sparse combinations of shared rank-one atoms."""

    name = "bilinear-compound"
    saved_name = "dictcheck/bilinear-compound"
    Options = CompoundOptions

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        n_a = fields.get("n_atoms")
        if not isinstance(n_a, int) or isinstance(n_a, bool) or n_a <= 0:
            raise ValueError(f"requires positive int metadata.dictcheck.bilinear.n_atoms, got {n_a!r}")
        glu = {"V": ((n_a, d_in), True)} if fields.get("atoms", "rank1") == "glu" else {}
        return {"U": ((n_a, d_in), True), **glu, "C": ((d_sae, n_a), True)}
