"""Sympy derivations of the identities the theory rests on (docs/theory.md §2.1, §4.1, §5.1;
docs/bsf.md §6, §9 for the manifold variance fractions).

Each function derives a result symbolically and returns the derived expression, so tests and
checks can compare it with the closed forms used numerically elsewhere.
"""

from __future__ import annotations

import sympy as sp


def am_gm_rescaling() -> tuple[sp.Expr, sp.Expr]:
    """min_{s>0} λ(s²a² + c²/s²) = 2λac at s² = c/a (spec §2.1). Returns (minimiser s², minimum)."""
    s, a, c, lam = sp.symbols("s a c lambda", positive=True)
    f = lam * (s**2 * a**2 + c**2 / s**2)
    (s_star,) = sp.solve(sp.diff(f, s), s)
    return sp.simplify(s_star**2), sp.simplify(f.subs(s, s_star))


def huber_piecewise_minimum() -> sp.Piecewise:
    """min_{t≥0} (ρ − t)² + 2λt = h_λ(ρ) (spec §4.1): derived by cases on the stationary point.

    The unconstrained minimiser is t = ρ − λ; it is feasible iff ρ ≥ λ, otherwise t = 0.
    """
    rho, lam, t = sp.symbols("rho lambda t", positive=True)
    f = (rho - t) ** 2 + 2 * lam * t
    (t_star,) = sp.solve(sp.diff(f, t), t)
    inner = sp.expand(f.subs(t, t_star))
    boundary = f.subs(t, 0)
    return sp.Piecewise((boundary, rho <= lam), (inner, True))


def dense_scalar_bias() -> tuple[sp.Expr, sp.Expr]:
    """b* = λp/(1 − p) and the optimal value for the 1-D toy with p < 1/2, a ≥ 2λ (spec §5.1).

    For b ∈ [0, λ] the zeros lie within λ (cost b²) and the actives beyond λ (cost
    2λ(a − b) − λ²), so H(b) = (1 − p)b² + p(2λ(a − b) − λ²). Returns (b*, H(b*)).
    """
    b, lam, p, a = sp.symbols("b lambda p a", positive=True)
    H = (1 - p) * b**2 + p * (2 * lam * (a - b) - lam**2)
    (b_star,) = sp.solve(sp.diff(H, b), b)
    return sp.simplify(b_star), sp.simplify(H.subs(b, b_star))


def analytic_best_direction_fraction(kind: str) -> sp.Rational:
    """Exact λ_max(Cov)/tr(Cov) for the uniform circle, S² and Clifford torus (docs/bsf.md §9), by sympy integration.

    Cov = E[φφᵀ] (every such manifold has E φ = 0) with the uniform measure of docs/bsf.md §5.
    """
    a, b = sp.symbols("a b", real=True)
    if kind == "circle":
        phi = sp.Matrix([sp.cos(a), sp.sin(a)])
        cov = (phi * phi.T).applyfunc(lambda f: sp.integrate(f, (a, 0, 2 * sp.pi)) / (2 * sp.pi))
    elif kind == "sphere":  # polar angle a ∈ [0, π], azimuth b, area element sin a
        phi = sp.Matrix([sp.sin(a) * sp.cos(b), sp.sin(a) * sp.sin(b), sp.cos(a)])
        cov = (phi * phi.T).applyfunc(
            lambda f: sp.integrate(sp.integrate(f * sp.sin(a), (b, 0, 2 * sp.pi)), (a, 0, sp.pi)) / (4 * sp.pi))
    elif kind == "torus":
        phi = sp.Matrix([sp.cos(a), sp.sin(a), sp.cos(b), sp.sin(b)]) / sp.sqrt(2)
        cov = (phi * phi.T).applyfunc(
            lambda f: sp.integrate(sp.integrate(f, (a, 0, 2 * sp.pi)), (b, 0, 2 * sp.pi)) / (4 * sp.pi**2))
    else:
        raise ValueError(f"kind must be 'circle', 'sphere' or 'torus', got {kind!r}")
    eig = max(cov.eigenvals(), key=lambda e: float(e))
    return sp.nsimplify(sp.simplify(eig / cov.trace()))


def analytic_nonnegative_circle_r2() -> sp.Rational:
    """Exact R² of a non-negative atom on the uniform unit circle (docs/bsf.md §6, §9).

    With w = e₁ and t = (cos θ)_+: E‖m − t w‖² = E‖m‖² − E[t²], so R² = E[(cos θ)_+²]/E‖m‖²
    = (1/2π)∫_{−π/2}^{π/2} cos²θ dθ.
    """
    a = sp.symbols("a", real=True)
    return sp.nsimplify(sp.integrate(sp.cos(a) ** 2, (a, -sp.pi / 2, sp.pi / 2)) / (2 * sp.pi))
