"""Products with a sparse code matrix, compiled: the backward pass of the TopK family's gathered
decode and sparse encoder (empirics/sae_models.py; docs/ecosystem.md §3, "The TopK family's
sparse step"; benchmarks/RESULTS.md §4).

The codes Z (B × d_sae) are given by their P non-zeros p = (token t_p, latent j_p, value z_p). With
a dense G (B × e):

* :func:`gather_dots`: out_p = ⟨W[j_p], G[t_p]⟩ for a (d_sae × e) W: ∂L/∂z_p of x̂ = Z W when
  G = ∂L/∂x̂ (and of the encoder's selected pre-activations, ∂L/∂z_p = ⟨W_enc[:, j_p], …⟩).
* :func:`scatter_rows`: (ZᵀG)[j] = Σ_{p: j_p = j} z_p G[t_p], a (d_sae × e) matrix: ∂L/∂W of
  x̂ = Z W, and the transpose of the encoder's ∂L/∂W_enc with G = x̃ (``transposed``: written in
  W_enc's (e × d_sae) layout directly, 16 latents at a time, instead of a transposed copy). It reads
  the non-zeros grouped by latent (:func:`by_latent`, a CSR layout of Zᵀ, by a compiled counting
  sort on the CPU), so every output row is written by one thread, in a fixed order: the result
  does not depend on the thread count.
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

import numba as nb
import numpy as np
import torch
from torch import Tensor

__all__ = ["by_latent", "gather_dots", "run_split", "scatter_rows", "scatter_rows_and_dots"]

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})
# Latents per block of :func:`_scatter_rows_t`: a 64-byte line of each output row (float32).
_T_BLOCK = 16


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
def _scatter_rows(crow, tok, val, G, out, j0, W, order, dots):
    """Rows j0:j0 + len(out) of ZᵀG; with a non-empty W also dots[order[p]] = ⟨W[j], G[tok[p]]⟩ for
    the entries p of those latents, from the row of G the sum has just loaded."""
    with_dots = W.shape[0] > 0
    for j in range(out.shape[0]):
        o = out[j]
        o[:] = 0
        for p in range(crow[j0 + j], crow[j0 + j + 1]):
            row = G[tok[p]]
            if with_dots:
                dots[order[p]] = _dot(W[j0 + j], row)
            _axpy(o, val[p], row)


@nb.njit(**_JIT)
def _scatter_rows_t(crow, tok, val, G, out_t, j0, j1):
    """Rows j0:j1 of ZᵀG as :func:`_scatter_rows` sums them, written as columns of out_t = (ZᵀG)ᵀ,
    _T_BLOCK latents at a time (accumulated in a small row buffer, then stored transposed)."""
    buf = np.empty((_T_BLOCK, G.shape[1]), G.dtype)
    for b0 in range(j0, j1, _T_BLOCK):
        nb_ = min(_T_BLOCK, j1 - b0)
        for jj in range(nb_):
            o = buf[jj]
            o[:] = 0
            for p in range(crow[b0 + jj], crow[b0 + jj + 1]):
                _axpy(o, val[p], G[tok[p]])
        for c in range(G.shape[1]):
            dst = out_t[c, b0 : b0 + nb_]
            for jj in range(nb_):
                dst[jj] = buf[jj, c]


@nb.njit(**_JIT)
def _counting_sort(lat, tok, crow, order, tok_sorted):
    crow[:] = 0
    for p in range(lat.shape[0]):
        crow[lat[p] + 1] += 1
    for j in range(crow.shape[0] - 1):
        crow[j + 1] += crow[j]
    nxt = crow[:-1].copy()
    for p in range(lat.shape[0]):
        q = nxt[lat[p]]
        nxt[lat[p]] = q + 1
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


def by_latent(lat: Tensor, tok: Tensor, d_sae: int) -> tuple[Tensor, Tensor, Tensor]:
    """(crow, order, tok[order]): the entries grouped by latent (stable: by entry within a latent),
    latent j's at positions crow[j]:crow[j + 1] of ``order``. On the CPU a compiled counting sort
    (one pass to count, one to place; the same result as a stable argsort of lat)."""
    if lat.device.type == "cpu":
        crow = torch.empty(d_sae + 1, dtype=torch.int64)
        order = torch.empty_like(lat)
        tok_sorted = torch.empty_like(tok)
        if lat.numel():
            _counting_sort(lat.numpy(), tok.numpy(), crow.numpy(), order.numpy(), tok_sorted.numpy())
        else:
            crow.zero_()
        return crow, order, tok_sorted
    order = torch.argsort(lat, stable=True)
    crow = torch.zeros(d_sae + 1, dtype=torch.int64, device=lat.device)
    crow[1:] = torch.cumsum(torch.bincount(lat, minlength=d_sae), 0)
    return crow, order, tok[order]


@torch.no_grad()
def gather_dots(tok: Tensor, lat: Tensor, W: Tensor, G: Tensor) -> Tensor:
    """(P,) out_p = ⟨W[lat_p], G[tok_p]⟩ (module docstring); CPU, contiguous float32/float64."""
    out = torch.empty(lat.shape[0], dtype=W.dtype)
    if out.numel():
        t, j, w, g, o = tok.numpy(), lat.numpy(), W.contiguous().numpy(), G.contiguous().numpy(), out.numpy()
        run_split(lambda lo, hi: _gather_dots(t[lo:hi], j[lo:hi], w, g, o[lo:hi]), o.shape[0])
    return out


@torch.no_grad()
def scatter_rows(crow: Tensor, tok_sorted: Tensor, val_sorted: Tensor, G: Tensor, *, transposed: bool = False) -> Tensor:
    """(d_sae, e) ZᵀG from the entries grouped by latent (:func:`by_latent`): row j is
    Σ val_sorted[p] G[tok_sorted[p]] over p in crow[j]:crow[j + 1]. ``transposed``: (ZᵀG)ᵀ, (e, d_sae)
    and contiguous, the same numbers written in that layout directly (no transposed copy)."""
    if not transposed:
        return _scatter_rows_run(crow, crow[:0], tok_sorted, val_sorted, G[:0], G)[0]  # no W: no dots
    d_sae, e = crow.shape[0] - 1, G.shape[1]
    c, t, v, g = crow.numpy(), tok_sorted.numpy(), val_sorted.contiguous().numpy(), G.contiguous().numpy()
    out = torch.empty(e, d_sae, dtype=G.dtype)
    o = out.numpy()
    n_blocks = -(-d_sae // _T_BLOCK)
    run_split(lambda lo, hi: _scatter_rows_t(c, t, v, g, o, lo * _T_BLOCK, min(d_sae, hi * _T_BLOCK)), n_blocks)
    return out


@torch.no_grad()
def scatter_rows_and_dots(crow: Tensor, order: Tensor, tok_sorted: Tensor, val_sorted: Tensor, W: Tensor,
                          G: Tensor) -> tuple[Tensor, Tensor]:
    """(ZᵀG, dots) in one pass over the entries grouped by latent (:func:`by_latent`'s crow, order,
    tok[order]): ZᵀG as :func:`scatter_rows` (d_sae, e), and dots (P,) = :func:`gather_dots`'s
    ⟨W[j_p], G[t_p]⟩ in the entries' original order, each from the row G[t_p] the sum has just
    loaded: the backward of x̂ = Z W reads each such row once instead of twice (both results bit
    for bit those of the two separate products; measured 15.6 → 12.6 ms at B = d_sae = 4096,
    e = 512, k = 32, two threads, benchmarks/RESULTS.md §4)."""
    return _scatter_rows_run(crow, order, tok_sorted, val_sorted, W, G)


def _scatter_rows_run(crow: Tensor, order: Tensor, tok_sorted: Tensor, val_sorted: Tensor, W: Tensor,
                      G: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_scatter_rows` over all latents, split over the threads: (ZᵀG, dots), the dots only
    for a non-empty W (order then maps grouped positions to the entries' own)."""
    d_sae, e = crow.shape[0] - 1, G.shape[1]
    out = torch.empty(d_sae, e, dtype=G.dtype)
    dots = torch.empty(order.shape[0], dtype=W.dtype)
    c, o_, t, v = crow.numpy(), order.numpy(), tok_sorted.numpy(), val_sorted.contiguous().numpy()
    w, g, o, dd = W.contiguous().numpy(), G.contiguous().numpy(), out.numpy(), dots.numpy()
    run_split(lambda lo, hi: _scatter_rows(c, t, v, g, o[lo:hi], lo, w, o_, dd), d_sae)
    return out, dots
