"""Numeric references for the block-sparse operators (spec/bsf.md §1, §2): second-order-cone
programs solved by Clarabel through cvxpy.

* :func:`numeric_l21_prox` — the prox of θ‖·‖_{2,1}, against which sh_θ is checked.
* :func:`solve_block_lasso` — the ℓ_{2,1} block lasso of the block wide limit.
"""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np

from theory.block_sparse import block_wide_objective

__all__ = ["numeric_l21_prox", "solve_block_lasso"]

#: Clarabel at gap and feasibility tolerances 1e-9: its defaults (1e-8) left errors up to 2e-6 in z;
#: 1e-10 and tighter sometimes end "optimal_inaccurate" on these problems.
_CLARABEL = {"solver": cp.CLARABEL, "tol_gap_abs": 1e-9, "tol_gap_rel": 1e-9, "tol_feas": 1e-9}


def _solve(problem: cp.Problem) -> None:
    """Solve; "optimal_inaccurate" is accepted because every use is conservative: the prox is compared
    with the closed form, and block-lasso values are re-evaluated at the returned z (an upper bound)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # cvxpy's "solution may be inaccurate"
        problem.solve(**_CLARABEL)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise RuntimeError(f"cvxpy/Clarabel did not solve the reference problem: status {problem.status}")


def numeric_l21_prox(a: np.ndarray, theta: float) -> np.ndarray:
    """argmin_z ½‖z − a‖² + θ Σ_g ‖z_g‖₂ for blocks a (n_b, q), solved numerically by cvxpy/Clarabel."""
    z = cp.Variable(a.shape)
    objective = 0.5 * cp.sum_squares(z - a) + theta * cp.sum(cp.norm(z, 2, axis=1))
    _solve(cp.Problem(cp.Minimize(objective)))
    return np.asarray(z.value)


def solve_block_lasso(x: np.ndarray, W: np.ndarray, lam: float) -> tuple[np.ndarray, float]:
    """(z, value) of min_z ‖x − Σ_g W_g z_g‖² + 2λ Σ_g ‖z_g‖₂ for W (n_b, D, q), by cvxpy/Clarabel.

    The returned value is the objective re-evaluated in numpy at the solver's z (so an upper bound
    on the true minimum up to rounding)."""
    n_b, _, q = W.shape
    z = cp.Variable((n_b, q))
    y = sum(W[g] @ z[g] for g in range(n_b))
    objective = cp.sum_squares(x - y) + 2.0 * lam * cp.sum(cp.norm(z, 2, axis=1))
    _solve(cp.Problem(cp.Minimize(objective)))
    z_val = np.asarray(z.value)
    return z_val, block_wide_objective(x, W, z_val, lam)
