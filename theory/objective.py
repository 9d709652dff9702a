"""Objective (1), its scaling-symmetric form (2) and the program J(Q, b) over Q = ZᵀZ (3).

docs/theory.md §1–§2. Shapes: X (D, N) points as columns, W (D, d_z), Z (d_z, N), b (D,).
Every value is a mean over the N points.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray


def check_lam(lam: object, name: str = "lam", *, zero: bool = False) -> float:
    """λ of objective (1) (or another sparsity price) as a float: a finite real number > 0 (≥ 0 with ``zero``);
    ValueError naming ``name`` otherwise. Every layer validates λ with this function."""
    ok = isinstance(lam, (numbers.Real, np.floating, np.integer)) and not isinstance(lam, bool)
    if not ok or not math.isfinite(lam) or lam < 0 or (lam == 0 and not zero):
        raise ValueError(f"{name} must be a finite number {'>=' if zero else '>'} 0, got {lam!r}")
    return float(lam)


def centred(X: NDArray, b: ArrayLike) -> NDArray[np.float64]:
    """X̃ = X − b1ᵀ (spec §0)."""
    return np.asarray(X, dtype=np.float64) - np.asarray(b, dtype=np.float64).reshape(-1, 1)


def sae_objective(W: NDArray, Z: NDArray, b: ArrayLike, X: NDArray, lam: float) -> float:
    """Objective (1): O = (1/N) Σ_i [‖W z_i + b − x_i‖² + 2λ‖z_i‖₁] (spec §1).

    The caller supplies unit-norm atoms (columns of W) and Z ≥ 0; this function evaluates the
    formula as written and does not renormalise.
    """
    R = centred(X, b) - W @ Z
    N = R.shape[1]
    return float((np.sum(R * R) + 2.0 * lam * np.sum(np.abs(Z))) / N)


def scaled_objective(W: NDArray, Z: NDArray, b: ArrayLike, X: NDArray, lam: float) -> float:
    """Form (2): F = (1/N)[‖X̃ − WZ‖_F² + λ‖W‖_F² + λ Σ_d ‖z_d·‖₁²] with W unconstrained (spec §2.1)."""
    R = centred(X, b) - W @ Z
    N = R.shape[1]
    row_l1 = np.sum(np.abs(Z), axis=1)
    return float((np.sum(R * R) + lam * np.sum(W * W) + lam * np.sum(row_l1**2)) / N)


def to_unit_atoms(W: NDArray, Z: NDArray) -> tuple[NDArray, NDArray]:
    """Conversion (2) → (1): ŵ_d = w_d/‖w_d‖ and unit-atom codes ‖w_d‖ z_d· (spec §2.1).

    Atoms of zero norm are returned as zero columns with zero codes (dead latents).
    """
    norms = np.linalg.norm(W, axis=0)
    safe = np.where(norms > 0, norms, 1.0)
    return W / safe, Z * norms[:, None]


def to_balanced(W_unit: NDArray, Z_unit: NDArray) -> tuple[NDArray, NDArray]:
    """Conversion (1) → (2): w_d = √‖z_d·‖₁ ŵ_d, z_d· ← z_d·/√‖z_d·‖₁, so ‖w_d‖ = ‖z_d·‖₁ (spec §2.1).

    Dead latents (z_d· = 0) get a zero atom and zero codes. The reconstruction WZ is unchanged.
    """
    l1 = np.sum(np.abs(Z_unit), axis=1)
    root = np.sqrt(l1)
    safe = np.where(root > 0, root, 1.0)
    return W_unit * root, Z_unit / safe[:, None]


def ridge_decoder(Z: NDArray, X_centred: NDArray, lam: float) -> NDArray[np.float64]:
    """W*(Z) = X̃ Zᵀ (ZZᵀ + λI)⁻¹, the minimiser of ‖X̃ − WZ‖² + λ‖W‖² over W (spec §2.2)."""
    d_z = Z.shape[0]
    gram = Z @ Z.T + lam * np.eye(d_z)
    return np.linalg.solve(gram, Z @ X_centred.T).T


def q_residuals(Q: NDArray, X_centred: NDArray, lam: float) -> NDArray[np.float64]:
    """R = X̃ − W*Z = λ X̃ (Q + λI_N)⁻¹ at the ridge optimum (spec §2.2)."""
    N = Q.shape[0]
    return lam * np.linalg.solve(Q + lam * np.eye(N), X_centred.T).T


def q_program(Q: NDArray, b: ArrayLike, X: NDArray, lam: float) -> float:
    """Program (3): J(Q, b) = (λ/N)[tr(X̃ (Q + λI)⁻¹ X̃ᵀ) + 1ᵀQ1] (spec §2.2).

    For Q = ZᵀZ with balanced Z ≥ 0, J equals min over W of form (2).
    """
    Xc = centred(X, b)
    N = Xc.shape[1]
    inv_xt = np.linalg.solve(Q + lam * np.eye(N), Xc.T)
    return float(lam / N * (np.sum(Xc.T * inv_xt) + np.sum(Q)))


@dataclass(frozen=True)
class QGradient:
    """∇_Q J = G/N with G = λ11ᵀ − RᵀR/λ, and ∇_b J = −(2/N) R1 (spec §2.2)."""

    grad_Q: NDArray[np.float64]
    grad_b: NDArray[np.float64]
    G: NDArray[np.float64]
    R: NDArray[np.float64]


def q_program_gradient(Q: NDArray, b: ArrayLike, X: NDArray, lam: float) -> QGradient:
    """Gradients of J(Q, b) in Q and b (spec §2.2)."""
    Xc = centred(X, b)
    N = Xc.shape[1]
    R = q_residuals(Q, Xc, lam)
    G = lam * np.ones((N, N)) - R.T @ R / lam
    return QGradient(grad_Q=G / N, grad_b=-2.0 * R.sum(axis=1) / N, G=G, R=R)
