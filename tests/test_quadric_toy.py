"""The quadric toy's ground truth is consistent (empirics/data/quadric_toy.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.data.quadric_toy import SHAPE_DIM, SHAPE_LABEL, make_quadric_toy
from dictcheck.theory.quadric_geometry import readout


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), extra=st.integers(1, 6), p_linear=st.sampled_from([0.0, 0.1, 0.5]),
       shapes=st.lists(st.sampled_from(["circle", "ellipsoid", "hyperboloid"]), min_size=1, max_size=3))
def test_planted_forms_are_exact_indicators_on_unit_tokens(seed: int, extra: int, p_linear: float,
                                                             shapes: list[str]) -> None:
    D = sum(SHAPE_DIM[s] for s in shapes) + extra
    toy = make_quadric_toy(seed=seed, N=300, D=D, shapes=shapes, p_linear=p_linear, k_linear=1)
    X = toy.X
    assert X.shape == (D, 300) and toy.rows.shape == (300, D)
    np.testing.assert_allclose(np.linalg.norm(X, axis=0), 1.0, atol=1e-14)
    # Bases are orthonormal, mutually orthogonal and orthogonal to the linear features.
    S = np.concatenate(toy.bases, axis=1)
    np.testing.assert_allclose(S.T @ S, np.eye(S.shape[1]), atol=1e-12)
    np.testing.assert_allclose(S.T @ toy.linear_features, 0.0, atol=1e-12)
    for c, shape in enumerate(shapes):
        H = toy.planted_form(c)
        values = np.einsum("in,ij,jn->n", X, H, X)
        mine = toy.component == c
        np.testing.assert_allclose(values[mine], 1.0, atol=1e-12)
        np.testing.assert_allclose(values[~mine], 0.0, atol=1e-12)
        y = toy.coords[c]
        np.testing.assert_allclose(toy.bases[c].T @ X[:, mine], y, atol=1e-12)
        np.testing.assert_allclose(np.einsum("in,ij,jn->n", y, toy.core_forms[c], y), 1.0, atol=1e-12)
        assert np.all(np.sum(y * y, axis=0) <= 0.97 + 1e-12)  # the filler √(1 − ‖y‖²) never vanishes
        g = readout(H[None])[0]
        assert (g.label, g.rank) == (SHAPE_LABEL[shape], SHAPE_DIM[shape]) == (toy.expected_label(c), y.shape[0])
        # The top-m eigenvectors of the planted form span the planted subspace.
        E = g.eigenvectors[:, : g.rank]
        np.testing.assert_allclose(np.linalg.svd(toy.bases[c].T @ E, compute_uv=False), 1.0, atol=1e-10)
    # The filler is the normalised non-negative combination of the active linear features.
    filler = X - S @ (S.T @ X)
    direction = toy.linear_features @ toy.linear_codes
    direction /= np.linalg.norm(direction, axis=0)
    np.testing.assert_allclose(filler / np.linalg.norm(filler, axis=0), direction, atol=1e-10)
    assert np.all(np.count_nonzero(toy.linear_codes, axis=0) == 1)


def test_seeded_and_shapes_distinguishable_from_the_subspace_sphere() -> None:
    a, b = make_quadric_toy(seed=3, N=500), make_quadric_toy(seed=3, N=500)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.component, b.component)
    assert not np.array_equal(a.X, make_quadric_toy(seed=4, N=500).X)
    assert set(np.unique(a.component)) == {-1, 0, 1, 2}
    # On ellipsoid and hyperboloid tokens ‖P_S x‖² varies, so P_S is not the planted indicator.
    for c in (1, 2):
        P = a.bases[c] @ a.bases[c].T
        energy = np.einsum("in,ij,jn->n", a.X, P, a.X)[a.component == c]
        assert energy.max() - energy.min() > 0.1


@pytest.mark.parametrize("kwargs,match", [
    ({"shapes": ["torus"]}, "shapes must be"),
    ({"shapes": []}, "shapes must be"),
    ({"D": 8}, "at least one dimension"),
    ({"N": 0}, "N must be"),
    ({"k_linear": 99}, "k_linear"),
    ({"p_linear": 1.0}, "p_linear"),
    ({"n_linear": 0}, "n_linear"),
])
def test_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_quadric_toy(**kwargs)


def test_lift_metrics_of_the_checks_on_the_toy() -> None:
    """The two lifted-space references of proofs_checks/checks/bilinear.py against explicit lifts."""
    from dictcheck.proofs_checks.checks.bilinear import lifted_nmse_of_reconstruction, lifted_pca_floor

    rows = make_quadric_toy(seed=2, N=200, D=9, shapes=["circle", "hyperboloid"]).rows
    T = np.einsum("ni,nj->nij", rows, rows).reshape(200, -1)
    x_hat = rows + 0.3 * np.random.default_rng(0).normal(size=rows.shape)
    explicit = np.mean(np.sum((T - np.einsum("ni,nj->nij", x_hat, x_hat).reshape(200, -1)) ** 2, axis=1))
    assert lifted_nmse_of_reconstruction(rows, x_hat) == pytest.approx(explicit, rel=1e-12)
    assert lifted_nmse_of_reconstruction(rows, -x_hat) == pytest.approx(explicit, rel=1e-12)  # sign-free
    for d in (1, 4, 10):
        _, vecs = np.linalg.eigh(T.T @ T)
        P = vecs[:, -d:]  # the best d-dim subspace of the lifts; residual of the projection
        brute = np.mean(np.sum((T - T @ P @ P.T) ** 2, axis=1))
        assert lifted_pca_floor(rows, d) == pytest.approx(brute, rel=1e-9, abs=1e-12)


def test_bilinear_check_protocol_helpers():
    from dictcheck.proofs_checks.checks.bilinear import _training_objective, decoder_rank_bound

    class _Model:
        hoyer_coef = 0.3

    assert _training_objective(_Model(), {"nmse_lifted": 0.2, "hoyer_density": 0.5}) == pytest.approx(0.35)
    assert _training_objective(object(), {"mse": 0.1}) == 0.1  # the TopK baseline minimises its mse
    assert decoder_rank_bound(32, {"n_atoms": 24}) == 24  # compound: ≤ n_atoms
    assert decoder_rank_bound(16, {}) == 16
