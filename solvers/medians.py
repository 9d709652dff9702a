"""Huber-smoothed and plain geometric medians (docs/theory.md §4.3).

* ``huber_median``: b* = argmin_b H(b), H(b) = (1/N) Σ_i h_λ(‖x_i − b‖), the optimal wide-limit
  bias. H is convex and C¹, so ‖∇H‖ is a proper stopping test.
* ``geometric_median``: argmin_b (1/N) Σ_i ‖x_i − b‖ (not differentiable at data points).

Method (Decision; spec §4.3 allows "or better"). The engine is the majorise–minimise step of the
spec: b ← Σ_i ω_i x_i / Σ_i ω_i with ω_i = min(1, λ/ρ_i) for Huber (bounded weights, no division
by zero) and Weiszfeld's ω_i = 1/ρ_i with the Vardi–Zhang correction at data points for the
geometric median. Every MM step decreases the objective, costs one pass over X, and needs no line
search. When MM slows down (the stationarity measure falls by less than half over an MM step), a
Newton step on the exact (generalised) Hessian is tried instead (D ≤ 512; a D×D solve), accepted
if it halves the stationarity measure or decreases the objective by more than rounding; otherwise
the MM step is taken. For the geometric median, the nearest data point is tested for optimality
(‖Σ_{x_i≠x_k} u_i‖ ≤ multiplicity of x_k) and returned exactly when it is the median, which
Weiszfeld only approaches sublinearly. In one dimension both are solved exactly (the root of a
piecewise-linear ψ; the sample median).

Stopping tolerance (stated): Huber stops when ‖∇H(b)‖ ≤ 2λ·tol (2λ is the largest gradient a
single point contributes); the geometric median stops when the minimum-norm subgradient has norm
≤ tol (each point contributes a unit vector). Default tol = 1e-10. Every result carries the
rigorous bound ``suboptimality_bound`` = ‖g‖·max_i‖x_i − b‖ ≥ f(b) − min f (f convex, its
minimiser in the convex hull of the data).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from dictcheck.theory.huber import huber_objective_hessian
from dictcheck.theory.scaling import canonical_scale
from dictcheck.theory.objective import check_lam


_MAX_NEWTON_DIM = 512
_STALL = 25
_EPS = np.finfo(float).eps


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

    def scaled(self, s: float, degree: int) -> MedianResult:
        """The result for the data times s (docs/theory.md §1.1): b·s, the objective (of degree ``degree``: 2 for
        Huber, 1 for the geometric median) and the suboptimality bound times s^degree, the gradient norm times
        s^(degree − 1)."""
        return replace(self, b=self.b * s, objective=self.objective * s**degree,
                       gradient_norm=self.gradient_norm * s ** (degree - 1),
                       suboptimality_bound=self.suboptimality_bound * s**degree)


@dataclass(frozen=True)
class _Local:
    """Quantities at one iterate, computed in one pass over X."""

    b: NDArray[np.float64]
    diff: NDArray[np.float64]
    rho: NDArray[np.float64]
    value: float
    grad: NDArray[np.float64]
    measure: float
    pull: NDArray[np.float64]  # Σ_i ω_i (x_i − b): the MM step is b + pull / Σ_i ω_i
    weight_sum: float


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

    lo, hi = 0, knots.size - 1  # ψ(knots[0]) ≥ 0 ≥ ψ(knots[-1])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if psi(knots[mid]) > 0:
            lo = mid
        else:
            hi = mid
    a, c = knots[lo], knots[hi]
    fa, fc = psi(a), psi(c)
    return float(a) if fa == fc else float(a + (c - a) * fa / (fa - fc))


def _huber_local(X: NDArray, b: NDArray, lam: float) -> _Local:
    diff = X - b[:, None]
    rho = np.sqrt(np.einsum("ij,ij->j", diff, diff))
    w = np.minimum(1.0, lam / np.maximum(rho, np.finfo(float).tiny))
    pull = diff @ w
    grad = -2.0 * pull / X.shape[1]
    value = float(np.mean(np.where(rho <= lam, rho**2, 2.0 * lam * rho - lam**2)))
    return _Local(b, diff, rho, value, grad, float(np.linalg.norm(grad)), pull, float(w.sum()))


def _mm_step(loc: _Local) -> NDArray[np.float64]:
    """b ← Σ ω_i x_i / Σ ω_i = b + Σ ω_i (x_i − b) / Σ ω_i (spec §4.3; Weiszfeld for ω_i = 1/ρ_i)."""
    return loc.b + loc.pull / loc.weight_sum


def _coincident(rho: NDArray, scale: float) -> NDArray[np.bool_]:
    """Points that coincide with b up to rounding (distance ≤ 64 ε · scale)."""
    return rho <= 64.0 * _EPS * scale


def _gm_local(X: NDArray, b: NDArray, scale: float) -> _Local:
    """Objective and minimum-norm subgradient of (1/N)Σ‖x_i − b‖.

    With m points at b, the subgradient set is g + (m/N)·unit ball, g = −(1/N)Σ_{x_i≠b} u_i, so its
    minimum-norm element has norm max(0, ‖g‖ − m/N); b is optimal iff ‖Σ_{x_i≠b} u_i‖ ≤ m.
    """
    diff = X - b[:, None]
    rho = np.sqrt(np.einsum("ij,ij->j", diff, diff))
    away = ~_coincident(rho, scale)
    w = np.divide(1.0, rho, out=np.zeros_like(rho), where=away)
    N = X.shape[1]
    pull = diff @ w
    norm = float(np.linalg.norm(pull)) / N
    shrunk = max(0.0, norm - np.count_nonzero(~away) / N)
    grad = -pull / N * (shrunk / norm if norm > 0 else 1.0)
    return _Local(b, diff, rho, float(np.mean(rho)), grad, shrunk, pull, float(w.sum()))


def _gm_mm(loc: _Local, scale: float) -> NDArray[np.float64]:
    """Weiszfeld's step with the Vardi–Zhang correction when b coincides with m data points:
    b ← (1 − min(1, m/r)) T + min(1, m/r) b, T the Weiszfeld step over the other points, r = ‖pull‖."""
    T = _mm_step(loc)
    m = np.count_nonzero(_coincident(loc.rho, scale))
    if m == 0:
        return T
    r = float(np.linalg.norm(loc.pull))
    if r == 0:
        return loc.b
    mix = min(1.0, m / r)
    return (1.0 - mix) * T + mix * loc.b


def _gm_hessian(loc: _Local, scale: float) -> NDArray[np.float64]:
    """(1/N) Σ_{x_i≠b} (1/ρ_i)(I − u_i u_iᵀ)."""
    away = ~_coincident(loc.rho, scale)
    D, N = loc.diff.shape
    U = loc.diff[:, away]
    return (np.sum(1.0 / loc.rho[away]) * np.eye(D) - (U * (1.0 / loc.rho[away] ** 3)) @ U.T) / N


def _minimise(
    loc: _Local,
    local: Callable[[NDArray], _Local],
    mm_step: Callable[[_Local], NDArray],
    hessian: Callable[[_Local], NDArray] | None,
    stop: float,
    max_iter: int,
    shortcut: Callable[[_Local], _Local | None] | None = None,
) -> tuple[_Local, int]:
    """MM iteration with Newton acceleration; returns the best iterate and the iteration count.

    Stops early when the stationarity measure has not improved for ``_STALL`` iterations (it has
    reached the rounding floor of the gradient; the result then reports converged=False).
    """
    previous, best, since_best = np.inf, loc, 0
    for it in range(max_iter):
        if loc.measure < best.measure:
            best, since_best = loc, 0
        else:
            since_best += 1
        if loc.measure <= stop:
            return loc, it
        if since_best >= _STALL:
            return best, it
        if shortcut is not None and (found := shortcut(loc)) is not None:
            return found, it + 1
        slow = loc.measure > 0.5 * previous
        previous = loc.measure
        if slow and hessian is not None:
            H = hessian(loc)
            try:
                direction = -np.linalg.solve(H + 1e-14 * np.trace(H) / H.shape[0] * np.eye(H.shape[0]), loc.grad)
            except np.linalg.LinAlgError:
                direction = None
            if direction is not None and np.all(np.isfinite(direction)):
                trial = local(loc.b + direction)
                slack = 16.0 * _EPS * max(abs(loc.value), 1.0)
                if trial.measure <= 0.5 * loc.measure or trial.value < loc.value - slack:
                    loc = trial
                    continue
        loc = local(mm_step(loc))
    return (loc if loc.measure < best.measure else best), max_iter


def _result(loc: _Local, iterations: int, stop: float, start: float) -> MedianResult:
    radius = float(np.max(loc.rho)) if loc.rho.size else 0.0
    return MedianResult(
        b=loc.b, objective=float(loc.value), iterations=iterations, gradient_norm=float(loc.measure),
        suboptimality_bound=float(loc.measure * radius), converged=bool(loc.measure <= stop),
        seconds=time.perf_counter() - start,
    )


def huber_median(
    X: NDArray, lam: float, *, tol: float = 1e-10, max_iter: int = 1000, b0: NDArray | None = None
) -> MedianResult:
    """Huber-smoothed geometric median b* = argmin_b (1/N) Σ_i h_λ(‖x_i − b‖) (spec §4.3).

    X has shape (D, N), points as columns. Stops when ‖∇H(b)‖ ≤ 2λ·tol. Computed at the canonical scale
    σ = :func:`dictcheck.theory.scaling.canonical_scale` (λ) (X, b₀ and λ divided by σ, the result scaled back).
    """
    start = time.perf_counter()
    X = _validate(X)
    lam = check_lam(lam)
    sigma = canonical_scale(lam)
    return _huber_median(X / sigma, lam / sigma, tol, max_iter, None if b0 is None else np.asarray(b0) / sigma,
                         start).scaled(sigma, 2)


def _huber_median(X: NDArray, lam: float, tol: float, max_iter: int, b0: NDArray | None, start: float) -> MedianResult:
    """:func:`huber_median` at the canonical scale."""
    stop = 2.0 * lam * tol
    if X.shape[0] == 1:
        b = np.array([_huber_median_1d(X[0], lam)])
        return _result(_huber_local(X, b, lam), 0, np.inf, start)  # exact
    b = np.mean(X, axis=1) if b0 is None else np.asarray(b0, dtype=np.float64).copy()
    hessian = (lambda loc: huber_objective_hessian(loc.b, X, lam)) if X.shape[0] <= _MAX_NEWTON_DIM else None
    loc, iterations = _minimise(_huber_local(X, b, lam), lambda bb: _huber_local(X, bb, lam),
                                _mm_step, hessian, stop, max_iter)
    return _result(loc, iterations, stop, start)


def geometric_median(X: NDArray, *, tol: float = 1e-10, max_iter: int = 1000, b0: NDArray | None = None) -> MedianResult:
    """Geometric median argmin_b (1/N) Σ_i ‖x_i − b‖ of the columns of X (spec §4.3).

    Stops when the minimum-norm subgradient has norm ≤ tol. In 1-D returns the sample median. Computed at the
    canonical scale σ = :func:`dictcheck.theory.scaling.canonical_scale` (max |x|) (X and b₀ divided by σ, the
    result scaled back).
    """
    start = time.perf_counter()
    X = _validate(X)
    biggest = float(np.max(np.abs(X)))
    sigma = canonical_scale(biggest) if biggest > 0 else 1.0
    return _geometric_median(X / sigma, tol, max_iter, None if b0 is None else np.asarray(b0) / sigma,
                             start).scaled(sigma, 1)


def _geometric_median(X: NDArray, tol: float, max_iter: int, b0: NDArray | None, start: float) -> MedianResult:
    """:func:`geometric_median` at the canonical scale (max |x| within a factor √2 of 1)."""
    scale = max(float(np.max(np.abs(X))), 1.0)
    if X.shape[0] == 1:
        b = np.array([float(np.median(X[0]))])
        return _result(_gm_local(X, b, scale), 0, np.inf, start)  # exact
    b = np.mean(X, axis=1) if b0 is None else np.asarray(b0, dtype=np.float64).copy()

    def nearest_point_if_optimal(loc: _Local) -> _Local | None:
        k = int(np.argmin(loc.rho))
        if loc.rho[k] > 1e-3 * float(np.median(loc.rho)):
            return None
        at_point = _gm_local(X, X[:, k].copy(), scale)
        return at_point if at_point.measure <= tol else None

    hessian = (lambda loc: _gm_hessian(loc, scale)) if X.shape[0] <= _MAX_NEWTON_DIM else None
    loc, iterations = _minimise(_gm_local(X, b, scale), lambda bb: _gm_local(X, bb, scale),
                                lambda loc: _gm_mm(loc, scale), hessian, tol, max_iter, nearest_point_if_optimal)
    return _result(loc, iterations, tol, start)
