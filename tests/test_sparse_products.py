"""Tests for empirics.kernels.sparse_products: the compiled sparse products equal the dense ones (float64),
and neither the tiles of tokens nor the thread count changes a bit of them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.kernels.sparse_products import (
    by_latent,
    gather_dots,
    scatter_rows,
    scatter_rows_and_dots,
    tile_tokens,
)

# Tokens per tile: None (one tile), 1 (every token its own tile), and sizes that leave a ragged last tile.
TILES = st.sampled_from([None, 1, 2, 3, 7, 64])


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
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 50), st.integers(1, 8), st.integers(1, 40), TILES)
def test_products_equal_the_dense_ones(seed, n, d_sae, per_token, e, tile):
    tok, lat, val, Z, W, G = _codes(seed, n, d_sae, per_token, e, torch.float64)
    dots = gather_dots(tok, lat, W, G)
    torch.testing.assert_close(dots, (G @ W.T)[tok, lat], rtol=1e-12, atol=1e-12)
    groups = by_latent(lat, tok, d_sae, tile)
    val_sorted = val[groups.order]
    torch.testing.assert_close(scatter_rows(groups, val_sorted, G), Z.T @ G, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(scatter_rows(groups, val_sorted, G, transposed=True), G.T @ Z, rtol=1e-12, atol=1e-12)
    rows, fused_dots = scatter_rows_and_dots(groups, val_sorted, W, G)
    torch.testing.assert_close(rows, Z.T @ G, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused_dots, (G @ W.T)[tok, lat], rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 70), st.integers(1, 8), TILES)
def test_grouping_is_a_stable_argsort_of_tile_and_latent(seed, n, d_sae, per_token, tile):
    """by_latent's counting sort gives what a stable argsort of the keys (token tile, latent) gives;
    with one tile (None) that is the argsort of the latents, the torch path kept for other devices,
    and crow is Zᵀ's CSR row pointer."""
    tok, lat, _, _, _, _ = _codes(seed, n, d_sae, per_token, 1, torch.float64)
    groups = by_latent(lat, tok, d_sae, tile)
    tiles = tok // (n if tile is None else tile)
    n_tiles = int(tiles.max()) + 1
    ref = torch.argsort(tiles * d_sae + lat, stable=True)
    assert groups.n_tiles == n_tiles and groups.d_sae == d_sae
    assert torch.equal(groups.order, ref) and torch.equal(groups.tok, tok[ref])
    counts = torch.bincount(tiles * d_sae + lat, minlength=n_tiles * d_sae)
    assert torch.equal(groups.crow, torch.cat([counts.new_zeros(1), counts.cumsum(0)]))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 70), st.integers(1, 8), st.integers(1, 40),
       st.sampled_from([torch.float32, torch.float64]), TILES)
def test_tiles_the_transposed_layout_and_the_fused_pass_change_no_bit(seed, n, d_sae, per_token, e, dtype, tile):
    """Against the untiled grouping (one tile): scatter_rows, its transposed layout (also across the
    16-latent blocks it writes, d_sae up to 70, latents without entries) and the fused pass with
    its dots (in the entries' own order, not the grouped one) are the same bits, and the fused dots
    are gather_dots' bits: each output row adds the same terms in the same (token) order."""
    tok, lat, val, _, W, G = _codes(seed, n, d_sae, per_token, e, dtype)
    one, tiled = by_latent(lat, tok, d_sae), by_latent(lat, tok, d_sae, tile)
    rows = scatter_rows(one, val[one.order], G)
    assert torch.equal(scatter_rows(tiled, val[tiled.order], G), rows)
    cols = scatter_rows(tiled, val[tiled.order], G, transposed=True)
    assert cols.is_contiguous() and torch.equal(cols, rows.T)
    fused_rows, dots = scatter_rows_and_dots(tiled, val[tiled.order], W, G)
    assert torch.equal(fused_rows, rows) and torch.equal(dots, gather_dots(tok, lat, W, G))


def test_grouping_of_no_entries():
    groups = by_latent(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 5, tile=4)
    assert groups.crow.tolist() == [0] * 6 and groups.order.numel() == 0 and groups.tok.numel() == 0


def test_tile_size_holds_a_mebibyte_of_rows_and_at_least_two_entries_per_latent():
    B, k = 4096, 32
    assert tile_tokens(512 * 4, B, B * k, 4096) == 512 and tile_tokens(512 * 8, B, B * k, 4096) == 256
    assert tile_tokens(2**21, 8, 8 * 4, 2) == 1  # rows over 1 MiB: one token per tile
    assert tile_tokens(512 * 4, 512, 512 * k, 64) is None  # the batch fits one tile
    # 8 tiles × 16384 latents: 1 entry per (tile, latent) on average, under 2: no tiles
    assert tile_tokens(512 * 4, B, B * k, 16384) is None and tile_tokens(512 * 4, B, B * k, 8192) == 512
    assert tile_tokens(8192 * 4, B, B * k, 131072) is None  # crow would hold 16.8 M entries


@pytest.mark.parametrize("threads", [2, 3])
def test_products_do_not_depend_on_the_thread_count(threads):
    tok, lat, val, _, W, G = _codes(3, 301, 97, 9, 33, torch.float32)
    groups = by_latent(lat, tok, 97, tile=40)
    val_sorted = val[groups.order]

    def products():
        return (gather_dots(tok, lat, W, G), scatter_rows(groups, val_sorted, G),
                scatter_rows(groups, val_sorted, G, transposed=True), *scatter_rows_and_dots(groups, val_sorted, W, G))

    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = products()
        torch.set_num_threads(threads)
        got = products()
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(r, s) for r, s in zip(ref, got))
