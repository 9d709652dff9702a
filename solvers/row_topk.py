"""Row-wise top-m in compiled code: the m largest entries of every row of a matrix, and their columns.

:func:`topk_rows` (numba, ``nogil``) fills vals[r], idx[r] with the m largest entries of row r of a
(n, d) matrix, sorted by value (largest first; equal values by column), the same as
``torch.topk(a, m, dim=1)`` up to the order of equal values. It serves the TopK family's sparse
step (:mod:`dictcheck.empirics.kernels.topk_select`, which splits rows over threads and never materialises
the pre-activation) and the candidate atoms of the exact codes' compiled phase A
(:mod:`dictcheck.solvers.lasso_codes`). Per row:

1. **Lower bound.** The columns are grouped into L = min(d, 8m) strided chunks (chunk q holds
   columns q, q + L, q + 2L, …), and the chunk maxima c_q are the elementwise maximum of the row's
   L-wide segments (one vectorised pass). Any t with at least m chunk maxima ≥ t is a lower bound
   of the row's m-th largest entry (those m chunks hold m distinct entries ≥ t), so every entry of
   the top m is ≥ t and lies in a chunk whose maximum is ≥ t. The kernel tries the previous row's
   t first and keeps it when m to 2m chunk maxima reach it; otherwise it computes the row's own:
   the m groups of chunks q ≡ g (mod m) each hold a chunk whose maximum is ≥ t_lo = min_g (group
   maximum), so t_lo is such a bound, and t = the (m + ⌊m/4⌋)-th largest of the chunk maxima
   ≥ t_lo (quickselect; the slack makes the next row likely to accept it).
2. **Selection.** Only the chunks whose maximum is ≥ t are read again, segment by segment, so
   their entries ≥ t are collected in column order; they are inserted into a sorted list of m
   (insertion sort; once m are held, only entries > the smallest held), so of equal values the
   lower column is kept and comes first.

On Gaussian-like rows about m + m/4 chunks pass step 1 and step 2 reads them (≈ 1/8 of the row)
and inserts little more than m entries; the previous row's bound is accepted for ~80–90 % of the
rows. The bound only decides what is read: the result is the row's exact top m whatever t was, so
it depends on the row's own values only, and the thread count (which decides each part's first
row) changes nothing. Non-finite pre-activations: ±inf are ordered as numbers; which entries a row
holding NaN keeps is unspecified (``torch.topk`` ranks NaN first; a NaN reaches a only from NaN
inputs or weights, which make the training loss NaN through the reconstruction anyway).
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["kth_largest", "topk_rows"]

# fastmath: re-association only (the chunk maxima vectorise), no assumptions about NaN or inf.
_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})
# Step 1 of the module docstring: L = min(d, this · m) strided chunks per row.
_CHUNKS_PER_M = 8


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


@nb.njit(inline="always", **_JIT)
def kth_largest(buf, n, k, idx):
    """The k-th largest of buf[:n] (1 ≤ k ≤ n, no NaN), reordering buf[:n] so that buf[:k] holds
    the k largest (quickselect, Hoare partition around the median of three). ``idx`` is empty or
    has n entries, reordered with buf (the exact codes keep each violator's atom that way)."""
    paired = idx.shape[0] > 0
    lo, hi, want = 0, n - 1, k - 1
    while hi > lo:
        a, b, c = buf[lo], buf[(lo + hi) >> 1], buf[hi]
        if a < b:
            a, b = b, a
        if b < c:
            b = min(a, c)
        i, j = lo, hi
        while i <= j:
            while buf[i] > b:
                i += 1
            while buf[j] < b:
                j -= 1
            if i <= j:
                buf[i], buf[j] = buf[j], buf[i]
                if paired:
                    idx[i], idx[j] = idx[j], idx[i]
                i += 1
                j -= 1
        if want <= j:
            hi = j
        elif want >= i:
            lo = i
        else:
            return b
    return buf[lo]


@nb.njit(**_JIT)
def topk_rows(a, m, vals, idx):
    """vals[r], idx[r] = the m largest entries of a[r] and their columns, descending (module
    docstring, steps 1 and 2). a is (n, d) C-contiguous float32 or float64; 1 ≤ m ≤ d."""
    n, d = a.shape
    L = min(d, _CHUNKS_PER_M * m)
    n_seg = (d + L - 1) // L
    slack = max(1, m // 4)
    cmax = np.empty(L, a.dtype)
    gmax = np.empty(m, a.dtype)
    cand = np.empty(L, a.dtype)
    hot = np.empty(L, np.int64)
    cv = np.empty(d, a.dtype)
    cc = np.empty(d, np.int64)
    unpaired = np.empty(0, np.int64)
    guess = -np.inf
    for r in range(n):
        row = a[r]
        cmax[:] = row[:L]
        for s in range(1, n_seg):
            seg = row[s * L : min(d, s * L + L)]
            for q in range(seg.shape[0]):
                cmax[q] = max(cmax[q], seg[q])
        n_hot = 0
        if guess > -np.inf:
            for q in range(L):
                hot[n_hot] = q
                n_hot += cmax[q] >= guess
        if m <= n_hot <= 2 * m:
            t = guess
        else:
            gmax[:] = cmax[:m]
            for o in range(m, L, m):
                part = cmax[o : min(L, o + m)]
                for g in range(part.shape[0]):
                    gmax[g] = max(gmax[g], part[g])
            t_lo = gmax.min()
            n_cand = 0
            for q in range(L):
                cand[n_cand] = cmax[q]
                n_cand += cmax[q] >= t_lo
            t = guess = -np.inf if n_cand < m else kth_largest(cand, n_cand, min(n_cand, m + slack), unpaired)
            n_hot = 0
            for q in range(L):
                hot[n_hot] = q
                n_hot += cmax[q] >= t
        n_c = 0
        hq = hot[:n_hot]
        for s in range(n_seg):
            seg = row[s * L : min(d, s * L + L)]
            for h in range(n_hot):
                q = hq[h]
                if q >= seg.shape[0]:
                    break
                v = seg[q]
                cv[n_c] = v
                cc[n_c] = s * L + q
                n_c += v >= t
        bv = vals[r]
        bi = idx[r]
        cnt = 0
        lo = t
        for p in range(n_c):
            if cnt == m and cv[p] <= lo:
                continue
            cnt = _insert(bv, bi, cnt, m, cv[p], cc[p])
            if cnt == m:
                lo = bv[m - 1]
