"""Block-sparse operators and the block wide limit (docs/bsf.md §0–§2; docs/theory.md §4.1).

Layout: a block code is an array of shape (..., n_b, q) — n_b blocks of size q, the last axis
holding one block z_g ∈ R^q (a flat code of length n_b·q reshapes to this with block g =
entries g·q … g·q+q−1, docs/bsf.md §0). A block dictionary is an array of shape (n_b, D, q)
holding the decoder blocks W_g ∈ R^{D×q}, so x̂ = Σ_g W_g z_g.

* :func:`block_soft_threshold` — sh_θ(a)_g = max(0, 1 − θ/‖a_g‖)·a_g with ‖a_g‖ clamped below at
  1e-8: the proximal operator of θ‖·‖_{2,1} (docs/bsf.md §2).
* :func:`block_topk` — Π_k: keep the k blocks of largest norm (ties to the lowest index,
  Decision), the Euclidean projection onto {‖z‖_{2,0} ≤ k} (docs/bsf.md §2).
* :func:`block_wide_objective`, :func:`block_wide_bound`, :func:`orthonormal_block_code` — the
  block wide limit (docs/bsf.md §1): for ‖W_g‖₂ ≤ 1 every code has
  ‖x̃ − Σ_g W_g z_g‖² + 2λΣ_g‖z_g‖ ≥ h_λ(‖x̃‖), with equality for an orthonormal block whose span
  contains x̃ and the group soft-threshold code z = max(0, 1 − λ/‖Wᵀx̃‖)·Wᵀx̃. [derived] For
  ‖W_g‖₂ ≤ σ the bound sharpens to h_{λ/σ}(‖x̃‖), which is why unit-Frobenius blocks of rank ≥ 2
  (σ < 1) cannot attain h_λ.
* :func:`lam_from_group_lasso_coef` — λ = c·D/2 (docs/bsf.md §1, "λ conversion").
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.huber import huber
from dictcheck.theory.objective import check_lam

__all__ = [
    "NORM_CLAMP",
    "block_norms",
    "l21_norm",
    "block_soft_threshold",
    "block_topk",
    "block_wide_objective",
    "block_wide_bound",
    "orthonormal_block_code",
    "orthonormal_block_value",
    "lam_from_group_lasso_coef",
]

#: Lower clamp of ‖a_g‖ inside sh_θ (docs/bsf.md §2).
NORM_CLAMP = 1e-8


def _blocks(a: ArrayLike, name: str = "a") -> NDArray[np.float64]:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim < 2 or a.shape[-1] < 1 or a.shape[-2] < 1:
        raise ValueError(f"{name} must have shape (..., n_b, q) with n_b, q >= 1, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite entries")
    return a


def block_norms(a: ArrayLike) -> NDArray[np.float64]:
    """‖a_g‖₂ for every block of a (..., n_b, q); shape (..., n_b)."""
    return np.linalg.norm(_blocks(a), axis=-1)


def l21_norm(z: ArrayLike) -> NDArray[np.float64]:
    """‖z‖_{2,1} = Σ_g ‖z_g‖₂ of a block code (..., n_b, q); shape (...) (docs/bsf.md §0)."""
    return block_norms(z).sum(axis=-1)


def block_soft_threshold(a: ArrayLike, theta: float) -> NDArray[np.float64]:
    """sh_θ(a)_g = max(0, 1 − θ/max(‖a_g‖, 1e-8))·a_g (docs/bsf.md §2).

    This is prox_{θ‖·‖_{2,1}}(a) = argmin_z ½‖z − a‖² + θ Σ_g ‖z_g‖: the objective separates over
    blocks, and for one block the minimiser is parallel to a_g with norm (‖a_g‖ − θ)₊ (the scalar
    soft threshold of the norm). The clamp only matters for a_g = 0, which maps to 0.
    """
    a = _blocks(a)
    if not (np.isfinite(theta) and theta >= 0):
        raise ValueError(f"theta must be a finite number >= 0, got {theta!r}")
    norms = np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), NORM_CLAMP)
    return np.maximum(0.0, 1.0 - theta / norms) * a


def block_topk(a: ArrayLike, k: int) -> NDArray[np.float64]:
    """Π_k(a)_g = a_g·1[‖a_g‖ is among the k largest] per sample (docs/bsf.md §2).

    Ties in ‖a_g‖ go to the lowest block index (Decision). Π_k is a Euclidean projection onto
    {z : ‖z‖_{2,0} ≤ k}: for a support S of k blocks the closest z is a restricted to S, at squared
    distance Σ_{g∉S}‖a_g‖², which is smallest when S holds the k largest block norms.
    """
    a = _blocks(a)
    n_b = a.shape[-2]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n_b:
        raise ValueError(f"k must be an int in [1, n_b={n_b}], got {k!r}")
    order = np.argsort(-np.linalg.norm(a, axis=-1), axis=-1, kind="stable")
    keep = np.zeros(a.shape[:-1], dtype=bool)
    np.put_along_axis(keep, order[..., :k], True, axis=-1)
    return np.where(keep[..., None], a, 0.0)


def _dictionary(W: ArrayLike, D: int) -> NDArray[np.float64]:
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 3 or W.shape[1] != D:
        raise ValueError(f"W must have shape (n_b, D={D}, q), got {W.shape}")
    if not np.all(np.isfinite(W)):
        raise ValueError("W has non-finite entries")
    return W


def _point(x: ArrayLike) -> NDArray[np.float64]:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError(f"x must be a finite vector of shape (D,), got shape {x.shape}")
    return x


def block_wide_objective(x: ArrayLike, W: ArrayLike, z: ArrayLike, lam: float) -> float:
    """‖x̃ − Σ_g W_g z_g‖² + 2λ Σ_g ‖z_g‖₂ for one centred point x̃ (D,), W (n_b, D, q), z (n_b, q).

    The block ℓ_{2,1} objective of docs/bsf.md §1 (docs/theory.md objective (1) per point, with the
    ℓ₁ penalty replaced by ℓ_{2,1}).
    """
    x = _point(x)
    W = _dictionary(W, x.shape[0])
    z = _blocks(z, "z")
    if z.shape != (W.shape[0], W.shape[2]):
        raise ValueError(f"z must have shape (n_b, q) = {(W.shape[0], W.shape[2])}, got {z.shape}")
    resid = x - np.einsum("gdq,gq->d", W, z)
    return float(resid @ resid + 2.0 * check_lam(lam, zero=True) * np.linalg.norm(z, axis=-1).sum())


def block_wide_bound(x: ArrayLike, lam: float, op_norm: float = 1.0) -> float:
    """h_{λ/σ}(‖x̃‖) with σ = ``op_norm``: a lower bound of :func:`block_wide_objective` over all codes
    and all dictionaries with max_g ‖W_g‖₂ ≤ σ (docs/bsf.md §1; docs/theory.md §4.1 bound (6)).

    The default σ = 1 gives the spec's bound h_λ(‖x̃‖). Proof: y = Σ_g W_g z_g has
    ‖y‖ ≤ Σ_g ‖W_g‖₂‖z_g‖ ≤ σΣ_g‖z_g‖, so the objective is ≥ ‖x̃ − y‖² + (2λ/σ)‖y‖ ≥
    min_y(‖x̃ − y‖² + 2(λ/σ)‖y‖) = h_{λ/σ}(‖x̃‖). Since h_λ is increasing in λ, σ < 1 (e.g.
    unit-Frobenius blocks of rank ≥ 2) gives a bound strictly above h_λ(‖x̃‖) when ‖x̃‖ > λ, so such
    blocks cannot attain h_λ. Equality: the block σ·W_g with W_g orthonormal and x̃ ∈ span(W_g).
    """
    if not (np.isfinite(op_norm) and op_norm > 0):
        raise ValueError(f"op_norm must be a finite number > 0, got {op_norm!r}")
    return float(huber(np.linalg.norm(_point(x)), check_lam(lam, zero=True) / op_norm))


def _orthonormal_block(W_g: ArrayLike, D: int, tol: float) -> NDArray[np.float64]:
    W_g = np.asarray(W_g, dtype=np.float64)
    if W_g.ndim != 2 or W_g.shape[0] != D:
        raise ValueError(f"W_g must have shape (D={D}, q), got {W_g.shape}")
    err = np.max(np.abs(W_g.T @ W_g - np.eye(W_g.shape[1])))
    if not err <= tol:
        raise ValueError(f"W_g must have orthonormal columns (max |W_gᵀW_g − I| = {err:.2e} > {tol:.0e})")
    return W_g


def orthonormal_block_code(W_g: ArrayLike, x: ArrayLike, lam: float, *, tol: float = 1e-10) -> NDArray[np.float64]:
    """argmin_z ‖x̃ − W_g z‖² + 2λ‖z‖ for an orthonormal block (W_gᵀW_g = I_q): the group
    soft-threshold z = max(0, 1 − λ/‖W_gᵀx̃‖)·W_gᵀx̃ = sh_λ(W_gᵀx̃) (docs/bsf.md §1).

    With u = W_gᵀx̃ the objective is ‖x̃ − W_gu‖² + ‖u − z‖² + 2λ‖z‖ (Pythagoras), whose minimiser
    is the prox of λ‖·‖ at u. When x̃ ∈ span(W_g) the value is h_λ(‖x̃‖), attaining
    :func:`block_wide_bound`; the reconstruction is (‖x̃‖ − λ)₊ x̃/‖x̃‖ as in docs/theory.md §4.2.
    """
    x = _point(x)
    W_g = _orthonormal_block(W_g, x.shape[0], tol)
    return block_soft_threshold((W_g.T @ x)[None, :], check_lam(lam, zero=True))[0]


def orthonormal_block_value(W_g: ArrayLike, x: ArrayLike, lam: float, *, tol: float = 1e-10) -> float:
    """The optimal value for one orthonormal block: ‖x̃‖² − ‖u‖² + h_λ(‖u‖), u = W_gᵀx̃ (docs/bsf.md §1).

    Since h_λ(ρ) − ρ² = −((ρ − λ)₊)² is non-increasing and ‖u‖ ≤ ‖x̃‖, the value is ≥ h_λ(‖x̃‖),
    with equality iff x̃ ∈ span(W_g) (‖u‖ = ‖x̃‖) or ‖x̃‖ ≤ λ.
    """
    x = _point(x)
    u = _orthonormal_block(W_g, x.shape[0], tol).T @ x
    return float(x @ x - u @ u + huber(np.linalg.norm(u), check_lam(lam, zero=True)))


def lam_from_group_lasso_coef(c: float, D: int) -> float:
    """λ = c·D/2 (docs/bsf.md §1, "λ conversion").

    The group-lasso loss per sample, (1/D)‖x − x̂‖² + c Σ_g‖z_g‖, is 1/D times
    ‖x − x̂‖² + 2λ Σ_g‖z_g‖ with 2λ = cD, so both have the same minimisers.
    """
    if not (np.isfinite(c) and c >= 0):
        raise ValueError(f"c must be a finite number >= 0, got {c!r}")
    if isinstance(D, bool) or not isinstance(D, (int, np.integer)) or D < 1:
        raise ValueError(f"D must be a positive int, got {D!r}")
    return float(c) * int(D) / 2.0
