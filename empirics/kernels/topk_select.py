"""Row-wise top-m of the TopK-family pre-activations (empirics/architectures/topk.py) without the dense pass.

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

Per row, the compiled selection of :func:`dictcheck.solvers.row_topk.topk_rows` (numba; ``nogil``,
so the rows of a block are split over ``torch.get_num_threads()`` Python threads that run in
parallel; a row's result depends on its own values only, so the thread count changes nothing).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dictcheck.empirics.kernels.sparse_products import run_split
from dictcheck.solvers.row_topk import topk_rows

__all__ = ["ALIKE_ROWS", "encoder_topk", "row_blocks", "row_topk"]

# Row blocks of encoder_topk: about this many bytes of pre-activations at a time.
_BLOCK_BYTES = 8 << 20
#: MKL's GEMM rounds a row alike in any product of at least this many rows (module docstring).
ALIKE_ROWS = 16


def _select_into(a: np.ndarray, m: int, vals: np.ndarray, idx: np.ndarray) -> None:
    """:func:`~dictcheck.solvers.row_topk.topk_rows` over the rows of ``a``, split over
    ``torch.get_num_threads()`` threads."""
    run_split(lambda lo, hi: topk_rows(a[lo:hi], m, vals[lo:hi], idx[lo:hi]), a.shape[0])


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


def row_blocks(n: int, d: int, element_size: int) -> list[int]:
    """Cuts 0 = c_0 < … < c_b = n of :func:`encoder_topk`'s row blocks of an (n, d) pre-activation:
    b blocks of at most 8 MiB and one row, but at least ``ALIKE_ROWS`` rows (unless n is smaller),
    of sizes ⌊n/b⌋ or one more (module docstring)."""
    n_blocks = min(max(1, n // ALIKE_ROWS), max(1, -(-n * d * element_size // _BLOCK_BYTES)))
    return [i * n // n_blocks for i in range(n_blocks + 1)]


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
    cuts = row_blocks(n, d, xe.element_size())
    buf = torch.empty(max(hi - lo for lo, hi in zip(cuts[:-1], cuts[1:])), d, dtype=xe.dtype)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        blk = buf[: hi - lo]
        torch.mm(xe[lo:hi], W_enc, out=blk).add_(b_enc)
        _select_into(blk.numpy(), m, vals[lo:hi].numpy(), idx[lo:hi].numpy())
    return vals, idx
