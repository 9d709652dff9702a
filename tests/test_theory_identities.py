"""Hypothesis properties of the theory identities (docs/theory.md §2, §4, §5.1)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.theory.certificate import cert_ratio, certificate_matrix, certificate_slack, certified_gap
from dictcheck.theory.dense_scalar import dense_scalar_optimum
from dictcheck.theory.huber import (
    huber, huber_objective, huber_objective_gradient, huber_objective_hessian, per_point_bound_attainer,
)
from dictcheck.theory.objective import (
    centred, q_program, q_program_gradient, q_residuals, ridge_decoder, sae_objective, scaled_objective,
    to_balanced, to_unit_atoms,
)
from dictcheck.theory.symbolic import am_gm_rescaling, dense_scalar_bias, huber_piecewise_minimum
from dictcheck.theory.wide_limit import diagonal_q_program_value, wide_optimum_at_bias

seeds = st.integers(0, 2**32 - 1)
lams = st.floats(0.05, 3.0)


def _instance(seed: int, sparse: bool = True):
    rng = np.random.default_rng(seed)
    D, N, d_z = rng.integers(1, 6), rng.integers(1, 9), rng.integers(1, 7)
    X, b = rng.normal(size=(D, N)) * 2, rng.normal(size=D)
    Z = rng.exponential(size=(d_z, N))
    if sparse:
        Z *= rng.random((d_z, N)) < 0.6
    return rng, X, b, Z


@settings(max_examples=60, deadline=None)
@given(seeds, lams)
def test_min_over_W_of_form_2_equals_J(seed: int, lam: float) -> None:
    _, X, b, Z = _instance(seed)
    W = ridge_decoder(Z, centred(X, b), lam)
    assert scaled_objective(W, Z, b, X, lam) == pytest.approx(q_program(Z.T @ Z, b, X, lam), rel=1e-10, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seeds, lams)
def test_ridge_decoder_is_the_minimiser(seed: int, lam: float) -> None:
    rng, X, b, Z = _instance(seed)
    W = ridge_decoder(Z, centred(X, b), lam)
    base = scaled_objective(W, Z, b, X, lam)
    for _ in range(5):
        assert scaled_objective(W + 1e-3 * rng.normal(size=W.shape), Z, b, X, lam) >= base - 1e-12


@settings(max_examples=40, deadline=None)
@given(seeds, lams)
def test_ridge_identities_R_and_W(seed: int, lam: float) -> None:
    _, X, b, Z = _instance(seed)
    Xc = centred(X, b)
    W = ridge_decoder(Z, Xc, lam)
    R = q_residuals(Z.T @ Z, Xc, lam)
    np.testing.assert_allclose(R, Xc - W @ Z, atol=1e-10 * (1 + np.abs(Xc).max()))
    np.testing.assert_allclose(W, R @ Z.T / lam, atol=1e-9 * (1 + np.abs(W).max()))


@settings(max_examples=30, deadline=None)
@given(seeds, lams)
def test_q_gradient_matches_finite_differences(seed: int, lam: float) -> None:
    rng, X, b, Z = _instance(seed, sparse=False)
    Q = Z.T @ Z
    g = q_program_gradient(Q, b, X, lam)
    E = rng.normal(size=Q.shape)
    E = (E + E.T) / 2
    # Fourth-order central differences (f(±h), f(±2h)): J's third derivative grows like λ⁻⁴, so the
    # second-order rule's h² error reached 19× the tolerance at λ ≈ 0.06 (h = 1e-5; seed 210, λ = 1/16
    # failed in a run). The fourth-order rule at h = 1e-4 used at most 0.21 of it on 3000 instances
    # (half of them with λ < 0.1), balancing its h⁴ truncation against the rounding of J (ε·|J|/h).
    h = 1e-4

    def derivative(f) -> float:
        return (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)

    fd_Q = derivative(lambda t: q_program(Q + t * E, b, X, lam))
    assert fd_Q == pytest.approx(np.sum(g.grad_Q * E), rel=1e-6, abs=1e-8)
    e = rng.normal(size=b.shape)
    fd_b = derivative(lambda t: q_program(Q, b + t * e, X, lam))
    assert fd_b == pytest.approx(g.grad_b @ e, rel=1e-6, abs=1e-8)
    np.testing.assert_allclose(g.G, lam - g.R.T @ g.R / lam)


@settings(max_examples=60, deadline=None)
@given(seeds, lams)
def test_am_gm_rescaling_bounds_objective_1_by_form_2(seed: int, lam: float) -> None:
    rng, X, b, Z = _instance(seed)
    W = rng.normal(size=(X.shape[0], Z.shape[0]))
    W_unit, Z_unit = to_unit_atoms(W, Z)
    assert sae_objective(W_unit, Z_unit, b, X, lam) <= scaled_objective(W, Z, b, X, lam) + 1e-10
    W_bal, Z_bal = to_balanced(W_unit, Z_unit)
    live = np.abs(Z_unit).sum(axis=1) > 0
    np.testing.assert_allclose(np.linalg.norm(W_bal, axis=0)[live], np.abs(Z_bal).sum(axis=1)[live], rtol=1e-12)
    assert scaled_objective(W_bal, Z_bal, b, X, lam) == pytest.approx(sae_objective(W_unit, Z_unit, b, X, lam), rel=1e-10)
    np.testing.assert_allclose(W_bal @ Z_bal, W @ Z, atol=1e-10 * (1 + np.abs(W @ Z).max()))


def test_am_gm_symbolic() -> None:
    s2, minimum = am_gm_rescaling()
    assert str(s2) == "c/a"
    assert str(minimum) == "2*a*c*lambda"


@settings(max_examples=80, deadline=None)
@given(st.floats(0, 10), lams)
def test_huber_is_twice_scipy_huber_and_the_symbolic_piecewise_minimum(rho: float, lam: float) -> None:
    assert huber(rho, lam) == pytest.approx(2 * scipy.special.huber(lam, rho), rel=1e-12, abs=1e-15)
    expr = huber_piecewise_minimum()
    symbols = {s.name: s for s in expr.free_symbols}
    assert float(expr.subs({symbols["rho"]: rho, symbols["lambda"]: lam})) == pytest.approx(float(huber(rho, lam)), rel=1e-12, abs=1e-15)
    t = np.linspace(0, rho + 1, 20001)
    assert np.min((rho - t) ** 2 + 2 * lam * t) >= float(huber(rho, lam)) - 1e-12


@settings(max_examples=60, deadline=None)
@given(seeds, lams)
def test_per_point_bound_6_and_its_attainer(seed: int, lam: float) -> None:
    rng = np.random.default_rng(seed)
    D, d_z = rng.integers(1, 5), rng.integers(1, 8)
    W = rng.normal(size=(D, d_z))
    W /= np.linalg.norm(W, axis=0)
    x = rng.normal(size=(D, 1)) * 2
    bound = float(huber(np.linalg.norm(x), lam))
    for _ in range(20):
        z = rng.exponential(size=(d_z, 1)) * (rng.random((d_z, 1)) < 0.5)
        assert np.sum((x - W @ z) ** 2) + 2 * lam * np.sum(z) >= bound - 1e-12
    y = per_point_bound_attainer(x, lam)
    assert np.sum((x - y) ** 2) + 2 * lam * np.linalg.norm(y) == pytest.approx(bound, rel=1e-12, abs=1e-14)


def test_per_point_bound_spec_values() -> None:
    np.testing.assert_allclose(huber([0.2, 0.4, 1.0, 3.0], 0.4), [0.04, 0.16, 0.64, 2.24])


@settings(max_examples=60, deadline=None)
@given(seeds, lams)
def test_certificate_lemma_copositive_iff_residuals_within_lambda(seed: int, lam: float) -> None:
    rng = np.random.default_rng(seed)
    D, N = rng.integers(1, 5), rng.integers(1, 8)
    R = rng.normal(size=(D, N))
    G = certificate_matrix(R, lam)
    simplex = rng.dirichlet(np.ones(N), size=200)
    quad = np.einsum("ki,ij,kj->k", simplex, G, simplex)
    if cert_ratio(R, lam) <= 1:
        assert quad.min() >= -1e-12
        assert G.min() >= -1e-12  # and then G is entrywise non-negative: in the DNN dual cone
    else:
        i = int(np.argmax(np.linalg.norm(R, axis=0)))
        assert G[i, i] < 0  # the violated vertex e_i


@settings(max_examples=60, deadline=None)
@given(seeds, lams)
def test_diagonal_q_minimised_at_soft_threshold(seed: int, lam: float) -> None:
    rng = np.random.default_rng(seed)
    X, b = rng.normal(size=(3, 7)) * 1.5, rng.normal(size=3) * 0.3
    opt = wide_optimum_at_bias(X, b, lam)
    assert diagonal_q_program_value(opt.q_diag, opt.rho, lam) == pytest.approx(opt.value, rel=1e-12)
    assert q_program(np.diag(opt.q_diag), b, X, lam) == pytest.approx(opt.value, rel=1e-12)
    for _ in range(10):
        q = np.maximum(opt.q_diag + 0.1 * rng.normal(size=opt.q_diag.shape), 0)
        assert diagonal_q_program_value(q, opt.rho, lam) >= opt.value - 1e-12
    np.testing.assert_allclose(np.linalg.norm(opt.residuals[:, opt.represented], axis=0), lam)
    # complementary slackness ⟨G, Q*⟩/N = 0 at the closed-form optimum (spec §2.3)
    assert certificate_slack(opt.residuals, np.diag(opt.q_diag), lam) == pytest.approx(0.0, abs=1e-12)
    assert opt.value == pytest.approx(huber_objective(b, X, lam))


@settings(max_examples=40, deadline=None)
@given(seeds, lams)
def test_huber_gradient_finite_differences(seed: int, lam: float) -> None:
    rng = np.random.default_rng(seed)
    X, b, e = rng.normal(size=(3, 9)), rng.normal(size=3), rng.normal(size=3)
    h = 1e-6
    fd = (huber_objective(b + h * e, X, lam) - huber_objective(b - h * e, X, lam)) / (2 * h)
    assert fd == pytest.approx(huber_objective_gradient(b, X, lam) @ e, rel=1e-5, abs=1e-8)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.02, 0.98).filter(lambda p: abs(p - 0.5) > 1e-3), st.floats(0.05, 0.9), st.floats(2.0, 5.0))
def test_dense_scalar_closed_form_against_brute_force(p: float, lam: float, a_factor: float) -> None:
    a = lam * a_factor  # a ≥ 2λ: the closed form's regime
    opt = dense_scalar_optimum(p, a, lam)
    grid = np.linspace(-0.5, a + 0.5, 200001)
    values = (1 - p) * huber(np.abs(grid), lam) + p * huber(np.abs(a - grid), lam)
    assert opt.objective == pytest.approx(values.min(), abs=1e-8)
    assert opt.b == pytest.approx(grid[np.argmin(values)], abs=2e-5)
    b_sym, v_sym = dense_scalar_bias()
    subs = {s: {"lambda": lam, "p": p, "a": a}[s.name] for s in b_sym.free_symbols | v_sym.free_symbols}
    if p < 0.5:
        assert float(b_sym.subs(subs)) == pytest.approx(opt.b, rel=1e-12)
        assert float(v_sym.subs(subs)) == pytest.approx(opt.objective, rel=1e-12)


def test_dense_scalar_closed_form_rejects_degenerate_regimes() -> None:
    with pytest.raises(ValueError):
        dense_scalar_optimum(0.5, 2.0, 0.1)
    with pytest.raises(ValueError):
        dense_scalar_optimum(0.3, 2.0, 1.5)


@settings(max_examples=30, deadline=None)
@given(seeds, lams)
def test_certified_gap_bounds_the_true_gap(seed: int, lam: float) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(2, 12))
    grid = np.stack(np.meshgrid(np.linspace(-2, 2, 201), np.linspace(-2, 2, 201)), -1).reshape(-1, 2)
    best = min(huber_objective(g, X, lam) for g in grid[::7])
    b = rng.normal(size=2) * 0.5
    value = huber_objective(b, X, lam) + 0.01  # any candidate attaining H(b) + 0.01
    gap = certified_gap(value, b, X, lam, learned_bias=True)
    assert gap.gap_at_bias == pytest.approx(0.01)
    assert gap.certified_gap >= value - best - 1e-9


@settings(max_examples=40, deadline=None)
@given(seeds, lams)
def test_huber_hessian_finite_differences(seed: int, lam: float) -> None:
    rng = np.random.default_rng(seed)
    X, b, e = rng.normal(size=(3, 9)), rng.normal(size=3), rng.normal(size=3)
    h = 1e-6
    fd = (huber_objective_gradient(b + h * e, X, lam) - huber_objective_gradient(b - h * e, X, lam)) / (2 * h)
    rho = np.linalg.norm(X - b[:, None], axis=0)
    if np.min(np.abs(rho - lam)) < 1e-4:
        return  # a point on the knee of h_λ: H is not twice differentiable there
    np.testing.assert_allclose(fd, huber_objective_hessian(b, X, lam) @ e, rtol=1e-5, atol=1e-7)
