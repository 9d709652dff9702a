"""The Huber function h_λ and the per-point bound (6) (docs/theory.md §0, §4.1, §4.3).

h_λ(ρ) = ρ² if ρ ≤ λ, else 2λρ − λ². It is *twice* the textbook Huber loss with threshold λ
(scipy.special.huber(λ, ρ) = h_λ(ρ)/2).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def huber(rho: ArrayLike, lam: float) -> NDArray[np.float64]:
    """h_λ(ρ) elementwise: ρ² for ρ ≤ λ, 2λρ − λ² beyond (docs/theory.md §0)."""
    rho = np.asarray(rho, dtype=np.float64)
    return np.where(rho <= lam, rho**2, 2.0 * lam * rho - lam**2)


def point_distances(X: NDArray, b: ArrayLike) -> NDArray[np.float64]:
    """ρ_i = ‖x_i − b‖ for the columns x_i of X (D, N)."""
    b = np.asarray(b, dtype=np.float64).reshape(-1, 1)
    return np.linalg.norm(np.asarray(X, dtype=np.float64) - b, axis=0)


def huber_objective(b: ArrayLike, X: NDArray, lam: float) -> float:
    """H(b) = (1/N) Σ_i h_λ(‖x_i − b‖): the wide-limit optimum at fixed bias b (spec §4.2, (7))."""
    return float(np.mean(huber(point_distances(X, b), lam)))


def huber_objective_gradient(b: ArrayLike, X: NDArray, lam: float) -> NDArray[np.float64]:
    """∇H(b) = −(2/N) Σ_i min(1, λ/ρ_i) (x_i − b), the gradient of H (spec §4.3).

    h_λ is C¹ with h'_λ(ρ) = 2 min(ρ, λ), so each point pulls b with weight min(1, λ/ρ_i);
    a point at ρ_i = 0 contributes nothing.
    """
    b = np.asarray(b, dtype=np.float64)
    diff = np.asarray(X, dtype=np.float64) - b.reshape(-1, 1)
    rho = np.linalg.norm(diff, axis=0)
    weights = np.minimum(1.0, lam / np.maximum(rho, np.finfo(float).tiny))
    return -2.0 * (diff @ weights) / diff.shape[1]


def huber_objective_hessian(b: ArrayLike, X: NDArray, lam: float) -> NDArray[np.float64]:
    """∇²H(b) = (2/N)[Σ_{ρ_i≤λ} I + Σ_{ρ_i>λ} (λ/ρ_i)(I − u_i u_iᵀ)], u_i = (x_i − b)/ρ_i (spec §4.3).

    H is twice differentiable except on the spheres ρ_i = λ; there this is one-sided.
    """
    b = np.asarray(b, dtype=np.float64)
    diff = np.asarray(X, dtype=np.float64) - b.reshape(-1, 1)
    rho = np.linalg.norm(diff, axis=0)
    out = rho > lam
    D, N = diff.shape
    U = diff[:, out]
    inner = np.count_nonzero(~out) + np.sum(lam / rho[out])
    return 2.0 * (inner * np.eye(D) - (U * (lam / rho[out] ** 3)) @ U.T) / N


def geometric_median_objective(b: ArrayLike, X: NDArray) -> float:
    """(1/N) Σ_i ‖x_i − b‖, the objective of the plain geometric median."""
    return float(np.mean(point_distances(X, b)))


def per_point_bound_attainer(x_centred: NDArray, lam: float) -> NDArray[np.float64]:
    """argmin_y ‖x̃ − y‖² + 2λ‖y‖ = (‖x̃‖ − λ)₊ x̃/‖x̃‖, the group soft-threshold (spec §4.1, (6)).

    Works columnwise on a (D, N) array. Its value is h_λ(‖x̃‖), the lower bound (6) that every
    unit dictionary with non-negative (or signed) codes obeys.
    """
    x_centred = np.asarray(x_centred, dtype=np.float64)
    rho = np.linalg.norm(x_centred, axis=0)
    scale = np.where(rho > lam, (rho - lam) / np.where(rho > 0, rho, 1.0), 0.0)
    return x_centred * scale
