"""Every trainable architecture: what each declares (:mod:`.base`), the registry of their names and modules
(:mod:`.registry`), and one module per architecture or family (docs/ecosystem.md §1, §3).

Importing this package loads no architecture module (and no torch): :data:`REGISTRY` and
:func:`architecture` import a module when it is first asked for.
"""

from __future__ import annotations

from dictcheck.empirics.architectures.base import (
    ArchOptions,
    Architecture,
    Schema,
    option,
    register,
    unregister,
)
from dictcheck.empirics.architectures.registry import REGISTRY, architecture, build_model, family_of, names

__all__ = ["REGISTRY", "ArchOptions", "Architecture", "Schema", "architecture", "option", "register", "unregister",
           "build_model", "family_of", "names"]
