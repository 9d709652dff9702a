"""Hungarian one-to-one matching of two dictionaries of quadratic forms (docs/bilinear.md §7).

Each symmetrised form is normalised to unit Frobenius norm (Decision), M_jl = |⟨Ŵ_j^a, Ŵ_l^b⟩_F|
is built from the Gram matrix of :func:`theory.form_similarity.form_gram` (nothing D²-sized), and
the one-to-one assignment maximising the matched sum is taken
(:func:`solvers.assignment.max_weight_matching`). Reported: the mean matched cosine and the
workshop ratio ‖matched entries‖₂ / ‖M‖_F. A zero form (e.g. a composite whose masked row of C
is zero) cannot be normalised: Decision: its cosine with every form is 0, and it is counted
(``n_zero_a``, ``n_zero_b``); the ratio is 0 when M is all zero. A permuted, sign-flipped copy of a dictionary of
mutually orthogonal forms scores 1 on both; a rotated copy (orthogonal mixing within the span)
keeps subspace similarity 1 but matches worse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dictcheck.solvers.assignment import max_weight_matching
from dictcheck.theory.form_similarity import Forms, form_gram, form_norms_sq

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
    n_zero_a: int
    n_zero_b: int


def _inverse_norms(forms: Forms) -> NDArray[np.float64]:
    """1/‖W_j‖_F, and 0 for a zero form (its cosines are then 0)."""
    norms = np.sqrt(form_norms_sq(forms))
    return np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0.0)


def match_forms(a: Forms, b: Forms) -> FormMatching:
    """Hungarian matching of the unit-Frobenius forms of a and b (module docstring)."""
    inv_a, inv_b = _inverse_norms(a), _inverse_norms(b)
    M = np.abs(form_gram(a, b)) * np.outer(inv_a, inv_b)
    rows, cols = max_weight_matching(M)
    matched = M[rows, cols]
    total = float(np.linalg.norm(M))
    return FormMatching(rows=rows, cols=cols, cosines=matched, mean_cosine=float(np.mean(matched)),
                        workshop_ratio=float(np.linalg.norm(matched)) / total if total > 0 else 0.0, M=M,
                        n_zero_a=int(np.sum(inv_a == 0.0)), n_zero_b=int(np.sum(inv_b == 0.0)))
