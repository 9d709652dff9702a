"""How fast the VASAE anchor aligns a dead decoder column under Adam (docs/vasae.md §10).

A dead column w (no reconstruction gradient) feels only λ·L_anchor = −(λ/d_z)·cos(w, e_t), whose
gradient has norm λ sin θ/(d_z‖w‖) and is orthogonal to w. When every coordinate of it is far below
Adam's ε, Adam's step lr·ĝ/(√v̂ + ε) is lr·g/ε: gradient descent with step lr/ε. To first order ‖w‖
stays constant and the angle θ to ê_t obeys

    dθ/dt = −r sin θ,    tan(θ_t/2) = tan(θ_0/2)·e^{−r t},    r = lr·λ / (ε·d_z·‖w‖²).
"""

from __future__ import annotations

import math

__all__ = ["alignment_rate", "steps_to_alignment"]


def alignment_rate(lr: float, lam: float, eps: float, d_z: int, norm_sq: float) -> float:
    """r = lr·λ/(ε·d_z·‖w‖²), the per-step rate of the ε-limited regime (module docstring)."""
    for name, v in (("lr", lr), ("lam", lam), ("eps", eps), ("d_z", d_z), ("norm_sq", norm_sq)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return lr * lam / (eps * d_z * norm_sq)


def steps_to_alignment(s0: float, s: float, rate: float) -> float:
    """Steps for cos θ to go from ``s0`` to ``s`` (−1 < s0 ≤ s < 1) at rate r: ln(tan(θ_0/2)/tan(θ/2))/r."""
    if not (-1.0 < s0 <= s < 1.0):
        raise ValueError(f"need -1 < s0 <= s < 1, got s0={s0!r}, s={s!r}")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
    return math.log(math.tan(math.acos(s0) / 2) / math.tan(math.acos(s) / 2)) / rate
