"""Tests of the §3/§6 diagnostics, the hull-distance QP and the best-new-atom search.

docs/theory.md §3 (R1, S1, R2, (4), (5), (5′), S4, S6), §6 (JSON keys), §8 Q1 (hull candidates).
All stationary points used here are exact and built in closed form (no learner).
"""

from __future__ import annotations

import json

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from dictcheck.solvers.hull_distance import HULL_CANDIDATES, hull_candidate_distances, hull_distance
from dictcheck.solvers.new_atom_search import best_new_atom, refine_atom
from dictcheck.theory.diagnostics import (
    DiagnosticTolerances,
    active_sets,
    antipode_gains,
    dictionary_diagnostics,
    gain,
    hull_prime_summands,
    nested_pairs,
    new_atom_codes,
    residuals,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def random_unit(rng: np.random.Generator, D: int) -> np.ndarray:
    v = rng.standard_normal(D)
    return v / np.linalg.norm(v)


def ray_stationary_point(seed: int, D: int, n_rays: int, lam: float, n_dead: int = 1, n_inner: int = 2):
    """Exact stationary point (wide-limit optimum at fixed b, spec §4.2/§4.4).

    One atom per ray from b; each ray carries 1–3 points at ρ > λ with codes ρ − λ and residuals
    λ·(ray direction). Points within λ of b get no code. Dead atoms are random unit vectors (every
    ‖r_i‖ ≤ λ, so their KKT-z holds). Returns (W, Z, b, X, ray_of_point).
    """
    rng = np.random.default_rng(seed)
    b = rng.standard_normal(D)
    dirs = np.stack([random_unit(rng, D) for _ in range(n_rays)], axis=1)
    cols, codes_rows, owner = [], [], []
    for d in range(n_rays):
        for _ in range(int(rng.integers(1, 4))):
            rho = lam * rng.uniform(1.2, 5.0)
            cols.append(b + rho * dirs[:, d])
            owner.append(d)
    for _ in range(n_inner):
        cols.append(b + lam * rng.uniform(0.0, 0.95) * random_unit(rng, D))
        owner.append(-1)
    X = np.stack(cols, axis=1)
    N = X.shape[1]
    n_atoms = n_rays + n_dead
    W = np.concatenate([dirs, np.stack([random_unit(rng, D) for _ in range(n_dead)], axis=1)], axis=1) if n_dead else dirs
    Z = np.zeros((n_atoms, N))
    for i, d in enumerate(owner):
        if d >= 0:
            Z[d, i] = np.linalg.norm(X[:, i] - b) - lam
    return W, Z, b, X, np.array(owner)


ray_cases = st.tuples(seeds, st.integers(2, 6), st.integers(1, 5), st.floats(0.05, 1.0))


# --------------------------------------------------------------------------------------------------
# (a) gain lemma
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(seed=seeds, D=st.integers(1, 5), lam=st.floats(0.01, 3.0), scale=st.floats(0.1, 5.0))
def test_gain_lemma_brute_force(seed: int, D: int, lam: float, scale: float) -> None:
    rng = np.random.default_rng(seed)
    R = scale * rng.standard_normal((D, 4))
    u = random_unit(rng, D)
    total_drop = 0.0
    for i in range(R.shape[1]):
        r = R[:, i]

        def f(t: float) -> float:
            return float(np.sum((r - t * u) ** 2) + 2.0 * lam * t)

        hi = abs(u @ r) + lam + 1.0
        res = minimize_scalar(f, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-12})
        brute = min(res.fun, f(0.0), min(f(t) for t in np.linspace(0.0, hi, 2001)))
        closed = float(r @ r - max(u @ r - lam, 0.0) ** 2)
        assert brute == pytest.approx(closed, abs=1e-9 * (1.0 + r @ r))
        assert f(new_atom_codes(u, r[:, None], lam)[0]) == pytest.approx(closed, abs=1e-12 * (1.0 + r @ r))
        total_drop += r @ r - brute
    assert gain(u, R, lam) == pytest.approx(total_drop, abs=1e-8 * (1.0 + np.sum(R * R)))


def test_gain_requires_unit_vector() -> None:
    with pytest.raises(ValueError):
        gain(np.array([2.0, 0.0]), np.ones((2, 3)), 0.5)


# --------------------------------------------------------------------------------------------------
# (b), (d) exact stationary point of the wide limit
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(case=ray_cases)
def test_wide_limit_stationary_point_passes(case) -> None:
    seed, D, n_rays, lam = case
    W, Z, b, X, owner = ray_stationary_point(seed, D, n_rays, lam)
    diag = dictionary_diagnostics(W, Z, b, X, lam)
    assert diag.kkt_violation <= 1e-10
    assert diag.stationarity_violation <= 1e-10
    assert diag.r2_violation <= 1e-10
    assert diag.hull_violation <= 1e-10
    assert diag.hull_prime_violation <= 1e-10
    assert diag.cert_ratio <= 1.0 + 1e-12
    assert diag.stationary and diag.failed_checks == ()
    assert diag.dead_atoms == (n_rays,)
    assert diag.live_atoms == tuple(range(n_rays))
    assert np.isnan(diag.stationarity_per_atom[n_rays]) and np.isnan(diag.hull_per_atom[n_rays])
    assert diag.nested_pairs == ()  # supports are disjoint rays
    assert np.all(diag.antipode_gain == 0.0)  # ‖r_i‖ ≤ λ: no atom can help (§2.3)
    # tau_act default = 1e-6 max z, reported
    assert diag.tau_act == pytest.approx(1e-6 * Z.max())
    # firing fraction counts points
    for d in range(n_rays):
        assert diag.firing_fraction[d] == pytest.approx(np.mean(owner == d))
    json.dumps(diag.to_json(), allow_nan=False)


@SETTINGS
@given(case=ray_cases)
def test_hull_prime_summands_nonnegative_at_stationary_point(case) -> None:
    seed, D, n_rays, lam = case
    W, Z, b, X, _ = ray_stationary_point(seed, D, n_rays, lam)
    R = residuals(W, Z, b, X)
    Phi = W.T @ R / lam
    active, _ = active_sets(Z)
    C = W.T @ W
    for d in range(W.shape[1]):
        for j in range(n_rays):  # live j
            if d == j:
                continue
            s = hull_prime_summands(Phi, Z, active, d, j)
            assert np.all(s >= -1e-12)
            assert s.sum() == pytest.approx(1.0 - C[d, j], abs=1e-10)
    diag = dictionary_diagnostics(W, Z, b, X, lam)
    assert diag.hull_prime_min_summand >= -1e-12


@SETTINGS
@given(case=ray_cases)
def test_hull_candidates_at_stationary_point(case) -> None:
    seed, D, n_rays, lam = case
    W, Z, b, X, owner = ray_stationary_point(seed, D, n_rays, lam)
    res = hull_candidate_distances(W, Z, b, X, lam)
    assert set(res.distances) == set(HULL_CANDIDATES)
    live = np.arange(n_rays)
    # (5) is proven: control; in the wide limit r_i/λ = x̃_i/ρ_i on active points, so H-act-data too
    assert np.all(res.distances["H-act-res"][live] <= 1e-9)
    assert np.all(res.distances["H-act-data"][live] <= 1e-9)
    assert np.isnan(res.distances["H-act-res"][n_rays])  # dead atom: empty set
    assert res.fraction_within(1e-6)["H-act-res"] == 1.0
    for name in ("H-inact-res", "H-inact-data"):
        assert np.all(np.isfinite(res.distances[name]))  # inner points are inactive for every atom
        assert np.all(res.set_sizes[name][live] == [np.sum(owner != d) for d in live])


# --------------------------------------------------------------------------------------------------
# (e) a perturbed dictionary fails KKT measurably
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(case=ray_cases, eps=st.floats(0.05, 0.3))
def test_perturbed_dictionary_fails_kkt(case, eps: float) -> None:
    seed, D, n_rays, lam = case
    W, Z, b, X, owner = ray_stationary_point(seed, D, n_rays, lam)
    rng = np.random.default_rng(seed + 1)
    w = W[:, 0]
    v = rng.standard_normal(D)
    v -= (v @ w) * w
    v /= np.linalg.norm(v)
    W2 = W.copy()
    W2[:, 0] = (w + eps * v) / np.sqrt(1.0 + eps**2)
    diag = dictionary_diagnostics(W2, Z, b, X, lam)
    # on ray 0: φ = (ρ cosθ − (ρ − λ))/λ, so |φ − 1| = ρ(1 − cosθ)/λ ≥ 1.2(1 − cosθ)
    rho = np.linalg.norm(X[:, owner == 0] - b[:, None], axis=0)
    expected = float(np.max(rho * (1.0 - 1.0 / np.sqrt(1.0 + eps**2)) / lam))
    assert diag.kkt_violation >= expected - 1e-12
    assert diag.kkt_violation > 1e-3
    assert not diag.stationary and "kkt" in diag.failed_checks


# --------------------------------------------------------------------------------------------------
# Exact codes of a non-stationary dictionary: KKT ≈ 0 but S1 fails
# --------------------------------------------------------------------------------------------------


def orthonormal_exact_codes(W: np.ndarray, X: np.ndarray, b: np.ndarray, lam: float) -> np.ndarray:
    """Exact non-negative lasso codes for orthonormal atoms: z_di = (ŵ_dᵀx̃_i − λ)₊ (separable)."""
    return np.maximum(W.T @ (X - b[:, None]) - lam, 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_exact_codes_of_nonstationary_dictionary(seed: int) -> None:
    rng = np.random.default_rng(seed)
    D, d_z, N, lam = 5, 3, 40, 0.3
    W = np.linalg.qr(rng.standard_normal((D, D)))[0][:, :d_z]
    X = rng.standard_normal((D, N)) + 0.5
    b = rng.standard_normal(D) * 0.1
    Z = orthonormal_exact_codes(W, X, b, lam)
    diag = dictionary_diagnostics(W, Z, b, X, lam)
    assert diag.kkt_violation <= 1e-12
    assert diag.stationarity_violation > 1e-2
    assert not diag.stationary and diag.failed_checks == ("stationarity", "hull")
    # R2 is the part of the S1 residual perpendicular to ŵ_d: never above S1
    live = np.array(diag.live_atoms)
    assert np.all(diag.r2_per_atom[live] <= diag.stationarity_per_atom[live] + 1e-12)
    # a lower objective exists: the search finds a strictly positive gain (cert fails)
    assert diag.cert_ratio > 1.0
    res = best_new_atom(residuals(W, Z, b, X), lam, W)
    rmax = np.max(np.linalg.norm(residuals(W, Z, b, X), axis=0))
    assert res.gain_mean >= (rmax - lam) ** 2 / N - 1e-12


def test_hierarchy_ground_truth_is_nested_and_not_stationary() -> None:
    """§5.2: ground-truth I₃ with exact codes has nested supports and fails S1 (absorption)."""
    rng = np.random.default_rng(0)
    lam = 0.1
    a = rng.uniform(1, 2, 120)
    X = np.zeros((3, 120))
    X[0] = a
    X[1, 60:90] = rng.uniform(1, 2, 30)
    X[2, 90:120] = rng.uniform(1, 2, 30)
    W, b = np.eye(3), np.zeros(3)
    Z = orthonormal_exact_codes(W, X, b, lam)
    diag = dictionary_diagnostics(W, Z, b, X, lam)
    assert diag.kkt_violation <= 1e-12
    assert set(diag.nested_pairs) == {(1, 0), (2, 0)}
    np.testing.assert_allclose(diag.nesting_cosine_defect, 1.0)
    assert diag.stationarity_violation > 0.1
    assert not diag.stationary
    assert diag.firing_fraction.tolist() == pytest.approx([1.0, 0.25, 0.25])


# --------------------------------------------------------------------------------------------------
# (f) nested pairs
# --------------------------------------------------------------------------------------------------


def test_nested_pairs_constructed_supports() -> None:
    active = np.array(
        [
            [1, 1, 0, 0, 0, 0],  # A_0 ⊂ A_1 = A_2
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],  # dead: never the first of a pair, and nothing is inside it
            [0, 0, 0, 1, 1, 0],  # disjoint from the others
            [0, 0, 1, 1, 0, 1],  # overlaps, no inclusion
        ],
        dtype=bool,
    )
    assert set(nested_pairs(active)) == {(0, 1), (0, 2), (1, 2), (2, 1)}


@SETTINGS
@given(seed=seeds, d_z=st.integers(1, 6), N=st.integers(1, 8), density=st.floats(0.1, 0.9))
def test_nested_pairs_match_set_inclusion(seed: int, d_z: int, N: int, density: float) -> None:
    active = np.random.default_rng(seed).random((d_z, N)) < density
    sets = [set(np.flatnonzero(row)) for row in active]
    expected = {(d, j) for d in range(d_z) for j in range(d_z) if d != j and sets[d] and sets[d] <= sets[j]}
    assert set(nested_pairs(active)) == expected


# --------------------------------------------------------------------------------------------------
# (g) the 50% rule: rank-1 data, one atom, stationary learned bias
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(
    seed=seeds,
    N=st.integers(4, 60),
    k_frac=st.floats(0.02, 0.98),
    lam=st.floats(0.05, 0.5),
    extra=st.floats(0.1, 2.0),
)
@example(seed=279, N=28, k_frac=0.96875, lam=0.494140625, extra=1.0)  # gains 2 ulps apart at 5.9
def test_fifty_percent_rule_antipode_gain(seed: int, N: int, k_frac: float, lam: float, extra: float) -> None:
    k = min(max(int(round(k_frac * N)), 1), N - 1)
    rng = np.random.default_rng(seed)
    u = random_unit(rng, 3)
    beta = lam * k / (N - k)  # the stationary learned bias b = βu (Σ_i r_i = kλ − (N − k)β = 0)
    a = beta + lam + extra  # active points lie beyond λ from b
    s = np.zeros(N)
    s[rng.permutation(N)[:k]] = a
    X = u[:, None] * s[None, :]
    b = beta * u
    Z = np.where(s > 0, a - beta - lam, 0.0)[None, :]
    diag = dictionary_diagnostics(u[:, None], Z, b, X, lam, learned_bias=True)
    assert diag.stationary, diag.failed_checks
    p = k / N
    assert diag.firing_fraction[0] == pytest.approx(p)
    assert diag.bias_off_mean[0] == pytest.approx(-p / (1 - p), rel=1e-10)
    assert diag.bias_residual_mean_norm <= 1e-12 * (1 + a)
    expected = (N - k) * max(beta - lam, 0.0) ** 2 / N  # = λ²(2p − 1)²/(1 − p) for p > 1/2
    assert diag.antipode_gain[0] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    if 2 * k > N:
        assert diag.antipode_gain[0] > 0.0
        assert expected == pytest.approx(lam**2 * (2 * p - 1) ** 2 / (1 - p), rel=1e-9)
    else:  # p ≤ 1/2: β ≤ λ, no point beyond λ along −u (p = 1/2 exactly: round-off only)
        assert diag.antipode_gain[0] <= 1e-24
    search = best_new_atom(residuals(u[:, None], Z, b, X), lam, u[:, None])
    # The search's best start is often the antipode itself, its gain summed by another formula: the
    # two agree to the rounding of an N-term sum, N·ε·gain (an absolute 1e-15 alone is under 2 ulps
    # once the gain exceeds 4: the example above gave 2 ulps at 5.9).
    assert search.gain_mean >= diag.antipode_gain[0] - 1e-15 - N * np.finfo(float).eps * diag.antipode_gain[0]


def test_dense_feature_bias_identity_example() -> None:
    """The §5.4 numbers at p = 0.695: off-mean −λp/(1 − p) = −0.22787 < −λ, so the antipode helps."""
    N, k, lam = 200, 139, 0.1
    u = np.array([1.0, 0.0, 0.0])
    beta = lam * k / (N - k)
    s = np.r_[np.full(k, 2.0), np.zeros(N - k)]
    X = u[:, None] * s
    Z = np.where(s > 0, 2.0 - beta - lam, 0.0)[None, :]
    diag = dictionary_diagnostics(u[:, None], Z, beta * u, X, lam, learned_bias=True)
    assert lam * diag.bias_off_mean[0] == pytest.approx(-0.22787, abs=1e-5)
    assert diag.bias_identity_violation <= 1e-12
    assert diag.antipode_gain[0] > 0


# --------------------------------------------------------------------------------------------------
# (c) the hull QP against cvxpy
# --------------------------------------------------------------------------------------------------


def cvxpy_hull_distance(c: np.ndarray, Phi: np.ndarray) -> float:
    pi = cp.Variable(Phi.shape[1], nonneg=True)
    # Minimise the norm itself (a cone program): the square root of a minimised squared distance
    # turns the solver's ~1e-10 value error into a ~1e-5 distance error near the hull.
    # The distance is then evaluated exactly at the solver's weights made feasible (clipped at 0,
    # renormalised), so the reference is an attained distance: never below the true minimum.
    prob = cp.Problem(cp.Minimize(cp.norm(Phi @ pi - c)), [cp.sum(pi) == 1])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    weights = np.maximum(pi.value, 0.0)
    return float(np.linalg.norm(Phi @ (weights / weights.sum()) - c))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=seeds, m=st.integers(1, 6), k=st.integers(1, 12), mode=st.sampled_from(["out", "in", "face"]))
def test_hull_distance_matches_cvxpy(seed: int, m: int, k: int, mode: str) -> None:
    rng = np.random.default_rng(seed)
    Phi = rng.standard_normal((m, k))
    if mode == "in":
        c = Phi @ rng.dirichlet(np.ones(k))
    elif mode == "face":
        w = rng.dirichlet(np.ones(k)) * (rng.random(k) < 0.5)
        w = w / w.sum() if w.sum() > 0 else np.eye(k)[0]
        c = Phi @ w + 0.5 * rng.standard_normal(m)
    else:
        c = 2.0 * rng.standard_normal(m)
    res = hull_distance(c, Phi)
    ref = cvxpy_hull_distance(c, Phi)
    assert res.converged
    assert res.distance == pytest.approx(ref, abs=1e-6)
    assert res.distance <= ref + 1e-8  # Wolfe's answer is exact up to round-off
    assert res.lower_bound <= ref + 1e-6
    assert np.all(res.weights >= 0) and res.weights.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(res.nearest, Phi @ res.weights, atol=1e-12)
    if mode == "in":
        assert res.distance <= 1e-9


def test_hull_distance_larger_instance_matches_cvxpy() -> None:
    rng = np.random.default_rng(7)
    Phi = rng.standard_normal((20, 300))
    for c in (3.0 * rng.standard_normal(20), Phi[:, :5].mean(axis=1) + 0.3 * rng.standard_normal(20)):
        res = hull_distance(c, Phi)
        assert res.converged
        assert res.distance == pytest.approx(cvxpy_hull_distance(c, Phi), abs=1e-6)
    assert hull_distance(Phi[:, 3], Phi).distance <= 1e-12  # a vertex
    with pytest.raises(ValueError):
        hull_distance(np.zeros(2), np.zeros((2, 0)))


# --------------------------------------------------------------------------------------------------
# New-atom search
# --------------------------------------------------------------------------------------------------


def test_new_atom_search_deterministic_and_monotone() -> None:
    rng = np.random.default_rng(3)
    R = rng.standard_normal((6, 50))
    W = np.linalg.qr(rng.standard_normal((6, 4)))[0]
    lam = 0.8
    r1 = best_new_atom(R, lam, W)
    r2 = best_new_atom(R, lam, W)
    assert r1.gain_sum == r2.gain_sum and np.array_equal(r1.u, r2.u) and r1.start == r2.start
    assert r1.gain_sum == pytest.approx(gain(r1.u, R, lam))
    assert r1.gain_mean >= np.max(antipode_gains(W, R, lam)) - 1e-15
    assert r1.gain_mean == pytest.approx(max(g for _, g in r1.start_gains))
    u0 = random_unit(rng, 6)
    u, g = refine_atom(u0, R, lam, n_steps=30)
    assert g >= gain(u0, R, lam) - 1e-12


def test_new_atom_search_zero_when_certified() -> None:
    W, Z, b, X, _ = ray_stationary_point(5, 4, 3, 0.4)
    res = best_new_atom(residuals(W, Z, b, X), 0.4, W)
    assert res.gain_mean <= 1e-24  # round-off only: ‖r_i‖ ≤ λ up to 1 ulp


# --------------------------------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------------------------------


def test_input_validation_and_thresholds() -> None:
    W, Z, b, X, _ = ray_stationary_point(11, 3, 3, 0.3)
    with pytest.raises(ValueError):
        dictionary_diagnostics(2.0 * W, Z, b, X, 0.3)
    with pytest.raises(ValueError):
        dictionary_diagnostics(W, Z - 0.1, b, X, 0.3)
    Zn = Z.copy()
    Zn[Zn == 0] = -1e-16  # round-off negatives are clipped
    assert dictionary_diagnostics(W, Zn, b, X, 0.3).stationary
    # an explicit τ_act is reported as given
    d = dictionary_diagnostics(W, Z, b, X, 0.3, tau_act=1e-3)
    assert d.tau_act == 1e-3 and d.to_json()["tau_act_rule"] == "given"
    # zero column (dead latent from to_unit_atoms) is accepted
    W0 = W.copy()
    W0[:, -1] = 0.0
    d0 = dictionary_diagnostics(W0, Z, b, X, 0.3)
    assert d0.stationary and d0.antipode_gain[-1] == 0.0
    # a stricter tolerance turns the verdict off
    tight = DiagnosticTolerances(kkt=0.0, stationarity=0.0, hull=0.0)
    assert isinstance(dictionary_diagnostics(W, Z, b, X, 0.3, tolerances=tight).stationary, bool)
