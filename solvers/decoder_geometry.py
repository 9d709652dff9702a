"""Pairs and neighbours among the atoms of a dictionary, exactly and without a d_z × d_z cosine matrix
(docs/theory.md §5, antipodal pairs; docs/ecosystem.md §7, the per-latent table).

For unit atoms w_d, c_dj = w_dᵀw_j. :func:`decoder_geometry` returns, for a dictionary of any width,

* the **antipodal pairs** {d, j} with c_dj < threshold (default −0.9, the dense antipodal features of §5),
* each atom's **nearest** other atom (largest c_dj, j ≠ d) and its **most antipodal** one (smallest c_dj),

from screened products of blocks of atoms with all atoms (:func:`~dictcheck.solvers.atom_rows.screen_pairs`:
every c_dj that may pass the threshold or attain a row's maximum or minimum once the best screened one is
known is re-evaluated in float64, :func:`~dictcheck.solvers.atom_rows.exact_extremes`), so
every reported cosine is exact and the memory is the atoms plus one block of products. Ties go to the lower
atom index. The time is d_z²·D multiply-adds in the screen's precision (bfloat16 on matrix units).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dictcheck.solvers.atom_rows import AtomRows, exact_extremes, screen_pairs
from dictcheck.solvers.reductions import LOCAL, Reduction

__all__ = ["DecoderGeometry", "decoder_geometry", "ANTIPODAL_COSINE"]

#: Decoder cosine below which two atoms count as an antipodal pair (docs/theory.md §5).
ANTIPODAL_COSINE = -0.9
#: Atoms whose products with all atoms are screened at a time.
_BLOCK = 4096


@dataclass(frozen=True)
class DecoderGeometry:
    """``pairs`` (k, 2) int64 with i < j and c_ij < threshold, sorted, with their cosines; per atom
    ``nearest`` / ``nearest_cosine`` (the largest c_dj, j ≠ d) and ``antipodal`` / ``antipodal_cosine`` (the
    smallest); −1 and NaN for a dictionary of one atom."""

    pairs: NDArray[np.int64]
    pair_cosines: NDArray[np.float64]
    nearest: NDArray[np.int64]
    nearest_cosine: NDArray[np.float64]
    antipodal: NDArray[np.int64]
    antipodal_cosine: NDArray[np.float64]


def decoder_geometry(atoms: AtomRows, threshold: float = ANTIPODAL_COSINE, workers: int = 1,
                     block: int = _BLOCK, reduce: Reduction = LOCAL) -> DecoderGeometry:
    """The pairs and neighbours of the module docstring for unit atoms (scales as stored: give
    :meth:`AtomRows.unit_rows_of` for a decoder). With ``reduce`` over several processes each takes every
    size-th block of atoms and all receive the whole result."""
    d_z = atoms.n_atoms
    nearest = np.full(d_z, -1, np.int64)
    antipodal = np.full(d_z, -1, np.int64)
    nearest_cos = np.full(d_z, np.nan)
    antipodal_cos = np.full(d_z, np.nan)
    pair_l: list[NDArray[np.int64]] = []
    cos_l: list[NDArray[np.float64]] = []
    for lo in range(reduce.rank * block, d_z, reduce.size * block):
        hi = min(d_z, lo + block)
        V = np.ascontiguousarray(atoms.unit_block(lo, hi))
        n = hi - lo
        own = np.arange(n)
        pairs = screen_pairs(atoms, V, below=np.full(n, threshold), top=("max", "min"), exclude=(own, own + lo),
                             scale=np.ones(n))
        keep = pairs.atoms != pairs.rows + lo
        rows, cols, screened = pairs.rows[keep], pairs.atoms[keep], pairs.screened[keep]
        may_pass = screened < threshold + pairs.bound[rows]
        c = exact_extremes(atoms, V, rows, cols, screened, pairs.bound, ("max", "min"), need=may_pass,
                           workers=workers)
        evaluated = ~np.isnan(c)
        rows, cols, c = rows[evaluated], cols[evaluated], c[evaluated]
        below = (c < threshold) & (rows + lo < cols)
        pair_l.append(np.stack([rows[below] + lo, cols[below]], axis=1))
        cos_l.append(c[below])
        for sign, idx, val in ((1.0, nearest, nearest_cos), (-1.0, antipodal, antipodal_cos)):
            order = np.lexsort((cols, -sign * c, rows))  # by row, best first, ties to the lower atom
            first = np.unique(rows[order], return_index=True)[1]
            best = order[first]
            idx[rows[best] + lo] = cols[best]
            val[rows[best] + lo] = c[best]
    P = np.concatenate(pair_l) if pair_l else np.zeros((0, 2), np.int64)
    C = np.concatenate(cos_l) if cos_l else np.zeros(0)
    if reduce.size > 1:
        parts = reduce.gather((P, C, nearest, nearest_cos, antipodal, antipodal_cos))
        P = np.concatenate([p[0] for p in parts])
        C = np.concatenate([p[1] for p in parts])
        for p in parts:
            done = p[2] >= 0
            nearest[done], nearest_cos[done] = p[2][done], p[3][done]
            antipodal[done], antipodal_cos[done] = p[4][done], p[5][done]
    order = np.lexsort((P[:, 1], P[:, 0]))
    return DecoderGeometry(pairs=P[order], pair_cosines=C[order], nearest=nearest, nearest_cosine=nearest_cos,
                           antipodal=antipodal, antipodal_cosine=antipodal_cos)
