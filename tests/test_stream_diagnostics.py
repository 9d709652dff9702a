"""Streamed diagnostics equal the reference (docs/theory.md §3, §6): every key, any batching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.solvers.stream_diagnostics import (
    SparseCodes,
    candidate_gains,
    column_batches,
    nested_pairs_of_codes,
    stream_diagnostics,
)
from dictcheck.theory.diagnostics import active_sets, dictionary_diagnostics, nested_pairs


def _problem(seed: int, D: int, d_z: int, N: int, dead: bool):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, d_z))
    W /= np.linalg.norm(W, axis=0)
    X = rng.normal(size=(D, N)) * 2
    b = rng.normal(size=D) * 0.3
    lam = float(rng.uniform(0.05, 1.5))
    Z = exact_codes(W, X, b, lam).Z.copy()
    if dead and d_z > 1:  # a dead latent as to_unit_atoms leaves it: zero column, zero codes
        W[:, 0] = 0.0
        Z[0] = 0.0
    return W, X, b, lam, Z


def _assert_same(ref: dict, out: dict) -> None:
    for key, value in ref.items():
        got = out[key]
        if isinstance(value, (str, bool, dict)) or value is None:
            assert got == value, key
        elif isinstance(value, list) and value and isinstance(value[0], list):
            assert got == value, key
        else:
            a, b = np.array(value, dtype=float), np.array(got, dtype=float)
            assert a.shape == b.shape, key
            np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-11, err_msg=key)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 12), st.integers(1, 40), st.integers(1, 9),
       st.booleans(), st.booleans(), st.booleans(), st.sampled_from([1 << 8, 1 << 28]))
def test_streamed_equals_the_reference(seed, D, d_z, N, batch, dead, learned, fast, block_bytes) -> None:
    """The blocked, Gram-free diagnostics equal the dense reference for any batch of points, block of atoms and
    screen precision; the antipode gains of a sample of points are the reference's restricted to it."""
    W, X, b, lam, Z = _problem(seed, D, d_z, N, dead)
    ref = dictionary_diagnostics(W, Z, b, X, lam, learned_bias=learned)
    sample = np.arange(0, N, 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dictcheck.solvers.atom_rows.bf16_is_fast", lambda device: fast)
        mp.setattr("dictcheck.solvers.atom_rows.BLOCK_BYTES", block_bytes)
        out = stream_diagnostics(W, SparseCodes.from_dense(Z), b, column_batches(X, batch), lam,
                                 learned_bias=learned, sample_points=sample)
    _assert_same(ref.to_json(), out.diagnostics.to_json())
    R = X[:, sample] - b[:, None] - W @ Z[:, sample]
    neg = np.maximum(-(W.T @ R) - lam, 0.0)
    np.testing.assert_allclose(out.sample_antipode_gains, np.sum(neg * neg, axis=1), rtol=1e-10, atol=1e-14)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 30), st.integers(1, 60))
def test_nested_pairs_of_cooccurring_supports_equal_the_dense_rule(seed, d_z, N) -> None:
    rng = np.random.default_rng(seed)
    Z = np.where(rng.random((d_z, N)) < rng.uniform(0.02, 0.6), rng.exponential(size=(d_z, N)), 0.0)
    Z[Z > 0] += rng.choice([0.0, 1e-9], size=int((Z > 0).sum()))  # a few entries near the threshold
    active, tau = active_sets(Z)
    assert nested_pairs_of_codes(SparseCodes.from_dense(Z), tau) == nested_pairs(active)


def test_candidate_gains_and_bad_batches() -> None:
    W, X, b, lam, Z = _problem(3, 4, 6, 25, False)
    U = np.linalg.qr(np.random.default_rng(1).normal(size=(4, 3)))[0]
    out = stream_diagnostics(W, SparseCodes.from_dense(Z), b, column_batches(X, 4), lam, candidates=U)
    R = X - b[:, None] - W @ Z
    np.testing.assert_allclose(out.candidate_gains, np.sum(np.maximum(U.T @ R - lam, 0) ** 2, axis=1), rtol=1e-12)
    np.testing.assert_allclose(candidate_gains(W, SparseCodes.from_dense(Z), b, column_batches(X, 7), lam, U),
                               out.candidate_gains, rtol=1e-12)
    with pytest.raises(ValueError, match="cover the points in order"):
        stream_diagnostics(W, SparseCodes.from_dense(Z), b, [(1, X[:, 1:])], lam)
    with pytest.raises(ValueError, match="covered 10 points"):
        stream_diagnostics(W, SparseCodes.from_dense(Z), b, [(0, X[:, :10])], lam)
