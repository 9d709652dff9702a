"""Best-new-atom search of docs/theory.md §3 S6 (diagnostic ``best_new_atom_gain``, §6).

Adding a unit atom u with its optimal codes (uᵀr_i − λ)₊, everything else fixed, lowers the sum
loss by gain(u) = Σ_i (uᵀr_i − λ)₊² (gain lemma). gain is convex in u, so its maximum over the unit
ball lies on the sphere and is hard in general; the search below returns a **lower bound**.

Decision (spec §3 S6):
1. Starts: the antipodes −ŵ_d of the non-zero atoms (when W is given), the normalised residuals
   r_i/‖r_i‖ of the ``n_residual_starts`` points with the largest ‖r_i‖, and ± the top
   ``n_eigen`` eigenvectors of RRᵀ.
2. The ``n_refine`` starts with the largest gain (all of them when there are fewer; ties by the order
   above) are improved by up to ``n_steps`` fixed-point steps u ← normalise(Σ_i (uᵀr_i − λ)₊ r_i).
   The step maximises the linearisation ∇gain(u)ᵀv over the unit sphere; because gain is convex,
   gain(u_new) ≥ gain(u) + ∇gain(u)ᵀ(u_new − u) ≥ gain(u), so the gain never decreases. A fixed
   point satisfies S1 for the new atom with codes (uᵀr_i − λ)₊.
3. The best gain over all starts and iterates is reported, as a sum and divided by N.

The starts and their refinement can use a sample of the points (:func:`search_starts`); the gain of the
refined atoms over all points is then a sum the caller streams (check-sae does), still a lower bound.

Deterministic: no random numbers; ties in the residual-norm ranking are broken by index (stable
sort), and eigenvectors are used with both signs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.diagnostics import new_atom_codes


@dataclass(frozen=True, eq=False)
class NewAtomSearchResult:
    """Best atom found: u (D,), gain_sum = gain(u), gain_mean = gain(u)/N (``best_new_atom_gain``).

    ``start`` names the start that led to it (``antipode[d]``, ``residual[i]``, ``+eig[k]``,
    ``-eig[k]``); ``start_gains`` lists (start, gain_mean after refinement) for every start.
    """

    u: NDArray[np.float64]
    gain_sum: float
    gain_mean: float
    start: str
    start_gains: tuple[tuple[str, float], ...]


def _gains_and_steps(U: NDArray, R: NDArray, lam: float, chunk: int) -> tuple[NDArray, NDArray]:
    """gain(u) = Σ_i (uᵀr_i − λ)₊² and the ascent direction Σ_i (uᵀr_i − λ)₊ r_i for every column u of U,
    over the points in chunks of ``chunk`` (memory S·chunk)."""
    gains = np.zeros(U.shape[1])
    V = np.zeros_like(U)
    for lo in range(0, R.shape[1], chunk):
        Rc = R[:, lo:lo + chunk]
        T = np.maximum(U.T @ Rc - lam, 0.0)
        gains += np.sum(T * T, axis=1)
        V += Rc @ T.T
    return gains, V


def refine_atoms(U0: ArrayLike, R: NDArray, lam: float, n_steps: int = 25, tol: float = 1e-12,
                 chunk: int = 65536) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Fixed-point ascent u ← normalise(Σ_i (uᵀr_i − λ)₊ r_i) from every unit column of U0, all at once
    (docs/theory.md §3 S6). Returns the best iterate of each start (D, S) and its gain (sum).

    A start stops when no point lies beyond λ along it (gain 0, the step is undefined) or when a step
    moves it by less than ``tol``; the gain never decreases along the ascent (module docstring)."""
    R = np.asarray(R, dtype=np.float64)
    U = np.asarray(U0, dtype=np.float64).copy()
    U /= np.linalg.norm(U, axis=0)
    best_U, best = U.copy(), np.zeros(U.shape[1])
    running = np.ones(U.shape[1], dtype=bool)
    for step in range(n_steps + 1):
        idx = np.flatnonzero(running)
        if idx.size == 0:
            break
        g, V = _gains_and_steps(U[:, idx], R, lam, chunk)
        better = g > best[idx] if step else np.ones(idx.size, dtype=bool)
        best[idx[better]] = g[better]
        best_U[:, idx[better]] = U[:, idx[better]]
        if step == n_steps:
            break
        nv = np.linalg.norm(V, axis=0)
        moving = nv > 0
        U_new = V[:, moving] / nv[moving]
        moved = np.linalg.norm(U_new - U[:, idx[moving]], axis=0)
        U[:, idx[moving]] = U_new
        running[idx[~moving]] = False
        running[idx[moving][moved <= tol]] = False
    return best_U, best


def refine_atom(u: ArrayLike, R: NDArray, lam: float, n_steps: int = 25, tol: float = 1e-12) -> tuple[NDArray[np.float64], float]:
    """:func:`refine_atoms` for one start u: the best iterate and its gain (sum)."""
    U, g = refine_atoms(np.asarray(u, dtype=np.float64).reshape(-1, 1), R, lam, n_steps=n_steps, tol=tol)
    return U[:, 0], float(g[0])


def _top_eigenvectors(R: NDArray, k: int) -> NDArray[np.float64]:
    """Top-k eigenvectors of RRᵀ as columns (D, k'), k' ≤ k, dropping zero eigenvalues."""
    D, N = R.shape
    if k <= 0 or R.size == 0:
        return np.zeros((D, 0))
    if D <= N:
        vals, vecs = np.linalg.eigh(R @ R.T)
    else:  # RRᵀ and RᵀR share the non-zero spectrum: map eigenvectors v of RᵀR to Rv/‖Rv‖
        vals, v = np.linalg.eigh(R.T @ R)
        vecs = R @ v
        norms = np.linalg.norm(vecs, axis=0)
        vecs = vecs / np.where(norms > 0, norms, 1.0)
    order = np.argsort(vals)[::-1][:k]
    keep = vals[order] > 0
    return vecs[:, order[keep]]


def search_starts(
    R: NDArray,
    lam: float,
    W: NDArray | None = None,
    *,
    antipodes: tuple[NDArray, NDArray, NDArray] | None = None,
    n_residual_starts: int = 8,
    n_eigen: int = 3,
    n_steps: int = 25,
    n_refine: int = 32,
) -> tuple[list[str], NDArray[np.float64], NDArray[np.float64]]:
    """The starts of the module docstring on residuals R (D, N), the ``n_refine`` best of them refined:
    (labels, unit atoms (D, S) after refinement where refined, their gains on R (sums)).

    The antipode starts come from W (D, d_z) (all atoms, their gains on R computed here), or, for a wide
    dictionary, from ``antipodes`` = (atom indices, unit atoms (D, k), their gains on R, computed by the
    caller): give at least the n_refine + (the caller's number of kept candidates) atoms of largest gain, which
    leaves the refined starts and every start the caller keeps as if all d_z antipodes had been given."""
    R = np.asarray(R, dtype=np.float64)
    D = R.shape[0]
    starts: list[tuple[str, NDArray]] = []
    known: list[float] = []
    if W is not None:
        W = np.asarray(W, dtype=np.float64)
        norms = np.linalg.norm(W, axis=0)
        for d in np.flatnonzero(norms > 0):
            starts.append((f"antipode[{d}]", -W[:, d] / norms[d]))
    elif antipodes is not None:
        idx, A, g = antipodes
        for t, d in enumerate(idx):
            starts.append((f"antipode[{int(d)}]", -A[:, t]))
        known = [float(v) for v in g]
    n_known = len(known)
    rnorm = np.linalg.norm(R, axis=0)
    order = np.argsort(-rnorm, kind="stable")[: max(n_residual_starts, 0)]
    for i in order:
        if rnorm[i] > 0:
            starts.append((f"residual[{i}]", R[:, i] / rnorm[i]))
    E = _top_eigenvectors(R, n_eigen)
    for k in range(E.shape[1]):
        starts.append((f"+eig[{k}]", E[:, k]))
        starts.append((f"-eig[{k}]", -E[:, k]))
    if not starts:
        return [], np.zeros((D, 0)), np.zeros(0)
    U = np.stack([u0 for _, u0 in starts], axis=1)
    gains = np.empty(U.shape[1])
    gains[:n_known] = known
    gains[n_known:], _ = _gains_and_steps(U[:, n_known:], R, lam, max(1, 2**24 // max(U.shape[1], 1)))
    chosen = np.argsort(-gains, kind="stable")[: max(n_refine, 1)]
    U[:, chosen], gains[chosen] = refine_atoms(U[:, chosen], R, lam, n_steps=n_steps)
    return [label for label, _ in starts], U, gains


def best_new_atom(
    R: NDArray,
    lam: float,
    W: NDArray | None = None,
    *,
    n_residual_starts: int = 8,
    n_eigen: int = 3,
    n_steps: int = 25,
    n_refine: int = 32,
) -> NewAtomSearchResult:
    """Search for the new unit atom with the largest gain (a lower bound on the maximum; spec §3 S6).

    R (D, N) residuals, λ of objective (1), W (D, d_z) the current unit atoms (optional; their
    antipodes are starts, zero columns are skipped). With max_i ‖r_i‖ > λ the residual starts alone
    guarantee gain ≥ (max_i ‖r_i‖ − λ)², so ``gain_mean > 0`` exactly when the §2.3 certificate fails
    (and 0 when it holds).
    """
    labels, U, gains = search_starts(R, lam, W, n_residual_starts=n_residual_starts, n_eigen=n_eigen,
                                     n_steps=n_steps, n_refine=n_refine)
    return best_of_candidates(labels, U, gains, np.shape(R)[1])


def best_of_candidates(labels: list[str], U: NDArray, gains_sum: NDArray, n_points: int) -> NewAtomSearchResult:
    """The result for candidate atoms U (D, S) with gains (sums over ``n_points`` points)."""
    D = U.shape[0]
    record = tuple((label, float(g) / max(n_points, 1)) for label, g in zip(labels, gains_sum))
    if not labels:
        return NewAtomSearchResult(u=np.zeros(D), gain_sum=0.0, gain_mean=0.0, start="none", start_gains=())
    k = int(np.argmax(gains_sum))
    if gains_sum[k] > 0:
        return NewAtomSearchResult(u=U[:, k], gain_sum=float(gains_sum[k]), gain_mean=float(gains_sum[k]) / max(n_points, 1),
                                   start=labels[k], start_gains=record)
    return NewAtomSearchResult(u=U[:, 0] / np.linalg.norm(U[:, 0]), gain_sum=0.0, gain_mean=0.0, start=labels[0],
                               start_gains=record)
