"""The explicit dual certificate of program (3) and the certified optimality gap (spec §2.3).

Lemma: G = λ11ᵀ − RᵀR/λ is copositive iff max_i ‖r_i‖ ≤ λ. When it holds, G is also entrywise
non-negative, hence in the dual of the doubly-nonnegative cone, so the DNN relaxation is tight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.huber import huber_objective, huber_objective_gradient, point_distances


def certificate_matrix(R: NDArray, lam: float) -> NDArray[np.float64]:
    """G = λ11ᵀ − RᵀR/λ, with R (D, N) the residuals (spec §0, §2.3)."""
    N = R.shape[1]
    return lam * np.ones((N, N)) - R.T @ R / lam


def cert_ratio(R: NDArray, lam: float) -> float:
    """max_i ‖r_i‖/λ; G is copositive iff this is ≤ 1 (spec §2.3, Lemma)."""
    return float(np.max(np.linalg.norm(R, axis=0)) / lam) if R.shape[1] else 0.0


def certificate_slack(R: NDArray, Q: NDArray, lam: float) -> float:
    """Complementary slackness ⟨G, Q⟩/N (spec §2.3, step 2); zero at an optimum."""
    return float(np.sum(certificate_matrix(R, lam) * Q) / R.shape[1])


@dataclass(frozen=True)
class CertifiedGap:
    """certified_gap = gap_b + ‖∇H(b)‖·max_i‖x_i − b‖ (spec §2.3, steps 4–6)."""

    gap_at_bias: float
    bias_term: float

    @property
    def certified_gap(self) -> float:
        return self.gap_at_bias + self.bias_term


def certified_gap(objective_value: float, b: ArrayLike, X: NDArray, lam: float, learned_bias: bool) -> CertifiedGap:
    """Rigorous upper bound on O(candidate) − min O, from the per-point bound (6).

    gap_b = O(candidate) − H(b) ≥ 0 bounds the gap at fixed b. With a learned bias, H convex and its
    minimiser in the convex hull of the data give H(b) − min H ≤ ‖∇H(b)‖·max_i‖x_i − b‖.
    """
    gap_b = objective_value - huber_objective(b, X, lam)
    bias_term = 0.0
    if learned_bias:
        grad = huber_objective_gradient(b, X, lam)
        bias_term = float(np.linalg.norm(grad) * np.max(point_distances(X, b)))
    return CertifiedGap(gap_at_bias=float(gap_b), bias_term=bias_term)
