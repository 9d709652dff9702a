"""Subspace similarity and Hungarian atom matching of form dictionaries (docs/bilinear.md §7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dictcheck.solvers.form_matching import match_forms
from dictcheck.theory.form_similarity import form_gram, form_norms_sq, subspace_similarity
from dictcheck.theory.quadric_geometry import FactoredForms

PRIORS = ("quadratic", "atomic", "compound")


def _dictionary(prior: str, rng: np.random.Generator, d: int, D: int, n_atoms: int = 6) -> FactoredForms:
    if prior == "quadratic":
        return FactoredForms(rng.normal(size=(d, D)), right=rng.normal(size=(d, D)))
    if prior == "atomic":
        return FactoredForms(rng.normal(size=(d, D)))
    C = rng.normal(size=(d, n_atoms)) * (rng.random((d, n_atoms)) < 0.5)
    C[np.arange(d), rng.integers(0, n_atoms, d)] = 1.0  # no zero composite
    return FactoredForms(rng.normal(size=(n_atoms, D)), mix=C)


def _brute_similarity(Wa: np.ndarray, Wb: np.ndarray) -> float:
    """The definition through the D²×D² Gram operators P = 𝒲ᵀ𝒲 (tiny D only)."""
    def P(W: np.ndarray) -> np.ndarray:
        F = np.stack([(0.5 * (w + w.T)).ravel() for w in W])
        return F.T @ F
    Pa, Pb = P(Wa), P(Wb)
    n_ab = np.sum(Pa * Pb) / (len(Wa) * len(Wb))
    n_aa = np.sum(Pa * Pa) / len(Wa) ** 2
    n_bb = np.sum(Pb * Pb) / len(Wb) ** 2
    return float(2 * np.sqrt(n_ab) / (np.sqrt(n_aa) + np.sqrt(n_bb)))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), D=st.integers(2, 5), da=st.integers(1, 5), db=st.integers(1, 5),
       pa=st.sampled_from(PRIORS), pb=st.sampled_from(PRIORS))
def test_gram_route_equals_brute_force(seed: int, D: int, da: int, db: int, pa: str, pb: str) -> None:
    rng = np.random.default_rng(seed)
    a, b = _dictionary(pa, rng, da, D), _dictionary(pb, rng, db, D)
    Wa, Wb = a.dense(), b.dense()
    loops = np.array([[np.sum(x * y) for y in Wb] for x in Wa])
    np.testing.assert_allclose(form_gram(a, b), loops, rtol=1e-10, atol=1e-10 * np.abs(loops).max())
    np.testing.assert_allclose(form_gram(Wa, Wb), loops, rtol=1e-10, atol=1e-10 * np.abs(loops).max())
    np.testing.assert_allclose(form_norms_sq(a), np.diag(form_gram(Wa, Wa)), rtol=1e-10)
    brute = _brute_similarity(Wa, Wb)
    assert subspace_similarity(a, b) == pytest.approx(brute, rel=1e-9)
    assert subspace_similarity(Wa, Wb) == pytest.approx(brute, rel=1e-9)
    # An asymmetric dense input counts through its symmetric part only.
    skew = rng.normal(size=(da, D, D))
    skew = skew - np.swapaxes(skew, 1, 2)
    assert subspace_similarity(Wa + skew, Wb) == pytest.approx(brute, rel=1e-9)


@settings(max_examples=20, deadline=None)
@example(seed=917, D=4, d=4, prior="compound")  # two equal atoms (see the matching below)
@given(seed=st.integers(0, 10_000), D=st.integers(3, 6), d=st.integers(2, 6), prior=st.sampled_from(PRIORS))
def test_rotated_permuted_and_sign_flipped_copies_score_one(seed: int, D: int, d: int, prior: str) -> None:
    rng = np.random.default_rng(seed)
    a = _dictionary(prior, rng, d, D)
    W = a.dense()
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    rotated = np.einsum("jl,lab->jab", Q, W)  # orthogonal mixing within the span
    assert subspace_similarity(W, rotated) == pytest.approx(1.0, abs=1e-12)
    perm = rng.permutation(d)
    signs = rng.choice([-1.0, 1.0], d)
    copy = signs[:, None, None] * W[perm]
    assert subspace_similarity(W, copy) == pytest.approx(1.0, abs=1e-12)
    if prior == "compound":  # the same in factored form: mixing C with Q keeps the atoms
        mixed = FactoredForms(a.left, mix=Q @ a.mix)
        assert subspace_similarity(a, mixed) == pytest.approx(1.0, abs=1e-12)
    m = match_forms(copy, W)  # the Hungarian matching recovers the permutation
    # ... up to atoms that are equal up to sign (the compound prior can draw two equal rows of C, e.g.
    # seed 917, D = d = 4, where either order is optimal): each copy is matched to its own atom or to
    # an equal one, and to its own wherever its atom is unique.
    F = W.reshape(d, -1) / np.linalg.norm(W.reshape(d, -1), axis=1, keepdims=True)
    same = np.abs(F @ F.T) > 1.0 - 1e-12
    assert sorted(m.rows.tolist()) == list(range(d)) and sorted(m.cols.tolist()) == list(range(d))
    assert all(same[perm[r], c] for r, c in zip(m.rows, m.cols))
    assert m.mean_cosine == pytest.approx(1.0, abs=1e-12)


def test_rotated_copy_matches_worse_than_it_is_similar() -> None:
    """§7 expected signature: the same span (similarity 1) with distinct entries (matching < 1)."""
    rng = np.random.default_rng(0)
    U = np.linalg.qr(rng.normal(size=(8, 8)))[0][:6]  # orthonormal atoms → orthonormal forms u uᵀ
    a = FactoredForms(U)
    W = a.dense()
    G = form_gram(W, W)
    np.testing.assert_allclose(G, np.eye(6), atol=1e-12)
    Q = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    rotated = np.einsum("jl,lab->jab", Q, W)
    m_self, m_rot = match_forms(W, W), match_forms(W, rotated)
    assert m_self.workshop_ratio == pytest.approx(1.0, abs=1e-12) and m_self.mean_cosine == pytest.approx(1.0)
    assert subspace_similarity(W, rotated) == pytest.approx(1.0, abs=1e-12)
    # For unit orthonormal forms M = |Q|: matched mean = max assignment of |Q|/6, ratio = ‖matched‖/√6.
    np.testing.assert_allclose(m_rot.M, np.abs(Q).T, atol=1e-12)
    assert m_rot.mean_cosine < 0.95 and m_rot.workshop_ratio < 0.95
    assert m_rot.workshop_ratio == pytest.approx(np.linalg.norm(m_rot.cosines) / np.sqrt(6), rel=1e-12)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_random_dictionary_scores_below_one_and_scale_matters(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = _dictionary("atomic", rng, 4, 8), _dictionary("atomic", rng, 4, 8)
    assert 0.0 < subspace_similarity(a, b) < 0.9
    # Not scale-invariant: a copy scaled by s scores 2s/(1 + s²) (N scales with s⁴, √N with s²).
    s = 2.0
    scaled = FactoredForms(np.sqrt(s) * a.left)
    assert subspace_similarity(a, scaled) == pytest.approx(2 * s / (1 + s**2), rel=1e-12)


def test_bad_input() -> None:
    a = FactoredForms(np.eye(3))
    with pytest.raises(ValueError, match="both as dense"):
        form_gram(a, a.dense())
    with pytest.raises(ValueError, match="different dimensions"):
        form_gram(a, FactoredForms(np.eye(4)))
    with pytest.raises(ValueError, match="all-zero"):
        subspace_similarity(a.dense(), np.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match=r"\(d, D, D\)"):
        form_gram(np.ones((2, 3)), np.ones((2, 3)))


def test_zero_forms_match_with_cosine_zero_and_are_counted() -> None:
    a = FactoredForms(np.eye(3))
    m = match_forms(a, FactoredForms(np.array([[1.0, 0, 0], [0, 0, 0]])))
    assert (m.n_zero_a, m.n_zero_b) == (0, 1)
    assert np.all(m.M[:, 1] == 0.0) and m.M[0, 0] == pytest.approx(1.0)
    assert m.mean_cosine == pytest.approx(0.5) and m.workshop_ratio == pytest.approx(1.0)
    empty = match_forms(a, FactoredForms(np.zeros((2, 3))))
    assert empty.mean_cosine == 0.0 and empty.workshop_ratio == 0.0 and empty.n_zero_b == 2
