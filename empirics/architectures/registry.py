"""The registry of trainable architectures: each name and the module of this package that defines it.

Adding an architecture is its module (which registers its class with
:func:`~dictcheck.empirics.architectures.base.register` when imported) and one line of :data:`MODULES`.
The order of :data:`MODULES` is the order ``dictcheck train --arch`` lists them. This module imports no
architecture until one is asked for, so the command line can list the names without loading torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dictcheck.empirics.architectures import base

if TYPE_CHECKING:
    import torch

    from dictcheck.empirics.architectures.featurizer import Featurizer

__all__ = ["MODULES", "REGISTRY", "architecture", "build_model", "family_of", "names", "load_all"]

#: Architecture name -> its module under ``dictcheck.empirics.architectures``.
MODULES: dict[str, str] = {
    "relu": "relu",
    "topk": "topk",
    "batchtopk": "batchtopk",
    "jumprelu": "jumprelu",
    "abs": "abs",
    "bsf-vanilla": "bsf",
    "bsf-grassmann": "bsf",
    "bsf-grouplasso": "bsf",
    "bilinear-quadratic": "bilinear",
    "bilinear-atomic": "bilinear",
    "bilinear-compound": "bilinear",
    "vasae": "vasae",
}


def names() -> list[str]:
    """Every architecture name, the listed ones first (in :data:`MODULES` order), without importing any."""
    return [*MODULES, *(n for n in base.REGISTERED if n not in MODULES)]


def architecture(name: str) -> base.Architecture:
    """The registered architecture called ``name`` (its module imported on first use); ValueError naming the
    known ones otherwise."""
    if isinstance(name, str) and name in MODULES and name not in base.REGISTERED:
        importlib.import_module(f"{__package__}.{MODULES[name]}")
    try:
        return base.REGISTERED[name]
    except (KeyError, TypeError):
        raise ValueError(f"arch must be one of {names()}, got {name!r}") from None


def load_all() -> None:
    """Import every module of :data:`MODULES` (registering their architectures)."""
    for module in dict.fromkeys(MODULES.values()):
        importlib.import_module(f"{__package__}.{module}")


class _Registry(Mapping[str, base.Architecture]):
    """Name -> architecture, every module of :data:`MODULES` loaded on first use; in :func:`names` order."""

    def __getitem__(self, name: str) -> base.Architecture:
        try:
            return architecture(name)
        except ValueError:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        load_all()
        return iter(names())

    def __len__(self) -> int:
        return len(names())

    def __contains__(self, name: object) -> bool:
        return name in MODULES or name in base.REGISTERED


#: Every architecture (its modules imported when first read).
REGISTRY: Mapping[str, base.Architecture] = _Registry()


def build_model(arch: str, d_in: int, d_sae: int, options: Mapping[str, Any] | base.ArchOptions | None = None, *,
                seed: int = 0, dtype: torch.dtype | None = None) -> Featurizer:
    """A freshly initialised model of architecture ``arch`` (:meth:`Architecture.build`; ``dtype`` None:
    float32)."""
    return architecture(arch).build(d_in, d_sae, options, seed=seed, dtype=dtype)


def family_of(name: str) -> str:
    """'sae', 'bsf', 'bilinear' or 'vasae'."""
    return architecture(name).family
