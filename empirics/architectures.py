"""Architecture names → the module that builds them, their options and their training defaults.

Each family module provides two functions (looked up by name, imported on first use):

* ``resolve_options(arch, d_sae, k, lam, options) -> dict``: validate ``k``, ``lam`` and the
  architecture options (a mapping of option name → value) and return the options with every
  default filled in. Raises ValueError with a one-line message.
* ``build(arch, d_in, d_sae, *, k, lam, aux_coef, b_dec_init, seed, dtype, **options)``: a freshly
  initialised :class:`empirics.featurizer.Featurizer` (``b_dec_init`` is a tensor [d_in] or None).

``b_dec_inits`` lists the centring rules the training loop may use for the architecture (the first
is the default); ``"none"`` means the architecture has no centring vector.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Architecture", "ARCHITECTURES", "architecture", "family_of"]


def sae_default_lr(d_sae: int) -> float:
    """dictionary_learning's TopK rule lr = 2e-4/√(d_sae/2^14) (ecosystem spec §3)."""
    return 2e-4 / math.sqrt(d_sae / 2**14)


def _constant_lr(value: float) -> Callable[[int], float]:
    def lr(d_sae: int) -> float:
        return value

    return lr


@dataclass(frozen=True)
class Architecture:
    """One trainable architecture: its family, building module, centring rules and default lr."""

    name: str
    family: str
    module: str
    b_dec_inits: tuple[str, ...]
    default_lr: Callable[[int], float]

    def _function(self, name: str) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.module), name)

    def resolve_options(self, d_sae: int, k: int | None, lam: float | None, options: Mapping[str, Any]) -> dict[str, Any]:
        return self._function("resolve_options")(self.name, d_sae, k, lam, options)

    @property
    def build(self) -> Callable[..., Any]:
        return self._function("build")


_SAE_INITS = ("geometric_median", "huber_median", "mean", "zero")
#: BSF: data are centred beforehand (spec/bsf.md §3); dictcheck centres by a fixed b_dec = the mean
#: of the first batch (Decision), or not at all.
_BSF_INITS = ("mean", "zero")
#: Bilinear autoencoders normalise tokens and have no centring vector (spec/bilinear.md §0).
_BILINEAR_INITS = ("none",)

ARCHITECTURES: dict[str, Architecture] = {
    **{a: Architecture(a, "sae", "dictcheck.empirics.sae_models", _SAE_INITS, sae_default_lr)
       for a in ("relu", "topk", "batchtopk", "jumprelu", "abs")},
    # spec/bsf.md §4: Adam, lr 4e-4 (the authors' code default).
    **{a: Architecture(a, "bsf", "dictcheck.empirics.bsf_models", _BSF_INITS, _constant_lr(4e-4))
       for a in ("bsf-vanilla", "bsf-grassmann", "bsf-grouplasso")},
    # spec/bilinear.md §8: the workshop trains with Muon at lr 0.03; dictcheck uses the loop's Adam,
    # whose default here is 1e-3 (Decision).
    **{a: Architecture(a, "bilinear", "dictcheck.empirics.bilinear_models", _BILINEAR_INITS, _constant_lr(1e-3))
       for a in ("bilinear-quadratic", "bilinear-atomic", "bilinear-compound")},
    # spec/vasae.md §1, §6: no b_dec subtraction and no median init (b_dec starts at 0); lr 1e-3 (the authors').
    "vasae": Architecture("vasae", "vasae", "dictcheck.empirics.vasae_models", ("zero",), _constant_lr(1e-3)),
}


def architecture(name: str) -> Architecture:
    """The :class:`Architecture` called ``name``; ValueError naming the known ones otherwise."""
    try:
        return ARCHITECTURES[name]
    except (KeyError, TypeError):
        raise ValueError(f"arch must be one of {list(ARCHITECTURES)}, got {name!r}") from None


def family_of(name: str) -> str:
    """'sae', 'bsf', 'bilinear' or 'vasae'."""
    return architecture(name).family
