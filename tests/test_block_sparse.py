"""Tests for theory.block_sparse (docs/bsf.md §1, §2; docs/theory.md §4.1)."""

from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers.block_lasso import numeric_l21_prox, solve_block_lasso
from dictcheck.theory.block_sparse import (
    block_norms,
    block_soft_threshold,
    block_topk,
    block_wide_bound,
    block_wide_objective,
    l21_norm,
    lam_from_group_lasso_coef,
    orthonormal_block_code,
    orthonormal_block_value,
)
from dictcheck.theory.huber import huber, per_point_bound_attainer

SOLVER_TOL = 1e-6  # the cvxpy/Clarabel references of solvers.block_lasso (1e-9, then 1e-10)
seeds = st.integers(0, 2**32 - 1)


def _random_blocks(rng: np.random.Generator, n_b: int, q: int, theta: float) -> np.ndarray:
    """Blocks with norms spread over [0.1θ, 3θ]: some below and some above the threshold."""
    a = rng.normal(size=(n_b, q))
    return a * theta * rng.uniform(0.1, 3.0, size=(n_b, 1)) / np.linalg.norm(a, axis=1, keepdims=True)


# ----------------------------------------------------------------------------------------------- sh_θ


@settings(max_examples=15, deadline=None)
@given(seed=seeds, n_b=st.integers(1, 4), q=st.integers(1, 4), theta=st.floats(0.05, 2.0))
def test_soft_threshold_is_the_l21_prox(seed, n_b, q, theta):
    a = _random_blocks(np.random.default_rng(seed), n_b, q, theta)
    np.testing.assert_allclose(block_soft_threshold(a, theta), numeric_l21_prox(a, theta), atol=SOLVER_TOL)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, n_b=st.integers(1, 5), q=st.integers(1, 4), theta=st.floats(0.05, 2.0))
def test_soft_threshold_shrinks_each_norm_by_theta(seed, n_b, q, theta):
    a = _random_blocks(np.random.default_rng(seed), n_b, q, theta)
    z = block_soft_threshold(a, theta)
    np.testing.assert_allclose(block_norms(z), np.maximum(block_norms(a) - theta, 0.0), atol=1e-12)
    # Each block is docs/theory.md §4.1's per-point minimiser (‖a_g‖ − θ)₊ a_g/‖a_g‖ (columns there).
    np.testing.assert_allclose(z, per_point_bound_attainer(a.T, theta).T, atol=1e-12)


def test_soft_threshold_edge_cases():
    a = np.array([[0.0, 0.0], [3.0, 4.0]])
    np.testing.assert_array_equal(block_soft_threshold(a, 0.0), a)  # θ = 0: identity
    np.testing.assert_allclose(block_soft_threshold(a, 1.0), [[0.0, 0.0], [2.4, 3.2]])  # 0 stays 0 (clamp)
    np.testing.assert_allclose(block_soft_threshold(a[None], 1.0)[0], block_soft_threshold(a, 1.0))  # batched
    assert l21_norm(a) == pytest.approx(5.0)


@pytest.mark.parametrize("bad", [
    lambda: block_soft_threshold(np.ones((2, 2)), -0.1),
    lambda: block_soft_threshold(np.ones((2, 2)), float("nan")),
    lambda: block_soft_threshold(np.ones(3), 0.1),
    lambda: block_soft_threshold(np.array([[np.inf, 0.0]]), 0.1),
    lambda: block_topk(np.ones((3, 2)), 0),
    lambda: block_topk(np.ones((3, 2)), 4),
    lambda: block_topk(np.ones((3, 2)), 1.5),
    lambda: block_wide_bound(np.ones(2), -1.0),
    lambda: block_wide_bound(np.ones(2), 0.5, op_norm=0.0),
    lambda: block_wide_objective(np.ones(2), np.ones((1, 3, 1)), np.ones((1, 1)), 0.5),
    lambda: block_wide_objective(np.ones(2), np.ones((1, 2, 1)), np.ones((2, 1)), 0.5),
    lambda: orthonormal_block_code(np.ones((2, 2)), np.ones(2), 0.5),
    lambda: lam_from_group_lasso_coef(-1.0, 4),
    lambda: lam_from_group_lasso_coef(0.01, 0),
])
def test_bad_input_raises(bad):
    with pytest.raises(ValueError):
        bad()


# ----------------------------------------------------------------------------------------------- Π_k


def _brute_force_projection(a: np.ndarray, k: int) -> np.ndarray:
    """argmin over all supports S with |S| ≤ k of ‖a − a·1_S‖² (the restriction is optimal for a fixed S)."""
    n_b = a.shape[0]
    best, best_dist = None, np.inf
    for size in range(k + 1):
        for S in itertools.combinations(range(n_b), size):
            z = np.zeros_like(a)
            z[list(S)] = a[list(S)]
            dist = np.sum((a - z) ** 2)
            if dist < best_dist:
                best, best_dist = z, dist
    return best


@settings(max_examples=40, deadline=None)
@given(seed=seeds, n_b=st.integers(1, 6), q=st.integers(1, 3), data=st.data())
def test_block_topk_is_the_projection_onto_k_block_sparse_sets(seed, n_b, q, data):
    k = data.draw(st.integers(1, n_b))
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n_b, q))
    # Distinct block norms (the spec: tests avoid ties): norms 1, 2, ..., n_b in random order.
    a *= rng.permutation(np.arange(1, n_b + 1))[:, None] / np.linalg.norm(a, axis=1, keepdims=True)
    np.testing.assert_array_equal(block_topk(a, k), _brute_force_projection(a, k))
    assert np.count_nonzero(block_norms(block_topk(a, k))) == k


def test_block_topk_ties_go_to_the_lowest_index():
    a = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, -1.0], [1.0, 0.0]])  # norms 1, 2, 1, 1
    np.testing.assert_array_equal(block_topk(a, 2), [[1.0, 0.0], [0.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    batched = block_topk(np.stack([a, a[::-1]]), 2)
    np.testing.assert_array_equal(batched[1], [[1.0, 0.0], [0.0, 0.0], [0.0, 2.0], [0.0, 0.0]])


# ----------------------------------------------------------------------------------------------- wide limit


def _op_norm_dictionary(rng: np.random.Generator, n_b: int, D: int, q: int, sigma: float) -> np.ndarray:
    W = rng.normal(size=(n_b, D, q))
    return W * sigma * rng.uniform(0.2, 1.0, size=(n_b, 1, 1)) / np.linalg.norm(W, ord=2, axis=(1, 2))[:, None, None]


@settings(max_examples=15, deadline=None)
@given(seed=seeds, D=st.integers(1, 4), n_b=st.integers(1, 4), q=st.integers(1, 3), lam=st.floats(0.05, 1.5),
       sigma=st.floats(0.3, 1.0))
def test_block_lasso_value_is_at_least_the_huber_bound(seed, D, n_b, q, lam, sigma):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=D) * rng.uniform(0.1, 3.0)
    W = _op_norm_dictionary(rng, n_b, D, q, sigma)  # max_g ‖W_g‖₂ ≤ σ ≤ 1
    value = solve_block_lasso(x, W, lam)[1]
    assert value >= block_wide_bound(x, lam, op_norm=sigma) - SOLVER_TOL
    assert block_wide_bound(x, lam, op_norm=sigma) >= block_wide_bound(x, lam) - 1e-15
    # The bound holds for EVERY code, not just the minimiser.
    for z in rng.normal(size=(5, n_b, q)) * rng.uniform(0.0, 2.0, size=(5, 1, 1)):
        assert block_wide_objective(x, W, z, lam) >= block_wide_bound(x, lam, op_norm=sigma) - 1e-12


@settings(max_examples=15, deadline=None)
@given(seed=seeds, D=st.integers(1, 5), data=st.data(), lam=st.floats(0.05, 1.5), sigma=st.floats(0.3, 1.0))
def test_orthonormal_block_containing_x_attains_the_bound(seed, D, data, lam, sigma):
    q = data.draw(st.integers(1, D))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=D) * rng.uniform(0.1, 3.0)
    frame = np.linalg.qr(np.column_stack([x, rng.normal(size=(D, q - 1))]))[0]  # span contains x
    h = block_wide_bound(x, lam)
    assert h == pytest.approx(float(huber(np.linalg.norm(x), lam)), abs=0.0)
    z = orthonormal_block_code(frame, x, lam)
    assert block_wide_objective(x, frame[None], z[None], lam) == pytest.approx(h, abs=1e-12)
    assert orthonormal_block_value(frame, x, lam) == pytest.approx(h, abs=1e-12)
    # Group soft-threshold of the norm: reconstruction (‖x‖ − λ)₊ x/‖x‖ (docs/theory.md §4.2).
    np.testing.assert_allclose(frame @ z, per_point_bound_attainer(x[:, None], lam)[:, 0], atol=1e-12)
    # Other blocks do not help: the solver's optimum over [frame, random blocks] is still h.
    W = np.concatenate([frame[None], _op_norm_dictionary(rng, 2, D, q, 1.0)])
    assert solve_block_lasso(x, W, lam)[1] == pytest.approx(h, abs=SOLVER_TOL)
    # A scaled block σ·frame attains the sharpened bound h_{λ/σ}.
    assert solve_block_lasso(x, sigma * frame[None], lam)[1] == pytest.approx(
        block_wide_bound(x, lam, op_norm=sigma), abs=SOLVER_TOL)


@settings(max_examples=15, deadline=None)
@given(seed=seeds, D=st.integers(2, 5), data=st.data(), lam=st.floats(0.05, 1.5))
def test_orthonormal_block_value_matches_the_solver(seed, D, data, lam):
    q = data.draw(st.integers(1, D - 1))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=D) * rng.uniform(0.1, 3.0)
    frame = np.linalg.qr(rng.normal(size=(D, q)))[0]  # generic: x not in the span
    z_num, value = solve_block_lasso(x, frame[None], lam)
    assert orthonormal_block_value(frame, x, lam) == pytest.approx(value, abs=SOLVER_TOL)
    np.testing.assert_allclose(orthonormal_block_code(frame, x, lam), z_num[0], atol=1e-5)
    assert orthonormal_block_value(frame, x, lam) >= block_wide_bound(x, lam) - 1e-12


def test_unit_frobenius_rank_two_blocks_cannot_attain_the_bound():
    rng = np.random.default_rng(3)
    x, lam = np.array([2.0, 0.5, -1.0]), 0.4
    W = rng.normal(size=(3, 3, 2))
    W /= np.linalg.norm(W, axis=(1, 2))[:, None, None]  # unit Frobenius, rank 2 ⇒ ‖W_g‖₂ < 1
    sigma = float(np.max(np.linalg.norm(W, ord=2, axis=(1, 2))))
    assert sigma < 1
    value = solve_block_lasso(x, W, lam)[1]
    assert value >= block_wide_bound(x, lam, op_norm=sigma) - SOLVER_TOL
    assert block_wide_bound(x, lam, op_norm=sigma) > block_wide_bound(x, lam)  # strictly: ‖x‖ > λ


@settings(max_examples=10, deadline=None)
@given(seed=seeds, D=st.integers(2, 5), c=st.floats(1e-3, 0.3))
def test_lam_conversion_matches_group_lasso_minimiser(seed, D, c):
    """The minimiser of (1/D)‖x − Wz‖² + c‖z‖ is the wide-limit code at λ = cD/2."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=D)
    frame = np.linalg.qr(rng.normal(size=(D, D - 1)))[0]
    z = cp.Variable(D - 1)
    cp.Problem(cp.Minimize(cp.sum_squares(x - frame @ z) / D + c * cp.norm(z, 2))).solve(solver=cp.CLARABEL)
    lam = lam_from_group_lasso_coef(c, D)
    assert lam == pytest.approx(c * D / 2)
    np.testing.assert_allclose(orthonormal_block_code(frame, x, lam), z.value, atol=1e-5)
