"""The synthetic manifold benchmark generator (docs/bsf.md §5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.data.manifold_toy import (
    MANIFOLD_DIMS,
    ManifoldConfig,
    make_manifold_benchmark,
    planted_config,
    sample_manifold,
)

SMALL = ManifoldConfig(D=40, counts=(("circle", 3), ("sphere", 2), ("torus", 2)), n_train=300, n_eval=200)


def test_defaults_are_the_spec():
    cfg = ManifoldConfig()
    assert (cfg.D, cfg.k_true, cfg.sigma, cfg.n_train, cfg.n_eval, cfg.scale) == (128, 3, 0.01, 50_000, 10_000, 1.0)
    assert cfg.types == ("circle",) * 8 + ("sphere",) * 8 + ("torus",) * 8
    assert sum(cfg.dims) == 72 and cfg.frames == "orthogonal" and cfg.support == "exact"


@pytest.mark.parametrize("frames", ["orthogonal", "independent"])
def test_frames_orthonormal(frames):
    b = make_manifold_benchmark(ManifoldConfig(**{**SMALL.__dict__, "frames": frames}), seed=3)
    for j in range(b.n_m):
        E = b.eval.frame(j)
        assert E.shape == (40, b.config.dims[j])
        assert np.allclose(E.T @ E, np.eye(E.shape[1]), atol=1e-12)
    gram = b.frames.T @ b.frames
    if frames == "orthogonal":  # all subspaces mutually orthogonal
        assert np.allclose(gram, np.eye(gram.shape[0]), atol=1e-12)
    else:  # independent QRs: different subspaces are generically not orthogonal
        assert np.abs(gram[0, 2:]).max() > 1e-3


def test_unit_norm_phi_and_exact_support():
    b = make_manifold_benchmark(SMALL, seed=1)
    for split in (b.train, b.eval):
        assert np.all(split.support.sum(axis=1) == 3)
        for j in range(b.n_m):
            phi_j = split.phi[:, split.offsets[j]:split.offsets[j + 1]]
            assert np.allclose(np.linalg.norm(phi_j, axis=1), 1.0, atol=1e-12)
    assert (b.train.N, b.eval.N) == (300, 200)


def test_truth_sums_to_clean_data_and_noise_level():
    b = make_manifold_benchmark(SMALL, seed=2)
    s = b.eval
    total = sum(s.contribution(j) for j in range(s.n_m))
    assert np.allclose(total, s.clean(), atol=1e-13)
    for j in range(s.n_m):
        off = ~s.support[:, j]
        assert np.all(s.contribution(j)[off] == 0)
        on = s.support[:, j]
        assert np.allclose(np.linalg.norm(s.contribution(j)[on], axis=1), 1.0, atol=1e-12)
    assert abs(s.noise.std() - 0.01) < 0.001


def test_coordinates_reproduce_phi():
    s = make_manifold_benchmark(SMALL, seed=4).eval
    theta = s.coords[0][:, 0]
    assert np.allclose(s.phi[:, 0:2], np.column_stack([np.cos(theta), np.sin(theta)]))
    a, b = s.coords[5][:, 0], s.coords[5][:, 1]
    sl = slice(s.offsets[5], s.offsets[6])
    assert np.allclose(s.phi[:, sl], np.column_stack([np.cos(a), np.sin(a), np.cos(b), np.sin(b)]) / np.sqrt(2))
    assert np.all((theta >= 0) & (theta < 2 * np.pi))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_seeded_determinism(seed):
    a, b = make_manifold_benchmark(SMALL, seed=seed), make_manifold_benchmark(SMALL, seed=seed)
    assert np.array_equal(a.train.X, b.train.X) and np.array_equal(a.eval.support, b.eval.support)
    c = make_manifold_benchmark(SMALL, seed=seed + 1)
    assert not np.array_equal(a.train.X, c.train.X)
    assert not np.array_equal(a.train.X[:50], a.eval.X[:50])  # eval is an independent draw


def test_bernoulli_support_rate():
    cfg = ManifoldConfig(**{**SMALL.__dict__, "support": "bernoulli", "n_train": 20_000})
    s = make_manifold_benchmark(cfg, seed=0).train
    sizes = s.support.sum(axis=1)
    assert len(set(sizes.tolist())) > 3  # not a fixed support size
    assert abs(sizes.mean() - 3.0) < 0.05  # E|S| = n_m · k_true/n_m, 4 standard errors ≈ 0.05


@pytest.mark.parametrize("kind", ["circle", "sphere", "torus"])
def test_planted_single_dimension(kind):
    b = make_manifold_benchmark(planted_config(kind, 5, D=32, n_train=50, n_eval=50), seed=0)
    assert set(b.types) == {kind} and set(b.config.dims) == {MANIFOLD_DIMS[kind]}


def test_donut_shape():
    phi, ab = sample_manifold(np.random.default_rng(0), "donut", 500)
    r_xy = np.linalg.norm(phi[:, :2], axis=1)
    assert np.allclose((r_xy - 1.0) ** 2 + phi[:, 2] ** 2, 0.4**2)


@pytest.mark.parametrize("change, message", [
    ({"counts": (("cube", 2),)}, "manifold type"),
    ({"k_true": 8}, "k_true"),
    ({"D": 10}, "orthogonal frames"),
    ({"frames": "random"}, "frames"),
    ({"support": "poisson"}, "support"),
    ({"sigma": -1.0}, "sigma"),
    ({"n_train": 0}, "n_train"),
    ({"counts": ()}, "at least one"),
])
def test_bad_config(change, message):
    with pytest.raises(ValueError, match=message):
        make_manifold_benchmark(ManifoldConfig(**{**SMALL.__dict__, **change}))


def test_bad_seed():
    with pytest.raises(ValueError, match="seed"):
        make_manifold_benchmark(SMALL, seed=-1)
