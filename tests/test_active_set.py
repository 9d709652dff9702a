"""The compiled active-set solves of the exact codes (solvers/active_set.py): the per-point kernel with the Gram
matrix cached, the kernel on candidate sets the rounds use, the pairs' classification, and the hand-over of what
they cannot finish to the exact fallback (docs/theory.md §1, KKT-z)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers import lasso_codes as lc
from dictcheck.solvers.active_set import STATUS_DEPENDENT, STATUS_OPTIMAL, classify_pairs
from dictcheck.solvers.atom_rows import AtomRows
from dictcheck.solvers.lasso_codes import exact_codes, kkt_violation
from dictcheck.solvers.row_topk import kth_largest

TOL = 1e-8


def _problem(seed: int, D: int, d_z: int, N: int, k: int):
    """Unit atoms, non-negative k-sparse generating codes plus noise (the RESULTS §3 family, small)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, d_z))
    W /= np.linalg.norm(W, axis=0)
    Z0 = np.zeros((d_z, N))
    for i in range(N):
        Z0[rng.choice(d_z, min(k, d_z), replace=False), i] = rng.exponential(size=min(k, d_z))
    X = W @ Z0 + 0.1 * rng.normal(size=(D, N)) + 0.1 * rng.normal(size=(D, 1))
    return W, X, 0.1 * rng.normal(size=D)


def _batch(W, X, b, candidates, guessed: bool = False):
    """A rounds batch whose point i has the candidate atoms candidates[i] and an empty support (or, when
    ``guessed``, all of them as its guessed support)."""
    n = X.shape[1]
    M = max(len(c) for c in candidates) + 4
    supports = [np.arange(len(c)) if guessed else np.zeros(0, np.int64) for c in candidates]
    return lc._Batch.start(np.arange(n), np.ascontiguousarray((X - b[:, None]).T),
                           [np.asarray(c, np.int64) for c in candidates], supports,
                           [np.zeros(len(c)) for c in supports], M, np.zeros(n, np.int64))


def _solve(W, batch, lam):
    atoms = AtomRows.from_columns(W)
    rounds = lc._Rounds(atoms, np.zeros((0, 0)), lam, TOL, 100, 1)
    act = np.arange(batch.pts.size)
    lc.solve_on_candidates(atoms.rows, atoms.scale, rounds.gram, batch.X, lam, batch.C, batch.nC, batch.filled,
                           batch.G, batch.q, batch.L, batch.factored, batch.P, batch.zP, batch.k, batch.R, batch.gP,
                           batch.status, rounds.eps, TOL * lam, act, 0, act.size)
    return rounds


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(4, 30), st.integers(8, 120), st.integers(1, 10), st.floats(0.02, 1.0))
def test_candidate_kernel_solves_the_restricted_problem(seed, D, d_z, k, lam) -> None:
    """On each point's candidates the kernel returns the exact codes of the dictionary restricted to them
    (cold exact codes of W[:, C] as reference), with the residual and exact support gradient it reports; a
    second call with more candidates continues from there to the codes restricted to the larger set."""
    W, X, b = _problem(seed, D, d_z, 6, k)
    d_z = W.shape[1]
    rng = np.random.default_rng(seed)
    first = [np.sort(rng.choice(d_z, min(d_z, D // 2), replace=False)) for _ in range(6)]  # ≤ D candidates in all
    batch = _batch(W, X, b, first)
    _solve(W, batch, lam)
    for stage in range(2):
        for i in range(6):
            C = batch.C[i, :batch.nC[i]]
            assert batch.status[i] == STATUS_OPTIMAL
            ref = exact_codes(W[:, C], X[:, [i]], b, lam)
            z = np.zeros(C.size)
            z[batch.P[i, :batch.k[i]]] = batch.zP[i, :batch.k[i]]
            np.testing.assert_allclose(z, ref.Z[:, 0], atol=1e-8 * (1 + np.abs(z).max()))
            r = X[:, i] - b - W[:, C] @ z
            np.testing.assert_allclose(batch.R[i], r, atol=1e-12 * (1 + np.linalg.norm(r)))
            np.testing.assert_allclose(batch.gP[i, :batch.k[i]], W[:, C[batch.P[i, :batch.k[i]]]].T @ r - lam,
                                       atol=1e-12 * (1 + np.linalg.norm(r)))
        if stage == 0:  # grow every point's candidates by atoms not yet in it
            for i in range(6):
                extra = np.setdiff1d(np.arange(d_z), batch.C[i, :batch.nC[i]])[:max(0, D - batch.nC[i])][:3]
                batch.C[i, batch.nC[i]:batch.nC[i] + extra.size] = extra
                batch.nC[i] += extra.size
            _solve(W, batch, lam)


def test_candidate_kernel_flags_dependent_atoms_and_exact_codes_finish_them() -> None:
    """Two copies of one atom in a guessed support make G_PP singular: the kernel says so (status), and
    exact_codes finishes such points exactly through the least-distance fallback, with or without the Gram
    matrix cached."""
    W, X, b = _problem(4, 16, 60, 20, 5)
    lam = 0.1
    W2 = np.concatenate([W, W[:, :1]], axis=1)
    d_z = W2.shape[1]
    batch = _batch(W2, X, b, [[0, d_z - 1]] * X.shape[1], guessed=True)
    _solve(W2, batch, lam)
    assert (batch.status == STATUS_DEPENDENT).any()
    init = np.zeros((d_z, X.shape[1]))
    init[[0, d_z - 1]] = 1.0
    for cache in (lc.GRAM_CACHE_BYTES, 0):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lc, "GRAM_CACHE_BYTES", cache)
            res = exact_codes(W2, X, b, lam, init=init)
        assert res.converged and kkt_violation(W2, res.Z, X, b, lam) <= TOL


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(2, 40))
def test_classify_pairs_matches_a_direct_count(seed, n, d_z) -> None:
    """classify_pairs: support and candidate membership of each checked pair, and per point the violation
    max(|g_P|, max off-support (g)₊), against sets and maxima computed directly."""
    rng = np.random.default_rng(seed)
    M = d_z
    C = np.zeros((n, M), np.int64)
    nC = rng.integers(0, d_z + 1, size=n)
    P = np.zeros((n, M), np.int64)
    k = np.zeros(n, np.int64)
    gP = rng.normal(size=(n, M)) * 1e-3
    for i in range(n):
        C[i, :nC[i]] = rng.choice(d_z, nC[i], replace=False)
        k[i] = rng.integers(0, nC[i] + 1)
        P[i, :k[i]] = rng.choice(nC[i], k[i], replace=False)
    which = rng.permutation(n)
    pairs = [(t, j) for t in range(n) for j in range(d_z) if rng.random() < 0.4]
    pi = np.array([p[0] for p in pairs], np.int64)
    pj = np.array([p[1] for p in pairs], np.int64)
    g = rng.normal(size=pi.size)
    on, inc, viol = classify_pairs(pi, pj, g, which, C, nC, P, k, gP, d_z)
    for t in range(n):
        i = which[t]
        supp = set(C[i, P[i, :k[i]]].tolist())
        cand = set(C[i, :nC[i]].tolist())
        sel = pi == t
        assert on[sel].tolist() == [j in supp for j in pj[sel]]
        assert inc[sel].tolist() == [j in cand for j in pj[sel]]
        off = [gg for gg, j in zip(g[sel], pj[sel]) if j not in supp]
        assert viol[t] == max([abs(x) for x in gP[i, :k[i]]] + [max(x, 0.0) for x in off] + [0.0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([0.0, 1.0, -2.5])), min_size=1, max_size=120),
       st.data())
def test_kth_largest_is_the_kth_of_the_sorted_values(values, data) -> None:
    """The quickselect behind the row top-k's bound and the violators joining C: the k-th largest
    of n values, ties included; the k largest come first, each with its index when paired."""
    val = np.array(values)
    n = val.size
    k = data.draw(st.integers(1, n))
    buf = val.copy()
    assert kth_largest(buf, n, k, np.empty(0, dtype=np.int64)) == np.sort(val)[n - k]
    assert np.array_equal(np.sort(buf), np.sort(val))  # reordered, nothing lost
    buf, idx = val.copy(), np.arange(n)
    t = kth_largest(buf, n, k, idx)
    assert np.array_equal(val[idx], buf)  # each value still paired with its index
    assert np.array_equal(np.sort(buf[:k]), np.sort(val)[n - k:]) and buf[:k].min() == t
