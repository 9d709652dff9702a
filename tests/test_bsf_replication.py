"""Closed forms, readings and protocols behind the BSF replications (issue 16; docs/bsf.md §3.3, §6, §7):
the ℓ₂,₁ unit costs, the contribution penalty, the invariant code length, the oracle and single-atom
references, the SAE readings, the elbow rule, the c_gl bisection and the rate at a distortion."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dictcheck.empirics.metrics.manifold_bench as mb
from dictcheck.empirics.architectures import architecture, build_model
from dictcheck.empirics.metrics.manifold import default_precisions, mdl_bits, recovery, sae_blocks
from dictcheck.empirics.data.manifold_toy import ManifoldConfig, make_manifold_benchmark, sample_manifold
from dictcheck.theory.symbolic import analytic_l21_unit_costs

F64 = torch.float64


@pytest.fixture(scope="module")
def bench():
    cfg = ManifoldConfig(D=24, counts=(("circle", 2), ("sphere", 2), ("torus", 2)), n_train=200, n_eval=3000)
    return make_manifold_benchmark(cfg, seed=3)


# ----------------------------------------------------------------------------- ℓ₂,₁ unit costs (§3.3)


def test_l21_unit_costs_exact_values():
    expected = {"circle": (sp.sqrt(2), 4 / sp.pi), "sphere": (sp.sqrt(3), sp.Rational(3, 2)),
                "torus": (sp.Integer(2), 4 * sp.sqrt(2) / sp.pi)}
    for kind, (block, split) in expected.items():
        got = analytic_l21_unit_costs(kind)
        assert sp.simplify(got[0] - block) == 0 and sp.simplify(got[1] - split) == 0
        assert float(got[1]) < float(got[0])  # splitting is cheaper: the mechanism
    with pytest.raises(ValueError, match="kind must be"):
        analytic_l21_unit_costs("donut")


@pytest.mark.parametrize("kind", ["circle", "sphere", "torus"])
def test_l21_split_cost_against_sampling(kind):
    """Brute force: the mean Σ_a |φ_a| of uniform samples (5 standard errors at N = 2·10⁵)."""
    phi = sample_manifold(np.random.default_rng(0), kind, 200_000)[0]
    cost = np.abs(phi).sum(axis=1)
    assert abs(cost.mean() - float(analytic_l21_unit_costs(kind)[1])) <= 5 * cost.std() / math.sqrt(cost.size)


@settings(max_examples=25, deadline=None)
@given(r=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_isotropic_unit_frobenius_block_pays_sqrt_r(r, seed):
    """Solver cross-check: the least-norm code of a contribution c ∈ span(U) under W = U/√r has ‖z‖ = √r‖c‖."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.normal(size=(9, r)))[0]
    W = U / math.sqrt(r)
    assert np.linalg.norm(W) == pytest.approx(1.0)
    c = U @ rng.normal(size=r)
    z = np.linalg.lstsq(W, c, rcond=None)[0]
    assert np.linalg.norm(z) == pytest.approx(math.sqrt(r) * np.linalg.norm(c), rel=1e-10)
    # block_mechanism reads the same ratio off codes and blocks
    Z = rng.normal(size=(50, 1, r))
    split = make_manifold_benchmark(ManifoldConfig(D=9, counts=(("circle", 1),), k_true=1, n_train=10, n_eval=50), 0).eval
    assert mb.block_mechanism(split, Z, W[None])["code_per_contribution"] == pytest.approx(math.sqrt(r))


# ----------------------------------------------------------------------------- contribution penalty


def test_contribution_penalty_loss_and_gradient():
    model = build_model("bsf-grouplasso", 6, 8, {"block_size": 2, "penalty": "contribution", "c_gl": 0.3,
                                                   "denoise": 0.0}, seed=1, dtype=F64)
    with torch.no_grad():
        model.log_theta.fill_(math.log(1.5))  # some blocks inactive: the penalty's zero point
    x = torch.randn(20, 6, generator=torch.Generator().manual_seed(2), dtype=F64)
    out = model(x)
    W = model.decoder_blocks()
    z = out.codes.view(20, 4, 2)
    contrib = torch.einsum("bgq,gdq->bgd", z, W).norm(dim=-1)
    assert (z.norm(dim=-1) == 0).any() and (z.norm(dim=-1) > 0).any()
    assert float(out.sparsity_loss.detach()) == pytest.approx(0.3 * float(contrib.detach().sum(-1).mean()), rel=1e-12)
    out.loss.backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    assert model.options()["penalty"] == "contribution"


def test_penalty_option_validation():
    opts = architecture("bsf-grouplasso").options
    assert opts({"block_size": 2}, 8).to_dict()["penalty"] == "code"
    with pytest.raises(ValueError, match="penalty must be one of"):
        opts({"block_size": 2, "penalty": "atoms"}, 8)
    with pytest.raises(ValueError, match="applies only to gate='shrink'"):
        opts({"block_size": 2, "penalty": "contribution", "gate": "ste", "k_target": 2}, 8)


# ----------------------------------------------------------------------------- invariant code length (§7)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), q=st.integers(1, 4))
def test_principal_codes_invariant_to_parametrisation(seed, q):
    rng = np.random.default_rng(seed)
    N, n_b, D = 300, 5, 10
    W = rng.normal(size=(n_b, D, q))
    Z = rng.normal(size=(N, n_b, q)) * (rng.random((N, n_b, 1)) < 0.4)
    Z2, W2 = mb.reparametrise(Z, W, rng)
    np.testing.assert_allclose(np.einsum("igq,gdq->igd", Z2, W2), np.einsum("igq,gdq->igd", Z, W), atol=1e-10)
    P, P2 = mb.principal_codes(Z, W), mb.principal_codes(Z2, W2)
    np.testing.assert_allclose(np.abs(P), np.abs(P2), atol=1e-8)
    X = rng.normal(size=(N, D))
    prec = default_precisions(X)
    a, b = (mdl_bits(X, X * 0.5, C, dof_kind="frobenius", precisions=prec) for C in (P, P2))
    assert abs(a.total - b.total) <= 1e-6
    assert mdl_bits(X, X * 0.5, Z, dof_kind="frobenius", precisions=prec).total != pytest.approx(
        mdl_bits(X, X * 0.5, Z2, dof_kind="frobenius", precisions=prec).total, abs=1e-3)


# ----------------------------------------------------------------------------- recovery references (§6)


def test_oracle_blocks_recover(bench):
    Z, W = mb.oracle_blocks(bench.eval, 4)
    assert recovery(bench.eval, bench.types, Z, W).summary()["mean_best"] > 0.999
    with pytest.raises(ValueError, match="widest manifold"):
        mb.oracle_blocks(bench.eval, 3)


def test_single_atom_ceiling_is_the_best_direction(bench):
    """Brute force: the top eigenvector of M attains the ceiling; random directions stay below it."""
    ceil = mb.single_atom_ceilings(bench.eval)
    rng = np.random.default_rng(0)
    for j, kind in enumerate(bench.types):
        on = bench.eval.support[:, j]
        m = bench.eval.contribution(j)[on]
        w = np.linalg.eigh(m.T @ m)[1][:, -1]
        assert mb.atom_set_r2(m, np.outer(m @ w, w)) == pytest.approx(ceil[j], abs=1e-10)
        for _ in range(20):
            v = rng.normal(size=m.shape[1])
            v /= np.linalg.norm(v)
            assert mb.atom_set_r2(m, np.outer(m @ v, v)) <= ceil[j] + 1e-12
        assert ceil[j] == pytest.approx({"circle": 1 / 2, "sphere": 1 / 3, "torus": 1 / 4}[kind], abs=0.05)


def test_sae_readings(bench):
    """Signed atoms = the frames' columns with codes = coordinates: best n_j atoms and assigned atoms recover
    exactly; the single-atom reading equals recovery()'s best block and sits at the ceiling."""
    split = bench.eval
    A = split.frames.T  # one atom per frame column
    codes = (split.X @ split.frames) * np.repeat(split.support, np.diff(split.offsets), axis=1)
    Z, W = sae_blocks(codes, A)
    r = mb.sae_readings(split, Z, W)
    assert r["best_n_atoms"]["mean"] > 0.999 and r["assigned_atoms"]["mean"] > 0.999
    best = recovery(split, bench.types, Z, W).best
    np.testing.assert_allclose(r["single_atom"]["per_manifold"], best, atol=1e-9)
    assert np.all(best <= mb.single_atom_ceilings(split) + 1e-9)
    with pytest.raises(ValueError, match="q = 1"):
        mb.sae_readings(split, np.zeros((split.N, 2, 2)), np.zeros((2, 24, 2)))


# ----------------------------------------------------------------------------- protocols


def test_elbow_k():
    assert mb.elbow_k({1: 0.67, 2: 0.33, 3: 0.02, 4: 0.015, 5: 0.012}, 1.0) == 3
    assert mb.elbow_k({1: 0.1, 2: 0.09}, 1.0) == 1
    with pytest.raises(ValueError, match="k = 1, 2"):
        mb.elbow_k({1: 0.5, 3: 0.1}, 1.0)


def test_rate_at_distortion():
    pts = [(1e-2, 100.0), (1e-4, 300.0), (1e-3, 200.0)]
    assert mb.rate_at_distortion(pts, 1e-3) == pytest.approx(200.0)
    assert mb.rate_at_distortion(pts, math.sqrt(1e-3 * 1e-4)) == pytest.approx(250.0)
    assert mb.rate_at_distortion(pts, 1e-5) is None and mb.rate_at_distortion(pts, 1.0) is None


def test_match_block_l0_bisects_on_l0(monkeypatch):
    """With block L0 = 0.1/c (monotone), geometric bisection of [1e-3, 1e-1] moves towards L0 = 3 and keeps
    the nearest c; then the best of the restarts by training objective."""
    seen = []

    def fake(prep, arch, d_sae, k, options, *, steps, batch_size, lr, seed, log=None):
        c = options["c_gl"]
        seen.append((c, seed))
        return mb.TrainedBlocks(Z=np.zeros((1, 1, 1)), W=np.zeros((1, 1, 1)), X_hat=np.zeros((1, 1)),
                                metrics={"block_l0": 0.1 / c, "train_objective": 1.0 / (1 + seed)})

    monkeypatch.setattr(mb, "train_blocks", fake)
    s = mb.BenchSettings(data=ManifoldConfig(), steps=1, restarts=2)
    m = mb.match_block_l0(None, "bsf-grouplasso", 8, {"block_size": 2}, 3.0, s, 5, bracket=(1e-3, 1e-1), evals=4)
    cs = [r["c"] for r in m.trail]
    assert cs[0] == pytest.approx(1e-2) and cs[1] == pytest.approx(10 ** -1.5)
    assert abs(math.log(0.1 / m.c / 3)) == min(abs(math.log(0.1 / c / 3)) for c in cs)
    assert [sd for _, sd in seen[4:]] == [11] and m.model.metrics["chosen"] == 1  # the search run is seed 10
    with pytest.raises(ValueError, match="bracket"):
        mb.match_block_l0(None, "x", 8, {}, 3.0, s, 0, bracket=(1e-1, 1e-3), evals=2)
