"""Tests for empirics/metrics/reconstruction.py (docs/ecosystem.md §2, docs/theory.md §6 amortisation_gap).

Metrics take tokens as ROWS (N, D); amortisation_gap takes the theory layout X (D, N).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dictcheck.empirics.metrics import reconstruction as M
from dictcheck.solvers.lasso_codes import exact_codes

SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


def _data(seed: int, n: int = 40, d: int = 6, noise: float = 0.3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, size=d) + rng.normal(size=d)
    x_hat = rng.uniform(0.3, 1.5) * x + noise * rng.normal(size=(n, d)) + 0.2 * rng.normal(size=d)
    return x, x_hat


# ---------------------------------------------------------------- closed forms (docs/ecosystem.md §2)


def test_predicting_mean_gives_ve_0_fvu_1():
    x, _ = _data(0)
    x_hat = np.broadcast_to(x.mean(axis=0), x.shape)
    assert M.fvu(x, x_hat) == pytest.approx(1.0, abs=1e-12)
    assert M.ve(x, x_hat) == pytest.approx(0.0, abs=1e-12)
    assert M.ve_legacy_per_token(x, x_hat) == pytest.approx(0.0, abs=1e-12)  # each term is 0


def test_perfect_reconstruction():
    x, _ = _data(1)
    m = M.reconstruction_metrics(x, x.copy())
    assert m["ve"] == 1.0 and m["fvu"] == 0.0 and m["fve_dl"] == 1.0 and m["mse"] == 0.0
    assert m["ve_legacy_per_token"] == 1.0
    assert m["cossim"] == pytest.approx(1.0, abs=1e-14)
    assert m["l2_ratio"] == pytest.approx(1.0, abs=1e-14)
    assert m["rel_recon_bias"] == pytest.approx(1.0, abs=1e-14)


def test_constant_offset_error():
    x, _ = _data(2)
    c = np.array([0.5, -1.0, 0.0, 2.0, 0.1, 0.3])
    x_hat = x + c
    assert M.fve_dl(x, x_hat) == pytest.approx(1.0, abs=1e-12)
    v = M.ve(x, x_hat)
    assert v < 1.0
    n = x.shape[0]
    expected = 1.0 - n * float(c @ c) / float(np.sum((x - x.mean(0)) ** 2))
    assert v == pytest.approx(expected, rel=1e-12)
    assert M.mse(x, x_hat) == pytest.approx(float(c @ c), rel=1e-12)
    assert M.mse_per_element(x, x_hat) == pytest.approx(float(c @ c) / 6, rel=1e-12)


def test_keys_exact_and_no_bare_explained_variance():
    x, x_hat = _data(3)
    codes = np.maximum(np.random.default_rng(3).normal(size=(40, 9)), 0.0)
    codes[:, 4] = 0.0
    m = M.reconstruction_metrics(x, x_hat, codes)
    assert tuple(m) == M.METRIC_NAMES
    assert "explained_variance" not in m
    assert m["n_eval_tokens"] == 40 and m["dead_frac"] == pytest.approx(1 / 9)
    assert tuple(M.reconstruction_metrics(x, x_hat)) == M.RECON_METRIC_NAMES
    for k in M.RECON_METRIC_NAMES:
        assert getattr(M, k)(x, x_hat) == pytest.approx(m[k], rel=1e-13, abs=1e-15)


def test_torch_input_matches_numpy():
    x, x_hat = _data(4)
    a = M.reconstruction_metrics(x, x_hat)
    f32 = torch.float32
    b = M.reconstruction_metrics(torch.tensor(x, dtype=f32), torch.tensor(x_hat, dtype=f32))
    c = M.reconstruction_metrics(torch.tensor(x), torch.tensor(x_hat, requires_grad=True))
    for k in a:
        assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6)
        assert c[k] == a[k]


def test_pooled_not_batch_mean():
    x, x_hat = _data(5, n=60)
    # pooled fvu differs from the mean of per-batch fvus in general; check against the pooled formula
    r = x - x_hat
    pooled = np.sum(r**2) / np.sum((x - x.mean(0)) ** 2)
    assert M.fvu(x, x_hat) == pytest.approx(pooled, rel=1e-14)
    batch_mean = np.mean([M.fvu(x[i : i + 20], x_hat[i : i + 20]) for i in (0, 20, 40)])
    assert abs(batch_mean - pooled) > 1e-6


# ---------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(SEEDS, st.integers(2, 30), st.integers(1, 5), st.floats(0.0, 3.0))
def test_fve_dl_ge_ve(seed, n, d, offset):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x_hat = x + rng.normal(size=(n, d)) * rng.uniform(0, 2) + offset * rng.normal(size=d)
    assume(np.sum((x - x.mean(0)) ** 2) > 1e-6)
    assert M.fve_dl(x, x_hat) >= M.ve(x, x_hat) - 1e-12
    assert M.ve(x, x_hat) <= 1.0 and M.fve_dl(x, x_hat) <= 1.0


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.floats(-50, 50), st.floats(0.1, 10.0))
def test_invariances(seed, shift, scale):
    """True invariances: a common constant added to x and x_hat leaves r and x − x̄ unchanged, so
    fvu, ve, fve_dl and ve_legacy_per_token are unchanged; a common scale s ≠ 0 scales numerator and
    denominator by s², and also leaves cossim, l2_ratio and rel_recon_bias unchanged. (cossim and
    l2_ratio are NOT shift-invariant, so they are not tested under the shift.)"""
    x, x_hat = _data(seed)
    c = shift * np.random.default_rng(seed + 1).normal(size=x.shape[1])
    base = M.reconstruction_metrics(x, x_hat)
    shifted = M.reconstruction_metrics(x + c, x_hat + c)
    scaled = M.reconstruction_metrics(scale * x, scale * x_hat)
    for k in ("fvu", "ve", "fve_dl", "ve_legacy_per_token", "mse"):
        assert shifted[k] == pytest.approx(base[k], rel=1e-8, abs=1e-10)
    for k in ("fvu", "ve", "fve_dl", "ve_legacy_per_token", "cossim", "l2_ratio", "rel_recon_bias"):
        assert scaled[k] == pytest.approx(base[k], rel=1e-10, abs=1e-12)
    # fve_dl is also invariant to a constant added to x_hat alone (the residual mean is removed)
    assert M.fve_dl(x, x_hat + c) == pytest.approx(base["fve_dl"], rel=1e-8, abs=1e-10)


def _golden_min_log(f, lo: float, hi: float, iters: int = 200) -> float:
    """Golden-section minimisation of f(exp(t)) over t ∈ [log lo, log hi] (f unimodal)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.floats(0.2, 5.0))
def test_rel_recon_bias_is_argmin(seed, shrink):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(30, 5)) + rng.normal(size=5)
    x_hat = shrink * x + 0.3 * rng.normal(size=(30, 5))
    assume(np.sum(x * x_hat) > 0)

    def loss(gamma: float) -> float:
        return float(np.mean(np.sum((x_hat / gamma - x) ** 2, axis=1)))

    g_num = _golden_min_log(loss, 1e-4, 1e4)
    assert M.rel_recon_bias(x, x_hat) == pytest.approx(g_num, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.integers(2, 25), st.integers(1, 5))
def test_per_token_metrics_against_loop(seed, n, d):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x_hat = x + rng.normal(size=(n, d)) * 0.5
    assume(np.sum((x - x.mean(0)) ** 2) > 1e-6)
    xbar = [sum(x[t][j] for t in range(n)) / n for j in range(d)]
    legacy, cs, lr = [], [], []
    for t in range(n):
        num = sum((x[t][j] - x_hat[t][j]) ** 2 for j in range(d))
        den = sum((x[t][j] - xbar[j]) ** 2 for j in range(d))
        legacy.append(1 - num / den)
        nx = math.sqrt(sum(v * v for v in x[t]))
        nh = math.sqrt(sum(v * v for v in x_hat[t]))
        cs.append(sum(x[t][j] * x_hat[t][j] for j in range(d)) / (nx * nh))
        lr.append(nh / nx)
    assert M.ve_legacy_per_token(x, x_hat) == pytest.approx(sum(legacy) / n, rel=1e-9, abs=1e-9)
    assert M.cossim(x, x_hat) == pytest.approx(sum(cs) / n, rel=1e-12, abs=1e-12)
    assert M.l2_ratio(x, x_hat) == pytest.approx(sum(lr) / n, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.integers(1, 30), st.integers(1, 12), st.floats(0.0, 1.0))
def test_l0_and_dead_frac_on_constructed_codes(seed, n, d_sae, p):
    rng = np.random.default_rng(seed)
    mask = rng.random((n, d_sae)) < p
    codes = np.where(mask, rng.uniform(0.1, 3.0, size=(n, d_sae)), 0.0)
    assert M.l0(codes) == pytest.approx(mask.sum() / n, rel=1e-14)
    dl = M.dead_latents(codes)
    assert dl.n_dead == int((~mask.any(axis=0)).sum())
    assert dl.dead_frac == pytest.approx(dl.n_dead / d_sae) == M.dead_frac(codes)
    assert dl.n_eval_tokens == n and dl.d_sae == d_sae
    assert np.array_equal(dl.dead_mask, ~mask.any(axis=0))


def test_l0_dead_frac_exact_small_case_and_tol():
    codes = np.array([[0.0, 1.0, 0.0, 1e-9], [0.0, 2.0, 3.0, 0.0], [0.0, 0.0, -1.0, 0.0]])
    assert M.l0(codes) == pytest.approx(5 / 3)  # signed codes count as ≠ 0
    assert M.dead_frac(codes) == 0.25
    assert M.dead_frac(codes, tol=1e-6) == 0.5
    assert M.l0(codes, tol=1e-6) == pytest.approx(4 / 3)


# ---------------------------------------------------------------- edge cases and errors


def test_zero_variance_raises():
    x = np.tile(np.array([[1.0, 2.0, 3.0]]), (5, 1))
    for f in (M.fvu, M.ve, M.fve_dl, M.ve_legacy_per_token, M.reconstruction_metrics):
        with pytest.raises(ValueError, match="zero variance"):
            f(x, x + 0.1)
    x01 = np.full((7, 2), 0.1)  # constant with inexact mean
    with pytest.raises(ValueError, match="zero variance"):
        M.fvu(x01, x01 * 0.5)
    # metrics that do not need variance still work
    assert M.mse(x, x + 0.1) == pytest.approx(0.03)


def test_empty_and_shape_errors():
    e = np.zeros((0, 3))
    for f in (M.mse, M.fvu, M.cossim, M.reconstruction_metrics):
        with pytest.raises(ValueError, match="N = 0"):
            f(e, e)
    with pytest.raises(ValueError, match="N = 0"):
        M.l0(np.zeros((0, 4)))
    with pytest.raises(ValueError, match="same shape"):
        M.mse(np.ones((3, 2)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="2-D"):
        M.mse(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="non-finite"):
        M.mse(np.array([[1.0, np.nan]]), np.ones((1, 2)))
    x, x_hat = _data(6)
    with pytest.raises(ValueError, match="rows"):
        M.reconstruction_metrics(x, x_hat, np.ones((x.shape[0] + 1, 3)))


def test_zero_norm_tokens():
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    x_hat = np.array([[5.0, 5.0], [2.0, 0.0], [0.0, 0.0]])
    # token 0 skipped; token 2 has x_hat = 0 -> cos 0, ratio 0
    assert M.cossim(x, x_hat) == pytest.approx(0.5)
    assert M.l2_ratio(x, x_hat) == pytest.approx(1.0)
    z = np.zeros((2, 3))
    with pytest.raises(ValueError, match="every x_t is zero"):
        M.cossim(z, z + 1)
    with pytest.raises(ValueError, match="every x_t is zero"):
        M.l2_ratio(z, z + 1)


def test_ve_legacy_skips_token_at_mean():
    x = np.array([[-1.0, 0.0], [0.0, 0.0], [1.0, 0.0]])  # middle token is x̄
    x_hat = np.array([[-0.5, 0.0], [0.3, 0.0], [1.0, 0.0]])
    assert M.ve_legacy_per_token(x, x_hat) == pytest.approx((0.75 + 1.0) / 2)


def test_rel_recon_bias_edge_cases():
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="identically zero"):
        M.rel_recon_bias(x, np.zeros_like(x))
    assert M.rel_recon_bias(x, np.array([[0.0, 1.0], [1.0, 0.0]])) == math.inf
    assert M.rel_recon_bias(x, -2 * x) == pytest.approx(-2.0)


# ---------------------------------------------------------------- amortisation gap (docs/theory.md §6)


def _problem(seed: int, D: int = 5, d_z: int = 8, N: int = 30):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, d_z))
    W /= np.linalg.norm(W, axis=0)
    X = rng.normal(size=(D, N)) + 0.5
    b = 0.3 * rng.normal(size=D)
    lam = float(rng.uniform(0.05, 0.5))
    return rng, W, X, b, lam


@settings(max_examples=15, deadline=None)
@given(SEEDS)
def test_amortisation_gap_nonneg_and_zero(seed):
    rng, W, X, b, lam = _problem(seed)
    ex = exact_codes(W, X, b, lam)
    assert ex.converged
    Z_exact = np.asarray(ex.Z)
    assert M.amortisation_gap(W, Z_exact, Z_exact, b, X, lam) == 0.0
    W_enc = W + 0.3 * rng.normal(size=W.shape)
    Z_enc = np.maximum(W_enc.T @ (X - b[:, None]) - lam, 0.0)  # linear + ReLU encoder
    gap = M.amortisation_gap(W, Z_enc, Z_exact, b, X, lam)
    assert gap >= -1e-10
    Z_pert = np.maximum(Z_exact + 0.05 * rng.normal(size=Z_exact.shape), 0.0)
    assert M.amortisation_gap(W, Z_pert, Z_exact, b, X, lam) >= -1e-10
    # Z_exact=None computes the same exact codes
    assert M.amortisation_gap(W, Z_enc, None, b, X, lam) == pytest.approx(gap, rel=1e-7, abs=1e-9)


def test_amortisation_gap_rescaling():
    """A decoder with arbitrary column norms s_d and codes z/s_d give the same gap as unit atoms."""
    rng, W, X, b, lam = _problem(11)
    Z_exact = np.asarray(exact_codes(W, X, b, lam).Z)
    Z_enc = np.maximum(W.T @ (X - b[:, None]) - lam, 0.0)
    gap_unit = M.amortisation_gap(W, Z_enc, Z_exact, b, X, lam)
    s = rng.uniform(0.2, 5.0, size=W.shape[1])
    Ws = W * s
    gap_scaled = M.amortisation_gap(Ws, Z_enc / s[:, None], Z_exact / s[:, None], b, X, lam)
    assert gap_scaled == pytest.approx(gap_unit, rel=1e-10, abs=1e-12)
    gap_none = M.amortisation_gap(Ws, Z_enc / s[:, None], None, b, X, lam)
    assert gap_none == pytest.approx(gap_unit, rel=1e-7, abs=1e-9)
    assert M.unit_atom_objective(Ws, Z_enc / s[:, None], b, X, lam) == pytest.approx(
        M.unit_atom_objective(W, Z_enc, b, X, lam), rel=1e-12
    )
    # and agrees with the direct formula (1)
    R = W @ Z_enc + b[:, None] - X
    direct = (np.sum(R**2) + 2 * lam * np.sum(Z_enc)) / X.shape[1]
    assert M.unit_atom_objective(W, Z_enc, b, X, lam) == pytest.approx(direct, rel=1e-12)


def test_amortisation_gap_errors():
    _, W, X, b, lam = _problem(12)
    Z = np.zeros((W.shape[1], X.shape[1]))
    with pytest.raises(ValueError, match="COLUMNS"):
        M.amortisation_gap(W, Z.T, Z.T, b, X.T, lam)
    with pytest.raises(ValueError, match="negative"):
        M.amortisation_gap(W, Z - 1.0, Z, b, X, lam)
    with pytest.raises(ValueError, match=r"\(d_z, N\)"):
        M.amortisation_gap(W, Z[:, :-1], Z, b, X, lam)
