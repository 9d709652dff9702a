"""Sums, maxima and gathers over the processes that share a computation's points (docs/ecosystem.md §3,
"When one machine is not enough").

A streamed pass over the points (the diagnostics, the λ search) computes sums, maxima and minima over its
points; when the points are split over P processes, each computes its part and a :class:`Reduction` combines
them. :data:`LOCAL` is the one-process reduction (identity). The distributed one lives with the launcher
(:mod:`dictcheck.proofs_checks.ranks`): every rank receives the combined value, so every rank takes the same
decisions afterwards.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

__all__ = ["Reduction", "LOCAL"]


class Reduction(Protocol):
    """Combines per-process values over ``size`` processes; this one is ``rank``."""

    rank: int
    size: int

    def sum(self, a: NDArray) -> NDArray:
        """The element-wise sum over the processes (same shape and dtype on every process)."""
        ...

    def max(self, a: NDArray) -> NDArray:
        """The element-wise maximum."""
        ...

    def min(self, a: NDArray) -> NDArray:
        """The element-wise minimum."""
        ...

    def gather(self, obj: Any) -> list[Any]:
        """Every process's (picklable) ``obj``, in rank order, on every process."""
        ...


class _Local:
    """One process: every reduction is the value itself."""

    rank = 0
    size = 1

    def sum(self, a: NDArray) -> NDArray:
        return np.asarray(a)

    def max(self, a: NDArray) -> NDArray:
        return np.asarray(a)

    def min(self, a: NDArray) -> NDArray:
        return np.asarray(a)

    def gather(self, obj: Any) -> list[Any]:
        return [obj]


LOCAL: Reduction = _Local()
