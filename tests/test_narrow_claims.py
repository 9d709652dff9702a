"""Tests of the helpers behind the narrow-claims checks (docs/theory.md §2.4, §3.1, §4.6, §4.7): the bisector
curvature closed form against second differences of objective (1) at exact codes, the autograd restricted Hessian
against finite differences, duplicate merging, revival, and the brute-force width-sweep prediction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.data.toys import make_toy
from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.solvers.reference_learner import fit_reference
from dictcheck.solvers.revival import distinct_atoms, fit_with_revival
from dictcheck.solvers.second_order import exact_code_hessian_fd, restricted_hessian
from dictcheck.solvers.wide_limit import solve_wide_limit
from dictcheck.solvers.width_sweep import one_atom_optimum, predict_groups
from dictcheck.theory.huber import huber_objective
from dictcheck.theory.objective import sae_objective
from dictcheck.theory.second_order import bisector_curvature


def _two_ray_points(alpha: float, radii: list[float]) -> np.ndarray:
    """Points at distances ``radii`` on each of the rays at ±α from 0 in the plane."""
    return np.column_stack([r * np.array([np.cos(s * alpha), np.sin(s * alpha)]) for s in (-1, 1) for r in radii])


def _one_atom_objective(theta: float, X: np.ndarray, lam: float) -> float:
    W = np.array([[np.cos(theta)], [np.sin(theta)]])
    return sae_objective(W, exact_codes(W, X, np.zeros(2), lam, tol=1e-12).Z, np.zeros(2), X, lam)


@settings(max_examples=25, deadline=None)
@given(alpha=st.floats(0.05, 1.3), lam=st.floats(0.01, 0.5), data=st.data())
def test_bisector_curvature_equals_second_difference_of_objective_1(alpha, lam, data) -> None:
    low = lam / np.cos(alpha) + 0.05
    radii = data.draw(st.lists(st.floats(low, low + 3.0), min_size=1, max_size=4))
    X = _two_ray_points(alpha, radii)
    rho = np.linalg.norm(X, axis=0)
    h = 1e-4
    fd = (_one_atom_objective(h, X, lam) - 2 * _one_atom_objective(0.0, X, lam) + _one_atom_objective(-h, X, lam)) / h**2
    closed = bisector_curvature(rho, alpha, lam)
    assert abs(fd - closed) <= 1e-5 * max(1.0, abs(closed))
    # and the autograd Hessian restricted to the tangent of the sphere, codes eliminated, is the same number
    W = np.array([[1.0], [0.0]])
    hess = restricted_hessian(W, exact_codes(W, X, np.zeros(2), lam).Z, np.zeros(2), X, lam, learn_bias=False)
    assert hess.gradient_norm <= 1e-12
    assert abs(hess.reduced[0, 0] - closed) <= 1e-9 * max(1.0, abs(closed))


def test_negative_bisector_curvature_is_a_descent_direction() -> None:
    X, lam = _two_ray_points(0.8, [1.0, 1.5, 2.0]), 0.1
    assert bisector_curvature(np.linalg.norm(X, axis=0), 0.8, lam) < 0
    at_saddle = _one_atom_objective(0.0, X, lam)
    assert _one_atom_objective(0.05, X, lam) < at_saddle and _one_atom_objective(-0.05, X, lam) < at_saddle


def test_restricted_hessian_schur_complement_matches_finite_differences_at_exact_codes() -> None:
    toy = make_toy("independent_features", seed=0, N=40)
    W_true = toy.ground_truth["W_true"]
    fit = fit_reference(toy.X, toy.lam, W0=W_true, Z0=np.maximum(toy.ground_truth["Z_true"] - toy.lam, 0.0))
    hess = restricted_hessian(fit.W, fit.Z, fit.b, toy.X, toy.lam, learn_bias=True)
    assert hess.gradient_norm <= 1e-10 and hess.complementarity_margin > 0
    fd = exact_code_hessian_fd(fit.W, fit.b, toy.X, toy.lam, learn_bias=True)
    assert fd.shape == hess.reduced.shape == (3 * 2 + 3, 3 * 2 + 3)
    assert np.max(np.abs(fd - hess.reduced)) <= 1e-5 * np.max(np.abs(hess.reduced))
    assert hess.min_eig > 0 and hess.min_eig_reduced > 0


def test_restricted_hessian_rejects_bad_input() -> None:
    X = np.ones((2, 3))
    with pytest.raises(ValueError, match="unit-norm"):
        restricted_hessian(np.array([[2.0], [0.0]]), np.ones((1, 3)), np.zeros(2), X, 0.1, learn_bias=False)
    with pytest.raises(ValueError, match="shapes disagree"):
        restricted_hessian(np.eye(2), np.ones((1, 3)), np.zeros(2), X, 0.1, learn_bias=False)
    with pytest.raises(ValueError, match="active on the bisector"):
        bisector_curvature([0.05, 1.0], 0.3, 0.1)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_merging_duplicated_and_dead_latents_keeps_objective_1(seed) -> None:
    rng = np.random.default_rng(seed)
    D, N, k = 3, 6, 3
    W = rng.normal(size=(D, k))
    W /= np.linalg.norm(W, axis=0)
    W = np.column_stack([W, W[:, 0], np.zeros(D), W[:, 1]])  # twin of 0, a dead latent, twin of 1
    Z = rng.exponential(size=(k + 3, N)) * (rng.random((k + 3, N)) < 0.6)
    Z[k + 1] = 0.0
    X, b, lam = rng.normal(size=(D, N)), rng.normal(size=D), 0.2
    W_m, Z_m = distinct_atoms(W, Z)
    live = Z.sum(axis=1)[:k] > 0
    assert W_m.shape[1] <= k and W_m.shape[1] >= int(live.sum())
    assert np.isclose(sae_objective(W_m, Z_m, b, X, lam), sae_objective(W, Z, b, X, lam), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="disagree"):
        distinct_atoms(W, Z[:-1])


def test_revival_reaches_the_huber_bound_at_wide_width() -> None:
    rng = np.random.default_rng(3)
    X, lam = rng.normal(size=(2, 6)), 0.3
    bound = huber_objective(np.zeros(2), X, lam)
    for _ in range(3):
        run = fit_with_revival(X, lam, rng.normal(size=(2, 6)), rng.exponential(size=(6, 6)), b0=np.zeros(2),
                               learn_bias=False)
        assert abs(run.fit.objective - bound) <= 1e-9 and not run.irreducible_uncertified
    with pytest.raises(ValueError, match="code rows"):
        fit_with_revival(X, lam, np.ones((2, 3)), np.ones((2, 6)), b0=np.zeros(2), learn_bias=False)


def test_one_atom_optimum_beats_every_in_plane_atom_and_matches_the_learner() -> None:
    X, lam = _two_ray_points(0.6, [1.0, 1.4, 2.0]), 0.1
    plane = np.eye(2)
    f1, u = one_atom_optimum(X, plane, lam)
    rng = np.random.default_rng(0)
    for theta in rng.uniform(-np.pi, np.pi, 40):
        W = np.array([[np.cos(theta)], [np.sin(theta)]])
        assert f1 <= X.shape[1] * sae_objective(W, exact_codes(W, X, np.zeros(2), lam).Z, np.zeros(2), X, lam) + 1e-12
    fit = fit_reference(X, lam, W0=u[:, None], b0=np.zeros(2), learn_bias=False)
    assert abs(fit.objective_sum - f1) <= 1e-9


def test_group_prediction_reaches_the_wide_limit_at_the_number_of_rays() -> None:
    planes = [np.eye(4)[:, :2], np.eye(4)[:, 2:]]
    groups = [P @ _two_ray_points(a, [1.0, 1.7]) for P, a in zip(planes, (0.4, 0.1))]
    X, lam = np.column_stack(groups), 0.1
    pred = predict_groups(groups, planes, lam, [1, 2, 3, 4, 5])
    wide = solve_wide_limit(X, lam, b=np.zeros(4))
    assert wide.n_rays == 4 and abs(pred.objective[4] - wide.objective) <= 1e-12
    assert all(pred.objective[k + 1] <= pred.objective[k] + 1e-15 for k in range(1, 5))
    assert pred.allocation[2] == (1, 1) and pred.allocation[3] == (2, 1) and pred.allocation[4] == (2, 2)
    with pytest.raises(ValueError, match="planes"):
        predict_groups(groups, planes[:1], lam, [1])
