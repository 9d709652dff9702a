"""Tests for empirics.sparse_products: the compiled sparse products equal the dense ones (float64)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.sparse_products import by_latent, gather_dots, scatter_rows, scatter_rows_and_dots


def _codes(seed: int, n: int, d_sae: int, per_token: int, e: int, dtype: torch.dtype):
    """Random non-zeros (token, latent, value), tokens ascending, some latents never used; the
    dense Z; and dense W (d_sae × e), G (n × e)."""
    g = torch.Generator().manual_seed(seed)
    k = min(per_token, d_sae)
    lat = torch.stack([torch.randperm(d_sae, generator=g)[:k] for _ in range(n)]).reshape(-1)
    tok = torch.arange(n).repeat_interleave(k)
    val = torch.randn(n * k, generator=g, dtype=torch.float64).to(dtype)
    Z = torch.zeros(n, d_sae, dtype=dtype)
    Z[tok, lat] = val
    W = torch.randn(d_sae, e, generator=g, dtype=torch.float64).to(dtype)
    G = torch.randn(n, e, generator=g, dtype=torch.float64).to(dtype)
    return tok, lat, val, Z, W, G


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 50), st.integers(1, 8), st.integers(1, 40))
def test_products_equal_the_dense_ones(seed, n, d_sae, per_token, e):
    tok, lat, val, Z, W, G = _codes(seed, n, d_sae, per_token, e, torch.float64)
    dots = gather_dots(tok, lat, W, G)
    torch.testing.assert_close(dots, (G @ W.T)[tok, lat], rtol=1e-12, atol=1e-12)
    crow, order, tok_sorted = by_latent(lat, tok, d_sae)
    assert torch.equal(crow, torch.cat([crow.new_zeros(1), torch.bincount(lat, minlength=d_sae).cumsum(0)]))
    assert bool((torch.diff(lat[order]) >= 0).all()) and torch.equal(tok_sorted, tok[order])
    torch.testing.assert_close(scatter_rows(crow, tok_sorted, val[order], G), Z.T @ G, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 70), st.integers(1, 8), st.integers(1, 40),
       st.sampled_from([torch.float32, torch.float64]))
def test_grouping_is_a_stable_argsort_and_the_transposed_layout_the_same_numbers(seed, n, d_sae, per_token, e, dtype):
    """by_latent's counting sort gives what a stable argsort of the latents gives (the torch path,
    kept for other devices), and scatter_rows(transposed=True) is scatter_rows(...).T bit for bit,
    also across the 16-latent blocks it writes (d_sae up to 70, latents without entries)."""
    tok, lat, val, _, _, G = _codes(seed, n, d_sae, per_token, e, dtype)
    crow, order, tok_sorted = by_latent(lat, tok, d_sae)
    ref = torch.argsort(lat, stable=True)
    assert torch.equal(order, ref) and torch.equal(tok_sorted, tok[ref])
    assert torch.equal(crow, torch.cat([crow.new_zeros(1), torch.bincount(lat, minlength=d_sae).cumsum(0)]))
    rows = scatter_rows(crow, tok_sorted, val[order], G)
    cols = scatter_rows(crow, tok_sorted, val[order], G, transposed=True)
    assert cols.is_contiguous() and torch.equal(cols, rows.T)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 70), st.integers(1, 8), st.integers(1, 40),
       st.sampled_from([torch.float32, torch.float64]))
def test_the_fused_pass_is_the_two_products_bit_for_bit(seed, n, d_sae, per_token, e, dtype):
    """scatter_rows_and_dots gives scatter_rows' ZᵀG and gather_dots' dots (in the entries' own order,
    not the grouped one) with the same bits: each dot and each sum is the same expression on the
    same row of G."""
    tok, lat, val, _, W, G = _codes(seed, n, d_sae, per_token, e, dtype)
    crow, order, tok_sorted = by_latent(lat, tok, d_sae)
    rows, dots = scatter_rows_and_dots(crow, order, tok_sorted, val[order], W, G)
    assert torch.equal(rows, scatter_rows(crow, tok_sorted, val[order], G))
    assert torch.equal(dots, gather_dots(tok, lat, W, G))


def test_grouping_of_no_entries():
    crow, order, tok_sorted = by_latent(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 5)
    assert crow.tolist() == [0] * 6 and order.numel() == 0 and tok_sorted.numel() == 0


@pytest.mark.parametrize("threads", [2, 3])
def test_products_do_not_depend_on_the_thread_count(threads):
    tok, lat, val, _, W, G = _codes(3, 301, 97, 9, 33, torch.float32)
    crow, order, tok_sorted = by_latent(lat, tok, 97)

    def products():
        return (gather_dots(tok, lat, W, G), scatter_rows(crow, tok_sorted, val[order], G),
                scatter_rows(crow, tok_sorted, val[order], G, transposed=True),
                *scatter_rows_and_dots(crow, order, tok_sorted, val[order], W, G))

    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = products()
        torch.set_num_threads(threads)
        got = products()
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(r, s) for r, s in zip(ref, got))
