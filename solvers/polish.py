"""Polish a dictionary to the nearest stationary point of objective (1) (docs/theory.md §1, §3).

From unit atoms W₀ and a bias b₀ (an SAE's decoder and ``b_dec``), alternate exact minimisation over
the three blocks of objective (1), each step lowering it (block coordinate descent):

1. **codes**: the exact non-negative lasso codes for (W, b) (:func:`dictcheck.solvers.lasso_codes.exact_codes`);
2. **atoms**, one at a time (Gauss–Seidel): with the codes fixed, the unit atom that minimises
   Σ_i ‖e_i − w z_di‖² over ‖w‖ = 1, where e_i = r_i + w_d z_di is the residual without atom d, is
   w = normalise(Σ_i z_di e_i), the S1 fixed point (an atom with no active point keeps its direction);
3. **bias** (when learned): b = mean_i(x_i − W z_i), which makes Σ_i r_i = 0.

The objective never increases, and a fixed point of the three steps satisfies KKT-z (step 1), S1 (step
2) and Σ_i r_i = 0 (step 3): a stationary point. It stops when no atom moves by more than ``step_tol``
(and the bias by more than ``step_tol``·λ) in a sweep, or after ``max_iter`` sweeps, and reports the
objective after every sweep. (The objective alone is a poor stopping rule: near a stationary point its
decrease is quadratic in the distance, so it stalls at 1e-13 while S1 is still 1e-5.) Atoms that
lose all their points die (their codes stay 0); a dead atom can come back in step 1.

Given held-out points, it also reports objective (1) there at the exact codes of each sweep's (W, b) (warm
started from the previous sweep's): whether the descent on the polishing points generalises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba as nb
import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.solvers.stream_diagnostics import SparseCodes
from dictcheck.theory.objective import centred

__all__ = ["PolishResult", "Sweep", "exact_code_objective", "polish_dictionary"]


@dataclass(frozen=True)
class PolishResult:
    """The polished unit atoms (D, d_z), bias and codes, the objective (1) before (at the start's exact codes)
    and after, the objective after each sweep, and whether it stopped by ``step_tol`` (converged). With held-out
    points, ``held_out_before`` and ``held_out_history`` are objective (1) there at the start and after each
    sweep (None and () without)."""

    W: NDArray[np.float64]
    b: NDArray[np.float64]
    codes: SparseCodes
    objective_before: float
    objective_after: float
    history: tuple[float, ...]
    iterations: int
    converged: bool
    held_out_before: float | None = None
    held_out_history: tuple[float, ...] = ()


@dataclass(frozen=True)
class Sweep:
    """The end of one sweep: its number (1-based), objective (1) on the polishing points and on the held-out
    points (None without), the largest atom move, and the current atoms and bias (the arrays themselves, which
    the next sweep changes: copy what you keep)."""

    index: int
    objective: float
    objective_held_out: float | None
    max_atom_move: float
    W: NDArray[np.float64]
    b: NDArray[np.float64]


def _objective(R: NDArray, codes: SparseCodes, lam: float) -> float:
    return float((np.sum(R * R) + 2.0 * lam * codes.values.sum()) / R.shape[1])


def _codes_and_residuals(W: NDArray, b: NDArray, X: NDArray, lam: float, tol: float,
                         init: SparseCodes | None = None) -> tuple[SparseCodes, NDArray]:
    """Exact codes of (W, b) on X (warm-started from ``init``) and the residuals x_i − b − W z_i."""
    warm = None if init is None else init.to_matrix()
    codes = SparseCodes.from_matrix(exact_codes(W, X, b, lam, tol=tol, sparse_output=True, init=warm).Z)
    return codes, centred(X, b) - codes.decode(W)


def exact_code_objective(W: ArrayLike, b: ArrayLike, X: ArrayLike, lam: float, tol: float = 1e-10) -> float:
    """Objective (1), (1/N) Σ_i ‖x_i − b − W z_i‖² + 2λ Σ_i ‖z_i‖₁ / N, at the exact codes of the unit atoms W (D, d_z)
    and bias b on points X (D, N): the dictionary's objective with the encoder replaced by the optimal codes."""
    W = np.asarray(W, dtype=np.float64)
    codes, R = _codes_and_residuals(W, np.asarray(b, dtype=np.float64).reshape(-1), np.asarray(X, dtype=np.float64),
                                    lam, tol)
    return _objective(R, codes, lam)


@nb.njit(cache=True, nogil=True)
def _atom_sweep(W, R, bounds, points, values):
    """Step 2 of the module docstring for every atom in turn (Gauss–Seidel), in place: atom d (row d of W) with
    the entries bounds[d] … bounds[d + 1] − 1 of (points, values): e_i = r_i + w_d z_di, w_d ← Σ_i z_di e_i
    normalised (kept when that sum is 0), r_i ← e_i − w_d z_di; R holds the residuals as rows."""
    D = W.shape[1]
    v = np.empty(D)
    for d in range(W.shape[0]):
        lo, hi = bounds[d], bounds[d + 1]
        if lo == hi:
            continue
        w = W[d]
        zz = 0.0
        for t in range(lo, hi):
            zz += values[t] * values[t]
        for j in range(D):
            v[j] = w[j] * zz
        for t in range(lo, hi):
            z = values[t]
            r = R[points[t]]
            for j in range(D):
                v[j] += z * r[j]
        norm = 0.0
        for j in range(D):
            norm += v[j] * v[j]
        norm = np.sqrt(norm)
        if norm == 0.0:
            continue
        for j in range(D):
            v[j] /= norm
        for t in range(lo, hi):
            z = values[t]
            r = R[points[t]]
            for j in range(D):
                r[j] += z * (w[j] - v[j])
        for j in range(D):
            w[j] = v[j]


def polish_dictionary(W: ArrayLike, b: ArrayLike, X: ArrayLike, lam: float, *, learn_bias: bool = True,
                      max_iter: int = 2000, step_tol: float = 1e-10, tol: float = 1e-10,
                      on_sweep: Callable[[int, float, float], None] | None = None,
                      X_held_out: ArrayLike | None = None,
                      on_state: Callable[[Sweep], None] | None = None) -> PolishResult:
    """Block coordinate descent from (W, b) on points X (D, N) at λ (module docstring). W's columns are
    normalised first (zero columns are not allowed). ``tol`` is the KKT tolerance of the exact codes, which
    each sweep warm-starts from the previous sweep's codes. ``on_sweep(sweep, objective, max_atom_move)`` is
    called after every sweep (progress reporting); ``X_held_out`` (D, M) adds objective (1) on those points per
    sweep; ``on_state`` receives every sweep's :class:`Sweep` (with the current atoms and bias, e.g. to checkpoint a
    long polish)."""
    W = np.array(W, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    b = np.array(b, dtype=np.float64).reshape(-1)
    norms = np.linalg.norm(W, axis=0)
    if np.any(norms == 0):
        raise ValueError(f"atoms {np.flatnonzero(norms == 0).tolist()} are zero and cannot be polished")
    W /= norms

    codes, R = _codes_and_residuals(W, b, X, lam, tol)
    before = _objective(R, codes, lam)
    held = None if X_held_out is None else np.asarray(X_held_out, dtype=np.float64)
    held_codes, held_before, held_history = None, None, []
    if held is not None:
        held_codes, R_held = _codes_and_residuals(W, b, held, lam, tol)
        held_before = _objective(R_held, held_codes, lam)
    history: list[float] = []
    converged = False
    it = 0
    for it in range(1, max_iter + 1):
        W_prev, b_prev = W.copy(), b.copy()
        order = np.lexsort((codes.points, codes.atoms))
        bounds = np.searchsorted(codes.atoms[order], np.arange(W.shape[1] + 1))
        Rt = np.ascontiguousarray(R.T)
        Wt = np.ascontiguousarray(W.T)
        _atom_sweep(Wt, Rt, bounds, codes.points[order], codes.values[order])
        np.copyto(W, Wt.T)
        np.copyto(R, Rt.T)
        if learn_bias:
            shift = R.mean(axis=1)
            b = b + shift
            R -= shift[:, None]
        codes, R = _codes_and_residuals(W, b, X, lam, tol, codes)
        history.append(_objective(R, codes, lam))
        if held is not None:
            held_codes, R_held = _codes_and_residuals(W, b, held, lam, tol, held_codes)
            held_history.append(_objective(R_held, held_codes, lam))
        moved = float(np.max(np.linalg.norm(W - W_prev, axis=0), initial=0.0))
        if on_sweep is not None:
            on_sweep(it, history[-1], moved)
        if on_state is not None:
            on_state(Sweep(it, history[-1], held_history[-1] if held is not None else None, moved, W, b))
        if moved <= step_tol and float(np.linalg.norm(b - b_prev)) <= step_tol * lam:
            converged = True
            break
    return PolishResult(W=W, b=b, codes=codes, objective_before=before,
                        objective_after=history[-1] if history else before, history=tuple(history),
                        iterations=it, converged=converged, held_out_before=held_before,
                        held_out_history=tuple(held_history))
