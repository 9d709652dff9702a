"""The reference learner for narrow dictionaries (docs/theory.md §2.2, "Reference learner").

It minimises the scaling-symmetric form (2) with the decoder eliminated by ridge regression:

    N·F(Z, b) = min_W ‖X̃ − WZ‖_F² + λ‖W‖_F² + λ‖Z1‖²,    Z ≥ 0 (balanced codes),
    W*(Z)     = X̃ Zᵀ (ZZᵀ + λI)⁻¹,       R = X̃ − W*Z,

over Z ≥ 0 and, when the bias is learned, over b. By the envelope theorem

    ∇_Z (N·F) = 2[λ (Z1)1ᵀ − W*ᵀR],      ∇_b (N·F) = −2 R1,

i.e. N times the spec's ∇_Z F = (2/N)[λ(Z1)1ᵀ − W*ᵀR] and ∇_b F = −(2/N)R1. The optimiser works
on the sum N·F (the scale does not change the minimiser; it does set what ``gtol`` means: the
projected-gradient tolerance applies to the gradient of the *sum*). scipy's L-BFGS-B with bounds
Z ≥ 0, ftol 1e-15, gtol 1e-11, up to 2·10⁴ iterations, float64 throughout.

Initialisation (zero-row trap, spec §2.2): a latent whose row reaches z_d· = 0 is stationary and
never revives, so the start is made strictly positive. The initial (W0, Z0) is converted to
unit-atom form (2) → (1), balanced (1) → (2) with :func:`theory.objective.to_balanced`, and 1e-3 is
added to every code entry. Only the *codes* enter the optimisation (W is eliminated), so W0 matters
only through the codes it defines: its column norms rescale a given Z0, and without Z0 it defines
the cheap initial codes (W0ᵀ(x_i − b0) − λ)₊ with W0's columns normalised (the exact non-negative
lasso code of a single isolated atom, and the exact code whenever the unit atoms are orthonormal).

The result is converted back to objective (1) (spec §2.1): ŵ_d = w_d/‖w_d‖ and unit-atom codes
‖w_d‖ z_d·. Dead latents (z_d· = 0 at the end) come back as zero columns with zero codes; they
contribute nothing to (1) and are flagged in ``ReferenceFit.live``.

This module imports only :mod:`theory` (layer contract).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, minres

from dictcheck.theory.diagnostics import active_sets, correlations, kkt_violation, residuals
from dictcheck.theory.objective import centred, check_lam, ridge_decoder, sae_objective, to_balanced, to_unit_atoms

#: Added to every balanced initial code (spec §2.2, zero-row trap).
INIT_OFFSET = 1e-3


@dataclass(frozen=True)
class ReducedObjective:
    """N·F(Z, b) with W eliminated, its gradients, and the ridge decoder / residuals behind them."""

    value_sum: float
    grad_Z: NDArray[np.float64]
    grad_b: NDArray[np.float64]
    W: NDArray[np.float64]
    R: NDArray[np.float64]


def reduced_objective(Z: NDArray, b: ArrayLike, X: NDArray, lam: float) -> ReducedObjective:
    """N·F(Z, b) = ‖R‖² + λ‖W*‖² + λ‖Z1‖² at W = W*(Z), and its gradients (spec §2.2).

    Z are balanced codes, Z ≥ 0 assumed (so ‖z_d·‖₁ = (Z1)_d). The gradients are those of the sum
    N·F: ∇_Z = 2[λ(Z1)1ᵀ − W*ᵀR], ∇_b = −2R1 (envelope theorem).
    """
    Z = np.asarray(Z, dtype=np.float64)
    Xc = centred(X, b)
    W = ridge_decoder(Z, Xc, lam)
    R = Xc - W @ Z
    row = Z.sum(axis=1)
    value = float(np.sum(R * R) + lam * np.sum(W * W) + lam * np.sum(row * row))
    grad_Z = 2.0 * (lam * row[:, None] - W.T @ R)
    grad_b = -2.0 * R.sum(axis=1)
    return ReducedObjective(value_sum=value, grad_Z=grad_Z, grad_b=grad_b, W=W, R=R)


def reduced_hvp(
    Z: NDArray, b: ArrayLike, X: NDArray, lam: float, dZ: NDArray, db: ArrayLike | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact Hessian-vector product of N·F(Z, b) (the smooth extension with ‖z_d·‖₁ = (Z1)_d).

    With A = ZZᵀ + λI, W = X̃ZᵀA⁻¹, R = X̃ − WZ and a direction (dZ, db), dX̃ = −db1ᵀ:
        dW = (dX̃Zᵀ + X̃dZᵀ − W(dZZᵀ + ZdZᵀ)) A⁻¹,   dR = dX̃ − dW Z − W dZ,
        d∇_Z = 2[λ(dZ1)1ᵀ − dWᵀR − WᵀdR],          d∇_b = −2 dR1.
    Returns (d∇_Z, d∇_b). Used by the Newton polish of :func:`fit_reference`.
    """
    Z = np.asarray(Z, dtype=np.float64)
    dZ = np.asarray(dZ, dtype=np.float64)
    Xc = centred(X, b)
    D, N = Xc.shape
    d_z = Z.shape[0]
    A = Z @ Z.T + lam * np.eye(d_z)
    W = np.linalg.solve(A, Z @ Xc.T).T
    R = Xc - W @ Z
    db_vec = np.zeros(D) if db is None else np.asarray(db, dtype=np.float64).reshape(D)
    dXc = -np.outer(db_vec, np.ones(N))
    rhs = dXc @ Z.T + Xc @ dZ.T - W @ (dZ @ Z.T + Z @ dZ.T)
    dW = np.linalg.solve(A, rhs.T).T
    dR = dXc - dW @ Z - W @ dZ
    hZ = 2.0 * (lam * dZ.sum(axis=1)[:, None] - dW.T @ R - W.T @ dR)
    hb = -2.0 * dR.sum(axis=1)
    return hZ, hb


def initial_codes(W0: NDArray, X: NDArray, b0: ArrayLike, lam: float) -> NDArray[np.float64]:
    """Cheap unit-atom starting codes (Ŵ0ᵀ(x_i − b0) − λ)₊ with Ŵ0 = W0 column-normalised.

    These are the exact codes when the unit atoms are orthonormal (e.g. the §5.2 ground truth I₃);
    otherwise they are only a positive-part correlation guess. Zero columns of W0 get zero codes
    (revived by the 1e-3 offset in :func:`fit_reference`).
    """
    W0 = np.asarray(W0, dtype=np.float64)
    norms = np.linalg.norm(W0, axis=0)
    W_unit = W0 / np.where(norms > 0, norms, 1.0)
    return np.maximum(W_unit.T @ centred(X, b0) - lam, 0.0)


@dataclass(frozen=True)
class ReferenceFit:
    """Result of :func:`fit_reference`, converted back to objective (1) (spec §2.1).

    W: (D, d_z) unit atoms (zero columns for dead latents); Z: (d_z, N) unit-atom codes, i.e. the
    learner's own codes rescaled by ‖w_d‖ (not re-solved lasso codes); b: (D,) bias.
    objective: mean objective (1) at (W, Z, b); objective_sum = N·objective.
    start_objective / start_objective_sum: form (2) with W eliminated, F(Z_start, b0), at the
    (offset) starting point; the fit never ends above it.
    reduced_objective: F (mean) at the end, with W eliminated; ≥ objective (AM–GM), equal at
    balance.
    iterations, n_evaluations, converged (scipy's success flag), message: L-BFGS-B bookkeeping;
    polish_steps: accepted Newton polish steps after it.
    projected_gradient: max-abs projected gradient of the *mean* F over (Z, b) at the end (an entry
    at its bound Z = 0 counts only if its gradient is negative); lbfgs_projected_gradient: the
    same right after L-BFGS-B, before the polish.
    kkt_violation: the §6 `kkt_violation` of the returned codes, max over (i, d) of |φ_id − 1| on
    active entries (z_di > tau_act) and (φ_id − 1)₊ elsewhere, φ_i = Ŵᵀr_i/λ (dimensionless).
    bias_gradient: ‖R1‖/N (0 up to round-off only when b is learned).
    balance_ratio: ‖w_d‖/‖z_d·‖₁ per latent for the balanced solution (NaN for dead latents);
    1 at every stationary point.
    live: mask of latents with a non-zero code row. tau_act: the activity threshold used.
    """

    W: NDArray[np.float64]
    Z: NDArray[np.float64]
    b: NDArray[np.float64]
    lam: float
    learn_bias: bool
    objective: float
    objective_sum: float
    start_objective: float
    start_objective_sum: float
    reduced_objective: float
    iterations: int
    polish_steps: int
    lbfgs_projected_gradient: float
    n_evaluations: int
    converged: bool
    message: str
    projected_gradient: float
    kkt_violation: float
    bias_gradient: float
    balance_ratio: NDArray[np.float64]
    live: NDArray[np.bool_]
    tau_act: float

    @property
    def firing_fraction(self) -> NDArray[np.float64]:
        """p_d = share of points with z_di > tau_act."""
        return np.mean(self.Z > self.tau_act, axis=1)

    @property
    def max_balance_deviation(self) -> float:
        """max over live latents of |balance_ratio − 1| (0 if none are live)."""
        dev = np.abs(self.balance_ratio[self.live] - 1.0)
        return float(dev.max()) if dev.size else 0.0


def fit_residuals(fit: ReferenceFit, X: NDArray) -> NDArray[np.float64]:
    """R = X − b1ᵀ − WZ for a fit and its data X (D, N)."""
    return centred(X, fit.b) - fit.W @ fit.Z


def _projected_gradient(Z: NDArray, grad_Z: NDArray, grad_b: NDArray | None) -> float:
    """max-abs projected gradient: entries at the bound Z = 0 count only when pointing inward."""
    pg = np.where(Z > 0, grad_Z, np.minimum(grad_Z, 0.0))
    val = float(np.max(np.abs(pg))) if pg.size else 0.0
    if grad_b is not None and grad_b.size:
        val = max(val, float(np.max(np.abs(grad_b))))
    return val


def _newton_polish_step(
    Z: NDArray, b: NDArray, X: NDArray, lam: float, red: ReducedObjective, learn_bias: bool, gtol: float
) -> tuple[NDArray, NDArray, ReducedObjective] | None:
    """One projected-Newton step on the free variables; None if it does not help.

    Free variables: Z entries that are positive or sit at 0 with a negative gradient, and b if
    learned. The Newton system H_ff s = −g_f is solved with MINRES (at most 5000 iterations) using
    :func:`reduced_hvp`; the new Z is projected onto Z ≥ 0. Accepted iff the max-abs projected
    gradient (sum form) drops and N·F rises by at most 1e-13·max(1, N·F) (round-off).
    """
    d_z, N = Z.shape
    D = X.shape[0]
    pg0 = _projected_gradient(Z, red.grad_Z, red.grad_b if learn_bias else None)
    if pg0 <= gtol:
        return None
    free = (Z > 0) | (red.grad_Z < 0)
    n_free = int(free.sum())
    n_b = D if learn_bias else 0
    if n_free + n_b == 0:
        return None

    def matvec(s_vec: NDArray) -> NDArray:
        dZ = np.zeros_like(Z)
        dZ[free] = s_vec[:n_free]
        db = s_vec[n_free:] if learn_bias else None
        hZ, hb = reduced_hvp(Z, b, X, lam, dZ, db)
        return np.concatenate([hZ[free], hb]) if learn_bias else hZ[free]

    g = np.concatenate([red.grad_Z[free], red.grad_b]) if learn_bias else red.grad_Z[free]
    H = LinearOperator((n_free + n_b, n_free + n_b), matvec=matvec, dtype=np.float64)
    s_vec, _ = minres(H, -g, rtol=1e-14, maxiter=min(10 * (n_free + n_b), 5000))
    if not np.all(np.isfinite(s_vec)):
        return None
    Z_new = Z.copy()
    Z_new[free] = np.maximum(Z[free] + s_vec[:n_free], 0.0)
    b_new = b + s_vec[n_free:] if learn_bias else b
    red_new = reduced_objective(Z_new, b_new, X, lam)
    pg1 = _projected_gradient(Z_new, red_new.grad_Z, red_new.grad_b if learn_bias else None)
    if pg1 < pg0 and red_new.value_sum <= red.value_sum + 1e-13 * max(1.0, abs(red.value_sum)):
        return Z_new, np.asarray(b_new, dtype=np.float64), red_new
    return None


def fit_reference(
    X: NDArray,
    lam: float,
    *,
    W0: NDArray,
    Z0: NDArray | None = None,
    b0: ArrayLike | None = None,
    learn_bias: bool = True,
    max_iter: int = 20000,
    ftol: float = 1e-15,
    gtol: float = 1e-11,
    maxcor: int = 10,
    polish_steps: int = 5,
) -> ReferenceFit:
    """Minimise form (2) over Z ≥ 0 (and b if ``learn_bias``) with W eliminated (spec §2.2).

    X: (D, N) data, points as columns. lam: λ of objective (1).
    W0: (D, d_z) initial dictionary (any non-zero column scaling). Z0: (d_z, N) initial codes
    *in W0's scaling* (for unit-norm W0 these are unit-atom codes); together (W0, Z0) are
    converted to unit-atom form, balanced, and offset by 1e-3. If Z0 is None the unit-atom codes
    are (Ŵ0ᵀ(x_i − b0) − λ)₊ (see :func:`initial_codes`).
    b0: (D,) initial bias (the fixed bias when ``learn_bias`` is False); default 0.
    max_iter, ftol, gtol, maxcor: L-BFGS-B options (``maxfun`` is 10·max_iter).
    polish_steps: at most this many projected-Newton steps after L-BFGS-B (0 disables; see
    :func:`_newton_polish_step`). L-BFGS-B's ftol test is limited by the float64 resolution of F
    itself (~1e-16·F), which stalls it at sum-gradients ~1e-7; the polish uses only gradients
    (accurate to ~1e-14) and the exact Hessian-vector product to reach round-off stationarity.
    Each step is kept only if it lowers the projected gradient and F does not rise beyond
    round-off, so it never changes the local minimum that L-BFGS-B found.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be (D, N), got shape {X.shape}")
    D, N = X.shape
    lam = check_lam(lam)
    W0 = np.asarray(W0, dtype=np.float64)
    if W0.ndim != 2 or W0.shape[0] != D:
        raise ValueError(f"W0 must be (D={D}, d_z), got shape {W0.shape}")
    d_z = W0.shape[1]
    b_start = np.zeros(D) if b0 is None else np.asarray(b0, dtype=np.float64).reshape(D).copy()

    if Z0 is None:
        Z_unit0 = initial_codes(W0, X, b_start, lam)
    else:
        Z0 = np.asarray(Z0, dtype=np.float64)
        if Z0.shape != (d_z, N):
            raise ValueError(f"Z0 must be (d_z={d_z}, N={N}), got shape {Z0.shape}")
        if np.any(Z0 < 0):
            raise ValueError("Z0 must be non-negative")
        _, Z_unit0 = to_unit_atoms(W0, Z0)
    W_unit0, _ = to_unit_atoms(W0, np.ones((d_z, 1)))
    _, Z_bal0 = to_balanced(W_unit0, Z_unit0)
    Z_start = Z_bal0 + INIT_OFFSET

    n_z = d_z * N

    def unpack(v: NDArray) -> tuple[NDArray, NDArray]:
        Z = v[:n_z].reshape(d_z, N)
        b = v[n_z:] if learn_bias else b_start
        return Z, b

    def fun(v: NDArray) -> tuple[float, NDArray]:
        Z, b = unpack(v)
        red = reduced_objective(Z, b, X, lam)
        if learn_bias:
            return red.value_sum, np.concatenate([red.grad_Z.ravel(), red.grad_b])
        return red.value_sum, red.grad_Z.ravel()

    v0 = np.concatenate([Z_start.ravel(), b_start]) if learn_bias else Z_start.ravel()
    bounds = [(0.0, None)] * n_z + ([(None, None)] * D if learn_bias else [])
    start_sum = fun(v0)[0]
    res = minimize(
        fun,
        v0,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": int(max_iter), "maxfun": 10 * int(max_iter), "ftol": ftol, "gtol": gtol,
                 "maxcor": int(maxcor)},
    )
    v = np.asarray(res.x, dtype=np.float64)
    Z_bal, b = unpack(v)
    Z_bal = np.maximum(Z_bal, 0.0)
    b = np.array(b, dtype=np.float64)
    red = reduced_objective(Z_bal, b, X, lam)
    # the returned values must not exceed the start (L-BFGS-B is monotone; guard round-off anyway)
    if red.value_sum > start_sum:  # pragma: no cover - defensive
        Z_bal, b = unpack(v0)
        Z_bal, b = Z_bal.copy(), np.array(b, dtype=np.float64)
        red = reduced_objective(Z_bal, b, X, lam)
    pg_lbfgs = _projected_gradient(Z_bal, red.grad_Z / N, red.grad_b / N if learn_bias else None)
    n_polish = 0
    for _ in range(int(polish_steps)):
        step = _newton_polish_step(Z_bal, b, X, lam, red, learn_bias, gtol)
        if step is None:
            break
        Z_bal, b, red = step
        n_polish += 1

    W_bal = red.W
    row_l1 = Z_bal.sum(axis=1)
    live = row_l1 > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        balance = np.where(live, np.linalg.norm(W_bal, axis=0) / np.where(live, row_l1, 1.0), np.nan)

    W_unit, Z_unit = to_unit_atoms(W_bal, Z_bal)
    Z_unit = np.where(live[:, None], Z_unit, 0.0)
    objective = sae_objective(W_unit, Z_unit, b, X, lam)

    R = residuals(W_unit, Z_unit, b, X)
    active, tau = active_sets(Z_unit)  # τ_act = 1e-6 · max z (spec §1)

    return ReferenceFit(
        W=W_unit,
        Z=Z_unit,
        b=b,
        lam=lam,
        learn_bias=bool(learn_bias),
        objective=objective,
        objective_sum=objective * N,
        start_objective=start_sum / N,
        start_objective_sum=start_sum,
        reduced_objective=red.value_sum / N,
        iterations=int(res.nit),
        polish_steps=n_polish,
        lbfgs_projected_gradient=pg_lbfgs,
        n_evaluations=int(res.nfev),
        converged=bool(res.success),
        message=str(res.message),
        projected_gradient=_projected_gradient(Z_bal, red.grad_Z / N, red.grad_b / N if learn_bias else None),
        kkt_violation=kkt_violation(correlations(W_unit, R, lam), active),
        bias_gradient=float(np.linalg.norm(R.sum(axis=1)) / N),
        balance_ratio=balance,
        live=live,
        tau_act=tau,
    )
