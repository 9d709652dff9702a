"""Row-wise top-m of the TopK-family pre-activations (empirics/sae_models.py) without the dense pass.

:func:`row_topk` returns, for every row of a (n, d) matrix, its m largest entries and their
columns, sorted by value (largest first; equal values by column), the same as
``torch.topk(a, m, dim=1)`` up to the order of equal values. :func:`encoder_topk` does the same
for the pre-activation a = x̃ W_enc + b_enc without materialising a: the encoder product is
computed in row blocks of (almost) equal size into one reused buffer of at most ≈ 8 MiB, the bias
is added while the block is in cache, and its rows are selected there. The (n, d) pre-activation
is never allocated (on the issue 17 setup, B = d_sae = 4096 float32, that is 64 MiB of fresh pages
per step) and no bias pass over it runs. MKL's GEMM rounds a row the same in a product of
``ALIKE_ROWS`` = 16 or more rows as in the full one, but not always in a product of 1–3 rows
(measured: an ulp apart). So a block never has fewer than 16 rows (unless the whole batch is one
smaller block) and the block sizes differ by at most one row (no short last block): the values
are bit for bit those of x̃ @ W_enc + b_enc in one piece (the dense path's, and any other reader's
of the same weights, e.g. a BatchTopK model saved as JumpReLU). Derivation: docs/ecosystem.md §3
("The TopK family's sparse step"); timings: benchmarks/RESULTS.md §4.

Per row, in compiled code (numba; ``nogil``, so the rows of a block are split over
``torch.get_num_threads()`` Python threads that run in parallel):

1. **Lower bound.** The row is cut into blocks of s = max(1, ⌊d / 2m⌋) columns (the last one
   shorter) and t = the m-th largest block maximum. The m blocks whose maximum is ≥ t hold m
   distinct entries ≥ t, so the m-th largest entry of the row is ≥ t: every entry of the top m
   is ≥ t, and lies in a block whose maximum is ≥ t.
2. **Selection.** Only those blocks are read again; every entry ≥ t (and, once m are held,
   > the smallest held) is inserted into a sorted list of m (insertion sort), in column order, so
   of equal values the lower column is kept and comes first.

With ⌈d/s⌉ ≥ 2m blocks, about half of them pass step 1 on random data, so step 2 reads about
half the row and inserts a few multiples of m entries. A row is selected from its own values
only, so the thread count changes nothing. Non-finite pre-activations: ±inf are ordered as numbers; which entries a row
holding NaN keeps is unspecified (``torch.topk`` ranks NaN first; a NaN reaches a only from NaN
inputs or weights, which make the training loss NaN through the reconstruction anyway).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import torch
from torch import Tensor

from dictcheck.empirics.sparse_products import run_split

__all__ = ["ALIKE_ROWS", "encoder_topk", "row_topk"]

# fastmath: re-association only (the block maxima vectorise), no assumptions about NaN or inf.
_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})
# Row blocks of encoder_topk: about this many bytes of pre-activations at a time.
_BLOCK_BYTES = 8 << 20
#: MKL's GEMM rounds a row alike in any product of at least this many rows (module docstring).
ALIKE_ROWS = 16


@nb.njit(inline="always", **_JIT)
def _insert(bv, bi, cnt, m, v, j):
    """Insert value v (column j) into the descending list bv[:cnt] (columns bi), capped at m
    entries (the smallest drops out when full); returns the new count."""
    if cnt == m:
        p = m - 1
    else:
        p = cnt
        cnt += 1
    while p > 0 and not (bv[p - 1] >= v):
        bv[p] = bv[p - 1]
        bi[p] = bi[p - 1]
        p -= 1
    bv[p] = v
    bi[p] = j
    return cnt


@nb.njit(**_JIT)
def _topk_rows(a, m, vals, idx):
    """vals[r], idx[r] = the m largest entries of a[r] and their columns, descending (module
    docstring, steps 1 and 2). a is (n, d) C-contiguous; m ≤ d."""
    n, d = a.shape
    s = max(1, d // (2 * m))
    nblk = (d + s - 1) // s
    bmax = np.empty(nblk, a.dtype)
    tv = np.empty(m, a.dtype)
    ti = np.empty(m, np.int64)
    for r in range(n):
        row = a[r]
        for q in range(nblk):
            hi = min(d, q * s + s)
            mx = row[q * s]
            for j in range(q * s + 1, hi):
                mx = max(mx, row[j])
            bmax[q] = mx
        cnt = 0
        for q in range(nblk):
            if cnt == m and bmax[q] <= tv[m - 1]:
                continue
            cnt = _insert(tv, ti, cnt, m, bmax[q], q)
        t = tv[m - 1]
        bv = vals[r]
        bi = idx[r]
        cnt = 0
        lo = t
        for q in range(nblk):
            if bmax[q] < t:
                continue
            for j in range(q * s, min(d, q * s + s)):
                v = row[j]
                if v < lo or (cnt == m and v <= lo):
                    continue
                cnt = _insert(bv, bi, cnt, m, v, j)
                if cnt == m:
                    lo = bv[m - 1]


def _select_into(a: np.ndarray, m: int, vals: np.ndarray, idx: np.ndarray) -> None:
    """:func:`_topk_rows` over the rows of ``a``, split over ``torch.get_num_threads()`` threads."""
    run_split(lambda lo, hi: _topk_rows(a[lo:hi], m, vals[lo:hi], idx[lo:hi]), a.shape[0])


def _check(m: int, d: int, dtype: torch.dtype) -> None:
    if not 1 <= m <= d:
        raise ValueError(f"top-m needs 1 <= m <= d = {d}, got m = {m}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"top-m selection supports float32 and float64, got {dtype}")


@torch.no_grad()
def row_topk(a: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """(values, columns), each (n, m): the m largest entries of every row of the CPU matrix a,
    descending (= ``torch.topk(a, m, dim=1)`` up to the order of equal values). No gradient."""
    n, d = a.shape
    _check(m, d, a.dtype)
    vals = torch.zeros(n, m, dtype=a.dtype)
    idx = torch.zeros(n, m, dtype=torch.int64)
    if n:
        _select_into(a.detach().contiguous().numpy(), m, vals.numpy(), idx.numpy())
    return vals, idx


@torch.no_grad()
def encoder_topk(xe: Tensor, W_enc: Tensor, b_enc: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """:func:`row_topk` of a = xe @ W_enc + b_enc (CPU), computed in row blocks of at most ≈ 8 MiB
    (but at least ``ALIKE_ROWS`` rows) whose sizes differ by at most one row (module docstring), so
    that a is never materialised. No gradient."""
    n = xe.shape[0]
    d = W_enc.shape[1]
    _check(m, d, xe.dtype)
    vals = torch.zeros(n, m, dtype=xe.dtype)
    idx = torch.zeros(n, m, dtype=torch.int64)
    n_blocks = min(max(1, n // ALIKE_ROWS), max(1, -(-n * d * xe.element_size() // _BLOCK_BYTES)))
    cuts = [i * n // n_blocks for i in range(n_blocks + 1)]  # sizes ⌊n/n_blocks⌋ or one more
    buf = torch.empty(-(-n // n_blocks), d, dtype=xe.dtype)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        blk = buf[: hi - lo]
        torch.mm(xe[lo:hi], W_enc, out=blk).add_(b_enc)
        _select_into(blk.numpy(), m, vals[lo:hi].numpy(), idx[lo:hi].numpy())
    return vals, idx
