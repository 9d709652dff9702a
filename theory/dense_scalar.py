"""Closed forms for the 1-D dense-scalar toy (docs/theory.md §5.1).

x_i = s_i u with s_i = 0 with probability 1 − p and s_i = a > 0 otherwise. Atoms can only be ±u,
and the wide-limit optimum reduces to min_b (1/N) Σ_i h_λ(|s_i − b|).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DenseScalarOptimum:
    """Optimal bias, mean objective and the atoms used (+u above b, −u below b)."""

    b: float
    objective: float
    uses_plus: bool
    uses_minus: bool


def dense_scalar_optimum(p: float, a: float, lam: float) -> DenseScalarOptimum:
    """Closed-form optimum for constant amplitude a ≥ 2λ and p ≠ 1/2 (spec §5.1).

    p < 1/2: b* = λp/(1 − p), value p(2λa − λ²) − λ²p²/(1 − p), one latent +u.
    p > 1/2: the reflection s → a − s, p → 1 − p: b* = a − λ(1 − p)/p, one latent −u.
    Raises ValueError outside the regime where the closed form is exact.
    """
    if not 0.0 < p < 1.0 or p == 0.5:
        raise ValueError(f"closed form needs 0 < p < 1 and p != 1/2, got p={p}")
    if a < 2.0 * lam:
        raise ValueError(f"closed form needs a >= 2*lam, got a={a}, lam={lam}")
    q = min(p, 1.0 - p)
    shift = lam * q / (1.0 - q)
    value = q * (2.0 * lam * a - lam**2) - lam**2 * q**2 / (1.0 - q)
    if p < 0.5:
        return DenseScalarOptimum(b=shift, objective=value, uses_plus=True, uses_minus=False)
    return DenseScalarOptimum(b=a - shift, objective=value, uses_plus=False, uses_minus=True)
