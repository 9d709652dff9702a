"""The λ of objective (1) at which exact codes have a given sparsity (docs/theory.md §1, §7).

A TopK, BatchTopK or JumpReLU SAE is not trained on objective (1), so no λ comes with it. The λ that
makes the comparison fair is the one at which the exact codes of its decoder are as sparse as its own
codes: mean L0 of the exact codes = the SAE's mean L0 (Decision, ``--lam auto``). At λ ≥ λ_max =
max_{i,d} ŵ_dᵀx̃_i every code is 0, and the L0 of the exact codes grows as λ falls, while the solve gets
dearer (a dense code costs far more than a sparse one). So the search comes down from λ_max, halving λ
until the L0 reaches the target, and then bisects on log λ inside that bracket: it never solves at a λ much
denser than the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.solvers.atom_rows import AtomRows, exact_products, screen_pairs
from dictcheck.solvers.lasso_codes import CodeSolver
from dictcheck.solvers.reductions import LOCAL, Reduction

__all__ = ["LamForL0", "lam_for_l0"]


@dataclass(frozen=True)
class LamForL0:
    """The λ found, the mean L0 of the exact codes there, the target, and the bisection's record."""

    lam: float
    l0: float
    target: float
    iterations: int
    lam_max: float
    evaluations: tuple[tuple[float, float], ...]


def lam_for_l0(W: ArrayLike | AtomRows, X: ArrayLike, b: ArrayLike, target: float, *, rel: float = 1e-2,
               max_iter: int = 40, tol: float = 1e-8, solver: CodeSolver | None = None,
               reduce: Reduction = LOCAL) -> LamForL0:
    """λ at which the exact codes of unit atoms W ((D, d_z) columns, or :class:`AtomRows`) on X (D, N) with bias
    b have mean L0 closest to ``target`` (module docstring): halving from λ_max (at most 27 times, to
    λ_max·2⁻²⁷), then bisection on log λ until the bracket is within a factor 1 + ``rel`` or ``max_iter``
    steps. Returns the evaluated λ whose L0 is closest to the target (the larger λ on a tie). ``solver``: a
    :class:`CodeSolver` for W, to reuse its atoms and caches. With ``reduce`` over several processes, X holds
    this process's part of the sample, and λ_max and each evaluation's L0 are those of the whole sample (every
    process bisects identically). ValueError for a target outside [0, d_z]."""
    solver = solver or (CodeSolver(atoms=W) if isinstance(W, AtomRows) else CodeSolver(W))
    atoms = solver.atoms
    X = np.asarray(X, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if not 0.0 <= target <= atoms.n_atoms:
        raise ValueError(f"target L0 must be in [0, d_z = {atoms.n_atoms}], got {target!r}")
    lam_max = max(0.0, float(reduce.max(np.array([largest_correlation(atoms, np.ascontiguousarray((X - b[:, None]).T))]))[0]))
    n_sample = float(reduce.sum(np.array([X.shape[1]], dtype=np.float64))[0])
    if lam_max <= 0.0:
        return LamForL0(lam=1.0, l0=0.0, target=float(target), iterations=0, lam_max=lam_max, evaluations=())
    record: list[tuple[float, float]] = []
    last: list[object] = [None]  # the previous solve's codes: the warm start of the next (time only)

    def l0_at(lam: float) -> float:
        codes = solver.codes(X, b, lam, tol=tol, sparse_output=True, init=last[0])
        last[0] = codes.Z
        record.append((lam, float(reduce.sum(np.array([codes.Z.nnz], dtype=np.float64))[0]) / n_sample))
        return record[-1][1]

    hi, lo = lam_max, lam_max / 2
    for _ in range(27):
        if l0_at(lo) >= target:
            break
        hi, lo = lo, lo / 2
    it = 0
    while it < max_iter and hi / lo > 1.0 + rel and record[-1][1] != target:
        mid = math.sqrt(lo * hi)
        if l0_at(mid) >= target:
            lo = mid
        else:
            hi = mid
        it += 1
    lam, l0 = min(record, key=lambda e: (abs(e[1] - target), -e[0]))
    return LamForL0(lam=lam, l0=l0, target=float(target), iterations=it, lam_max=lam_max, evaluations=tuple(record))


def largest_correlation(atoms: AtomRows, R: NDArray[np.float64]) -> float:
    """max_{i,j} w_jᵀr_i over the rows r_i of R and every atom (λ_max of the codes: every code is 0 for λ at or
    above it), exactly: the screened products keep each row's candidates for its maximum
    (:func:`~dictcheck.solvers.atom_rows.screen_pairs`) and those are re-evaluated in float64."""
    pairs = screen_pairs(atoms, R, top="max")
    h = exact_products(atoms, R, pairs.rows, pairs.atoms)
    return float(h.max(initial=-np.inf))
