"""Best-new-atom search of docs/theory.md §3 S6 (diagnostic ``best_new_atom_gain``, §6).

Adding a unit atom u with its optimal codes (uᵀr_i − λ)₊, everything else fixed, lowers the sum
loss by gain(u) = Σ_i (uᵀr_i − λ)₊² (gain lemma). gain is convex in u, so its maximum over the unit
ball lies on the sphere and is hard in general; the search below returns a **lower bound**.

Decision (spec §3 S6):
1. Starts: the antipodes −ŵ_d of the non-zero atoms (when W is given), the normalised residuals
   r_i/‖r_i‖ of the ``n_residual_starts`` points with the largest ‖r_i‖, and ± the top
   ``n_eigen`` eigenvectors of RRᵀ.
2. Each start is improved by up to ``n_steps`` fixed-point steps u ← normalise(Σ_i (uᵀr_i − λ)₊ r_i).
   The step maximises the linearisation ∇gain(u)ᵀv over the unit sphere; because gain is convex,
   gain(u_new) ≥ gain(u) + ∇gain(u)ᵀ(u_new − u) ≥ gain(u), so the gain never decreases. A fixed
   point satisfies S1 for the new atom with codes (uᵀr_i − λ)₊.
3. The best gain over all starts and iterates is reported, as a sum and divided by N.

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


def _gain_sum(u: NDArray, R: NDArray, lam: float) -> float:
    return float(np.sum(new_atom_codes(u, R, lam) ** 2))


def refine_atom(u: ArrayLike, R: NDArray, lam: float, n_steps: int = 25, tol: float = 1e-12) -> tuple[NDArray[np.float64], float]:
    """Fixed-point ascent u ← normalise(Σ_i (uᵀr_i − λ)₊ r_i) from a unit u (spec §3 S6).

    Returns the best iterate and its gain (sum). Stops early when no point lies beyond λ along u
    (gain 0, the step is undefined) or when the step moves u by less than ``tol``.
    """
    R = np.asarray(R, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    u = u / np.linalg.norm(u)
    best_u, best = u, _gain_sum(u, R, lam)
    for _ in range(n_steps):
        t = new_atom_codes(u, R, lam)
        v = R @ t
        nv = np.linalg.norm(v)
        if nv == 0.0:
            break
        u_new = v / nv
        g = _gain_sum(u_new, R, lam)
        if g > best:
            best_u, best = u_new, g
        if np.linalg.norm(u_new - u) <= tol:
            break
        u = u_new
    return best_u, best


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


def best_new_atom(
    R: NDArray,
    lam: float,
    W: NDArray | None = None,
    *,
    n_residual_starts: int = 8,
    n_eigen: int = 3,
    n_steps: int = 25,
) -> NewAtomSearchResult:
    """Search for the new unit atom with the largest gain (a lower bound on the maximum; spec §3 S6).

    R (D, N) residuals, λ of objective (1), W (D, d_z) the current unit atoms (optional; their
    antipodes are starts, zero columns are skipped). With max_i ‖r_i‖ > λ the residual starts alone
    guarantee gain ≥ (max_i ‖r_i‖ − λ)², so ``gain_mean > 0`` exactly when the §2.3 certificate fails
    (and 0 when it holds).
    """
    R = np.asarray(R, dtype=np.float64)
    D, N = R.shape
    starts: list[tuple[str, NDArray]] = []
    if W is not None:
        W = np.asarray(W, dtype=np.float64)
        norms = np.linalg.norm(W, axis=0)
        for d in np.flatnonzero(norms > 0):
            starts.append((f"antipode[{d}]", -W[:, d] / norms[d]))
    rnorm = np.linalg.norm(R, axis=0)
    order = np.argsort(-rnorm, kind="stable")[: max(n_residual_starts, 0)]
    for i in order:
        if rnorm[i] > 0:
            starts.append((f"residual[{i}]", R[:, i] / rnorm[i]))
    E = _top_eigenvectors(R, n_eigen)
    for k in range(E.shape[1]):
        starts.append((f"+eig[{k}]", E[:, k]))
        starts.append((f"-eig[{k}]", -E[:, k]))

    best_label, best_u, best = "none", np.zeros(D), 0.0
    record: list[tuple[str, float]] = []
    for label, u0 in starts:
        u, g = refine_atom(u0, R, lam, n_steps=n_steps)
        record.append((label, g / max(N, 1)))
        if g > best:
            best_label, best_u, best = label, u, g
    if best == 0.0 and starts:
        best_label, best_u = starts[0][0], starts[0][1] / np.linalg.norm(starts[0][1])
    return NewAtomSearchResult(
        u=best_u,
        gain_sum=best,
        gain_mean=best / max(N, 1),
        start=best_label,
        start_gains=tuple(record),
    )
