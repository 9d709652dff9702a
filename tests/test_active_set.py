"""The compiled phase A of the exact codes (solvers/active_set.py) against the batched torch phase A it
replaces on the CPU, and its hand-over of the points it cannot finish (docs/theory.md §1, KKT-z).

The batched phase A still runs on CUDA and in float32; here it is forced on the CPU in float64 by routing
``_phase_a_compiled`` to it, so both paths are held to the same codes on the same problems.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers import lasso_codes as lc
from dictcheck.solvers.active_set import solve_points
from dictcheck.solvers.row_topk import kth_largest
from dictcheck.solvers.lasso_codes import exact_codes, kkt_violation
from dictcheck.theory.objective import sae_objective
from test_lasso_codes import _unique_and_well_conditioned

TOL = 1e-8


def _problem(seed: int, D: int, d_z: int, N: int, k: int):
    """Unit atoms, non-negative k-sparse generating codes plus noise (the RESULTS §3 family, small)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, d_z))
    W /= np.linalg.norm(W, axis=0)
    Z0 = np.zeros((d_z, N))
    for i in range(N):
        Z0[rng.choice(d_z, min(k, d_z), replace=False), i] = rng.exponential(size=min(k, d_z))
    X = W @ Z0 + 0.1 * rng.normal(size=(D, N)) + 0.1 * rng.normal(size=(D, 1))
    return W, X, 0.1 * rng.normal(size=D)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(4, 40), st.integers(8, 200), st.integers(1, 12),
       st.floats(0.02, 1.0))
def test_compiled_phase_a_equals_the_batched_one(seed, D, d_z, k, lam) -> None:
    W, X, b = _problem(seed, D, d_z, 30, k)
    compiled = exact_codes(W, X, b, lam)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lc, "_phase_a_compiled",  # the batched torch phase A on the CPU
                   lambda ctx, Xc, F0, T, res: lc._phase_a_batched(ctx, (Xc @ ctx.W).sub_(ctx.lam), F0, T, res))
        batched = exact_codes(W, X, b, lam)
    for res in (compiled, batched):
        assert res.converged and res.kkt_violation <= TOL
        # the recorded violation is the measured one (Gram route against the residual route: rounding apart)
        assert res.kkt_violation == pytest.approx(kkt_violation(W, res.Z, X, b, lam), rel=1e-6, abs=1e-12)
    # Same objective always; same codes wherever the minimiser is unique and well conditioned (an ill-conditioned
    # support lets rounding move the codes further than 1e-9 at the same objective).
    assert sae_objective(W, compiled.Z, b, X, lam) == pytest.approx(sae_objective(W, batched.Z, b, X, lam), rel=1e-12)
    for i in range(X.shape[1]):
        if _unique_and_well_conditioned(W, batched.Z[:, i], X[:, i] - b, lam):
            scale = 1.0 + np.abs(batched.Z[:, i]).max()
            np.testing.assert_allclose(compiled.Z[:, i], batched.Z[:, i], atol=1e-9 * scale, rtol=0)


def _kernel_inputs(W, X, b, lam, guess=None, max_checks=30):
    ctx = lc._make_ctx(W, lam, TOL, torch.device("cpu"), torch.float64)
    Xc = torch.as_tensor(np.ascontiguousarray((X - b[:, None]).T))
    n, d_z = Xc.shape[0], W.shape[1]
    F0 = torch.as_tensor(np.full((n, 1), d_z) if guess is None else guess)
    return lc._compiled_inputs(ctx, Xc, F0, max_checks)


def _codes(idx, val, d_z: int) -> np.ndarray:
    Z = np.zeros((d_z, idx.shape[0]))
    r, c = np.nonzero(idx < d_z)
    Z[idx[r, c], r] = val[r, c]
    return Z


@pytest.mark.parametrize("max_checks", [1, 30])
def test_kernel_reports_the_exact_violation_and_is_deterministic(max_checks: int) -> None:
    W, X, b = _problem(3, 24, 120, 40, 6)
    lam = 0.2
    args = _kernel_inputs(W, X, b, lam, max_checks=max_checks)
    idx, val, viol, checks, ok = solve_points(*args)
    assert (checks >= 1).all() and (checks <= max_checks).all()
    assert ok.all() if max_checks == 30 else (~ok).any()
    Z = _codes(idx, val, W.shape[1])
    assert (Z >= 0).all()
    for i in range(X.shape[1]):  # the recorded violation is the measured one, also far from optimal
        measured = kkt_violation(W, Z[:, [i]], X[:, [i]], b, lam)
        assert viol[i] / lam == pytest.approx(measured, rel=1e-9, abs=1e-12)
        assert ok[i] == (measured <= TOL + 1e-12)
    again = solve_points(*args)
    np.testing.assert_array_equal(again[0], idx)
    np.testing.assert_array_equal(again[1], val)


def test_kernel_hands_over_what_it_cannot_finish() -> None:
    W, X, b = _problem(4, 16, 60, 20, 5)
    lam = 0.1
    # A guess with two copies of one atom: G_PP is singular, so the kernel hands every point over and
    # exact_codes finishes them exactly in phases B and C.
    W2 = np.concatenate([W, W[:, :1]], axis=1)
    d_z = W2.shape[1]
    guess = np.tile(np.array([0, d_z - 1]), (X.shape[1], 1))
    _, _, _, _, ok2 = solve_points(*_kernel_inputs(W2, X, b, lam, guess=guess))
    assert not ok2.any()
    init = np.zeros((d_z, X.shape[1]))
    init[[0, d_z - 1]] = 1.0
    res = exact_codes(W2, X, b, lam, init=init)
    assert res.converged and kkt_violation(W2, res.Z, X, b, lam) <= TOL


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.integers(1, 60), st.floats(-30, 30), st.floats(-30, 30),
       st.floats(1e-6, 1e3))
def test_float32_correlations_lie_within_their_bound(seed, D, d_z, log2_x, log2_w, lam) -> None:
    """The kernel's q̃ = fl32(X̃W − λ) is within _correlation_bound of the float64 q, entrywise, on
    data of any scale (entries spread over 2¹² within a matrix, cancellation included); the bound
    is not vacuous: at most 1e-3 of ‖x̃‖·max‖w‖ + λ."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, d_z)) * 2.0 ** rng.uniform(-6, 6, size=(D, d_z)) * 2.0**log2_w
    X = rng.normal(size=(D, 7)) * 2.0 ** rng.uniform(-6, 6, size=(D, 7)) * 2.0**log2_x
    X[:, 0] = W[:, 0] * 2.0**log2_x  # a point along an atom: large correlations next to small ones
    ctx = lc._make_ctx(W, lam, TOL, torch.device("cpu"), torch.float64)
    Xc = torch.as_tensor(np.ascontiguousarray(X.T))
    args = lc._compiled_inputs(ctx, Xc, torch.full((7, 1), d_z), 30)
    Qs, eq = args[2], args[6]
    assert Qs.dtype == np.float32
    exact = X.T @ W - lam
    assert (np.abs(Qs.astype(np.float64) - exact) <= eq[:, None]).all()
    scale = np.linalg.norm(X, axis=0) * np.sqrt(ctx.cmax2) + lam
    assert (eq <= 1e-3 * scale).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([0.0, 1.0, -2.5])), min_size=1, max_size=120),
       st.data())
def test_kth_largest_is_the_kth_of_the_sorted_values(values, data) -> None:
    """The quickselect behind the row top-k's bound and the violators joining C: the k-th largest
    of n values, ties included; the k largest come first, each with its index when paired."""
    val = np.array(values)
    n = val.size
    k = data.draw(st.integers(1, n))
    buf = val.copy()
    assert kth_largest(buf, n, k, np.empty(0, dtype=np.int64)) == np.sort(val)[n - k]
    assert np.array_equal(np.sort(buf), np.sort(val))  # reordered, nothing lost
    buf, idx = val.copy(), np.arange(n)
    t = kth_largest(buf, n, k, idx)
    assert np.array_equal(val[idx], buf)  # each value still paired with its index
    assert np.array_equal(np.sort(buf[:k]), np.sort(val)[n - k:]) and buf[:k].min() == t
