"""Second-order closed form at a symmetric narrow stationary point (docs/theory.md §3.1).

Data on two rays from b = 0 at angles ±α about a unit direction e, one unit atom u(θ) at angle θ from e,
exact codes. If every point is active on the bisector (ρ_i cos α > λ), then near θ = 0

    O(θ) = (1/N) Σ_i [ ρ_i² − (ρ_i cos(θ ∓ α) − λ)² ]      (gain lemma, S6, with r = x̃),

O′(0) = 0 by symmetry, and

    O″(0) = (2/N) Σ_i ρ_i (ρ_i cos 2α − λ cos α),

so the bisector is a strict local minimum of the one-atom problem iff Σ ρ_i(ρ_i cos 2α − λ cos α) > 0 and a
saddle of the full problem (a maximum along θ) iff it is < 0, e.g. for every α > π/4.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def bisector_curvature(rho: ArrayLike, alpha: float, lam: float) -> float:
    """O″(0) = (2/N) Σ_i ρ_i (ρ_i cos 2α − λ cos α) for points at distances ρ_i on the rays at ±α (all of them,
    both rays; N = len(rho)). Raises ValueError unless every point is active on the bisector (ρ_i cos α > λ)."""
    rho = np.asarray(rho, dtype=np.float64).reshape(-1)
    if rho.size == 0 or lam <= 0:
        raise ValueError(f"need at least one point and λ > 0, got {rho.size} points and λ = {lam}")
    if np.any(rho * np.cos(alpha) <= lam):
        raise ValueError("every point must be active on the bisector (ρ_i cos α > λ) for the closed form")
    return float(2.0 * np.sum(rho * (rho * np.cos(2 * alpha) - lam * np.cos(alpha))) / rho.size)
