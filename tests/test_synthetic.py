"""The synthetic generator (dictcheck.empirics.data.synthetic, docs/ecosystem.md §6): each property against its
definition. Its statistics against sae_lens.synthetic are tests/test_ground_truth_saelens.py (benchmark venv)."""

from __future__ import annotations

import numpy as np
import pytest

from dictcheck.empirics.data.synthetic import (
    FoldedNormal,
    HierarchySpec,
    SyntheticModel,
    SyntheticSpec,
    ZipfFiring,
    synthsaebench_spec,
)


def test_zipf_probabilities() -> None:
    p = ZipfFiring(0.5, 0.4, 5e-4).probabilities(100)
    assert p[0] == pytest.approx(0.4) and p[-1] == pytest.approx(5e-4)
    g = np.arange(1, 101)
    np.testing.assert_allclose((p - 5e-4) / (0.4 - 5e-4), (g ** -0.5 - 100 ** -0.5) / (1 - 100 ** -0.5))
    with pytest.raises(ValueError):
        ZipfFiring(1.0, 0.1, 0.2)


def test_independent_firing_rates_and_magnitudes() -> None:
    spec = SyntheticSpec(n_features=20, d=8, firing=ZipfFiring(1.0, 0.5, 0.05), magnitude_mean=(3.0, 1.0),
                         magnitude_std=0.0, bias_norm=0.0, seed=1)
    m = SyntheticModel(spec)
    b = m.sample(40000, np.random.default_rng(0))
    rates = np.asarray((b.acts > 0).sum(axis=0)).ravel() / 40000
    assert np.all(np.abs(rates - m.p) < 5 * np.sqrt(m.p * (1 - m.p) / 40000))
    dense = b.acts.toarray()
    for g in (0, 10, 19):  # σ = 0: every firing has magnitude μ_g, μ linear from 3 to 1
        assert np.allclose(dense[dense[:, g] > 0, g], 3.0 - 2.0 * g / 19)
    np.testing.assert_allclose(b.x, dense @ m.features)  # x = aᵀF (no bias)


def test_copula_keeps_the_marginals_and_correlates() -> None:
    spec = SyntheticSpec(n_features=30, d=8, firing=ZipfFiring(1.0, 0.4, 0.05), correlation_rank=2,
                         correlation_scale=0.5, seed=2)
    m = SyntheticModel(spec)
    assert np.all(m.diag >= 0.01 - 1e-12)
    np.testing.assert_allclose(np.sum(m.factor ** 2, axis=1) + m.diag, 1.0)
    on = (m.sample(40000, np.random.default_rng(0)).acts > 0).toarray().astype(float)
    rates = on.mean(axis=0)
    assert np.all(np.abs(rates - m.p) < 5 * np.sqrt(m.p * (1 - m.p) / 40000))
    corr = np.corrcoef(on.T)
    latent = m.factor @ m.factor.T  # the copula's correlations; firing indicators follow their sign
    off = ~np.eye(30, dtype=bool) & (np.abs(latent) > 0.3)
    assert np.mean(np.sign(corr[off]) == np.sign(latent[off])) > 0.95


def test_hierarchy_gates_and_excludes() -> None:
    spec = SyntheticSpec(n_features=60, d=16, firing=ZipfFiring(0.5, 0.6, 0.2),
                         hierarchy=HierarchySpec(roots=3, branching=3, depth=2, exclusive_fraction=1.0), seed=3)
    m = SyntheticModel(spec)
    f = m.forest
    assert list(f.parent[:3]) == [-1, -1, -1] and list(f.parent[3:6]) == [0, 0, 0]  # breadth-first layout
    assert list(f.parent[12:15]) == [3, 3, 3] and np.all(f.parent[39:] == -1)
    on = (m.sample(20000, np.random.default_rng(0)).acts > 0).toarray()
    kids = np.concatenate(f.levels)
    assert not np.any(on[:, kids] & ~on[:, f.parent[kids]])
    for groups in f.groups:
        assert groups.shape[0] > 0 and not np.any(on[:, groups].sum(axis=2) > 1)
    stats = m.statistics(5000)
    assert stats["orphan_fraction"] == 0.0 and stats["exclusive_clashes"] == 0
    # without exclusion siblings do fire together: the test above can fail
    loose = SyntheticModel(SyntheticSpec(**{**spec.__dict__, "hierarchy": HierarchySpec(3, 3, 2, 0.0)}))
    assert all(g.shape[0] == 0 for g in loose.forest.groups)
    on2 = (loose.sample(20000, np.random.default_rng(0)).acts > 0).toarray()
    assert np.any(on2[:, 3:6].sum(axis=1) > 1)


def test_compensation_restores_the_child_rates() -> None:
    spec = SyntheticSpec(n_features=40, d=16, firing=ZipfFiring(0.3, 0.5, 0.05),
                         hierarchy=HierarchySpec(roots=4, branching=3, depth=1, exclusive_fraction=0.0, compensate=True),
                         seed=4)
    m = SyntheticModel(spec)
    kids = m.forest.levels[0]
    np.testing.assert_allclose(m.p[kids], np.minimum(1, m.p_target[kids] / m.p_target[m.forest.parent[kids]]))
    on = (m.sample(40000, np.random.default_rng(0)).acts > 0).toarray()
    rates = on.mean(axis=0)
    unclipped = kids[m.p[kids] < 1]
    assert np.all(np.abs(rates[unclipped] - m.p_target[unclipped]) < 5 * np.sqrt(0.25 / 40000))


def test_orthogonalisation_lowers_the_overlap_and_seeds_reproduce() -> None:
    base = SyntheticSpec(n_features=200, d=20, seed=5)
    rho0 = SyntheticModel(base).statistics(100)["rho_mm"]
    ortho = SyntheticModel(SyntheticSpec(**{**base.__dict__, "orthogonalise_steps": 50, "orthogonalise_lr": 0.005}))
    assert ortho.statistics(100)["rho_mm"] < rho0
    np.testing.assert_allclose(np.linalg.norm(ortho.features, axis=1), 1.0)
    a, b = SyntheticModel(base).sample(50), SyntheticModel(base).sample(50)
    np.testing.assert_array_equal(a.x, b.x)
    assert (a.acts != b.acts).nnz == 0


def test_synthsaebench_spec() -> None:
    spec = synthsaebench_spec()
    assert (spec.n_features, spec.d, spec.correlation_rank) == (16384, 768, 25)
    assert spec.hierarchy == HierarchySpec(roots=128, branching=4, depth=3, exclusive_fraction=1.0, compensate=True)
    assert spec.magnitude_std == FoldedNormal(0.5, 0.5) and spec.magnitude_mean == (5.0, 4.0)
    assert synthsaebench_spec(512, 64, correlation_rank=4).correlation_rank == 4
