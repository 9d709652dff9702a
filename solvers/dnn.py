"""The doubly-nonnegative relaxation of program (3) (docs/theory.md §2.2–§2.3).

    minimise  J(Q, b) = (λ/N) [ tr(X̃ (Q + λI)⁻¹ X̃ᵀ) + 1ᵀQ1 ]   over Q ⪰ 0, Q ≥ 0 (and b, if learned).

The relaxation is tight for every N (spec §2.3: the certificate G = λ11ᵀ − RᵀR/λ lies in the dual
cone at the optimum), so its value is the global optimum of objective (1) over all widths.
tr(X̃ (Q + λI)⁻¹ X̃ᵀ) is cvxpy's ``matrix_frac(X̃ᵀ, Q + λI)``, which cvxpy turns into one
Schur-complement LMI.

Solvers: Clarabel by default (tolerance 1e-9, then 1e-10), SCS as the fallback when Clarabel is
missing or fails. Only the status "optimal" is accepted; anything else (infeasible,
"optimal_inaccurate", a solver crash) raises :class:`DNNSolveError` naming the solvers tried and
their statuses. The solvers' own console output (SCS prints warnings from C, e.g. on badly scaled
problems) is discarded, so a caller's stdout holds only what it prints itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.objective import check_lam, q_program

DEFAULT_SOLVERS: tuple[str, ...] = ("CLARABEL", "SCS")
#: Settings run in turn for each solver; the tightest that ends "optimal" is returned. Q's accuracy
#: sets how well the certificate can be read off the solution (max‖r_i‖/λ moves by ~‖ΔQ‖/ρ_i): Clarabel
#: at 1e-9 alone left cert_ratio at 1 + 1.3e-4 and Q 2.7e-4 off on 3-point problems with λ ≈ 0.1; with
#: the 1e-10 pass the worst over 302 random problems was 1 + 4.5e-5 and 4.9e-5. Clarabel at 1e-11 ends
#: "optimal_inaccurate" on such problems, so it is not used.
_SOLVER_SETTINGS: dict[str, tuple[dict[str, float | int], ...]] = {
    "CLARABEL": tuple({"tol_gap_abs": t, "tol_gap_rel": t, "tol_feas": t} for t in (1e-9, 1e-10)),
    "SCS": ({"eps_abs": 1e-9, "eps_rel": 1e-9, "max_iters": 200_000},),
}


class DNNSolveError(RuntimeError):
    """Every solver tried failed or returned an inaccurate status."""


@contextlib.contextmanager
def _solver_output_discarded() -> Iterator[None]:
    """File descriptor 1 points at /dev/null for the block (the solvers print from C, past sys.stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


@dataclass(frozen=True)
class DNNSolution:
    """Optimal value (mean over points), Q (balanced codes' Gram), b, and the solve record."""

    objective: float
    Q: NDArray[np.float64]
    b: NDArray[np.float64]
    status: str
    solver: str
    seconds: float
    learned_bias: bool


def solve_dnn(
    X: NDArray, lam: float, *, b: ArrayLike | None = None, solvers: tuple[str, ...] = DEFAULT_SOLVERS
) -> DNNSolution:
    """Solve the DNN relaxation of (3) for data X (D, N). ``b=None`` learns the bias.

    The returned ``objective`` is J re-evaluated in numpy at the returned (Q, b), so it does not
    depend on the solver's internal scaling.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] == 0:
        raise ValueError(f"X must have shape (D, N) with N >= 1, got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or inf")
    lam = check_lam(lam)
    D, N = X.shape
    learned = b is None
    Q = cp.Variable((N, N), symmetric=True)
    bias = cp.Variable(D) if learned else np.asarray(b, dtype=np.float64).reshape(D)
    Xc_t = X.T - cp.reshape(bias, (1, D), order="C") if learned else X.T - bias[None, :]
    ones = np.ones(N)
    objective = (lam / N) * (cp.matrix_frac(Xc_t, Q + lam * np.eye(N)) + ones @ Q @ ones)
    problem = cp.Problem(cp.Minimize(objective), [Q >> 0, Q >= 0])
    attempts: list[str] = []
    installed = set(cp.installed_solvers())
    for name in solvers:
        if name not in installed:
            attempts.append(f"{name}: not installed")
            continue
        solution = None
        for options in _SOLVER_SETTINGS.get(name, ({},)):
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(), _solver_output_discarded():  # statuses are handled below
                    warnings.simplefilter("ignore", UserWarning)
                    problem.solve(solver=name, **options)
            except cp.error.SolverError as exc:
                attempts.append(f"{name} {options}: {exc}")
                continue
            seconds = time.perf_counter() - start
            if problem.status == cp.OPTIMAL:
                Q_val = np.asarray(Q.value, dtype=np.float64)
                Q_val = 0.5 * (Q_val + Q_val.T)
                b_val = np.asarray(bias.value if learned else bias, dtype=np.float64).reshape(D)
                solution = DNNSolution(
                    objective=q_program(Q_val, b_val, X, lam), Q=Q_val, b=b_val, status=problem.status,
                    solver=name, seconds=seconds + (solution.seconds if solution else 0.0), learned_bias=learned,
                )
            else:
                attempts.append(f"{name} {options}: status {problem.status}")
        if solution is not None:
            return solution
    raise DNNSolveError("DNN relaxation not solved to optimality (" + "; ".join(attempts) + ")")
