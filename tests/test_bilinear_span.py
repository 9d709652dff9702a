"""Span-level recovery and the lifted-PCA ceiling (docs/bilinear.md §6a, §12; issue 16 item 2), the equal-width
embeddings of the priors and the matched TopK density of proofs_checks/checks/bilinear.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.proofs_checks.checks.bilinear import _embed, matched_topk_k, warm_start_rows
from dictcheck.theory.bilinear_lifted import (
    BilinearDictionary,
    lifted_principal_forms,
    naive_lifted_loss,
    normalise_tokens,
    span_fraction,
)


def _sym(rng: np.random.Generator, *shape: int) -> np.ndarray:
    G = rng.normal(size=(*shape[:-2], shape[-1], shape[-1]))
    return 0.5 * (G + np.swapaxes(G, -1, -2))


@settings(max_examples=25, deadline=None)
@given(D=st.integers(2, 6), d=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_span_fraction_equals_least_squares(D, d, seed):
    rng = np.random.default_rng(seed)
    W, H = _sym(rng, d, D, D), _sym(rng, D, D)
    A = W.reshape(d, -1).T
    coef = np.linalg.lstsq(A, H.ravel(), rcond=None)[0]
    brute = np.sum((A @ coef) ** 2) / np.sum(H * H)
    assert span_fraction(W, H) == pytest.approx(brute, rel=1e-9, abs=1e-12)
    mix = rng.normal(size=(d, d)) + 3 * np.eye(d)  # invariant to invertible mixing
    assert span_fraction(np.einsum("kj,jab->kab", mix, W), H) == pytest.approx(brute, rel=1e-7, abs=1e-10)
    assert span_fraction(np.concatenate([W, H[None]]), H) == pytest.approx(1.0, abs=1e-12)


def test_span_fraction_errors():
    with pytest.raises(ValueError, match="same D"):
        span_fraction(np.zeros((2, 3, 3)), np.eye(4))
    with pytest.raises(ValueError, match="zero"):
        span_fraction(np.ones((2, 3, 3)), np.zeros((3, 3)))
    assert span_fraction(np.zeros((2, 3, 3)), np.eye(3)) == 0.0


@settings(max_examples=15, deadline=None)
@given(D=st.integers(2, 5), N=st.integers(3, 40), seed=st.integers(0, 10**6))
def test_principal_forms_are_the_lift_pca(D, N, seed):
    rng = np.random.default_rng(seed)
    X = normalise_tokens(rng.normal(size=(N, D)) * np.exp(rng.normal(size=D)))[0]
    T = np.einsum("ni,nj->nij", X, X).reshape(N, -1)
    brute = np.sort(np.linalg.eigvalsh(T.T @ T / N))[::-1]  # D² × D² second moment: same nonzero spectrum
    m = D * (D + 1) // 2
    r = int(rng.integers(1, m + 1))
    F, ev = lifted_principal_forms(X, r)
    np.testing.assert_allclose(ev, np.clip(brute[:m], 0, None), atol=1e-12)
    np.testing.assert_allclose(np.einsum("aij,bij->ab", F, F), np.eye(r), atol=1e-10)  # orthonormal
    np.testing.assert_allclose(F, np.swapaxes(F, 1, 2), atol=1e-14)  # symmetric
    assert naive_lifted_loss(X, F) == pytest.approx(1.0 - ev[:r].sum(), abs=1e-10)  # Eckart–Young floor
    with pytest.raises(ValueError, match="r must"):
        lifted_principal_forms(X, m + 1)


def test_embeddings_keep_the_forms():
    rng = np.random.default_rng(0)
    U, V, C = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(2, 4))
    cases = [(BilinearDictionary("atomic", U), "quadratic"), (BilinearDictionary("atomic", U), "compound"),
             (BilinearDictionary("compound", U, C=C), "compound-glu"),
             (BilinearDictionary("quadratic", U, V), "compound-glu"),
             (BilinearDictionary("quadratic", U, V, decoder="asymmetric"), "compound-glu")]
    for poor, rich in cases:
        np.testing.assert_allclose(_embed(poor, rich).forms(), poor.forms(), atol=1e-12)


def test_warm_start_rows_never_rise():
    rows = warm_start_rows(np.random.default_rng(1))
    assert len(rows) == 4
    for r in rows:
        assert r["embedding_gap"] < 1e-12 and r["max_step_rise"] < 1e-12 and r["richer_after"] <= r["poorer_loss"]


def test_matched_topk_k():
    assert matched_topk_k(0.5, 48) == 12  # η ≈ √p: p = 0.25
    assert matched_topk_k(0.0, 48) == 1 and matched_topk_k(1.0, 48) == 48
    with pytest.raises(ValueError, match="Hoyer"):
        matched_topk_k(1.5, 8)


@settings(max_examples=15, deadline=None)
@given(D=st.integers(2, 6), N=st.integers(2, 40), seed=st.integers(0, 10**6))
def test_lifted_spectrum_both_routes(D, N, seed):
    from dictcheck.theory.bilinear_lifted import lifted_spectrum

    rng = np.random.default_rng(seed)
    X = normalise_tokens(rng.normal(size=(N, D)) * np.exp(rng.normal(size=D)))[0]
    ev = lifted_principal_forms(X, 1)[1]
    sp = lifted_spectrum(X)
    n = min(ev.size, sp.size)
    np.testing.assert_allclose(sp[:n], ev[:n], atol=1e-11)
    assert sp.sum() == pytest.approx(1.0, abs=1e-10)


@settings(max_examples=25, deadline=None)
@given(D=st.integers(1, 8), N=st.integers(1, 20), scale=st.floats(0.0, 2.0), seed=st.integers(0, 10**6))
def test_lifted_error_of_a_linear_reconstruction(D, N, scale, seed):
    """‖xxᵀ − x̂x̂ᵀ‖² = 2a² + 2‖e‖² + 4a‖e‖² + ‖e‖⁴ with x̂ = x + e, a = x·e (docs/bilinear.md §12)."""
    from dictcheck.proofs_checks.checks.bilinear import lifted_nmse_of_reconstruction

    rng = np.random.default_rng(seed)
    X = normalise_tokens(rng.normal(size=(N, D)) + 1e-3)[0]
    E = scale * rng.normal(size=X.shape)
    a, ee = np.sum(X * E, axis=1), np.sum(E * E, axis=1)
    closed = np.mean(2 * a * a + 2 * ee + 4 * a * ee + ee * ee)
    assert lifted_nmse_of_reconstruction(X, X + E) == pytest.approx(closed, rel=1e-9, abs=1e-12)
