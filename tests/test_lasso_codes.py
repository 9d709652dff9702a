"""Exact non-negative lasso codes for fixed (W, b) (docs/theory.md §1, KKT-z).

References: cvxpy + Clarabel on the same problem, scikit-learn's ``sparse_encode`` (same
minimiser with α = λ, spec §1 table), the one-atom closed form and the zero-code threshold.
"""

from __future__ import annotations

import io
import warnings

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers import lasso_codes as lc
from dictcheck.solvers.atom_rows import AtomRows
from dictcheck.solvers.lasso_codes import ExactCodes, exact_codes, kkt_violation
from dictcheck.theory.objective import sae_objective

seeds = st.integers(0, 2**32 - 1)
TOL = 1e-8


def _random_problem(seed: int, D: int, d_z: int, N: int, unit: bool):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, d_z))
    if unit:
        W /= np.linalg.norm(W, axis=0)
    else:
        W *= rng.uniform(0.2, 3.0, size=d_z)
    X = rng.normal(size=(D, N)) * rng.uniform(0.5, 2.0)
    b = rng.normal(size=D) * 0.3
    return W, X, b


def _cvxpy_codes(W, X, b, lam, *, with_accuracy=False):
    """Clarabel solution of min (1/N) Σ ‖x̃_i − W z_i‖² + 2λ‖z_i‖₁, Z ≥ 0, clipped at 0.

    Tight tolerances (1e-12) first; Clarabel occasionally stops on those, and then a fresh
    problem is solved with the default tolerances and flagged as not tight (codes to ~1e-4).
    """
    d_z, N = W.shape[1], X.shape[1]
    Xc = X - b[:, None]
    attempts = [
        dict(tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, max_iter=500),
        dict(),
    ]
    for k, opts in enumerate(attempts):
        Z = cp.Variable((d_z, N), nonneg=True)
        prob = cp.Problem(cp.Minimize((cp.sum_squares(Xc - W @ Z) + 2 * lam * cp.sum(Z)) / N))
        try:
            prob.solve(solver=cp.CLARABEL, **opts)
        except cp.error.SolverError:
            continue
        if prob.status == "optimal" or (k > 0 and prob.status == "optimal_inaccurate"):
            Zc = np.maximum(Z.value, 0.0)
            if k == 0:
                Zc = np.stack([_polished(W, Xc[:, i], lam, Zc[:, i]) for i in range(N)], axis=1)
            return (Zc, k == 0) if with_accuracy else Zc
    raise AssertionError("cvxpy/Clarabel reference failed")


def _polished(W, x, lam, z):
    """Clarabel's code made exact: starting from its support S, solve z_S = (W_Sᵀ W_S)⁻¹(W_Sᵀ x̃ − λ1) and drop
    the most negative entry until z_S > 0; kept when the result is a KKT point (w_dᵀr ≤ λ off S), otherwise
    Clarabel's code as it is. An interior-point code at gap 1e-12 can still be ~1e-6 off (the excess
    objective is quadratic in the code error; seed 16085928: 2.6e-6 at an excess of 3e-12, with a fifth
    atom at 2e-6 in its support), while the polished one is exact to rounding."""
    S = z > 1e-7 * max(1.0, z.max())
    zs = np.zeros(0)
    while S.any():
        if np.linalg.matrix_rank(W[:, S]) < S.sum():
            return z
        zs = np.linalg.solve(W[:, S].T @ W[:, S], W[:, S].T @ x - lam)
        if zs.min() > 0:
            break
        S[np.flatnonzero(S)[np.argmin(zs)]] = False
    out = np.zeros_like(z)
    out[S] = zs
    g = W.T @ (x - W @ out) - lam
    scale = lam * (1.0 + np.linalg.norm(W, axis=0))
    return out if np.all(g[~S] <= 1e-9 * scale[~S]) else z


def _unique_and_well_conditioned(W, z, x_centred, lam, floor=1e-2) -> bool:
    """The lasso minimiser is unique when the atoms tight in (KKT-z) are independent.

    Tight set E = support ∪ {d : |w_dᵀr − λ| ≤ 1e-6 λ}; compare codes only when σ_min(W_E) is
    comfortably positive (otherwise a 1e-9 objective gap allows large code differences).
    """
    g = W.T @ (x_centred - W @ z) - lam
    E = (z > 0) | (np.abs(g) <= 1e-6 * lam)
    if not E.any():
        return True
    if E.sum() > W.shape[0]:
        return False
    return bool(np.linalg.svd(W[:, E], compute_uv=False).min() > floor)


# --------------------------------------------------------------------------------------------
# Properties against cvxpy (Clarabel)
# --------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    seeds,
    st.integers(1, 7),
    st.integers(1, 12),
    st.integers(1, 5),
    st.floats(1e-3, 2.0),
    st.booleans(),
)
def test_kkt_objective_and_codes_match_cvxpy(seed, D, d_z, N, lam, unit) -> None:
    W, X, b = _random_problem(seed, D, d_z, N, unit)
    res = exact_codes(W, X, b, lam)
    assert isinstance(res, ExactCodes)
    assert res.Z.shape == (d_z, N) and res.Z.dtype == np.float64
    assert np.all(res.Z >= 0)
    assert res.converged and res.kkt_violation <= TOL
    assert kkt_violation(W, res.Z, X, b, lam) <= TOL  # recomputed independently, in numpy

    Zc, tight = _cvxpy_codes(W, X, b, lam, with_accuracy=True)
    ours = sae_objective(W, res.Z, b, X, lam)
    ref = sae_objective(W, Zc, b, X, lam)
    assert ours <= ref + 1e-9
    # the minimiser is unique when the tight atoms are independent; compare codes then
    for i in range(N):
        if _unique_and_well_conditioned(W, res.Z[:, i], X[:, i] - b, lam):
            scale = 1.0 + np.abs(res.Z[:, i]).max()
            atol = (1e-6 if tight else 1e-4) * scale
            np.testing.assert_allclose(res.Z[:, i], Zc[:, i], atol=atol, rtol=0)


@settings(max_examples=25, deadline=None)
@given(seeds, st.integers(1, 6), st.integers(1, 6), st.floats(1e-2, 3.0), st.floats(0.1, 5.0))
def test_one_atom_closed_form(seed, D, N, lam, norm) -> None:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D, 1))
    w *= norm / np.linalg.norm(w)
    X = rng.normal(size=(D, N)) * 2.0
    b = rng.normal(size=D) * 0.5
    res = exact_codes(w, X, b, lam)
    expected = np.maximum(w[:, 0] @ (X - b[:, None]) - lam, 0.0) / norm**2
    np.testing.assert_allclose(res.Z[0], expected, rtol=1e-12, atol=1e-14)
    assert res.kkt_violation <= TOL


@settings(max_examples=25, deadline=None)
@given(seeds, st.integers(1, 8), st.integers(1, 20), st.integers(1, 6), st.floats(0.0, 2.0))
def test_zero_codes_when_no_correlation_exceeds_lambda(seed, D, d_z, N, margin) -> None:
    W, X, b = _random_problem(seed, D, d_z, N, unit=False)
    C = W.T @ (X - b[:, None])
    lam = max(float(C.max()), 1e-3) * (1.0 + margin)  # ‖(Wᵀx̃)₊‖∞ ≤ λ for every point
    res = exact_codes(W, X, b, lam)
    assert np.all(res.Z == 0.0)
    assert res.converged and res.iterations == 1
    assert kkt_violation(W, res.Z, X, b, lam) == 0.0


# --------------------------------------------------------------------------------------------
# Against scikit-learn: sparse_encode(lasso_cd, positive=True, alpha=λ) has the same minimiser
# --------------------------------------------------------------------------------------------


def test_matches_sklearn_sparse_encode_lasso_cd() -> None:
    from sklearn.decomposition import sparse_encode

    rng = np.random.default_rng(7)
    D, d_z, N, lam = 24, 64, 150, 0.15
    W = rng.normal(size=(D, d_z))
    W /= np.linalg.norm(W, axis=0)
    Z0 = rng.exponential(size=(d_z, N)) * (rng.random((d_z, N)) < 0.1)
    b = rng.normal(size=D) * 0.2
    X = W @ Z0 + b[:, None] + 0.05 * rng.normal(size=(D, N))
    res = exact_codes(W, X, b, lam)
    assert res.converged and res.kkt_violation <= TOL
    Zs = sparse_encode(
        (X - b[:, None]).T, W.T, algorithm="lasso_cd", alpha=lam, positive=True, max_iter=10_000
    ).T
    assert np.all(Zs >= 0)
    np.testing.assert_allclose(res.Z, Zs, atol=1e-5)
    # sklearn stops at its own duality-gap tolerance: never better than the exact codes
    assert sae_objective(W, res.Z, b, X, lam) <= sae_objective(W, Zs, b, X, lam) + 1e-12
    assert kkt_violation(W, Zs, X, b, lam) <= 1e-3


# --------------------------------------------------------------------------------------------
# Structure, options and determinism
# --------------------------------------------------------------------------------------------


def _medium(seed=3, D=32, d_z=96, N=300):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, d_z))
    W /= np.linalg.norm(W, axis=0)
    Z0 = rng.exponential(size=(d_z, N)) * (rng.random((d_z, N)) < 0.08)
    X = W @ Z0 + 0.05 * rng.normal(size=(D, N))
    return W, X, np.zeros(D)


def test_batching_determinism_and_sparse_output() -> None:
    W, X, b = _medium()
    lam = 0.1
    a = exact_codes(W, X, b, lam)
    a2 = exact_codes(W, X, b, lam)
    np.testing.assert_array_equal(a.Z, a2.Z)  # deterministic
    c = exact_codes(W, X, b, lam, batch_size=37)
    np.testing.assert_allclose(a.Z, c.Z, atol=1e-10, rtol=0)
    assert c.kkt_violation <= TOL
    for workers in (1, 3):  # the per-point solves in one thread or several: the same codes
        w = exact_codes(W, X, b, lam, batch_size=40, workers=workers)
        np.testing.assert_array_equal(a.Z, w.Z)
        assert w.converged and w.kkt_violation <= TOL
    s = exact_codes(W, X, b, lam, sparse_output=True)
    assert sp.issparse(s.Z) and s.Z.shape == a.Z.shape
    np.testing.assert_array_equal(s.Z.toarray(), a.Z)
    assert kkt_violation(W, s.Z, X, b, lam) == pytest.approx(kkt_violation(W, a.Z, X, b, lam))
    assert a.mean_support == pytest.approx(np.count_nonzero(a.Z) / X.shape[1])
    assert a.n_unconverged == 0 and a.seconds > 0 and a.tol == TOL


def test_zero_atom_duplicate_atoms_and_wide_supports() -> None:
    W, X, b = _medium(seed=5, D=12, d_z=40, N=60)
    W[:, 3] = 0.0  # a zero atom never activates
    W = np.concatenate([W, W[:, :5], 2.0 * W[:, 5:8]], axis=1)  # duplicates and rescaled copies
    for lam in (1e-3, 0.05, 0.5):  # from nearly dense supports (≈ D) to very sparse codes
        res = exact_codes(W, X, b, lam)
        assert res.converged, (lam, res.kkt_violation)
        assert np.all(res.Z[3] == 0.0)
        assert kkt_violation(W, res.Z, X, b, lam) <= TOL
        ref = _cvxpy_codes(W, X, b, lam)
        assert sae_objective(W, res.Z, b, X, lam) <= sae_objective(W, ref, b, X, lam) + 1e-9


def test_not_converged_is_reported_not_raised() -> None:
    W, X, b = _medium()
    res = exact_codes(W, X, b, 0.1, max_iter=1)
    assert not res.converged
    assert res.iterations == 1 and res.n_unconverged > 0
    assert np.isfinite(res.kkt_violation) and res.kkt_violation > TOL
    assert res.kkt_violation == pytest.approx(kkt_violation(W, res.Z, X, b, 0.1), rel=1e-9)
    loose = exact_codes(W, X, b, 0.1, tol=1e-3)
    assert loose.converged and loose.kkt_violation <= 1e-3


def test_progress_bar_and_empty_input() -> None:
    W, X, b = _medium(N=50)
    import contextlib

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = exact_codes(W, X, b, 0.1, progress=True, batch_size=20)
    assert res.converged
    empty = exact_codes(W, X[:, :0], b, 0.1)
    assert empty.Z.shape == (W.shape[1], 0) and empty.converged and empty.kkt_violation == 0.0


def test_kkt_violation_matches_spec_phi_for_unit_atoms() -> None:
    W, X, b = _medium(N=40)
    lam = 0.1
    Z = exact_codes(W, X, b, lam).Z
    Z_pert = Z * 1.01  # move off the optimum
    phi = W.T @ (X - b[:, None] - W @ Z_pert) / lam
    spec = np.where(Z_pert > 0, np.abs(phi - 1), np.maximum(phi - 1, 0)).max()
    assert kkt_violation(W, Z_pert, X, b, lam) == pytest.approx(spec, rel=1e-12)
    # interior-point codes: tiny positive entries need the τ_act threshold
    Zc = _cvxpy_codes(W, X, b, lam)
    assert kkt_violation(W, Zc, X, b, lam, tau_act=1e-6 * Zc.max()) <= 1e-5


# --------------------------------------------------------------------------------------------
# Error paths
# --------------------------------------------------------------------------------------------


def test_errors() -> None:
    W, X, b = _medium(N=5)
    D, d_z = W.shape
    bad_calls = [
        dict(W=W[:, 0], X=X, b=b, lam=0.1),  # W not 2-D
        dict(W=W, X=X[:-1], b=b, lam=0.1),  # X has the wrong D
        dict(W=W, X=X[:, 0], b=b, lam=0.1),  # X not 2-D
        dict(W=W, X=X, b=b[:-1], lam=0.1),  # b has the wrong length
        dict(W=np.where(np.eye(D, d_z) > 0, np.nan, W), X=X, b=b, lam=0.1),
        dict(W=W, X=np.where(np.eye(D, 5) > 0, np.inf, X), X_=None, b=b, lam=0.1),
        dict(W=W, X=X, b=np.full(D, np.nan), lam=0.1),
        dict(W=W, X=X, b=b, lam=0.0),
        dict(W=W, X=X, b=b, lam=-1.0),
        dict(W=W, X=X, b=b, lam=float("nan")),
        dict(W=W, X=X, b=b, lam=float("inf")),
        dict(W=W, X=X, b=b, lam=0.1, tol=0.0),
        dict(W=W, X=X, b=b, lam=0.1, max_iter=0),
        dict(W=W, X=X, b=b, lam=0.1, batch_size=0),
        dict(W=W, X=X, b=b, lam=0.1, workers=0),
        dict(W=np.zeros((D, 0)), X=X, b=b, lam=0.1),
    ]
    for kw in bad_calls:
        kw.pop("X_", None)
        with pytest.raises(ValueError):
            exact_codes(**kw)
    Z = np.zeros((d_z, 5))
    with pytest.raises(ValueError):
        kkt_violation(W, -np.ones((d_z, 5)), X, b, 0.1)
    with pytest.raises(ValueError):
        kkt_violation(W, Z[:, :4], X, b, 0.1)
    with pytest.raises(ValueError):
        kkt_violation(W, Z, X, b, 0.0)
    with pytest.raises(ValueError):
        kkt_violation(W, np.full((d_z, 5), np.nan), X, b, 0.1)


# --------------------------------------------------------------------------------------------
# Screened gradients and warm starts
# --------------------------------------------------------------------------------------------


log_scales = st.floats(-6.0, 6.0)


@settings(max_examples=60, deadline=None)
@given(seeds, st.integers(1, 40), st.integers(1, 200), log_scales, log_scales, st.sampled_from(["bf16", "fp32"]),
       st.booleans(), st.booleans())
def test_screened_products_within_their_bound(seed, D, d_z, log_w, log_x, precision, stored32, unit) -> None:
    """|ρ_i h̃_ij − w_jᵀr_i| ≤ E_i for every row and atom (atom_rows.Screen), for stored rows of norms and data
    spanning 12 orders of magnitude, float32 stored rows (screened as they are, scaled afterwards) or float64
    ones (a rounded copy), bfloat16 or float32 products; the reference's own float64 rounding allowed."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d_z, D)) * 10.0 ** (log_w + rng.uniform(-1, 1, size=(d_z, 1)))
    A = A.astype(np.float32) if stored32 else A
    atoms = AtomRows.unit_rows_of(A) if unit else AtomRows(np.ascontiguousarray(A), np.ones(d_z))
    R = rng.normal(size=(7, D)) * 10.0 ** (log_x + rng.uniform(-2, 2, size=(7, 1)))
    screen = atoms.screen(precision)
    Rhat, rho, E = screen.prepare(R)
    H = torch.cat([h for _, h in screen.blocks(Rhat)], dim=1).double().numpy() * rho[:, None]
    exact = R @ atoms.unit_block(0, d_z).T
    ref_err = 1e-13 * np.linalg.norm(R, axis=1, keepdims=True) * screen.wmax
    assert np.all(np.abs(H - exact) <= E[:, None] + ref_err)


@settings(max_examples=25, deadline=None)
@given(seeds, st.integers(4, 40), st.integers(8, 200), st.integers(1, 6), st.floats(0.02, 1.0),
       st.sampled_from([1, 7, 64]), st.sampled_from([1 << 12, 1 << 28]), st.booleans())
def test_rounds_equal_the_gram_kernel_for_any_blocks(seed, D, d_z, N, lam, batch, block_bytes, fast) -> None:
    """The rounds (no Gram matrix: screened products of all atoms, blocks of atoms and points) give the codes
    of the compiled kernel with the Gram matrix cached, for any batch size, block of atoms and screen
    precision; both report the violation the codes have."""
    W, X, b = _random_problem(seed, D, d_z, 12 * N, unit=True)
    gram = exact_codes(W, X, b, lam)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lc, "GRAM_CACHE_BYTES", 0)
        mp.setattr("dictcheck.solvers.atom_rows.BLOCK_BYTES", block_bytes)
        mp.setattr("dictcheck.solvers.atom_rows.bf16_is_fast", lambda device: fast)
        rounds = exact_codes(W, X, b, lam, batch_size=batch)
    for res in (gram, rounds):
        assert res.converged and res.kkt_violation <= TOL
        assert res.kkt_violation == pytest.approx(kkt_violation(W, res.Z, X, b, lam), rel=1e-6, abs=1e-12)
    assert sae_objective(W, rounds.Z, b, X, lam) == pytest.approx(sae_objective(W, gram.Z, b, X, lam), rel=1e-12)
    for i in range(X.shape[1]):
        if _unique_and_well_conditioned(W, gram.Z[:, i], X[:, i] - b, lam):
            scale = 1.0 + np.abs(gram.Z[:, i]).max()
            np.testing.assert_allclose(rounds.Z[:, i], gram.Z[:, i], atol=1e-9 * scale, rtol=0)


def _guesses(rng, Z: np.ndarray):
    d_z, N = Z.shape
    exact = Z > 0
    yield "exact support", exact
    yield "empty", np.zeros((d_z, N))
    yield "random", rng.random((d_z, N)) < rng.uniform(0.0, 1.0)
    yield "support plus noise", sp.csc_array(exact | (rng.random((d_z, N)) < 0.1))
    yield "half the support", torch.as_tensor(np.where(rng.random((d_z, N)) < 0.5, Z, 0.0))


@settings(max_examples=20, deadline=None)
@given(seeds, st.integers(2, 10), st.integers(2, 30), st.integers(1, 6), st.floats(1e-2, 1.0))
def test_warm_start_never_changes_the_answer(seed, D, d_z, N, lam) -> None:
    W, X, b = _random_problem(seed, D, d_z, N, unit=bool(seed % 2))
    cold = exact_codes(W, X, b, lam)
    assert cold.converged
    rng = np.random.default_rng(seed + 1)
    for name, guess in _guesses(rng, cold.Z):
        warm = exact_codes(W, X, b, lam, init=guess)
        assert warm.converged and warm.kkt_violation <= TOL, name
        assert kkt_violation(W, warm.Z, X, b, lam) <= TOL, name
        assert sae_objective(W, warm.Z, b, X, lam) <= sae_objective(W, cold.Z, b, X, lam) + 1e-12
        for i in range(N):
            if _unique_and_well_conditioned(W, cold.Z[:, i], X[:, i] - b, lam):
                scale = 1.0 + np.abs(cold.Z[:, i]).max()
                np.testing.assert_allclose(warm.Z[:, i], cold.Z[:, i], atol=1e-9 * scale, err_msg=name)
        again = exact_codes(W, X, b, lam, init=guess)
        np.testing.assert_array_equal(again.Z, warm.Z)  # deterministic


def test_warm_start_from_the_exact_support_needs_one_check() -> None:
    W, X, b = _medium()
    cold = exact_codes(W, X, b, 0.1)
    warm = exact_codes(W, X, b, 0.1, init=cold.Z)
    assert warm.iterations == 1 < cold.iterations
    np.testing.assert_allclose(warm.Z, cold.Z, atol=1e-12, rtol=0)
    with pytest.raises(ValueError):
        exact_codes(W, X, b, 0.1, init=cold.Z[:, :-1])  # wrong shape
    with pytest.raises(ValueError):
        exact_codes(W, X, b, 0.1, init=np.full_like(cold.Z, np.nan))
