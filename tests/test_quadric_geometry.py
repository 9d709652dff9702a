"""Geometry readout of quadratic forms (theory/quadric_geometry.py; docs/bilinear.md §6)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.theory.bilinear_lifted import BilinearDictionary
from dictcheck.theory.quadric_geometry import (
    TAU_EIG,
    FactoredForms,
    captured_fraction,
    classify,
    compound_support,
    effective_rank,
    numerical_rank,
    readout,
)


def _orthogonal(rng: np.random.Generator, D: int) -> np.ndarray:
    Q, R = np.linalg.qr(rng.normal(size=(D, D)))
    return Q * np.sign(np.diag(R))


def _form(mu: list[float], Q: np.ndarray) -> np.ndarray:
    """Q diag(μ, 0, …) Qᵀ."""
    full = np.zeros(Q.shape[0])
    full[: len(mu)] = mu
    return (Q * full) @ Q.T


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), D=st.integers(4, 7))
def test_classification_of_constructed_forms(seed: int, D: int) -> None:
    rng = np.random.default_rng(seed)
    Q = _orthogonal(rng, D)
    cases = {
        "null": _form([], Q),
        "slab": _form([-2.0], Q),
        "ellipsoid": _form([3.0, 1.0, 0.5], Q),
        "hyperboloid": _form([1.0, -0.2], Q),
    }
    forms = np.stack(list(cases.values()))
    got = readout(forms)
    assert [g.label for g in got] == list(cases)
    assert [g.rank for g in got] == [0, 1, 3, 2]
    # A negative-definite form is an ellipsoid too (one sign).
    assert readout(_form([-1.0, -4.0], Q)[None])[0].label == "ellipsoid"
    # Paraboloid: a linear term outside the range of B; inside the range it changes nothing.
    B = _form([1.0, 2.0], Q)
    inside, outside = Q[:, 0] - 3.0 * Q[:, 1], Q[:, 0] + 0.5 * Q[:, 3]
    labels = [g.label for g in readout(np.stack([B, B]), linear=np.stack([inside, outside]))]
    assert labels == ["ellipsoid", "paraboloid"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), D=st.integers(3, 8))
def test_glu_latent_is_an_indefinite_rank_two_form(seed: int, D: int) -> None:
    """§2: sym(u vᵀ) has eigenvalues ½(u·v ± ‖u‖‖v‖), one of each sign unless u ∥ v."""
    rng = np.random.default_rng(seed)
    u, v = rng.normal(size=D), rng.normal(size=D)
    g = readout(FactoredForms(u[None], right=v[None]))[0]
    expected = 0.5 * (u @ v + np.array([1.0, -1.0]) * np.linalg.norm(u) * np.linalg.norm(v))
    np.testing.assert_allclose(np.sort(g.eigenvalues[: g.rank]), np.sort(expected), rtol=1e-10)
    assert g.label == "hyperboloid" and g.rank == 2
    parallel = readout(FactoredForms(u[None], right=-2.5 * u[None]))[0]
    assert parallel.label == "slab" and parallel.rank == 1


def test_effective_rank_and_captured_of_known_spectra() -> None:
    assert effective_rank([1.0, -1.0, 1.0, 0.0]) == pytest.approx(3.0, rel=1e-14)
    assert effective_rank([3.0, 1.0]) == pytest.approx(16.0 / 10.0, rel=1e-14)
    assert effective_rank([0.0, 0.0]) == 0.0
    assert effective_rank([5.0]) == pytest.approx(1.0)
    assert captured_fraction([4.0, -3.0, 2.0, 1.0]) == pytest.approx(0.9, rel=1e-14)
    assert captured_fraction([1.0, -1.0]) == pytest.approx(1.0)
    assert captured_fraction([0.0]) == 0.0


def test_numerical_rank_threshold_is_relative() -> None:
    assert TAU_EIG == 1e-6
    assert numerical_rank([1.0, 0.9e-6, -0.5e-6]) == 1
    assert numerical_rank([-2.0, 1.1e-6 * 2.0]) == 2
    assert numerical_rank([]) == 0 and numerical_rank([0.0, 0.0]) == 0
    assert classify([1.0, -1e-9]) == "slab"  # eigen-noise below τ does not make a hyperboloid
    assert classify([0.0, 0.0], linear_outside_range=True) == "null"


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), D=st.integers(2, 7), n=st.integers(1, 6), d=st.integers(1, 4),
       prior=st.sampled_from(["quadratic", "atomic", "compound", "compound-glu"]))
def test_factored_readout_equals_dense_eigendecomposition(seed: int, D: int, n: int, d: int, prior: str) -> None:
    rng = np.random.default_rng(seed)
    U, V = rng.normal(size=(n, D)), rng.normal(size=(n, D))
    C = rng.normal(size=(d, n)) * (rng.random((d, n)) < 0.6)
    forms = {"quadratic": FactoredForms(U, right=V), "atomic": FactoredForms(U),
             "compound": FactoredForms(U, mix=C), "compound-glu": FactoredForms(U, right=V, mix=C)}[prior]
    dense = forms.dense()
    np.testing.assert_allclose(dense, np.swapaxes(dense, 1, 2), atol=0)
    fast, slow = readout(forms), readout(dense)
    scale = max(float(np.abs(dense).max()), 1e-300)
    for f, s in zip(fast, slow):
        assert (f.label, f.rank) == (s.label, s.rank)
        assert f.importance == pytest.approx(s.importance, rel=1e-9, abs=1e-15)
        assert f.effective_rank == pytest.approx(s.effective_rank, rel=1e-9, abs=1e-12)
        assert f.captured_top3 == pytest.approx(s.captured_top3, rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(f.eigenvalues[: f.rank], s.eigenvalues[: s.rank], atol=1e-10 * scale)
        # Eigenvectors of simple eigenvalues agree (both signed by their largest entry).
        mu = s.eigenvalues[: s.rank]
        gaps = np.abs(mu[:, None] - mu[None, :]) + np.eye(len(mu)) * 1e9
        simple = [i for i in range(min(f.eigenvectors.shape[1], len(mu))) if gaps[i].min() > 1e-6 * scale]
        for i in simple:
            np.testing.assert_allclose(np.abs(f.eigenvectors[:, i] @ s.eigenvectors[:, i]), 1.0, atol=1e-7)
        # B e = μ e for the returned eigenvectors.
        B = dense[f.index]
        for i in range(min(f.rank, f.eigenvectors.shape[1])):
            e = f.eigenvectors[:, i]
            np.testing.assert_allclose(B @ e, f.eigenvalues[i] * e, atol=1e-9 * scale)
    total = sum(g.importance for g in fast)
    assert total == pytest.approx(1.0, rel=1e-12) or np.all(dense == 0)


def test_importance_support_and_summary() -> None:
    rng = np.random.default_rng(3)
    U = rng.normal(size=(5, 4))
    C = np.array([[1.0, 0, 0, 2.0, 0], [0, 0, -1.0, 0, 0], [0, 0, 0, 0, 0]])
    forms = FactoredForms(U, mix=C)
    got = readout(forms)
    fro = np.einsum("kij,kij->k", forms.dense(), forms.dense())
    np.testing.assert_allclose([g.importance for g in got], fro / fro.sum(), rtol=1e-12)
    assert [g.support for g in got] == [2, 1, 0] == list(compound_support(C))
    assert got[2].label == "null" and got[2].effective_rank == 0.0 and got[2].importance == 0.0
    assert got[1].label == "slab"
    s = got[0].summary()
    assert set(s) == {"latent", "label", "rank", "effective_rank", "importance", "frobenius_sq",
                      "captured_top3", "top_eigenvalues", "support"}
    assert readout(forms, latents=[1])[0].importance == pytest.approx(got[1].importance)


@pytest.mark.parametrize("prior,decoder", [("quadratic", "symmetric"), ("quadratic", "asymmetric"),
                                           ("atomic", "symmetric"), ("compound", "symmetric")])
def test_from_dictionary_gives_the_symmetrised_forms_of_the_model(prior: str, decoder: str) -> None:
    rng = np.random.default_rng(5)
    U = rng.normal(size=(4, 5))
    V = rng.normal(size=(4, 5)) if prior == "quadratic" else None
    C = rng.normal(size=(3, 4)) * (rng.random((3, 4)) < 0.6) if prior == "compound" else None
    dictionary = BilinearDictionary(prior, U, V, C, decoder)
    W = dictionary.forms()
    np.testing.assert_allclose(FactoredForms.from_dictionary(dictionary).dense(), 0.5 * (W + np.swapaxes(W, 1, 2)),
                               atol=1e-12)
    if decoder == "symmetric":  # the readout's Gram is the decoder's kernel K
        np.testing.assert_allclose(FactoredForms.from_dictionary(dictionary).gram(
            FactoredForms.from_dictionary(dictionary)), dictionary.kernel(), atol=1e-12)


def test_bad_input_raises_one_line_value_errors() -> None:
    with pytest.raises(ValueError, match="NaN or inf"):
        FactoredForms(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="one per atom"):
        FactoredForms(np.ones((2, 3)), mix=np.ones((1, 3)))
    with pytest.raises(ValueError, match="square"):
        readout(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="out of range"):
        readout(FactoredForms(np.ones((2, 3))), latents=[2])
    with pytest.raises(ValueError, match="linear terms"):
        readout(FactoredForms(np.ones((2, 3))), linear=np.ones((2, 4)))
    with pytest.raises(ValueError, match="top_k"):
        readout(FactoredForms(np.ones((2, 3))), top_k=0)
