"""Second-order status of a narrow stationary point of objective (1) (docs/theory.md §3.1).

Variables (the face of the constraints the point lies on):
* for every live atom d, a tangent coordinate v_d ∈ R^{D−1} with ŵ_d(v) = (ŵ_d + B_d v_d)/‖ŵ_d + B_d v_d‖,
  B_d an orthonormal basis of ŵ_d^⊥ (a retraction onto the unit sphere);
* the active codes z_di > τ_act (inactive codes stay at 0; with strict complementarity, φ_id < 1 off the
  support, moving them off 0 raises (1) at first order);
* b, when it is learned.

At a critical point the ordinary Hessian of the pulled-back objective is the Riemannian Hessian, so a local
minimum has it PSD (second-order necessary condition) and a strict local minimum PD. The codes block
C = ∂²O/∂z² = (2/N) blockdiag(Ŵ_{S_i}ᵀŴ_{S_i}) is PD when each support's atoms are independent; the
Schur complement H_red = A − B C⁻¹ Bᵀ is then the Hessian of the exact-code objective
g(v, b) = min_Z O(Ŵ(v), Z, b), and the joint Hessian is PSD iff H_red is.

:func:`restricted_hessian` computes the joint Hessian with torch autograd (float64,
``torch.func.hessian``); :func:`exact_code_hessian_fd` computes the Hessian of g by central finite
differences of objective (1) at exact codes (:func:`dictcheck.solvers.lasso_codes.exact_codes`), an
independent route to H_red.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from scipy.linalg import null_space

from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.theory.diagnostics import active_sets, correlations, residuals
from dictcheck.theory.objective import sae_objective


def tangent_bases(W_hat: NDArray) -> list[NDArray[np.float64]]:
    """An orthonormal basis (D, D−1) of ŵ_d^⊥ for every column of W_hat (unit atoms)."""
    return [null_space(W_hat[:, [d]].T) for d in range(W_hat.shape[1])]


def retract(W_hat: NDArray, bases: list[NDArray], v: ArrayLike) -> NDArray[np.float64]:
    """ŵ_d(v) = (ŵ_d + B_d v_d)/‖ŵ_d + B_d v_d‖ for v = (v_1, …, v_k) stacked (k(D−1),)."""
    D, k = W_hat.shape
    V = np.asarray(v, dtype=np.float64).reshape(k, D - 1)
    W = W_hat + np.column_stack([B @ V[d] for d, B in enumerate(bases)])
    return W / np.linalg.norm(W, axis=0)


@dataclass(frozen=True)
class RestrictedHessian:
    """The joint Hessian of (1) on the constraint face (order: tangent coordinates, active codes, bias) and its
    Schur complement onto (tangent, bias), all of the mean objective (1).

    gradient_norm: ‖∇‖_∞ there (0 at a stationary point). complementarity_margin: min over inactive entries of
    live atoms of 1 − φ_id (> 0: strict complementarity; the restricted Hessian then decides the local status).
    """

    hessian: NDArray[np.float64]
    reduced: NDArray[np.float64]
    n_tangent: int
    n_codes: int
    n_bias: int
    gradient_norm: float
    complementarity_margin: float

    @property
    def min_eig(self) -> float:
        return float(np.linalg.eigvalsh(self.hessian)[0])

    @property
    def min_eig_reduced(self) -> float:
        return float(np.linalg.eigvalsh(self.reduced)[0]) if self.reduced.size else 0.0

    @property
    def max_abs_eig(self) -> float:
        return float(np.max(np.abs(np.linalg.eigvalsh(self.hessian))))

    @property
    def min_eig_codes(self) -> float:
        t, c = self.n_tangent, self.n_codes
        return float(np.linalg.eigvalsh(self.hessian[t:t + c, t:t + c])[0]) if c else 0.0


def restricted_hessian(W: NDArray, Z: NDArray, b: ArrayLike, X: NDArray, lam: float, *,
                       learn_bias: bool, tau_act: float | None = None) -> RestrictedHessian:
    """The Hessian of the mean objective (1) at (W, Z, b) on the face described in the module docstring.

    W (D, d_z) atoms (zero columns, dead latents, are left out), Z (d_z, N) unit-atom codes, b (D,), X (D, N).
    Raises ValueError for mismatched shapes or a live atom that is not unit-norm (to 1e-8).
    """
    W, Z, X = (np.asarray(a, dtype=np.float64) for a in (W, Z, X))
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    D, N = X.shape
    if W.shape[0] != D or Z.shape != (W.shape[1], N) or b.size != D:
        raise ValueError(f"shapes disagree: W {W.shape}, Z {Z.shape}, b {b.shape}, X {X.shape}")
    live = np.linalg.norm(W, axis=0) > 0
    W_hat, Z_live = W[:, live], Z[live]
    if np.any(np.abs(np.linalg.norm(W_hat, axis=0) - 1.0) > 1e-8):
        raise ValueError("live atoms must be unit-norm (objective (1))")
    active, _ = active_sets(Z_live, tau_act)
    Phi = correlations(W_hat, residuals(W_hat, Z_live, b, X), lam)
    margin = float(np.min(1.0 - Phi[~active])) if np.any(~active) else float("inf")
    bases = tangent_bases(W_hat)
    k = W_hat.shape[1]
    n_t, n_c, n_b = k * (D - 1), int(active.sum()), D if learn_bias else 0
    rows, cols = np.nonzero(active)
    t = torch.float64
    W0, B = torch.tensor(W_hat, dtype=t), torch.tensor(np.stack(bases), dtype=t)  # B: (k, D, D−1)
    Xt, b_fixed = torch.tensor(X, dtype=t), torch.tensor(b, dtype=t)
    r_idx, c_idx = torch.tensor(rows), torch.tensor(cols)

    def objective(theta: torch.Tensor) -> torch.Tensor:
        V = theta[:n_t].reshape(k, D - 1)
        Wv = W0 + torch.einsum("kdj,kj->dk", B, V)
        Wv = Wv / torch.linalg.norm(Wv, dim=0)
        Zv = torch.zeros((k, N), dtype=t).index_put((r_idx, c_idx), theta[n_t:n_t + n_c])
        bv = theta[n_t + n_c:] if learn_bias else b_fixed
        R = Xt - bv[:, None] - Wv @ Zv
        return (torch.sum(R * R) + 2.0 * lam * torch.sum(Zv)) / N

    theta0 = torch.tensor(np.concatenate([np.zeros(n_t), Z_live[active], b if learn_bias else []]), dtype=t)
    grad = torch.func.grad(objective)(theta0).numpy()
    H = torch.func.hessian(objective)(theta0).numpy()
    H = (H + H.T) / 2
    keep = np.r_[np.arange(n_t), np.arange(n_t + n_c, n_t + n_c + n_b)]
    codes = np.arange(n_t, n_t + n_c)
    A, Bm, C = H[np.ix_(keep, keep)], H[np.ix_(keep, codes)], H[np.ix_(codes, codes)]
    reduced = A - Bm @ np.linalg.solve(C, Bm.T) if n_c else A
    return RestrictedHessian(hessian=H, reduced=(reduced + reduced.T) / 2, n_tangent=n_t, n_codes=n_c, n_bias=n_b,
                             gradient_norm=float(np.max(np.abs(grad))) if grad.size else 0.0,
                             complementarity_margin=margin)


def exact_code_hessian_fd(W_hat: NDArray, b: ArrayLike, X: NDArray, lam: float, *, learn_bias: bool,
                          step: float = 1e-4) -> NDArray[np.float64]:
    """Central finite-difference Hessian of g(v, b) = O(Ŵ(v), exact codes, b) in the coordinates of
    :func:`restricted_hessian`'s reduced block (tangent coordinates, then b if learned). Error O(step²) plus
    rounding O(ε·O/step²); exact codes are solved to relative KKT 1e-12."""
    W_hat, X = np.asarray(W_hat, dtype=np.float64), np.asarray(X, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    D, k = W_hat.shape
    bases = tangent_bases(W_hat)
    n_t = k * (D - 1)
    n = n_t + (D if learn_bias else 0)

    def g(p: NDArray) -> float:
        Wv = retract(W_hat, bases, p[:n_t])
        bv = b + p[n_t:] if learn_bias else b
        return sae_objective(Wv, exact_codes(Wv, X, bv, lam, tol=1e-12).Z, bv, X, lam)

    E = np.eye(n) * step
    H = np.empty((n, n))
    for i in range(n):
        for j in range(i, n):
            H[i, j] = H[j, i] = (g(E[i] + E[j]) - g(E[i] - E[j]) - g(E[j] - E[i]) + g(-E[i] - E[j])) / (4 * step**2)
    return H
