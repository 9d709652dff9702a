"""Distance from a vector to a convex hull, and the four hull candidates of docs/theory.md §8 Q1.

dist(c, conv{φ_i : i ∈ S}) = min_{π ≥ 0, 1ᵀπ = 1} ‖Φ_S π − c‖₂, a QP over the simplex. It is the
minimum-norm point of the polytope conv{φ_i − c}, which Wolfe's algorithm (P. Wolfe, *Finding the
nearest point in a polytope*, Math. Programming 11, 1976) solves exactly in finitely many steps:
an active-set method that keeps an affinely independent corral of points and, at termination,
returns the exact affine minimiser on the optimal face (round-off aside). Each step costs one
matrix–vector product with Φ plus a small least-squares solve, so it is much faster than a generic
conic solver; the tests check it against cvxpy/Clarabel.

Certificate. With x the returned nearest point (relative to c) and the Wolfe gap
g = ‖x‖² − min_i (φ_i − c)ᵀx ≥ 0, every point y of the hull obeys yᵀx ≥ ‖x‖² − g, so
dist ≥ (‖x‖² − g)/‖x‖ (``lower_bound``) and ‖x − x*‖² ≤ 2g.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.linalg import cho_factor, cho_solve

from dictcheck.theory.diagnostics import (
    active_sets,
    clean_codes,
    correlations,
    cosine_matrix,
    residuals,
    unit_atom_norm_check,
)
from dictcheck.theory.objective import centred


@dataclass(frozen=True, eq=False)
class HullDistance:
    """Result of :func:`hull_distance`.

    distance: ‖Φπ − c‖ at the returned weights (the exact optimum up to round-off when converged).
    weights: π ∈ simplex, shape (k,). nearest: Φπ, shape (m,). gap: Wolfe's duality gap.
    lower_bound: certified lower bound on the distance (see module docstring).
    """

    distance: float
    weights: NDArray[np.float64]
    nearest: NDArray[np.float64]
    gap: float
    lower_bound: float
    iterations: int
    converged: bool


def _affine_minimiser(P: NDArray) -> NDArray[np.float64]:
    """argmin ‖P α‖ subject to 1ᵀα = 1 (α unsigned), by least squares in affine coordinates.

    With base p_0 and E = [p_i − p_0]_{i≥1}, α = (1 − 1ᵀβ, β) with β = argmin ‖p_0 + Eβ‖. Solved by
    the semi-normal equations (Cholesky of EᵀE, one step of refinement with E itself, which recovers
    QR-level accuracy for well-conditioned E) and, when EᵀE is ill-conditioned (Cholesky pivot
    ratio ≤ 1e-6, i.e. cond(E) ≳ 1e6), by SVD least squares.
    """
    k = P.shape[1]
    if k == 1:
        return np.ones(1)
    base = P[:, 0]
    E = P[:, 1:] - base[:, None]
    A = E.T @ E
    try:
        factor = cho_factor(A, check_finite=False)
        pivots = np.abs(np.diag(factor[0]))
        if not pivots.min() > 1e-6 * pivots.max():
            raise np.linalg.LinAlgError("ill-conditioned corral")
        beta = cho_solve(factor, -(E.T @ base), check_finite=False)
        beta += cho_solve(factor, E.T @ (-base - E @ beta), check_finite=False)
    except np.linalg.LinAlgError:
        beta, *_ = np.linalg.lstsq(E, -base, rcond=None)
    return np.concatenate(([1.0 - beta.sum()], beta))


def min_norm_point(
    P: NDArray, *, rtol: float = 1e-12, max_iter: int | None = None
) -> tuple[NDArray[np.float64], float, int, bool]:
    """Wolfe's algorithm: weights π of the minimum-norm point of conv{columns of P}.

    Returns (π, gap, iterations, converged). ``rtol`` stops when the gap is ≤ rtol·max_i ‖p_i‖².
    """
    P = np.asarray(P, dtype=np.float64)
    m, k = P.shape
    if k == 0:
        raise ValueError("empty point set: the convex hull is empty")
    sq = np.einsum("ij,ij->j", P, P)
    scale = max(float(sq.max()), np.finfo(float).tiny)
    max_iter = max_iter if max_iter is not None else 20 * (k + m) + 100
    S = [int(np.argmin(sq))]
    w = np.ones(1)
    zero_tol = 1e-14
    gap = np.inf
    converged = False
    it = 0
    while it < max_iter:
        it += 1
        x = P[:, S] @ w
        g = P.T @ x
        j = int(np.argmin(g))
        gap = float(x @ x - g[j])
        if gap <= rtol * scale:
            converged = True
            break
        if j in S:  # numerical stall: the best direction is already in the corral
            converged = gap <= 1e3 * rtol * scale
            break
        S.append(j)
        w = np.append(w, 0.0)
        stalled = False
        while True:  # minor cycle
            alpha = _affine_minimiser(P[:, S])
            if np.all(alpha > zero_tol):
                w = alpha
                break
            neg = alpha <= zero_tol
            denom = w[neg] - alpha[neg]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios = np.where(denom > 0, w[neg] / denom, np.inf)
            theta = float(min(1.0, ratios.min()))
            w = w + theta * (alpha - w)
            drop = np.zeros(len(S), dtype=bool)
            drop[np.flatnonzero(neg)[int(np.argmin(ratios))]] = True
            drop |= w <= zero_tol
            if drop[-1] and len(S) >= 1 and S[-1] == j and theta == 0.0:
                stalled = True  # the entering point would leave at once: round-off regime
            S = [s for s, dd in zip(S, drop) if not dd]
            w = w[~drop]
            if not S:  # cannot happen in exact arithmetic; restart from the entering point
                S, w = [j], np.ones(1)
                break
            w = np.maximum(w, 0.0)
            w = w / w.sum()
            if stalled:
                break
        if stalled:
            x = P[:, S] @ w
            g = P.T @ x
            gap = float(x @ x - g.min())
            converged = gap <= 1e3 * rtol * scale
            break
    weights = np.zeros(k)
    weights[S] = w
    return weights, gap, it, converged


def hull_distance(c: ArrayLike, Phi: NDArray, *, rtol: float = 1e-12, max_iter: int | None = None) -> HullDistance:
    """Euclidean distance from c (m,) to conv{columns of Phi (m, k)}: min_{π∈Δ} ‖Φπ − c‖ (spec §6, §8 Q1).

    Raises ValueError if Phi has no columns.
    """
    c = np.asarray(c, dtype=np.float64).reshape(-1)
    Phi = np.asarray(Phi, dtype=np.float64)
    if Phi.ndim != 2 or Phi.shape[0] != c.size:
        raise ValueError(f"Phi must be (m, k) with m = len(c) = {c.size}, got {Phi.shape}")
    if Phi.shape[1] == 0:
        raise ValueError("empty point set: the convex hull is empty")
    P = Phi - c[:, None]
    weights, gap, it, converged = min_norm_point(P, rtol=rtol, max_iter=max_iter)
    nearest = Phi @ weights
    x = nearest - c
    dist = float(np.linalg.norm(x))
    lower = max(0.0, (dist**2 - gap) / dist) if dist > 0 else 0.0
    return HullDistance(
        distance=dist,
        weights=weights,
        nearest=nearest,
        gap=gap,
        lower_bound=min(lower, dist),
        iterations=it,
        converged=converged,
    )


# --------------------------------------------------------------------------------------------------
# §8 open question 1: the four candidate hull statements
# --------------------------------------------------------------------------------------------------

HULL_CANDIDATES = ("H-act-res", "H-inact-res", "H-inact-data", "H-act-data")


@dataclass(frozen=True, eq=False)
class HullCandidateDistances:
    """Distance per atom per candidate of spec §8 Q1; NaN where the point set is empty.

    distances[name] has shape (d_z,). set_sizes[name] gives the number of points in each hull.
    """

    distances: dict[str, NDArray[np.float64]]
    set_sizes: dict[str, NDArray[np.int64]]
    tau_act: float

    def fraction_within(self, tol: float = 1e-6) -> dict[str, float]:
        """Per candidate, the fraction of atoms (with a non-empty set) whose distance is ≤ tol.

        NaN for a candidate that is undefined for every atom.
        """
        out: dict[str, float] = {}
        for name, dist in self.distances.items():
            ok = np.isfinite(dist)
            out[name] = float(np.mean(dist[ok] <= tol)) if ok.any() else float("nan")
        return out


def hull_candidate_distances(
    W: NDArray,
    Z: NDArray,
    b: ArrayLike,
    X: NDArray,
    lam: float,
    tau_act: float | None = None,
    *,
    rtol: float = 1e-12,
    atoms: ArrayLike | None = None,
) -> HullCandidateDistances:
    """Evaluate the four candidate forms of the paper's eq. 6 per atom (docs/theory.md §8 Q1).

    ``atoms`` limits the QPs to those atoms (the others get NaN): each is a QP over up to N points in
    d_z dimensions, so at real sizes the caller picks the atoms and a sample of the points.

    With φ_i = Ŵᵀr_i/λ, ψ_i = Ŵᵀx̃_i/ρ_i (normalised centred data) and c_d· = Ŵᵀŵ_d:

    * H-act-res:    dist(c_d·, conv{φ_i : i ∈ A_d}) over all d_z coordinates — proven by (5) (control).
    * H-inact-res:  dist((c_dj)_{j≠d}, conv{(φ_ij)_{j≠d} : i ∉ A_d}).
    * H-inact-data: dist((c_dj)_{j≠d}, conv{(ψ_ij)_{j≠d} : i ∉ A_d}).
    * H-act-data:   the same as H-inact-data with i ∈ A_d (Decision: coordinate d is excluded here
      too, the literal reading of "the same with i ∈ A_d"; with it, the form would fail trivially
      because ψ_id < 1 unless x̃_i is aligned with ŵ_d).

    Points with ρ_i = 0 have no normalised data point and are left out of the data forms. A
    candidate whose point set is empty for atom d gets NaN (dead atoms for the active forms, p_d = 1
    for the inactive forms). With d_z = 1 the coordinate-excluded forms are 0-dimensional: distance 0
    whenever the set is non-empty.
    """
    Z = clean_codes(Z)
    W = unit_atom_norm_check(W, Z)
    R = residuals(W, Z, b, X)
    active, tau = active_sets(Z, tau_act)
    Phi = correlations(W, R, lam)
    Xc = centred(X, b)
    rho = np.linalg.norm(Xc, axis=0)
    has_dir = rho > 0
    Psi = W.T @ (Xc / np.where(has_dir, rho, 1.0))
    C = cosine_matrix(W)
    d_z = W.shape[1]
    dist = {name: np.full(d_z, np.nan) for name in HULL_CANDIDATES}
    sizes = {name: np.zeros(d_z, dtype=np.int64) for name in HULL_CANDIDATES}

    def measure(name: str, d: int, target: NDArray, points: NDArray) -> None:
        sizes[name][d] = points.shape[1]
        if points.shape[1] == 0:
            return
        if target.size == 0:
            dist[name][d] = 0.0
            return
        dist[name][d] = hull_distance(target, points, rtol=rtol).distance

    for d in (range(d_z) if atoms is None else np.asarray(atoms, dtype=np.int64)):
        on = active[d]
        others = np.arange(d_z) != d
        measure("H-act-res", d, C[:, d], Phi[:, on])
        measure("H-inact-res", d, C[others, d], Phi[np.ix_(others, ~on)])
        measure("H-inact-data", d, C[others, d], Psi[np.ix_(others, ~on & has_dir)])
        measure("H-act-data", d, C[others, d], Psi[np.ix_(others, on & has_dir)])
    return HullCandidateDistances(distances=dist, set_sizes=sizes, tau_act=tau)
