"""Exact conic references for the two medians of docs/theory.md §4.3 (used by tests and benchmarks).

* ``huber_median_cvxpy``: b* = argmin_b H(b), H(b) = (1/N) Σ_i h_λ(‖x_i − b‖), the optimal
  wide-limit bias (spec §4.3; §4.2 (7) says why it is the optimal bias).
* ``geometric_median_cvxpy``: argmin_b (1/N) Σ_i ‖x_i − b‖ (spec §4.3, the seed's "b is the
  geometric median", exact only without crowding).

Both are second-order-cone programs written directly in cvxpy and solved by Clarabel (an
interior-point method) at tight tolerances. They share no code and no algorithm with the
specialised Newton/MM solvers of :mod:`solvers.medians`; they exist to check those (and to time
against them), not to be fast: at D = 64 a solve takes ~1 s at N = 10³ and about a minute at
N = 10⁴ on one core.

Huber formulations (both exact):

* ``"atom"``: (1/N) Σ_i cp.huber(‖x_i − b‖, λ). cvxpy's huber(x, M) is x² for |x| ≤ M and
  2M|x| − M² beyond, which is exactly h_λ (spec §0, §4.1: twice the textbook Huber loss) with M = λ.
* ``"epigraph"`` (default): h_λ(ρ) = min_s s² + 2λ(ρ − s)₊ for ρ ≥ 0 (s = min(ρ, λ) attains it),
  i.e. minimise (1/N)[Σ s_i² + 2λ Σ t_i] s.t. ‖x_i − b‖ ≤ r_i, t_i ≥ r_i − s_i, t ≥ 0.
  Decision: default because Clarabel hits NumericalError on cvxpy's own huber canonicalisation
  at tolerances ≤ 1e-9 already for N = 10³, D = 64, where this form still solves.

Limitation: where the Huber median is exactly a data point (for instance data symmetric about one of
their points), the problem is degenerate for an interior-point method (that point's cone is at its
apex with a zero multiplier) and Clarabel may fail at every setting; ReferenceSolveError is then
raised. Such cases are better checked against their exact answer.

Conditioning (Decision): the data are centred at their mean c and divided by s, the RMS distance
to c, before the solve; with λ' = λ/s, h_λ'(ρ/s) = h_λ(ρ)/s², so b = c + s·b'. This is an exact
reformulation that only improves the solver's scaling.

Tolerances: Clarabel is run at each tolerance of ``tolerances`` in turn (gap abs/rel and
feasibility all set to it); where it fails with its default settings it is rerun at the same
tolerance with ``SAFEGUARDED_OPTIONS``. A status "optimal" is returned at once; an "optimal_inaccurate"
answer (Clarabel's reduced tolerances) is kept as a candidate while the next tolerance is tried;
a solver failure moves on. The candidate with the lowest objective is returned; if none, raise
:class:`ReferenceSolveError`. The reported ``objective`` is re-evaluated in numpy
(``theory.huber``) at the returned b, so it is directly comparable with
:class:`solvers.medians.MedianResult.objective`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
from numpy.typing import NDArray

from dictcheck.theory.huber import geometric_median_objective, huber_objective
from dictcheck.theory.objective import check_lam

REFERENCE_SOLVER = "CLARABEL"
DEFAULT_TOLERANCES: tuple[float, ...] = (1e-12, 1e-11, 1e-10, 1e-9, 1e-8)
# Retried at the same tolerance when Clarabel fails with its defaults. Needed when the optimum puts
# a data point at the apex of its cone with a zero multiplier (the Huber median equal to a data
# point, e.g. data symmetric about one of its points), where the interior-point method often stops
# with NumericalError; turning equilibration off rescues about three quarters of such cases.
SAFEGUARDED_OPTIONS: dict[str, bool] = {"equilibrate_enable": False}
HUBER_FORMULATIONS = ("epigraph", "atom")


class ReferenceSolveError(RuntimeError):
    """The conic solver returned no usable solution at any of the tolerances tried."""


@dataclass(frozen=True)
class ReferenceMedian:
    """A median from the conic reference: location, objective (mean over points), solve record.

    ``status`` is cvxpy's status of the returned solve and ``tolerance`` the Clarabel tolerance it
    ran at; ``seconds`` is the wall time of all ``solves`` solver calls tried (cvxpy compilation
    included).
    """

    b: NDArray[np.float64]
    objective: float
    status: str
    solver: str
    tolerance: float
    seconds: float
    solves: int


def _prepare(X: NDArray) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"X must have shape (D, N) with D, N >= 1, got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or inf")
    centre = X.mean(axis=1)
    scale = float(np.sqrt(np.mean(np.sum((X - centre[:, None]) ** 2, axis=0))))
    return X, centre, scale if scale > 0 else 1.0


def _solve_ladder(
    problem: cp.Problem,
    b: cp.Variable,
    to_original: Callable[[NDArray], NDArray[np.float64]],
    objective: Callable[[NDArray], float],
    solver: str,
    tolerances: Sequence[float],
) -> ReferenceMedian:
    if not tolerances:
        raise ValueError("tolerances must not be empty")
    start = time.perf_counter()
    best: tuple[float, NDArray, str, float] | None = None
    attempts: list[str] = []
    solves = 0
    for tol in tolerances:
        options = {"tol_gap_abs": tol, "tol_gap_rel": tol, "tol_feas": tol, "max_iter": 500}
        for extra in ({}, SAFEGUARDED_OPTIONS) if solver == "CLARABEL" else ({},):
            solves += 1
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # cvxpy warns on optimal_inaccurate; the status is kept
                    problem.solve(solver=solver, warm_start=False, **options, **extra)
            except cp.error.SolverError as exc:
                attempts.append(f"tol {tol:g}{' safeguarded' if extra else ''}: {exc}")
                continue
            break
        else:
            continue
        if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or b.value is None:
            attempts.append(f"tol {tol:g}: status {problem.status}")
            continue
        b_val = to_original(np.asarray(b.value, dtype=np.float64))
        value = objective(b_val)
        if best is None or value < best[0]:
            best = (value, b_val, problem.status, tol)
        if problem.status == cp.OPTIMAL:
            break
    if best is None:
        raise ReferenceSolveError(f"{solver}: no usable solution (" + "; ".join(attempts) + ")")
    value, b_val, status, tol = best
    return ReferenceMedian(b_val, value, status, solver, tol, time.perf_counter() - start, solves)


def huber_median_cvxpy(
    X: NDArray,
    lam: float,
    *,
    formulation: str = "epigraph",
    solver: str = REFERENCE_SOLVER,
    tolerances: Sequence[float] = DEFAULT_TOLERANCES,
    fallback: bool = True,
) -> ReferenceMedian:
    """Huber-smoothed geometric median argmin_b (1/N) Σ_i h_λ(‖x_i − b‖) by a conic solve.

    docs/theory.md §4.3. X has shape (D, N), points as columns. ``formulation`` is "epigraph"
    (default) or "atom" (cp.huber of the norms); see the module docstring. With ``fallback``, an
    epigraph solve that fails at every tolerance is repeated with the atom formulation.
    """
    lam = check_lam(lam)
    if formulation not in HUBER_FORMULATIONS:
        raise ValueError(f"formulation must be one of {HUBER_FORMULATIONS}, got {formulation!r}")
    X, centre, scale = _prepare(X)
    D, N = X.shape
    Y, lam_s = (X - centre[:, None]) / scale, lam / scale
    b = cp.Variable(D)
    norms = cp.norm(Y - b[:, None], 2, axis=0)
    if formulation == "atom":
        problem = cp.Problem(cp.Minimize(cp.sum(cp.huber(norms, lam_s)) / N))
    else:
        r, s, t = cp.Variable(N), cp.Variable(N), cp.Variable(N, nonneg=True)
        problem = cp.Problem(
            cp.Minimize((cp.sum_squares(s) + 2.0 * lam_s * cp.sum(t)) / N), [norms <= r, t >= r - s]
        )

    def to_original(bb: NDArray) -> NDArray[np.float64]:
        return centre + scale * bb

    try:
        return _solve_ladder(problem, b, to_original, lambda bb: huber_objective(bb, X, lam), solver, tolerances)
    except ReferenceSolveError:
        if formulation != "epigraph" or not fallback:
            raise
    return huber_median_cvxpy(X, lam, formulation="atom", solver=solver, tolerances=tolerances, fallback=False)


def geometric_median_cvxpy(
    X: NDArray, *, solver: str = REFERENCE_SOLVER, tolerances: Sequence[float] = DEFAULT_TOLERANCES
) -> ReferenceMedian:
    """Plain geometric median argmin_b (1/N) Σ_i ‖x_i − b‖ by a conic solve (docs/theory.md §4.3).

    One second-order cone per point. X has shape (D, N), points as columns.
    """
    X, centre, scale = _prepare(X)
    b = cp.Variable(X.shape[0])
    Y = (X - centre[:, None]) / scale
    problem = cp.Problem(cp.Minimize(cp.sum(cp.norm(Y - b[:, None], 2, axis=0)) / X.shape[1]))
    return _solve_ladder(
        problem, b, lambda bb: centre + scale * bb, lambda bb: geometric_median_objective(bb, X), solver, tolerances
    )
