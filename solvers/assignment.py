"""One-to-one matching by the Hungarian method (scipy's ``linear_sum_assignment``).

Used by the bilinear atom matching (docs/bilinear.md §7) and the BSF Hungarian recovery score
(docs/bsf.md §6).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = ["max_weight_matching"]


def max_weight_matching(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns of the one-to-one assignment maximising Σ scores[rows, cols].

    ``scores`` is (m, n), any m and n ≥ 1; min(m, n) pairs are returned, rows in increasing order.
    ValueError for a non-2-D, empty or non-finite matrix.
    """
    S = np.asarray(scores, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] < 1 or S.shape[1] < 1:
        raise ValueError(f"scores must be a non-empty 2-D matrix, got shape {S.shape}")
    if not np.isfinite(S).all():
        raise ValueError("scores contain NaN or inf")
    rows, cols = linear_sum_assignment(S, maximize=True)
    return rows, cols
