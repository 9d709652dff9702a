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


def analytic_l21_unit_costs(kind: str) -> tuple[sp.Expr, sp.Expr]:
    """Exact ℓ₂,₁ code cost per sample of a unit-norm manifold point (docs/bsf.md §3.3, the group-lasso mechanism):
    ``(one isotropic block, split over rank-1 blocks)`` for the uniform circle, S² and Clifford torus of §5.

    A unit-Frobenius block of rank r that acts isotropically on the manifold's span is W = U/√r (UᵀU = I_r),
    so its contribution c = Wz needs ‖z‖ = √r‖c‖: one block costs √n_j per sample (‖m‖ = 1). Splitting the
    manifold over n_j unit rank-1 blocks along its orthonormal axes costs Σ_a |φ_a|, whose mean is computed
    here by sympy integration: 4/π (circle, against √2), 3/2 (S², against √3), 4√2/π (torus, against 2).
    """
    a, b = sp.symbols("a b", real=True)
    if kind == "circle":  # E(|cos a| + |sin a|) = 2·E|cos a|, and |cos a| is cos a on two half-periods
        split = 2 * 2 * sp.integrate(sp.cos(a), (a, -sp.pi / 2, sp.pi / 2)) / (2 * sp.pi)
        return sp.sqrt(2), sp.nsimplify(split)
    if kind == "sphere":  # E(|x|+|y|+|z|) = 3·E|cos a| over the polar angle (area element sin a)
        split = 3 * 2 * sp.integrate(sp.cos(a) * sp.sin(a), (a, 0, sp.pi / 2)) * 2 * sp.pi / (4 * sp.pi)
        return sp.sqrt(3), sp.nsimplify(split)
    if kind == "torus":  # φ = (cos a, sin a, cos b, sin b)/√2: two circles of radius 1/√2
        circle = analytic_l21_unit_costs("circle")[1]
        return sp.Integer(2), sp.simplify(2 * circle / sp.sqrt(2))
    raise ValueError(f"kind must be 'circle', 'sphere' or 'torus', got {kind!r}")
