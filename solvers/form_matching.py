"""Hungarian one-to-one matching of two dictionaries of quadratic forms (spec/bilinear.md §7).

Each symmetrised form is normalised to unit Frobenius norm (Decision), M_jl = |⟨Ŵ_j^a, Ŵ_l^b⟩_F|
is built from the Gram matrix of :func:`theory.form_similarity.form_gram` (nothing D²-sized), and
the one-to-one assignment maximising the matched sum is taken
(:func:`solvers.assignment.max_weight_matching`). Reported: the mean matched cosine and the
workshop ratio ‖matched entries‖₂ / ‖M‖_F. A permuted, sign-flipped copy of a dictionary of
mutually orthogonal forms scores 1 on both; a rotated copy (orthogonal mixing within the span)
keeps subspace similarity 1 but matches worse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from solvers.assignment import max_weight_matching
from theory.form_similarity import Forms, form_gram, form_norms_sq

__all__ = ["FormMatching", "match_forms"]


@dataclass(frozen=True)
class FormMatching:
    """rows[i] of a is matched to cols[i] of b with cosine cosines[i]; M is the |cosine| matrix."""

    rows: NDArray[np.int64]
    cols: NDArray[np.int64]
    cosines: NDArray[np.float64]
    mean_cosine: float
    workshop_ratio: float
    M: NDArray[np.float64]


def _norms(forms: Forms, which: str) -> NDArray[np.float64]:
    sq = form_norms_sq(forms)
    zero = np.flatnonzero(sq <= 0.0)
    if zero.size:
        raise ValueError(f"form {int(zero[0])} of dictionary {which} is zero and cannot be normalised")
    return np.sqrt(sq)


def match_forms(a: Forms, b: Forms) -> FormMatching:
    """Hungarian matching of the unit-Frobenius forms of a and b (module docstring)."""
    G = form_gram(a, b)
    M = np.abs(G) / np.outer(_norms(a, "a"), _norms(b, "b"))
    rows, cols = max_weight_matching(M)
    matched = M[rows, cols]
    return FormMatching(rows=rows, cols=cols, cosines=matched, mean_cosine=float(np.mean(matched)),
                        workshop_ratio=float(np.linalg.norm(matched) / np.linalg.norm(M)), M=M)
