"""Every trainable architecture, one registered class each (docs/ecosystem.md §1, §3).

:mod:`.base` holds :class:`Architecture` (what an architecture declares in one place) and the registry;
each family module registers its classes when it is imported below, in the order ``dictcheck train
--arch`` lists them. Adding an architecture is one module (or one class in a family module) plus one
import line here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dictcheck.empirics.architectures import sae  # noqa: I001  (registration, in this order)
from dictcheck.empirics.architectures import bsf  # noqa: F401
from dictcheck.empirics.architectures import bilinear  # noqa: F401
from dictcheck.empirics.architectures import vasae  # noqa: F401
from dictcheck.empirics.architectures.base import (
    REGISTRY,
    ArchOptions,
    Architecture,
    Schema,
    architecture,
    option,
    register,
    unregister,
)
from dictcheck.empirics.architectures.sae import sae_default_lr
from dictcheck.empirics.architectures.featurizer import Featurizer

__all__ = ["REGISTRY", "ArchOptions", "Architecture", "Schema", "architecture", "option", "register", "unregister",
           "sae_default_lr", "build_model", "family_of"]


def build_model(arch: str, d_in: int, d_sae: int, options: Mapping[str, Any] | ArchOptions | None = None, *,
                seed: int = 0, dtype: torch.dtype = torch.float32) -> Featurizer:
    """A freshly initialised model of architecture ``arch`` (:meth:`Architecture.build`)."""
    return architecture(arch).build(d_in, d_sae, options, seed=seed, dtype=dtype)


def family_of(name: str) -> str:
    """'sae', 'bsf', 'bilinear' or 'vasae'."""
    return architecture(name).family
