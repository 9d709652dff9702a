"""Recovery R², MDL bits, stable rank and half variance (docs/bsf.md §6–§9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.metrics.manifold import (
    MDLPrecisions,
    best_direction_fraction,
    binary_entropy,
    contribution_stable_ranks,
    decoder_stable_ranks,
    mdl_bits,
    nonnegative_atom_r2,
    normalised_cov_eigenvalues,
    orthonormal_codes,
    recovery,
    recovery_r2_matrix,
    sae_blocks,
    stable_rank,
)
from dictcheck.empirics.data.manifold_toy import ManifoldConfig, make_manifold_benchmark, sample_manifold
from dictcheck.theory.symbolic import analytic_best_direction_fraction, analytic_nonnegative_circle_r2

CFG = ManifoldConfig(D=30, counts=(("circle", 2), ("sphere", 2), ("torus", 2)), n_train=20, n_eval=400)


def _bench(seed=0, frames="orthogonal"):
    return make_manifold_benchmark(ManifoldConfig(**{**CFG.__dict__, "frames": frames}), seed=seed)


def _truth_blocks(split, q=4):
    """One block per manifold holding exactly its ground truth (padded to q columns)."""
    Z = np.zeros((split.N, split.n_m, q))
    W = np.zeros((split.n_m, split.X.shape[1], q))
    for j in range(split.n_m):
        e = split.embedding(j)
        Z[:, j, :e.shape[1]] = e
        W[j, :, :e.shape[1]] = split.frame(j)
    return Z, W


def _brute_r2(split, Z, W, over="active"):
    """R²_{j,g} straight from the definition, materialising every m_ij and c_ig."""
    out = np.empty((split.n_m, W.shape[0]))
    for j in range(split.n_m):
        A = split.support[:, j] if over == "active" else np.ones(split.N, dtype=bool)
        M = split.contribution(j)[A]
        den = np.sum((M - M.mean(axis=0)) ** 2)
        for g in range(W.shape[0]):
            C = Z[A, g, :] @ W[g].T
            out[j, g] = 1 - np.sum((M - C) ** 2) / den
    return out


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), frames=st.sampled_from(["orthogonal", "independent"]),
       over=st.sampled_from(["active", "all"]))
def test_r2_matrix_matches_brute_force(seed, frames, over):
    split = _bench(seed, frames).eval
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(split.N, 5, 3)) * (rng.random((split.N, 5, 1)) < 0.5)
    W = rng.normal(size=(5, 30, 3)) / 4
    assert np.allclose(recovery_r2_matrix(split, Z, W, over=over), _brute_r2(split, Z, W, over), atol=1e-10)


def test_truth_has_r2_one_and_zero_contributions_at_most_zero():
    b = _bench(1)
    Z, W = _truth_blocks(b.eval)
    res = recovery(b.eval, b.types, Z, W)
    assert np.allclose(res.best, 1.0, atol=1e-12) and np.allclose(res.hungarian, 1.0, atol=1e-12)
    assert np.array_equal(res.best_block, np.arange(b.n_m))
    s = res.summary()
    assert s["mean_best"] == pytest.approx(1.0) and set(s["per_type_best"]) == {"circle", "sphere", "torus"}
    zero = recovery_r2_matrix(b.eval, np.zeros_like(Z), W)
    # R² of c = 0 is −‖m̄‖²·|A|/Σ‖m − m̄‖² ≤ 0
    assert np.all(zero <= 0) and np.all(zero > -0.2)


def test_hungarian_on_permuted_blocks_and_unassigned():
    b = _bench(2)
    Z, W = _truth_blocks(b.eval)
    perm = np.random.default_rng(0).permutation(b.n_m)
    res = recovery(b.eval, b.types, Z[:, perm], W[perm])
    assert np.array_equal(perm[res.hungarian_block], np.arange(b.n_m))
    assert np.allclose(res.hungarian, 1.0)
    # Fewer blocks than manifolds: the unassigned manifolds score 0 and carry block −1.
    few = recovery(b.eval, b.types, Z[:, :4], W[:4])
    assert np.sum(few.hungarian_block == -1) == 2
    assert np.all(few.hungarian[few.hungarian_block == -1] == 0)
    assert few.summary()["mean_hungarian"] == pytest.approx(4 / 6)


def test_hungarian_beats_greedy_duplicate():
    """Best-block lets two manifolds claim one block; the Hungarian match cannot."""
    b = _bench(3)
    Z, W = _truth_blocks(b.eval)
    # Block 0 holds circles 0 and 1 together (frame [E_0 E_1]); circle 1's own block is removed.
    Z[:, 0, 2:] = Z[:, 1, :2]
    W[0, :, 2:] = W[1, :, :2]
    keep = [0, 2, 3, 4, 5]
    res = recovery(b.eval, b.types, Z[:, keep], W[keep])
    assert res.best_block[0] == res.best_block[1] == 0
    assert 0.5 < res.best[0] < 1 and 0.5 < res.best[1] < 1  # the other circle leaks into block 0
    assert res.hungarian_block[:2].tolist().count(0) == 1  # one-to-one: only one circle keeps block 0
    assert res.summary()["mean_hungarian"] < res.summary()["mean_best"]


def test_sae_blocks_single_direction_ceiling():
    """A single atom along a circle's frame column with code wᵀm: R² = 1/2 on that circle (§6 ceiling)."""
    b = _bench(4)
    s = b.eval
    w = s.frame(0)[:, 0]
    codes = (s.contribution(0) @ w)[:, None]
    Z, W = sae_blocks(codes, w[None, :])
    r2 = recovery_r2_matrix(s, Z, W)[0, 0]
    # sampled circle: 1 − Σ sin²/Σ‖m − m̄‖², close to 1/2 at |A_0| ≈ 200
    assert 0.4 < r2 < 0.6
    assert r2 == pytest.approx(_brute_r2(s, Z, W)[0, 0], abs=1e-12)


def test_recovery_bad_input():
    s = _bench().eval
    with pytest.raises(ValueError, match="disagree"):
        recovery_r2_matrix(s, np.zeros((s.N, 3, 2)), np.zeros((4, 30, 2)))
    with pytest.raises(ValueError, match="over"):
        recovery_r2_matrix(s, np.zeros((s.N, 3, 2)), np.zeros((3, 30, 2)), over="some")
    with pytest.raises(ValueError, match="NaN"):
        recovery_r2_matrix(s, np.full((s.N, 3, 2), np.nan), np.zeros((3, 30, 2)))


# ---------------------------------------------------------------------------------------------- MDL


def test_mdl_terms_by_hand():
    N, D = 4, 2
    X = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    X_hat = X + np.array([[0.1, 0.0], [-0.1, 0.0], [0.0, 0.2], [0.0, -0.2]])
    Z = np.zeros((N, 2, 1))
    Z[0, 0, 0], Z[1, 0, 0], Z[2, 1, 0] = 1.0, -1.0, 2.0  # block 0 fires on 2/4, block 1 on 1/4
    prec = MDLPrecisions(delta_x=0.01, delta_z=0.5, B_w=16.0, N_ref=4, sigma_x=1.0)
    r = mdl_bits(X, X_hat, Z, dof_kind="frobenius", k=1, precisions=prec)
    H = lambda p: -p * math.log2(p) - (1 - p) * math.log2(1 - p)  # noqa: E731
    assert r.L_support == pytest.approx(H(0.5) + H(0.25))
    assert r.L_support_fixed_k == pytest.approx(1.0)  # log2 C(2, 1)
    assert r.B_z == pytest.approx(math.log2(2 * 2.0 / 0.5)) and r.B_z == pytest.approx(3.0)
    assert r.L_code == pytest.approx(3 / 4 * 3.0)
    s2 = np.array([0.01 / 2, 0.04 / 2])  # mean squared residual per coordinate
    assert r.L_resid == pytest.approx(sum(max(0.0, 0.5 * math.log2(2 * math.pi * math.e * v) - math.log2(0.01)) for v in s2))
    assert r.L_dict == pytest.approx(2 * 1 * 2 * 16 / 4)
    assert r.L_dict_grassmann == pytest.approx(2 * 1 * 1 * 16 / 4)
    assert r.total == pytest.approx(r.L_support + r.L_code + r.L_resid + r.L_dict)
    st_ = mdl_bits(X, X_hat, Z, dof_kind="stiefel", precisions=prec)
    assert st_.L_dict == pytest.approx(2 * (2 - 1) * 16 / 4) and st_.L_support_fixed_k is None
    assert r.as_dict()["precisions"]["delta_z"] == 0.5


def test_mdl_default_precisions_and_exact_reconstruction():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3)) * 2
    r = mdl_bits(X, X, rng.normal(size=(50, 2, 2)), dof_kind="stiefel")
    sigma_x = math.sqrt(np.mean(X.var(axis=0)))
    assert r.precisions.sigma_x == pytest.approx(sigma_x)
    assert r.precisions.delta_x == pytest.approx(0.01 * sigma_x) == r.precisions.delta_z
    assert (r.precisions.B_w, r.precisions.N_ref) == (16.0, 50)
    assert r.L_resid == 0.0  # zero residual: every coordinate is clamped at 0 bits
    assert r.L_support == 0.0  # every block always fires: H_b(1) = 0


def test_binary_entropy():
    assert np.allclose(binary_entropy([0.0, 1.0, 0.5]), [0.0, 0.0, 1.0])
    with pytest.raises(ValueError):
        binary_entropy([1.5])


def test_mdl_bad_input():
    X = np.ones((3, 2)) * np.arange(3)[:, None]
    with pytest.raises(ValueError, match="dof_kind"):
        mdl_bits(X, X, np.zeros((3, 1, 1)), dof_kind="grass")
    with pytest.raises(ValueError, match="same|one"):
        mdl_bits(X, X[:2], np.zeros((3, 1, 1)), dof_kind="frobenius")
    with pytest.raises(ValueError, match="k must"):
        mdl_bits(X, X, np.zeros((3, 2, 1)), dof_kind="frobenius", k=3)
    with pytest.raises(ValueError, match="zero variance"):
        mdl_bits(np.ones((3, 2)), np.ones((3, 2)), np.zeros((3, 1, 1)), dof_kind="frobenius")


# --------------------------------------------------------------------------------------- stable rank


@pytest.mark.parametrize("n", [3, 4, 7, 12])
def test_stable_rank_even_circle_is_two(n):
    t = 2 * np.pi * np.arange(n) / n
    assert stable_rank(np.column_stack([np.cos(t), np.sin(t), np.zeros(n)])) == pytest.approx(2.0, abs=1e-12)


def test_stable_rank_line_and_frame():
    rng = np.random.default_rng(1)
    assert stable_rank(np.outer(rng.normal(size=9), rng.normal(size=5))) == pytest.approx(1.0, abs=1e-12)
    for q in (1, 2, 5):
        Q = np.linalg.qr(rng.normal(size=(20, q)))[0]
        assert stable_rank(Q) == pytest.approx(q, abs=1e-12)
    A = rng.normal(size=(8, 4))
    s = np.linalg.svd(A, compute_uv=False)
    assert 1.0 <= stable_rank(A) <= 4.0 and stable_rank(A) == pytest.approx(np.sum(s**2) / s[0] ** 2)
    with pytest.raises(ValueError, match="zero"):
        stable_rank(np.zeros((3, 3)))


def test_block_stable_ranks():
    n = 12
    t = 2 * np.pi * np.arange(n) / n
    Z = np.zeros((n + 1, 3, 2))
    Z[:n, 0] = np.column_stack([np.cos(t), np.sin(t)]) + 5.0  # offset: centring removes it
    Z[:n, 1, 0] = np.arange(n)  # a line
    Z[n, 2, 0] = 1.0  # fires once: undefined
    W = np.stack([np.linalg.qr(np.random.default_rng(g).normal(size=(6, 2)))[0] for g in range(3)])
    ranks = contribution_stable_ranks(Z, W)
    assert ranks[0] == pytest.approx(2.0, abs=1e-12) and ranks[1] == pytest.approx(1.0) and ranks[2] is None
    assert np.allclose(decoder_stable_ranks(W), 2.0)


# ----------------------------------------------------------------------------------- half variance


@pytest.mark.parametrize("n", [3, 4, 5, 16])
def test_half_variance_even_angles_exact(n):
    t = 2 * np.pi * np.arange(n) / n
    assert np.allclose(normalised_cov_eigenvalues(np.column_stack([np.cos(t), np.sin(t)])), [0.5, 0.5],
                       rtol=0, atol=1e-14)


def test_half_variance_analytic():
    assert analytic_best_direction_fraction("circle") == sp.Rational(1, 2)
    assert analytic_best_direction_fraction("sphere") == sp.Rational(1, 3)
    assert analytic_best_direction_fraction("torus") == sp.Rational(1, 4)
    assert analytic_nonnegative_circle_r2() == sp.Rational(1, 4)
    with pytest.raises(ValueError, match="kind"):
        analytic_best_direction_fraction("donut")


@pytest.mark.parametrize("kind, expected", [("circle", 1 / 2), ("sphere", 1 / 3), ("torus", 1 / 4)])
def test_half_variance_sampled(kind, expected):
    phi, _ = sample_manifold(np.random.default_rng(5), kind, 100_000)
    assert best_direction_fraction(phi) == pytest.approx(expected, abs=0.01)


def test_nonnegative_atom_quarter():
    phi, _ = sample_manifold(np.random.default_rng(6), "circle", 100_000)
    assert nonnegative_atom_r2(phi, np.array([1.0, 0.0])) == pytest.approx(0.25, abs=0.01)
    t = 2 * np.pi * np.arange(8) / 8
    assert nonnegative_atom_r2(np.column_stack([np.cos(t), np.sin(t)]), np.array([0.0, 1.0])) == pytest.approx(0.25)


def test_orthonormal_codes_keep_contributions():
    rng = np.random.default_rng(7)
    Z = rng.normal(size=(20, 3, 2)) * (rng.random((20, 3, 1)) < 0.6)
    W = rng.normal(size=(3, 6, 2))
    Zc, Q = orthonormal_codes(Z, W)
    assert np.allclose(np.einsum("gdq,igq->igd", Q, Zc), np.einsum("gdq,igq->igd", W, Z), atol=1e-12)
    assert np.allclose(np.einsum("gdq,gdr->gqr", Q, Q), np.eye(2), atol=1e-12)
    assert np.all((Zc != 0).any(axis=2) == (Z != 0).any(axis=2))  # supports unchanged
    # Orthonormal blocks keep their codes and columns up to the sign convention diag(R) > 0.
    Qn = np.stack([np.linalg.qr(rng.normal(size=(6, 2)))[0] for _ in range(3)])
    Z2, Q2 = orthonormal_codes(Z, Qn)
    assert np.allclose(np.abs(Z2), np.abs(Z), atol=1e-12)
    assert np.allclose(np.abs(np.einsum("gdq,gdq->gq", Q2, Qn)), 1.0, atol=1e-12)
