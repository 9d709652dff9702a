"""Tests of the toy data generators (empirics/data/toys.py; docs/theory.md §4, §5)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.data.toys import (
    TOYS,
    Toy,
    clusters,
    crowded_median,
    dense_feature,
    dense_scalar,
    independent_features,
    make_toy,
    parent_child,
    rank_one,
    rays,
    rays_reference,
)
from dictcheck.solvers.medians import huber_median as solve_huber_median
from dictcheck.theory.dense_scalar import dense_scalar_optimum
from dictcheck.theory.huber import huber_objective, huber_objective_gradient

RANDOM_TOYS = ["independent_features", "parent_child", "dense_feature", "rank_one", "clusters"]
DETERMINISTIC_TOYS = ["rays", "rays_reference", "crowded_median"]


def huber_median(X: np.ndarray, lam: float) -> np.ndarray:
    """The Huber-smoothed geometric median b* (spec §4.3), from the solver verified against cvxpy."""
    return solve_huber_median(X, lam).b


def geometric_median(X: np.ndarray) -> np.ndarray:
    """Weiszfeld's iteration (the test data never lands an iterate on a data point)."""
    b = X.mean(axis=1)
    for _ in range(200_000):
        rho = np.linalg.norm(X - b[:, None], axis=0)
        w = 1.0 / rho
        b_new = X @ w / w.sum()
        if np.linalg.norm(b_new - b) < 1e-15:
            return b_new
        b = b_new
    return b


# ------------------------------------------------------------------------------------------------
# interface
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TOYS))
def test_every_toy_has_the_common_interface(name):
    toy = make_toy(name)
    assert isinstance(toy, Toy) and toy.name == name
    assert toy.X.dtype == np.float64 and toy.X.ndim == 2
    assert (toy.D, toy.N) == toy.X.shape
    assert np.all(np.isfinite(toy.X))
    assert isinstance(toy.lam, float) and toy.lam > 0
    assert isinstance(toy.learn_bias, bool)
    assert isinstance(toy.ground_truth, dict) and isinstance(toy.params, dict)
    assert "seed" in toy.params
    assert toy.b_fixed.shape == (toy.D,)
    W_true = toy.ground_truth.get("W_true")
    if W_true is not None:
        assert W_true.shape[0] == toy.D
        assert np.allclose(np.linalg.norm(W_true, axis=0), 1.0)
    Z_true = toy.ground_truth.get("Z_true")
    if Z_true is not None:
        assert Z_true.shape == (W_true.shape[1], toy.N)
    with pytest.raises(dataclasses.FrozenInstanceError):
        toy.lam = 1.0


def test_make_toy_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError) as err:
        make_toy("no_such_toy")
    for name in TOYS:
        assert name in str(err.value)


def test_make_toy_passes_seed_and_params():
    toy = make_toy("independent_features", seed=7, N=40, p=0.5)
    ref = independent_features(7, N=40, p=0.5)
    assert np.array_equal(toy.X, ref.X)
    assert toy.params["seed"] == 7 and toy.params["N"] == 40 and toy.params["p"] == 0.5
    with pytest.raises(TypeError):
        make_toy("parent_child", no_such_param=1)


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(RANDOM_TOYS), seed=st.integers(0, 2**31 - 1))
def test_determinism_under_seed(name, seed):
    a, b = make_toy(name, seed=seed), make_toy(name, seed=seed)
    assert np.array_equal(a.X, b.X)
    for key, val in a.ground_truth.items():
        if isinstance(val, np.ndarray):
            assert np.array_equal(val, b.ground_truth[key])
    c = make_toy(name, seed=seed + 1)
    assert not np.array_equal(a.X, c.X)


@pytest.mark.parametrize("name", DETERMINISTIC_TOYS)
def test_deterministic_presets_ignore_the_seed(name):
    assert np.array_equal(make_toy(name, seed=0).X, make_toy(name, seed=123).X)


# ------------------------------------------------------------------------------------------------
# §5.3 independent features
# ------------------------------------------------------------------------------------------------


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_independent_features(seed):
    toy = independent_features(seed)
    assert toy.X.shape == (3, 150) and toy.lam == 0.1 and toy.learn_bias
    W, Z = toy.ground_truth["W_true"], toy.ground_truth["Z_true"]
    assert np.allclose(W.T @ W, np.eye(3), atol=1e-12)
    on = Z > 0
    assert np.all((Z[on] >= 1) & (Z[on] <= 2))
    assert 0.15 < on.mean() < 0.45
    noise = toy.X - W @ Z
    assert np.allclose(noise, toy.ground_truth["noise"], atol=1e-14)
    assert 0.005 < noise.std() < 0.02


# ------------------------------------------------------------------------------------------------
# §5.2 parent / child
# ------------------------------------------------------------------------------------------------


def test_parent_child():
    toy = parent_child(0)
    assert toy.X.shape == (3, 120) and toy.lam == 0.1 and not toy.learn_bias
    assert np.array_equal(toy.b_fixed, np.zeros(3))
    lab = toy.ground_truth["labels"]
    assert [int(np.sum(lab == k)) for k in range(3)] == [60, 30, 30]
    X = toy.X
    assert np.all((X[0] >= 1) & (X[0] <= 2))
    assert np.all(X[1:, lab == 0] == 0)
    assert np.all((X[1, lab == 1] >= 1) & (X[1, lab == 1] <= 2)) and np.all(X[2, lab == 1] == 0)
    assert np.all((X[2, lab == 2] >= 1) & (X[2, lab == 2] <= 2)) and np.all(X[1, lab == 2] == 0)
    assert np.array_equal(toy.X, toy.ground_truth["Z_true"])  # W_true = I₃, noise-free


# ------------------------------------------------------------------------------------------------
# §5.1 dense scalar
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lam,p,b_ref,obj_ref", [
    (0.1, 0.2, 0.025, 0.0775), (0.1, 0.49, 0.096078, 0.186392), (0.1, 0.6, 1.933333, 0.153333),
    (0.3, 0.4, 0.2, 0.42), (0.3, 0.51, 1.711765, 0.501529), (0.6, 0.8, 1.85, 0.39),
])
def test_dense_scalar_constant_matches_table(lam, p, b_ref, obj_ref):
    toy = dense_scalar(p=p, lam=lam)
    assert toy.X.shape == (1, 1000) and toy.learn_bias and toy.lam == lam
    s = toy.ground_truth["s"]
    k = round(p * 1000)
    assert np.array_equal(s[:k], np.full(k, 2.0)) and np.all(s[k:] == 0)
    assert toy.ground_truth["p_hat"] == k / 1000
    opt = dense_scalar_optimum(p, 2.0, lam)
    assert opt.b == pytest.approx(b_ref, abs=1e-6)
    assert huber_objective([opt.b], toy.X, lam) == pytest.approx(obj_ref, abs=1e-6)
    assert abs(huber_objective_gradient([opt.b], toy.X, lam)[0]) < 1e-12  # b* minimises H


def test_dense_scalar_seed_and_variants():
    t1 = dense_scalar(0, p=0.5, amplitude="constant")
    t2 = dense_scalar(99, p=0.5, amplitude="constant")
    assert np.array_equal(t1.X, t2.X)  # constant amplitude is deterministic
    u = dense_scalar(3, p=0.51, N=4000, amplitude="uniform")
    s = u.ground_truth["s"]
    assert np.all((s == 0) | ((s >= 1) & (s <= 3)))
    assert abs(u.ground_truth["p_hat"] - 0.51) < 0.03
    g = dense_scalar(3, N=4000, amplitude="gaussian")
    assert abs(g.ground_truth["s"].mean()) < 0.1 and abs(g.ground_truth["s"].std() - 1) < 0.05
    two = dense_scalar(0, p=0.3, D=2, u=[3.0, 4.0], offset=[1.0, -1.0])
    assert two.X.shape == (2, 1000)
    assert np.allclose(two.ground_truth["u"], [0.6, 0.8])
    assert np.linalg.matrix_rank(two.X - two.ground_truth["b_true"][:, None]) == 1
    assert np.array_equal(dense_scalar(0, D=2).ground_truth["u"], [1.0, 0.0])
    with pytest.raises(ValueError):
        dense_scalar(amplitude="bogus")


# ------------------------------------------------------------------------------------------------
# §5.4 dense feature
# ------------------------------------------------------------------------------------------------


def test_dense_feature_reproduces_reference_stream():
    """default_rng(1): 139 dense-on points (p = 0.695), 34 per sparse coordinate (p = 0.17)."""
    toy = dense_feature()
    assert toy.params["seed"] == 1 and toy.X.shape == (3, 200) and toy.lam == 0.1 and toy.learn_bias
    Z = toy.ground_truth["Z_true"]
    assert int(toy.ground_truth["dense_on"].sum()) == 139
    assert [int(np.sum(Z[j] > 0)) for j in (1, 2)] == [34, 34]
    assert np.all((Z[0][Z[0] > 0] >= 1) & (Z[0][Z[0] > 0] <= 3))
    assert np.all((Z[1:][Z[1:] > 0] >= 1) & (Z[1:][Z[1:] > 0] <= 2))
    # wide-limit optimum on the same data (spec: 45.10 as a sum)
    b = huber_median(toy.X, toy.lam)
    assert toy.N * huber_objective(b, toy.X, toy.lam) == pytest.approx(45.10, abs=0.01)


# ------------------------------------------------------------------------------------------------
# generic geometric toys
# ------------------------------------------------------------------------------------------------


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000), signed=st.booleans(), D=st.integers(1, 4))
def test_rank_one(seed, signed, D):
    toy = rank_one(seed, signed=signed, D=D, N=50)
    u, s = toy.ground_truth["u"], toy.ground_truth["s"]
    assert toy.X.shape == (D, 50)
    assert np.allclose(toy.X, np.outer(u, s))
    assert np.linalg.matrix_rank(toy.X) == 1
    assert np.all((np.abs(s) >= 0.5) & (np.abs(s) <= 2.0))
    if signed:
        assert (s > 0).any() and (s < 0).any()
    else:
        assert np.all(s > 0)
    noisy = rank_one(seed, signed=signed, D=D, N=50, noise=0.1)
    assert not np.allclose(noisy.X, toy.X)


def test_rays_generic():
    dirs = np.eye(3)[:, :2]
    toy = rays(4, centre=(1.0, 1.0, 1.0), directions=dirs, radii=None, n_per_ray=5, near_points=None, lam=0.2)
    assert toy.X.shape == (3, 10)
    Xc = toy.X - 1.0
    assert np.all(Xc[2] == 0) and np.all(Xc[1, :5] == 0) and np.all(Xc[0, 5:] == 0)
    r = toy.ground_truth["radius"]
    assert np.all((r >= 0.5) & (r <= 2.5))
    assert np.array_equal(toy.ground_truth["ray"], np.repeat([0, 1], 5))
    with pytest.raises(ValueError):
        rays(centre=(0.0, 0.0, 0.0))  # angles need D = 2


def test_rays_reference_d():
    """Spec §4.4 reference (D): b = 0 sum 6.0325; learned b = Huber median, mean 0.668658, 8 rays."""
    toy = rays_reference()
    assert toy.X.shape == (2, 9) and toy.lam == 0.3
    ang = np.array([0.0] * 3 + [2.0] * 2 + [4.0] * 3)
    rad = np.array([0.7, 1.5, 2.4, 1.0, 2.0, 0.5, 1.2, 1.9])
    assert np.allclose(toy.X[:, :8], rad * np.vstack([np.cos(ang), np.sin(ang)]), atol=1e-15)
    assert np.array_equal(toy.X[:, 8], [0.1, 0.15])
    assert np.array_equal(rays().X, toy.X)  # rays() defaults are reference (D)
    ref = toy.ground_truth["reference"]
    assert 9 * huber_objective(np.zeros(2), toy.X, 0.3) == pytest.approx(6.0325, abs=5e-5)
    assert huber_objective(np.zeros(2), toy.X, 0.3) == pytest.approx(ref["b0_mean_objective"], abs=1e-6)
    b = huber_median(toy.X, 0.3)
    assert np.allclose(b, ref["huber_median"], atol=1e-6)
    assert huber_objective(b, toy.X, 0.3) == pytest.approx(ref["learned_b_mean_objective"], abs=1e-6)
    # 8 distinct rays from b* among the points beyond λ; the near point is within λ
    Xc = toy.X - b[:, None]
    rho = np.linalg.norm(Xc, axis=0)
    beyond = rho > 0.3
    assert beyond.sum() == 8 and rho[8] == pytest.approx(0.133, abs=1e-3)
    theta = np.arctan2(Xc[1, beyond], Xc[0, beyond])
    gaps = np.abs((theta[:, None] - theta[None, :] + np.pi) % (2 * np.pi) - np.pi)
    gaps = gaps[np.triu_indices(8, 1)]
    assert gaps.min() == pytest.approx(0.0048, abs=1e-4)


def test_clusters():
    toy = clusters(2, n_clusters=4, n_per_cluster=10, D=3, spread=0.05)
    assert toy.X.shape == (3, 40) and toy.learn_bias
    c, lab = toy.ground_truth["centres"], toy.ground_truth["labels"]
    assert c.shape == (3, 4) and np.array_equal(lab, np.repeat(np.arange(4), 10))
    assert np.max(np.abs(toy.X - c[:, lab])) < 0.05 * 6


def test_crowded_median_c3():
    """Spec §4.3 (C3): Huber median vs geometric median."""
    toy = crowded_median()
    assert toy.X.shape == (2, 6) and toy.lam == 0.8 and toy.learn_bias
    ref = toy.ground_truth["reference"]
    b = huber_median(toy.X, 0.8)
    assert np.allclose(b, ref["huber_median"], atol=1e-6)
    assert huber_objective(b, toy.X, 0.8) == pytest.approx(ref["mean_objective"], abs=1e-6)
    assert 6 * huber_objective(b, toy.X, 0.8) == pytest.approx(ref["sum_objective"], abs=1e-6)
    d = np.linalg.norm(toy.X[:, :3] - b[:, None], axis=0)
    assert np.allclose(d, ref["clustered_distances"], atol=1e-3) and np.all(d < 0.8)
    gm = geometric_median(toy.X)
    assert np.allclose(gm, ref["geometric_median"], atol=1e-6)
    assert np.mean(np.linalg.norm(toy.X - gm[:, None], axis=0)) == pytest.approx(
        ref["geometric_median_mean_distance"], abs=1e-6)
    assert huber_objective(gm, toy.X, 0.8) == pytest.approx(ref["huber_at_geometric_median"], abs=1e-6)
