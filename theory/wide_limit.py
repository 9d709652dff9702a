"""Closed-form wide-limit optimum at a given bias (docs/theory.md §4.2).

With one atom per distinct ray from b, min over (W, Z ≥ 0) of objective (1) equals
(1/N) Σ_i h_λ(‖x_i − b‖). Points with ρ_i > λ are represented by the atom x̃_i/ρ_i with
unit-atom code ρ_i − λ and residual λ x̃_i/ρ_i; points with ρ_i ≤ λ get no atom.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.huber import huber
from dictcheck.theory.objective import centred


@dataclass(frozen=True)
class WideOptimumAtBias:
    """The wide-limit optimum at fixed b: value, balanced Q* diagonal, residuals, reconstructions."""

    value: float
    rho: NDArray[np.float64]
    q_diag: NDArray[np.float64]
    residuals: NDArray[np.float64]
    reconstruction: NDArray[np.float64]
    represented: NDArray[np.bool_]


def wide_optimum_at_bias(X: NDArray, b: ArrayLike, lam: float) -> WideOptimumAtBias:
    """Evaluate (7) at fixed b together with the optimal Q* = diag((ρ − λ)₊) in balanced codes.

    Q* is exact for generic data (no two points on one ray from b); with shared rays the optimal
    face holds other points too (spec §4.2, §4.4).
    """
    Xc = centred(X, b)
    rho = np.linalg.norm(Xc, axis=0)
    represented = rho > lam
    safe_rho = np.where(rho > 0, rho, 1.0)
    shrink = np.where(represented, lam / safe_rho, 1.0)
    residuals = Xc * shrink
    b_col = np.asarray(b, dtype=np.float64).reshape(-1, 1)
    return WideOptimumAtBias(
        value=float(np.mean(huber(rho, lam))),
        rho=rho,
        q_diag=np.maximum(rho - lam, 0.0),
        residuals=residuals,
        reconstruction=b_col + Xc - residuals,
        represented=represented,
    )


def diagonal_q_program_value(q: ArrayLike, rho: ArrayLike, lam: float) -> float:
    """J(diag(q)) = (λ/N) Σ_i [ρ_i²/(q_i + λ) + q_i]; minimised at q_i = (ρ_i − λ)₊ (spec §4.2)."""
    q = np.asarray(q, dtype=np.float64)
    rho = np.asarray(rho, dtype=np.float64)
    return float(lam / rho.size * np.sum(rho**2 / (q + lam) + q))
