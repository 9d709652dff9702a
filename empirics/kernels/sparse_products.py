"""Products with a sparse code matrix, compiled: the backward pass of the TopK family's gathered
decode and sparse encoder (empirics/kernels/active_latents.py; docs/ecosystem.md §3, "The TopK family's
sparse step"; benchmarks/RESULTS.md §4).

The codes Z (B × d_sae) are given by their P non-zeros p = (token t_p, latent j_p, value z_p). With
a dense G (B × e):

* :func:`gather_dots`: out_p = ⟨W[j_p], G[t_p]⟩ for a (d_sae × e) W: ∂L/∂z_p of x̂ = Z W when
  G = ∂L/∂x̂ (and of the encoder's selected pre-activations, ∂L/∂z_p = ⟨W_enc[:, j_p], …⟩).
* :func:`scatter_rows`: (ZᵀG)[j] = Σ_{p: j_p = j} z_p G[t_p], a (d_sae × e) matrix: ∂L/∂W of
  x̂ = Z W, and the transpose of the encoder's ∂L/∂W_enc with G = x̃ (``transposed``: also written
  in W_enc's (e × d_sae) layout, by the thread that summed the rows). It reads the non-zeros
  grouped by latent (:func:`by_latent`, a CSR layout of Zᵀ, by a compiled counting sort on the
  CPU), so every output row is written by one thread, in a fixed order: the result does not depend
  on the thread count. On the CPU the groups are also cut by tiles of tokens (:func:`tile_tokens`:
  ≤ 1 MiB of G's rows, ≥ 2 entries per tile and latent on average) and the sums run tile by tile:
  each tile's rows of G stay in the core's L2 cache while every latent's entries in it are added,
  where the latent-by-latent order fetched a random row of G from the shared cache or memory for
  every entry (alone, B = d_sae = 4096, e = 512, k = 32, two threads: 1.9× faster, 2.4× with the
  transposed layout; inside a training step the backward gains less, 30.7 → 27.9 ms,
  benchmarks/RESULTS.md §4). Every output row still adds its entries in token order, so the tiles
  change no bit of the result.
* :func:`scatter_rows_and_dots`: both of the above for the same G in one pass (the decode's
  backward needs ∂L/∂z and ∂L/∂W from the same rows of ∂L/∂x̂), bit for bit the same numbers.

Both run in compiled code (numba, ``nogil``; the work is split over ``torch.get_num_threads()``
Python threads, by entries and by latents). Every sum is in the dtype of the inputs (float32 or
float64), re-associated for vectorisation (``fastmath`` re-association and contraction only), so
they equal ``embedding_bag``'s backward and the dense products to rounding.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba as nb
import numpy as np
import torch
from torch import Tensor

__all__ = ["LatentGroups", "by_latent", "gather_dots", "run_split", "scatter_rows", "scatter_rows_and_dots",
           "tile_tokens"]

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})
# Block side of :func:`_transpose_into`: a 64-byte line of float32.
_T_BLOCK = 16
# Bytes of G's rows per tile of tokens (:func:`tile_tokens`): half a 2 MiB per-core L2, so the tile
# stays cached next to the output rows streaming through. At B = d_sae = 4096, e = 512, k = 32, two
# threads (RESULTS.md §4): alone, tiles of 0.5, 1, 2 and 4 MiB took 0.41, 0.37, 0.39 and 0.49 of the
# untiled time; in a TopK step's backward 0.25, 0.5, 1, 2 and 4 MiB gave 35.8, 29.6, 27.9, 30.0 and
# 30.2 ms against 30.7–33.5 untiled.
_TILE_BYTES = 1 << 20
# Fewest entries per (tile, latent) on average for tiles to be used (:func:`tile_tokens`): at 2 (tiles of
# 256 tokens in the case above) the step's backward still gained (29.6 against 30.7 ms).
_MIN_PER_GROUP = 2


@nb.njit(inline="always", **_JIT)
def _dot(w, g):
    s = w[0] * g[0]
    for c in range(1, w.shape[0]):
        s += w[c] * g[c]
    return s


@nb.njit(inline="always", **_JIT)
def _axpy(o, v, g):
    for c in range(o.shape[0]):
        o[c] += v * g[c]


@nb.njit(**_JIT)
def _gather_dots(tok, lat, W, G, out):
    for p in range(out.shape[0]):
        out[p] = _dot(W[lat[p]], G[tok[p]])


@nb.njit(**_JIT)
def _scatter_rows(crow, tok, val, G, out, j0, d_sae, W, order, dots, out_t):
    """Rows j0:j0 + len(out) of ZᵀG, tile by tile (crow holds d_sae groups per tile); with a non-empty W
    also dots[order[p]] = ⟨W[j], G[tok[p]]⟩ for the entries p of those latents, from the row of G the
    sum has just loaded; with a non-empty out_t also those rows transposed into its columns."""
    with_dots = W.shape[0] > 0
    out[:] = 0
    for base in range(0, crow.shape[0] - 1, d_sae):
        for j in range(out.shape[0]):
            o = out[j]
            for p in range(crow[base + j0 + j], crow[base + j0 + j + 1]):
                row = G[tok[p]]
                if with_dots:
                    dots[order[p]] = _dot(W[j0 + j], row)
                _axpy(o, val[p], row)
    if out_t.shape[0] > 0:
        _transpose_into(out, out_t, j0)


@nb.njit(inline="always", **_JIT)
def _transpose_into(rows, out_t, j0):
    """out_t[:, j0:j0 + len(rows)] = rowsᵀ in 16 × 16 blocks (each block's reads and writes stay
    within a few cache lines)."""
    n, e = rows.shape
    for b0 in range(0, n, _T_BLOCK):
        b1 = min(b0 + _T_BLOCK, n)
        for c0 in range(0, e, _T_BLOCK):
            for c in range(c0, min(c0 + _T_BLOCK, e)):
                dst = out_t[c]
                for j in range(b0, b1):
                    dst[j0 + j] = rows[j, c]


@nb.njit(**_JIT)
def _counting_sort(lat, tok, tile, d_sae, crow, order, tok_sorted):
    """Stable counting sort of the entries by group (tok // tile)·d_sae + lat."""
    crow[:] = 0
    for p in range(lat.shape[0]):
        crow[(tok[p] // tile) * d_sae + lat[p] + 1] += 1
    for j in range(crow.shape[0] - 1):
        crow[j + 1] += crow[j]
    nxt = crow[:-1].copy()
    for p in range(lat.shape[0]):
        key = (tok[p] // tile) * d_sae + lat[p]
        q = nxt[key]
        nxt[key] = q + 1
        order[q] = p
        tok_sorted[q] = tok[p]


_POOL: tuple[int, int, ThreadPoolExecutor] | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads (rebuilt after a fork or a change of size)."""
    global _POOL
    if _POOL is None or _POOL[:2] != (os.getpid(), workers):
        _POOL = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="dictcheck-sparse"))
    return _POOL[2]


def run_split(fn: Callable[[int, int], None], n: int) -> None:
    """fn(lo, hi) over [0, n) cut into ``torch.get_num_threads()`` contiguous parts, run in
    parallel threads (fn must release the GIL, e.g. a ``nogil`` kernel, and write disjoint output)."""
    workers = min(torch.get_num_threads(), n)
    if workers <= 1:
        fn(0, n)
        return
    cuts = np.linspace(0, n, workers + 1).astype(np.int64)
    jobs = [_pool(workers).submit(fn, int(lo), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:])]
    for job in jobs:
        job.result()


class LatentGroups(NamedTuple):
    """Entries grouped by (tile of tokens, latent): group (b, j), the entries of latent j whose token
    is in tile b, at positions crow[b·d_sae + j]:crow[b·d_sae + j + 1] of ``order`` (the entries'
    own indices, stable: ascending within a group); ``tok`` = tok[order]. One tile on other devices
    or with ``tile`` None: then crow is the CSR row pointer of Zᵀ."""

    crow: Tensor
    order: Tensor
    tok: Tensor
    d_sae: int

    @property
    def n_tiles(self) -> int:
        return (self.crow.shape[0] - 1) // self.d_sae


def tile_tokens(row_bytes: int, n_tokens: int, n_entries: int, d_sae: int) -> int | None:
    """Tokens per tile for products with rows of G of ``row_bytes`` bytes: ≤ _TILE_BYTES of rows, at
    least one; None (one tile) when that gives one tile only, or fewer than _MIN_PER_GROUP entries per
    (tile, latent) on average: such tiles save no reads (each output row would be loaded per entry,
    as each row of G is without tiles) and crow would grow to n_tiles·d_sae (e.g. 16.8 M entries for
    d_in = 8192 in float32, B = 4096, d_sae = 131072)."""
    tile = max(1, _TILE_BYTES // max(1, row_bytes))
    n_tiles = -(-n_tokens // tile)
    if n_tiles <= 1 or n_entries < _MIN_PER_GROUP * n_tiles * d_sae:
        return None
    return tile


def by_latent(lat: Tensor, tok: Tensor, d_sae: int, tile: int | None = None) -> LatentGroups:
    """The entries (token tok_p, latent lat_p) grouped by latent, within tiles of ``tile`` tokens on
    the CPU (:class:`LatentGroups`; None: one tile). Within a latent the entries stay in their
    own order, so with tokens ascending in the entries (as every caller builds them) each latent's
    entries are in token order whatever the tiles. On the CPU a compiled counting sort (one pass to
    count, one to place; the same result as a stable argsort of the group keys)."""
    if lat.device.type == "cpu":
        n_tok = int(tok.max()) + 1 if tok.numel() else 1
        tile = n_tok if tile is None else tile
        n_tiles = -(-n_tok // tile)
        crow = torch.empty(n_tiles * d_sae + 1, dtype=torch.int64)
        order = torch.empty_like(lat)
        tok_sorted = torch.empty_like(tok)
        if lat.numel():
            _counting_sort(lat.numpy(), tok.numpy(), tile, d_sae, crow.numpy(), order.numpy(), tok_sorted.numpy())
        else:
            crow.zero_()
        return LatentGroups(crow, order, tok_sorted, d_sae)
    order = torch.argsort(lat, stable=True)
    crow = torch.zeros(d_sae + 1, dtype=torch.int64, device=lat.device)
    crow[1:] = torch.cumsum(torch.bincount(lat, minlength=d_sae), 0)
    return LatentGroups(crow, order, tok[order], d_sae)


@torch.no_grad()
def gather_dots(tok: Tensor, lat: Tensor, W: Tensor, G: Tensor) -> Tensor:
    """(P,) out_p = ⟨W[lat_p], G[tok_p]⟩ (module docstring); CPU, contiguous float32/float64."""
    out = torch.empty(lat.shape[0], dtype=W.dtype)
    if out.numel():
        t, j, w, g, o = tok.numpy(), lat.numpy(), W.contiguous().numpy(), G.contiguous().numpy(), out.numpy()
        run_split(lambda lo, hi: _gather_dots(t[lo:hi], j[lo:hi], w, g, o[lo:hi]), o.shape[0])
    return out


@torch.no_grad()
def scatter_rows(groups: LatentGroups, val_sorted: Tensor, G: Tensor, *, transposed: bool = False) -> Tensor:
    """(d_sae, e) ZᵀG from the grouped entries (:func:`by_latent`; val_sorted = the values in the
    grouped order): row j is Σ val_sorted[p] G[tok[p]] over latent j's entries, in token order.
    ``transposed``: (ZᵀG)ᵀ, (e, d_sae) and contiguous, the same numbers, each thread transposing
    the rows it has just summed (in 16 × 16 blocks; at least as fast as torch's transposed copy after
    the sum, and it scales with the threads: sum + transpose 5.6 ms against 5.9–8.0 ms at two threads,
    9.0 against 8.6 on one, B = d_sae = 4096, e = 512, k = 32, benchmarks/RESULTS.md §4)."""
    return _scatter_rows_run(groups, val_sorted, G[:0], G, transposed)[0]  # no W: no dots


@torch.no_grad()
def scatter_rows_and_dots(groups: LatentGroups, val_sorted: Tensor, W: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    """(ZᵀG, dots) in one pass over the grouped entries: ZᵀG as :func:`scatter_rows` (d_sae, e),
    and dots (P,) = :func:`gather_dots`'s ⟨W[j_p], G[t_p]⟩ in the entries' own order, each from the
    row G[t_p] the sum has just loaded: the backward of x̂ = Z W reads each such row once instead of
    twice (both results bit for bit those of the two separate products; measured 15.6 → 12.6 ms at
    B = d_sae = 4096, e = 512, k = 32, two threads, before the tiles, benchmarks/RESULTS.md §4)."""
    return _scatter_rows_run(groups, val_sorted, W, G, False)


def _scatter_rows_run(groups: LatentGroups, val_sorted: Tensor, W: Tensor, G: Tensor,
                      transposed: bool) -> tuple[Tensor, Tensor]:
    """:func:`_scatter_rows` over all latents, split over the threads: (ZᵀG or its transpose,
    dots), the dots only for a non-empty W."""
    d_sae, e = groups.d_sae, G.shape[1]
    rows = torch.empty(d_sae, e, dtype=G.dtype)
    out_t = torch.empty((e, d_sae) if transposed else (0, 0), dtype=G.dtype)
    dots = torch.empty(groups.order.shape[0] if W.shape[0] else 0, dtype=W.dtype)
    c, o_, t, v = groups.crow.numpy(), groups.order.numpy(), groups.tok.numpy(), val_sorted.contiguous().numpy()
    w, g, r, ot, dd = W.contiguous().numpy(), G.contiguous().numpy(), rows.numpy(), out_t.numpy(), dots.numpy()
    run_split(lambda lo, hi: _scatter_rows(c, t, v, g, r[lo:hi], lo, d_sae, w, o_, dd, ot), d_sae)
    return (out_t if transposed else rows), dots
