"""Screened products of points with every atom (solvers/atom_rows.py) and what is built on them: the queries
of screen_pairs answered exactly, the per-row maxima of the (5)/(5′) vectors, and the decoder's pairs and
neighbours (solvers/decoder_geometry.py), each against brute force on small dictionaries, for both screen
precisions and any block size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers.atom_rows import AtomRows, atom_max_products, exact_products, screen_pairs
from dictcheck.solvers.decoder_geometry import decoder_geometry

seeds = st.integers(0, 2**32 - 1)
precisions = st.sampled_from([True, False])  # bfloat16 screen where "fast", else float32
blocks = st.sampled_from([1 << 10, 1 << 28])


def _atoms(rng, D: int, d_z: int, clustered: bool) -> AtomRows:
    A = rng.normal(size=(d_z, D))
    if clustered and d_z > 3:  # near-duplicates and near-antipodes: cosines close to the thresholds
        A[1] = A[0] + 0.3 * rng.normal(size=D)
        A[2] = -A[0] + 0.4 * rng.normal(size=D)
        A[3] = -A[1]
    return AtomRows.unit_rows_of(A.astype(np.float32))


@settings(max_examples=40, deadline=None)
@given(seeds, st.integers(2, 24), st.integers(1, 150), st.integers(1, 9), precisions, blocks,
       st.floats(-3.0, 3.0))
def test_screen_pairs_answer_every_query(seed, D, d_z, n, fast, block_bytes, log_r) -> None:
    """Each pair set contains every pair the query asks for (above, below, the row's max, min and |max| over
    the atoms not excluded), so the exact values of the pairs answer it."""
    rng = np.random.default_rng(seed)
    atoms = _atoms(rng, D, d_z, clustered=True)
    R = rng.normal(size=(n, D)) * 10.0 ** (log_r + rng.uniform(-1, 1, size=(n, 1)))
    H = R @ atoms.unit_block(0, d_z).T
    above = np.quantile(H, 0.8, axis=1)
    below = np.quantile(H, 0.2, axis=1)
    ex_r = np.repeat(np.arange(n), 1)
    ex_a = rng.integers(0, d_z, size=n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dictcheck.solvers.atom_rows.bf16_is_fast", lambda device: fast)
        mp.setattr("dictcheck.solvers.atom_rows.BLOCK_BYTES", block_bytes)
        p = screen_pairs(atoms, R, above=above, below=below, top=("max", "min", "abs"), exclude=(ex_r, ex_a))
    got = set(zip(p.rows.tolist(), p.atoms.tolist()))
    assert list(zip(p.rows, p.atoms)) == sorted(got)  # sorted, no pair twice
    want = set(zip(*np.nonzero(H > above[:, None]))) | set(zip(*np.nonzero(H < below[:, None])))
    Hx = H.copy()
    Hx[ex_r, ex_a] = np.nan
    for f in (np.nanargmax, np.nanargmin):
        for i in range(n):
            if np.isfinite(Hx[i]).any():
                want.add((i, int(f(Hx[i]))))
    for i in range(n):
        if np.isfinite(Hx[i]).any():
            want.add((i, int(np.nanargmax(np.abs(Hx[i])))))
    assert want <= got
    exact = exact_products(atoms, R, p.rows, p.atoms)
    np.testing.assert_allclose(exact, H[p.rows, p.atoms], rtol=1e-12, atol=1e-12 * np.abs(H).max())
    assert np.all(np.abs(p.screened - exact) <= p.bound[p.rows] * (1 + 1e-9))  # every pair's h̃ within E_i


@settings(max_examples=30, deadline=None)
@given(seeds, st.integers(2, 24), st.integers(2, 120), st.integers(1, 20), precisions)
def test_atom_max_products_are_exact(seed, D, d_z, n, fast) -> None:
    rng = np.random.default_rng(seed)
    atoms = _atoms(rng, D, d_z, clustered=False)
    V = rng.normal(size=(n, D)) * rng.uniform(0.01, 10.0, size=(n, 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dictcheck.solvers.atom_rows.bf16_is_fast", lambda device: fast)
        got = atom_max_products(atoms, V, block=int(rng.integers(1, 8)))
    np.testing.assert_allclose(got, np.abs(V @ atoms.unit_block(0, d_z).T).max(axis=1), rtol=1e-13)


@settings(max_examples=30, deadline=None)
@given(seeds, st.integers(2, 24), st.integers(2, 120), precisions, st.integers(1, 50))
def test_decoder_geometry_matches_the_cosine_matrix(seed, D, d_z, fast, block) -> None:
    rng = np.random.default_rng(seed)
    atoms = _atoms(rng, D, d_z, clustered=True)
    U = atoms.unit_block(0, d_z)
    C = U @ U.T
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dictcheck.solvers.atom_rows.bf16_is_fast", lambda device: fast)
        g = decoder_geometry(atoms, threshold=-0.5, block=block)
    i, j = np.nonzero(np.triu(C < -0.5, 1))
    np.testing.assert_array_equal(g.pairs, np.stack([i, j], axis=1).reshape(-1, 2))
    np.testing.assert_allclose(g.pair_cosines, C[i, j], rtol=1e-13)
    Cn = C.copy()
    np.fill_diagonal(Cn, -np.inf)
    np.testing.assert_allclose(g.nearest_cosine, Cn.max(axis=1), rtol=1e-13)
    np.testing.assert_allclose(C[np.arange(d_z), g.nearest], g.nearest_cosine, rtol=1e-13)
    np.fill_diagonal(Cn, np.inf)
    np.testing.assert_allclose(g.antipodal_cosine, Cn.min(axis=1), rtol=1e-13)
    assert np.all(g.nearest != np.arange(d_z)) and np.all(g.antipodal != np.arange(d_z))
