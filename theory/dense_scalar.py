"""Closed forms for the 1-D dense-scalar toy (docs/theory.md §5.1, §5.5).

x_i = s_i u with s_i = 0 with probability 1 − p and s_i = a > 0 otherwise. Atoms can only be ±u,
and the wide-limit optimum reduces to min_b (1/N) Σ_i h_λ(|s_i − b|) (objective (1), §5.1). Under an L0
price c per active code instead (JumpReLU's loss ‖x − x̂‖² + c‖z‖₀) each point costs min((s_i − b)², c)
when an atom of the residual's sign exists (§5.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


# --------------------------------------------------------------------------------------------------
# The L0 analogue (docs/theory.md §5.5): each point costs min((s − b)², c) with both atoms ±u.

#: The atom sets of a 1-D dictionary: no atom, +u only, −u only, the antipodal pair ±u.
L0_ATOM_SETS = ("none", "+u", "-u", "+u,-u")


def l0_point_costs(s: np.ndarray, b: float | np.ndarray, c: float, atoms: str) -> np.ndarray:
    """Cost of each point of the 1-D L0 objective at bias b with exact codes (docs/theory.md §5.5).

    A point s_i with residual r = s_i − b costs min(r², c) when an atom of r's sign is present (code |r|,
    price c), else r². ``atoms`` is one of :data:`L0_ATOM_SETS`. ``s`` and ``b`` broadcast (e.g. s (1, N)
    against a grid of biases (G, 1)).
    """
    if atoms not in L0_ATOM_SETS:
        raise ValueError(f"atoms must be one of {L0_ATOM_SETS}, got {atoms!r}")
    r = np.asarray(s, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    can_buy = np.zeros(r.shape, dtype=bool)
    if "+u" in atoms:
        can_buy |= r > 0
    if "-u" in atoms:
        can_buy |= r < 0
    sq = r * r
    return np.where(can_buy, np.minimum(sq, float(c)), sq)


@dataclass(frozen=True)
class L0UniformOptimum:
    """Population optimum of the L0 dense scalar with active values U[lo, hi] (docs/theory.md §5.5).

    ``one_latent`` = p·c (b = 0, +u on every active point); ``pair`` = c − p·G at any b with
    [b − √c, b + √c] ⊂ [lo, hi] (the zeros pay c each, the active values within √c of b pay their square);
    ``gain`` G = (4/3)c^{3/2}/(hi − lo); ``p_star`` = 1/(1 + (4/3)√c/(hi − lo)): the pair is strictly better
    iff p > p_star; ``n_latents`` 1 or 2.
    """

    p: float
    one_latent: float
    pair: float
    gain: float
    p_star: float
    n_latents: int

    @property
    def objective(self) -> float:
        return min(self.one_latent, self.pair)


def l0_uniform_threshold(c: float, lo: float, hi: float) -> float:
    """p* = 1/(1 + (4/3)√c/(hi − lo)), where the second (antipodal) latent starts to pay (§5.5).

    Valid when lo ≥ 2√c (no window of width 2√c holds both a zero and an active value) and
    (hi − lo)² ≥ 12c (no atom never beats one atom); ValueError otherwise.
    """
    if not (c > 0 and 0 <= lo < hi):
        raise ValueError(f"need c > 0 and 0 <= lo < hi, got c={c}, lo={lo}, hi={hi}")
    if lo < 2.0 * np.sqrt(c) or (hi - lo) ** 2 < 12.0 * c:
        raise ValueError(f"closed form needs lo >= 2*sqrt(c) and (hi - lo)^2 >= 12c, got c={c}, lo={lo}, hi={hi}")
    return 1.0 / (1.0 + (4.0 / 3.0) * np.sqrt(c) / (hi - lo))


def l0_uniform_optimum(p: float, c: float, lo: float, hi: float) -> L0UniformOptimum:
    """The population optimum of §5.5 at activity p ∈ (0, 1) (regime of :func:`l0_uniform_threshold`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"need 0 < p < 1, got p={p}")
    p_star = l0_uniform_threshold(c, lo, hi)
    gain = (4.0 / 3.0) * c**1.5 / (hi - lo)
    one, pair = p * c, c - p * gain
    return L0UniformOptimum(p=p, one_latent=one, pair=pair, gain=gain, p_star=p_star, n_latents=2 if pair < one else 1)
