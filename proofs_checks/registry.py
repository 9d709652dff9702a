"""The registry of checks: each check states its prediction before it measures.

A check is a function ``CheckContext -> Outcome`` registered with :func:`check`. Its prediction
(what the theory says will be measured) is part of the registration, so it is fixed before any
number is computed. The runner (proofs_checks.runner) records predicted, measured, tolerance and
the reason for that tolerance for every check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

JSONValue = Any


@dataclass
class Outcome:
    """What a check measured.

    ``passed`` is the verdict at ``tolerance``; ``tolerance_reason`` says why that tolerance.
    ``finding`` is set when the measurement contradicts the theory's claim (reported, not hidden).
    """

    measured: JSONValue
    tolerance: JSONValue
    tolerance_reason: str
    passed: bool
    details: dict[str, JSONValue] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    finding: str | None = None


@dataclass(frozen=True)
class CheckContext:
    """Where a check writes figures, its seed, and whether this is the quick suite."""

    out_dir: Path
    seed: int
    quick: bool

    def rng(self, check_id: str) -> np.random.Generator:
        """A generator seeded by (seed, check id): checks stay reproducible when run alone."""
        digest = hashlib.sha256(f"{self.seed}:{check_id}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:8], "little"))

    def figure_path(self, name: str) -> Path:
        """Path for a PNG figure inside the output directory (created on demand)."""
        path = self.out_dir / "figures" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


@dataclass(frozen=True)
class Check:
    """A registered check: id, title, spec section, the prediction, and the measuring function."""

    id: str
    title: str
    spec: str
    predicted: JSONValue
    func: Callable[[CheckContext], Outcome]
    quick: bool = True


REGISTRY: dict[str, Check] = {}


def check(
    id: str, title: str, spec: str, predicted: JSONValue, quick: bool = True
) -> Callable[[Callable[[CheckContext], Outcome]], Callable[[CheckContext], Outcome]]:
    """Register a check. ``quick=False`` keeps it out of ``dictcheck run --quick``."""

    def register(func: Callable[[CheckContext], Outcome]) -> Callable[[CheckContext], Outcome]:
        if id in REGISTRY:
            raise ValueError(f"check id registered twice: {id}")
        REGISTRY[id] = Check(id=id, title=title, spec=spec, predicted=predicted, func=func, quick=quick)
        return func

    return register


def load_all_checks() -> dict[str, Check]:
    """Import every module of proofs_checks.checks so that their checks register."""
    import importlib
    import pkgutil

    import dictcheck.proofs_checks.checks as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return REGISTRY
