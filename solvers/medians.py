"""Huber-smoothed and plain geometric medians (spec/theory.md §4.3).

* ``huber_median``: b* = argmin_b H(b), H(b) = (1/N) Σ_i h_λ(‖x_i − b‖), the optimal wide-limit
  bias. H is convex and C¹, so ‖∇H‖ is a proper stopping test.
* ``geometric_median``: argmin_b (1/N) Σ_i ‖x_i − b‖ (not differentiable at data points).

Method (Decision, spec §4.3 allows "or better"): a damped Newton iteration with backtracking
line search on the exact (generalised) Hessian, safeguarded by the majorise–minimise step
(IRLS: b ← Σ ω_i x_i / Σ ω_i with ω_i = min(1, λ/ρ_i) for Huber, Weiszfeld with the
Vardi–Zhang correction for the geometric median) whenever Newton does not decrease the
objective. In one dimension both are solved exactly by sorting (breakpoints x_i ± λ, or the
sample median). The MM step always decreases the objective, so the iteration is monotone.

Stopping tolerance (stated): Huber stops when ‖∇H(b)‖ ≤ 2λ·tol (2λ is the largest gradient
a single point can contribute); the geometric median stops when the minimum-norm subgradient
has norm ≤ tol (each point contributes a unit vector). Default tol = 1e-10. Every result also
carries the rigorous bound ``suboptimality_bound`` = ‖g‖·max_i‖x_i − b‖ ≥ f(b) − min f.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from theory.huber import geometric_median_objective, huber_objective, huber_objective_gradient

_MAX_DENSE_HESSIAN_DIM = 1024


@dataclass(frozen=True)
class MedianResult:
    """A computed median: location, objective (mean over points), convergence record."""

    b: NDArray[np.float64]
    objective: float
    iterations: int
    gradient_norm: float
    suboptimality_bound: float
    converged: bool
    seconds: float


def _validate(X: NDArray) -> NDArray[np.float64]:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] == 0 or X.shape[0] == 0:
        raise ValueError(f"X must have shape (D, N) with D, N >= 1, got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or inf")
    return X


def _huber_median_1d(x: NDArray[np.float64], lam: float) -> float:
    """Exact 1-D Huber median: the root of ψ(b) = Σ_i clip(x_i − b, −λ, λ), decreasing and piecewise linear."""
    knots = np.unique(np.concatenate([x - lam, x + lam]))

    def psi(b: float) -> float:
        return float(np.sum(np.clip(x - b, -lam, lam)))

    values = np.array([psi(k) for k in knots]) if knots.size < 4096 else None
    if values is None:
        lo, hi = 0, knots.size - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if psi(knots[mid]) > 0:
                lo = mid
            else:
                hi = mid
        a, c = knots[lo], knots[hi]
        fa, fc = psi(a), psi(c)
    else:
        idx = int(np.searchsorted(-values, 0.0))  # first knot with ψ ≤ 0
        if idx == 0:
            return float(knots[0])
        a, c = knots[idx - 1], knots[idx]
        fa, fc = values[idx - 1], values[idx]
    if fa == fc:
        return float(a)
    return float(a + (c - a) * fa / (fa - fc))


def _huber_pieces(X: NDArray, b: NDArray, lam: float) -> tuple[NDArray, NDArray, NDArray]:
    diff = X - b[:, None]
    rho = np.linalg.norm(diff, axis=0)
    return diff, rho, rho > lam


def _huber_hessian(X: NDArray, b: NDArray, lam: float) -> NDArray[np.float64]:
    """∇²H = (2/N)[Σ_{ρ≤λ} I + Σ_{ρ>λ} (λ/ρ)(I − uuᵀ)], u = (x − b)/ρ."""
    diff, rho, out = _huber_pieces(X, b, lam)
    N, D = X.shape[1], X.shape[0]
    w = lam / rho[out]
    U = diff[:, out] / rho[out]
    H = (np.count_nonzero(~out) + w.sum()) * np.eye(D) - (U * w) @ U.T
    return 2.0 * H / N


def _huber_mm_step(X: NDArray, b: NDArray, lam: float) -> NDArray[np.float64]:
    """b ← Σ ω_i x_i / Σ ω_i with ω_i = min(1, λ/ρ_i) (spec §4.3); never divides by zero."""
    _, rho, _ = _huber_pieces(X, b, lam)
    w = np.minimum(1.0, lam / np.maximum(rho, np.finfo(float).tiny))
    return (X @ w) / w.sum()


def _newton_mm(
    X: NDArray,
    b: NDArray,
    f: Callable[[NDArray], float],
    stationarity: Callable[[NDArray], tuple[NDArray, float]],
    hessian: Callable[[NDArray], NDArray] | None,
    mm_step: Callable[[NDArray], NDArray],
    stop: float,
    max_iter: int,
) -> tuple[NDArray, int, float, bool]:
    """Monotone Newton/MM iteration; returns (b, iterations, stationarity measure, converged)."""
    fb = f(b)
    for it in range(1, max_iter + 1):
        grad, measure = stationarity(b)
        if measure <= stop:
            return b, it - 1, measure, True
        candidate = None
        if hessian is not None and np.all(np.isfinite(grad)):
            Hm = hessian(b)
            shift = 1e-12 * max(np.trace(Hm) / Hm.shape[0], 1e-300)
            try:
                direction = -np.linalg.solve(Hm + shift * np.eye(Hm.shape[0]), grad)
            except np.linalg.LinAlgError:
                direction = None
            if direction is not None and np.all(np.isfinite(direction)):
                step, slope = 1.0, float(grad @ direction)
                while step > 1e-8:
                    trial = b + step * direction
                    f_trial = f(trial)
                    if f_trial <= fb + 1e-4 * step * slope:
                        candidate, f_candidate = trial, f_trial
                        break
                    step *= 0.5
        if candidate is None:
            candidate = mm_step(b)
            f_candidate = f(candidate)
            if f_candidate > fb:  # MM guarantees descent; only rounding can trip this
                return b, it, measure, False
            if f_candidate == fb and np.array_equal(candidate, b):
                return b, it, measure, measure <= stop
        b, fb = candidate, f_candidate
    _, measure = stationarity(b)
    return b, max_iter, measure, measure <= stop


def huber_median(
    X: NDArray, lam: float, *, tol: float = 1e-10, max_iter: int = 500, b0: NDArray | None = None
) -> MedianResult:
    """Huber-smoothed geometric median b* = argmin_b (1/N) Σ_i h_λ(‖x_i − b‖) (spec §4.3).

    X has shape (D, N), points as columns. Stops when ‖∇H(b)‖ ≤ 2λ·tol.
    """
    start = time.perf_counter()
    X = _validate(X)
    if not np.isfinite(lam) or lam <= 0:
        raise ValueError(f"lam must be positive and finite, got {lam}")
    D = X.shape[0]
    if D == 1:
        b = np.array([_huber_median_1d(X[0], lam)])
        iterations, converged = 0, True
    else:
        b = np.mean(X, axis=1) if b0 is None else np.asarray(b0, dtype=np.float64).copy()

        def stationarity(bb: NDArray) -> tuple[NDArray, float]:
            g = huber_objective_gradient(bb, X, lam)
            return g, float(np.linalg.norm(g))

        hess = (lambda bb: _huber_hessian(X, bb, lam)) if D <= _MAX_DENSE_HESSIAN_DIM else None
        b, iterations, _, converged = _newton_mm(
            X, b, lambda bb: huber_objective(bb, X, lam), stationarity, hess,
            lambda bb: _huber_mm_step(X, bb, lam), 2.0 * lam * tol, max_iter,
        )
    g = huber_objective_gradient(b, X, lam)
    gnorm = float(np.linalg.norm(g))
    converged = converged or gnorm <= 2.0 * lam * tol
    radius = float(np.max(np.linalg.norm(X - b[:, None], axis=0)))
    return MedianResult(
        b=b, objective=huber_objective(b, X, lam), iterations=iterations, gradient_norm=gnorm,
        suboptimality_bound=gnorm * radius, converged=converged, seconds=time.perf_counter() - start,
    )


def _gm_subgradient(X: NDArray, b: NDArray) -> tuple[NDArray, float]:
    """Minimum-norm subgradient of (1/N)Σ‖x_i − b‖ at b and its norm.

    With m points equal to b, g = −(1/N) Σ_{x_i≠b} u_i is shrunk by m/N (the unit ball of the
    coincident terms), so b is optimal iff ‖Σ_{x_i≠b} u_i‖ ≤ m.
    """
    diff = X - b[:, None]
    rho = np.linalg.norm(diff, axis=0)
    away = rho > 0
    N = X.shape[1]
    g = -(diff[:, away] / rho[away]).sum(axis=1) / N
    m = np.count_nonzero(~away)
    norm = float(np.linalg.norm(g))
    shrunk = max(0.0, norm - m / N)
    return (g * (shrunk / norm) if norm > 0 else g), shrunk


def _gm_hessian(X: NDArray, b: NDArray) -> NDArray[np.float64]:
    """(1/N) Σ_{x_i≠b} (1/ρ_i)(I − u_i u_iᵀ)."""
    diff = X - b[:, None]
    rho = np.linalg.norm(diff, axis=0)
    away = rho > 0
    w = 1.0 / rho[away]
    U = diff[:, away] / rho[away]
    return (w.sum() * np.eye(X.shape[0]) - (U * w) @ U.T) / X.shape[1]


def _weiszfeld_vardi_zhang_step(X: NDArray, b: NDArray) -> NDArray[np.float64]:
    """Weiszfeld's step with the Vardi–Zhang correction when b coincides with data points."""
    diff = X - b[:, None]
    rho = np.linalg.norm(diff, axis=0)
    away = rho > 0
    w = 1.0 / rho[away]
    T = (X[:, away] @ w) / w.sum()
    m = np.count_nonzero(~away)
    if m == 0:
        return T
    r = float(np.linalg.norm((diff[:, away] * w).sum(axis=1)))
    if r == 0:
        return b
    mix = min(1.0, m / r)
    return (1.0 - mix) * T + mix * b


def geometric_median(X: NDArray, *, tol: float = 1e-10, max_iter: int = 1000, b0: NDArray | None = None) -> MedianResult:
    """Geometric median argmin_b (1/N) Σ_i ‖x_i − b‖ of the columns of X (spec §4.3).

    Stops when the minimum-norm subgradient has norm ≤ tol. In 1-D returns the sample median.
    """
    start = time.perf_counter()
    X = _validate(X)
    D = X.shape[0]
    if D == 1:
        b = np.array([float(np.median(X[0]))])
        iterations, converged = 0, True
    else:
        b = np.mean(X, axis=1) if b0 is None else np.asarray(b0, dtype=np.float64).copy()
        hess = (lambda bb: _gm_hessian(X, bb)) if D <= _MAX_DENSE_HESSIAN_DIM else None
        b, iterations, _, converged = _newton_mm(
            X, b, lambda bb: geometric_median_objective(bb, X), lambda bb: _gm_subgradient(X, bb),
            hess, lambda bb: _weiszfeld_vardi_zhang_step(X, bb), tol, max_iter,
        )
    _, gnorm = _gm_subgradient(X, b)
    converged = converged or gnorm <= tol
    radius = float(np.max(np.linalg.norm(X - b[:, None], axis=0)))
    return MedianResult(
        b=b, objective=geometric_median_objective(b, X), iterations=iterations, gradient_norm=gnorm,
        suboptimality_bound=gnorm * radius, converged=converged, seconds=time.perf_counter() - start,
    )
