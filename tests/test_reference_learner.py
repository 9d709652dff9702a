"""Tests of the reference learner (docs/theory.md §2.2) and the §5.2–§5.4 toy-model assertions.

Stationarity is checked on the learner's own codes (converted to objective (1)):
KKT-z (φ_id = 1 on active entries, ≤ 1 elsewhere), S1 (Σ_i z_di r_i = λ‖z_d·‖₁ ŵ_d, relative to
λ‖z_d·‖₁), and with a learned bias R1 = 0 and identity (4).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.data.toys import dense_feature, independent_features, parent_child
from dictcheck.solvers.reference_learner import (
    ReferenceFit,
    fit_reference,
    fit_residuals,
    reduced_hvp,
    reduced_objective,
)
from dictcheck.solvers.medians import huber_median as solve_huber_median
from dictcheck.theory.huber import huber_objective, huber_objective_gradient
from dictcheck.theory.objective import sae_objective, scaled_objective

STAT_TOL = 1e-8  # spec §2.2: the reference learner reaches stationarity to about 1e-8


# ------------------------------------------------------------------------------------------------
# helpers (diagnostics of §3 / §6, computed from a fit and its data)
# ------------------------------------------------------------------------------------------------


def huber_median(X: np.ndarray, lam: float) -> np.ndarray:
    """The Huber-smoothed geometric median b* (spec §4.3), from the solver verified against cvxpy."""
    return solve_huber_median(X, lam).b


def active(fit: ReferenceFit) -> np.ndarray:
    return fit.Z > fit.tau_act


def kkt_violation(fit: ReferenceFit, X: np.ndarray) -> float:
    """§6 kkt_violation: max |φ_id − 1| on active entries, (φ_id − 1)₊ elsewhere."""
    phi = fit.W.T @ fit_residuals(fit, X) / fit.lam
    A = active(fit)
    return float(np.max(np.where(A, np.abs(phi - 1.0), np.maximum(phi - 1.0, 0.0))))


def s1_violation_at(W: np.ndarray, Z: np.ndarray, b: np.ndarray, X: np.ndarray, lam: float) -> float:
    """max over live d of ‖Σ_i z_di r_i − λ‖z_d·‖₁ ŵ_d‖ / (λ‖z_d·‖₁) (S1, relative), unit atoms W."""
    R = X - b[:, None] - W @ Z
    worst = 0.0
    for d in np.flatnonzero(Z.sum(axis=1) > 0):
        mass = Z[d].sum()
        worst = max(worst, float(np.linalg.norm(R @ Z[d] - lam * mass * W[:, d]) / (lam * mass)))
    return worst


def s1_violation(fit: ReferenceFit, X: np.ndarray) -> float:
    return s1_violation_at(fit.W, fit.Z, fit.b, X, fit.lam)


def bias_identity_violation(fit: ReferenceFit, X: np.ndarray) -> float:
    """max over d with 0 < p_d < 1 of |mean_{i off} φ_id + p_d/(1 − p_d)| (identity (4) / λ)."""
    phi = fit.W.T @ fit_residuals(fit, X) / fit.lam
    A = active(fit)
    worst = 0.0
    for d in range(fit.W.shape[1]):
        p = A[d].mean()
        if 0 < p < 1:
            worst = max(worst, abs(phi[d, ~A[d]].mean() + p / (1 - p)))
    return worst


def antipode_gains(fit: ReferenceFit, X: np.ndarray) -> np.ndarray:
    """gain(−ŵ_d) = Σ_i (−ŵ_dᵀ r_i − λ)₊² per atom (sum form, S6)."""
    proj = fit.W.T @ fit_residuals(fit, X)
    return np.sum(np.maximum(-proj - fit.lam, 0.0) ** 2, axis=1)


def nested_pairs(fit: ReferenceFit) -> list[tuple[int, int]]:
    A = active(fit)
    d_z = A.shape[0]
    return [(d, j) for d in range(d_z) for j in range(d_z)
            if d != j and A[d].any() and np.all(A[j][A[d]])]


def assert_stationary(fit: ReferenceFit, X: np.ndarray, tol: float = STAT_TOL) -> None:
    assert kkt_violation(fit, X) <= tol
    assert s1_violation(fit, X) <= tol
    assert fit.max_balance_deviation <= tol
    if fit.learn_bias:
        assert fit.bias_gradient <= tol * fit.lam
        assert bias_identity_violation(fit, X) <= tol


def assert_bracketed(fit: ReferenceFit, X: np.ndarray) -> None:
    """objective = (1) at the returned (W, Z, b); wide-limit bound ≤ objective ≤ start."""
    assert fit.objective == pytest.approx(sae_objective(fit.W, fit.Z, fit.b, X, fit.lam), rel=1e-14, abs=1e-14)
    assert fit.objective_sum == pytest.approx(fit.objective * X.shape[1], rel=1e-14)
    bound = huber_objective(fit.b, X, fit.lam)
    assert fit.objective >= bound - 1e-12
    assert fit.objective <= fit.reduced_objective + 1e-12  # AM–GM: (1) ≤ (2)
    assert fit.reduced_objective <= fit.start_objective + 1e-12


# ------------------------------------------------------------------------------------------------
# gradients and Hessian-vector products of N·F
# ------------------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), D=st.integers(1, 4), N=st.integers(1, 12), d_z=st.integers(1, 4),
       lam=st.floats(0.05, 1.0))
def test_reduced_objective_gradient_and_hvp_match_finite_differences(seed, D, N, d_z, lam):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(D, N))
    Z = rng.random((d_z, N)) + 0.1
    b = rng.normal(size=D)
    red = reduced_objective(Z, b, X, lam)
    # value: N·F at W = W*(Z) (form (2), W eliminated)
    assert red.value_sum == pytest.approx(N * scaled_objective(red.W, Z, b, X, lam), rel=1e-12)
    dZ, db = rng.normal(size=Z.shape), rng.normal(size=D)
    h = 1e-6
    plus, minus = reduced_objective(Z + h * dZ, b + h * db, X, lam), reduced_objective(Z - h * dZ, b - h * db, X, lam)
    fd = (plus.value_sum - minus.value_sum) / (2 * h)
    analytic = np.sum(red.grad_Z * dZ) + red.grad_b @ db
    assert fd == pytest.approx(analytic, rel=1e-6, abs=1e-7)
    hZ, hb = reduced_hvp(Z, b, X, lam, dZ, db)
    fdZ, fdb = (plus.grad_Z - minus.grad_Z) / (2 * h), (plus.grad_b - minus.grad_b) / (2 * h)
    scale = max(1.0, np.abs(hZ).max(), np.abs(hb).max())
    assert np.abs(fdZ - hZ).max() <= 1e-5 * scale
    assert np.abs(fdb - hb).max() <= 1e-5 * scale


def test_gradient_matches_spec_formula():
    """∇_Z F = (2/N)[λ(Z1)1ᵀ − W*ᵀR], ∇_b F = −(2/N)R1: reduced_objective returns N times these."""
    rng = np.random.default_rng(3)
    X, Z, b, lam = rng.normal(size=(3, 7)), rng.random((2, 7)), rng.normal(size=3), 0.2
    red = reduced_objective(Z, b, X, lam)
    W = red.W
    R = X - b[:, None] - W @ Z
    N = X.shape[1]
    assert np.allclose(red.grad_Z / N, 2 / N * (lam * np.outer(Z.sum(1), np.ones(N)) - W.T @ R), atol=1e-14)
    assert np.allclose(red.grad_b / N, -2 / N * R.sum(1), atol=1e-14)


# ------------------------------------------------------------------------------------------------
# API, shapes, determinism, initialisation
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def indep_fit():
    toy = independent_features(0)
    t0 = time.perf_counter()
    fit = fit_reference(toy.X, toy.lam, W0=toy.ground_truth["W_true"],
                        Z0=np.maximum(toy.ground_truth["Z_true"] - toy.lam, 0.0))
    print(f"\n[§5.3] independent_features fit: {time.perf_counter() - t0:.3f}s")
    return toy, fit


def test_shapes_and_types(indep_fit):
    toy, fit = indep_fit
    D, N = toy.X.shape
    assert fit.W.shape == (D, 3) and fit.Z.shape == (3, N) and fit.b.shape == (D,)
    assert fit.balance_ratio.shape == (3,) and fit.live.shape == (3,)
    assert fit.W.dtype == fit.Z.dtype == fit.b.dtype == np.float64
    assert np.allclose(np.linalg.norm(fit.W[:, fit.live], axis=0), 1.0, atol=1e-14)
    assert np.all(fit.Z >= 0)
    assert fit.converged and fit.iterations > 0
    with pytest.raises(AttributeError):
        fit.objective = 0.0  # frozen


def test_deterministic():
    toy = independent_features(5)
    a = fit_reference(toy.X, toy.lam, W0=toy.ground_truth["W_true"])
    b = fit_reference(toy.X, toy.lam, W0=toy.ground_truth["W_true"])
    assert np.array_equal(a.W, b.W) and np.array_equal(a.Z, b.Z) and np.array_equal(a.b, b.b)
    assert a.objective == b.objective


def test_w0_scaling_is_irrelevant_given_codes():
    """(W0, Z0) and (2·W0, Z0/2) define the same unit-atom start, hence the same fit."""
    toy = independent_features(2)
    W0, Z0 = toy.ground_truth["W_true"], np.maximum(toy.ground_truth["Z_true"] - toy.lam, 0.0)
    a = fit_reference(toy.X, toy.lam, W0=W0, Z0=Z0)
    b = fit_reference(toy.X, toy.lam, W0=2.0 * W0, Z0=Z0 / 2.0)
    assert a.objective == pytest.approx(b.objective, rel=1e-12)
    assert np.allclose(a.W, b.W, atol=1e-7)


def test_fixed_bias_stays_fixed():
    toy = independent_features(1)
    b0 = np.array([0.05, -0.02, 0.01])
    fit = fit_reference(toy.X, toy.lam, W0=toy.ground_truth["W_true"], b0=b0, learn_bias=False)
    assert np.array_equal(fit.b, b0)
    assert_stationary(fit, toy.X)
    assert_bracketed(fit, toy.X)


def test_zero_codes_revive_through_the_offset():
    """Zero-row trap: an all-zero start is offset by 1e-3, so every latent can still grow."""
    toy = independent_features(0)
    fit = fit_reference(toy.X, toy.lam, W0=np.eye(3), Z0=np.zeros((3, toy.N)))
    assert fit.live.all()
    assert fit.objective < huber_objective(fit.b, toy.X, fit.lam) + 0.5  # far below "no atoms"
    no_atoms = np.mean(np.sum((toy.X - fit.b[:, None]) ** 2, axis=0))
    assert fit.objective < 0.5 * no_atoms


def test_input_validation():
    X = np.zeros((3, 5))
    with pytest.raises(ValueError):
        fit_reference(X, 0.1, W0=np.eye(2))
    with pytest.raises(ValueError):
        fit_reference(X, 0.1, W0=np.eye(3), Z0=np.zeros((3, 4)))
    with pytest.raises(ValueError):
        fit_reference(X, 0.1, W0=np.eye(3), Z0=-np.ones((3, 5)))
    with pytest.raises(ValueError):
        fit_reference(X, 0.0, W0=np.eye(3))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), D=st.integers(2, 3), N=st.integers(4, 14), d_z=st.integers(1, 4),
       lam=st.floats(0.05, 0.5), learn_bias=st.booleans())
def test_random_problems_bracketed_and_balanced(seed, D, N, d_z, lam, learn_bias):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(D, N)) + 1.0
    W0 = rng.normal(size=(D, d_z))
    Z0 = rng.random((d_z, N))
    fit = fit_reference(X, lam, W0=W0, Z0=Z0, learn_bias=learn_bias)
    assert_bracketed(fit, X)
    assert fit.max_balance_deviation <= 1e-6
    assert kkt_violation(fit, X) <= 1e-6


# ------------------------------------------------------------------------------------------------
# §5.3 independent features
# ------------------------------------------------------------------------------------------------


def test_independent_features_stationary(indep_fit):
    toy, fit = indep_fit
    X = toy.X
    assert_stationary(fit, X)
    assert_bracketed(fit, X)
    assert fit.projected_gradient <= 1e-10


def test_independent_features_robust_properties(indep_fit):
    """§5.3: near-orthogonal atoms, firing fractions ≈ 0.3, no nesting, zero antipode gains."""
    toy, fit = indep_fit
    C = fit.W.T @ fit.W
    off = np.abs(C - np.eye(3)).max()
    p = fit.firing_fraction
    print(f"[§5.3] sum {fit.objective_sum:.4f} (spec 38.31), max|cos| {off:.4f} (spec <= 0.03), "
          f"p {np.round(p, 3)} (spec 0.29-0.32), antipode gains {antipode_gains(fit, toy.X)}")
    assert off <= 0.05
    assert np.all((p > 0.2) & (p < 0.4))
    assert nested_pairs(fit) == []
    assert np.all(antipode_gains(fit, toy.X) == 0.0)
    # atoms recover the mixing matrix up to order
    match = np.abs(toy.ground_truth["W_true"].T @ fit.W).max(axis=0)
    assert np.all(match > 0.99)
    assert fit.objective_sum == pytest.approx(38.31, rel=0.1)  # seeded; our stream differs


# ------------------------------------------------------------------------------------------------
# §5.2 parent/child hierarchy
# ------------------------------------------------------------------------------------------------


def test_parent_child_absorption():
    toy = parent_child(0)
    X, lam = toy.X, toy.lam
    Z_true = toy.ground_truth["Z_true"]
    labels = toy.ground_truth["labels"]
    gt_exact_sum = X.shape[1] * sae_objective(np.eye(3), np.maximum(Z_true - lam, 0.0), np.zeros(3), X, lam)
    t0 = time.perf_counter()
    fit = fit_reference(X, lam, W0=np.eye(3), Z0=np.maximum(Z_true - lam, 0.0), learn_bias=False)
    elapsed = time.perf_counter() - t0
    assert np.array_equal(fit.b, np.zeros(3))
    assert_stationary(fit, X)
    assert_bracketed(fit, X)
    bound_sum = X.shape[1] * huber_objective(np.zeros(3), X, lam)

    # the ground-truth start is not stationary: S1 fails for I₃ with its exact codes
    assert s1_violation_at(np.eye(3), np.maximum(Z_true - lam, 0.0), np.zeros(3), X, lam) > 0.1
    assert bound_sum < fit.objective_sum < fit.start_objective_sum <= gt_exact_sum + 1e-9

    A = active(fit)
    parent = int(np.argmax(np.abs(fit.W[0])))  # the atom closest to e₁
    children = [d for d in range(3) if d != parent]
    parent_off_child = int(np.sum(~A[parent][labels > 0]))
    parent_on_only = int(np.sum(A[parent][labels == 0]))
    cos_pc = [float(fit.W[:, parent] @ fit.W[:, d]) for d in children]
    cos_cc = float(fit.W[:, children[0]] @ fit.W[:, children[1]])
    ratio = Z_true[1:].sum(0) / Z_true[0]
    off_pts = (labels > 0) & ~A[parent]
    on_pts = (labels > 0) & A[parent]
    phi = fit.W.T @ fit_residuals(fit, X) / lam
    print(f"\n[§5.2] fit {elapsed:.3f}s; sums: GT exact {gt_exact_sum:.2f} (spec 51.74), start F "
          f"{fit.start_objective_sum:.2f} (50.63), final {fit.objective_sum:.2f} (43.26), wide bound "
          f"{bound_sum:.2f} (42.09); parent on {parent_on_only}/60 parent-only, on child-1 "
          f"{int(A[parent][labels == 1].sum())}/30 (22), child-2 {int(A[parent][labels == 2].sum())}/30 (20); "
          f"ratio where off {ratio[off_pts].mean():.2f} (1.41), on {ratio[on_pts].mean():.2f} (0.98); "
          f"cos parent-child {np.round(cos_pc, 3)} (0.629, 0.610), child-child {cos_cc:.3f} (0.380); "
          f"max inactive phi {phi[~A].max():.3f} (0.868)")
    # robust assertions of §5.2
    assert nested_pairs(fit) == []
    assert parent_off_child > 0 or max(cos_pc) > 0.1
    # and, as in the reference: parent on every parent-only point, children on exactly their own points
    assert parent_on_only == 60
    for d in children:
        own = 1 if abs(fit.W[1, d]) > abs(fit.W[2, d]) else 2
        assert np.array_equal(A[d], labels == own)
    assert min(cos_pc) > 0.1 and parent_off_child > 0


# ------------------------------------------------------------------------------------------------
# §5.4 dense feature (the 50% rule)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense_toy():
    return dense_feature()  # default_rng(1), as in the spec


def test_dense_feature_dz3(dense_toy):
    toy = dense_toy
    X, lam, N = toy.X, toy.lam, toy.N
    t0 = time.perf_counter()
    fit = fit_reference(X, lam, W0=np.eye(3), Z0=np.maximum(toy.ground_truth["Z_true"] - lam, 0.0))
    elapsed = time.perf_counter() - t0
    assert_stationary(fit, X)
    assert_bracketed(fit, X)
    p = fit.firing_fraction
    dense = int(np.argmax(np.abs(fit.W[0])))
    gains = antipode_gains(fit, X)
    phi = fit.W.T @ fit_residuals(fit, X) / lam
    off_mean = lam * phi[dense, ~active(fit)[dense]].mean()
    b_h = huber_median(X, lam)
    wide_sum = N * huber_objective(b_h, X, lam)
    print(f"\n[§5.4 d_z=3] fit {elapsed:.3f}s; sum {fit.objective_sum:.4f} (spec 70.40); dense p {p[dense]:.3f} "
          f"(0.695); off-mean {off_mean:.5f} (-0.22787); antipode gain {gains[dense]:.4f} (1.025); sparse p "
          f"{np.round(np.delete(p, dense), 3)} (0.17) gains {np.delete(gains, dense)} (0); wide {wide_sum:.4f} (45.10)")
    assert p[dense] > 0.5
    assert gains[dense] > 0
    assert off_mean == pytest.approx(-lam * p[dense] / (1 - p[dense]), abs=1e-4 * lam)
    assert off_mean < -lam
    assert np.all(np.delete(gains, dense) == 0.0)
    # seeded reference values; our generator reproduces the spec's stream, compare loosely
    assert fit.objective_sum == pytest.approx(70.40, rel=5e-3)
    assert wide_sum == pytest.approx(45.10, rel=5e-3)
    assert np.linalg.norm(huber_objective_gradient(b_h, X, lam)) < 1e-10


def test_dense_feature_dz4_antipodal_pair(dense_toy):
    toy = dense_toy
    X, lam, N = toy.X, toy.lam, toy.N
    Z_true = toy.ground_truth["Z_true"]
    W0 = np.column_stack([np.eye(3), -np.eye(3)[:, 0]])  # the spare atom's direction is irrelevant (W is eliminated)
    Z0 = np.vstack([np.maximum(Z_true - lam, 0.0), 0.3 * (~toy.ground_truth["dense_on"])])
    t0 = time.perf_counter()
    fit = fit_reference(X, lam, W0=W0, Z0=Z0)
    elapsed = time.perf_counter() - t0
    assert_stationary(fit, X)
    assert_bracketed(fit, X)
    fit3 = fit_reference(X, lam, W0=np.eye(3), Z0=np.maximum(Z_true - lam, 0.0))
    C = fit.W.T @ fit.W
    np.fill_diagonal(C, 1.0)
    d, j = np.unravel_index(np.argmin(C), C.shape)
    p = fit.firing_fraction
    print(f"\n[§5.4 d_z=4] fit {elapsed:.3f}s; sum {fit.objective_sum:.4f} (spec 53.57); pair cos {C[d, j]:.5f} "
          f"(-0.99977); pair p {p[d]:.3f}, {p[j]:.3f} (0.455, 0.465); b {np.round(fit.b, 4)} (b1 1.486)")
    assert C[d, j] < -0.99
    assert p[d] <= 0.5 + 2 / N and p[j] <= 0.5 + 2 / N
    assert fit.objective_sum < fit3.objective_sum
    assert fit.b[0] > 1.0  # b moves into the dense variable's range
    assert fit.objective_sum == pytest.approx(53.57, rel=5e-3)


# ------------------------------------------------------------------------------------------------
# §5.1 dense scalar, constant amplitude: the deterministic table (one latent, +u or −u)
# ------------------------------------------------------------------------------------------------

TABLE_51 = {  # λ: {p: (b*, mean objective)}  docs/theory.md §5.1, a = 2, N = 1000
    0.1: {0.2: (0.025, 0.0775), 0.49: (0.096078, 0.186392), 0.51: (1.903922, 0.186392), 0.8: (1.975, 0.0775)},
    0.3: {0.4: (0.2, 0.42), 0.6: (1.8, 0.42)},
    0.6: {0.49: (0.576471, 0.830118), 0.51: (1.423529, 0.830118)},
}


@pytest.mark.parametrize("lam,p", [(lam, p) for lam, row in TABLE_51.items() for p in row])
def test_dense_scalar_table(lam, p):
    from dictcheck.empirics.data.toys import dense_scalar
    from dictcheck.theory.dense_scalar import dense_scalar_optimum

    toy = dense_scalar(p=p, lam=lam)
    plus = p < 0.5
    # one latent: +u started at b = 0, or −u started at b = a (so its cheap codes are non-zero)
    fit = fit_reference(toy.X, lam, W0=np.array([[1.0 if plus else -1.0]]), b0=[0.0 if plus else 2.0])
    b_ref, obj_ref = TABLE_51[lam][p]
    assert fit.b[0] == pytest.approx(b_ref, abs=1e-6)
    assert fit.objective == pytest.approx(obj_ref, abs=1e-6)
    closed = dense_scalar_optimum(p, 2.0, lam)
    assert fit.b[0] == pytest.approx(closed.b, abs=1e-9)
    assert fit.objective == pytest.approx(closed.objective, abs=1e-12)
    assert fit.W[0, 0] == pytest.approx(1.0 if plus else -1.0, abs=1e-15)
    assert fit.firing_fraction[0] == pytest.approx(min(p, 1 - p), abs=1e-12)
    assert_stationary(fit, toy.X)
