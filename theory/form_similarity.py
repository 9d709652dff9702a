"""Subspace (Frobenius) similarity of two dictionaries of quadratic forms (docs/bilinear.md §7).

For dictionaries a and b with symmetrised forms {W_j^a}, {W_l^b} (composites for compound):

    N_ab = mean_{j,l} ⟨W_j^a, W_l^b⟩_F²,      sim(a, b) = 2√N_ab / (√N_aa + √N_bb).

Σ_{j,l}⟨W_j^a, W_l^b⟩² = ⟨P_a, P_b⟩_F with P = 𝒲ᵀ𝒲 the D²×D² Gram operator of a dictionary, so
the score is invariant to permutations, sign flips and orthogonal mixing within the span, but not to
scale (forms are compared as trained).

**No D²×D² object is formed.** Everything goes through the (d_a × d_b) Gram matrix of the forms:

* factored forms (:class:`theory.quadric_geometry.FactoredForms`, all three priors): the atom Gram
  ⟨sym(l rᵀ), sym(l' r'ᵀ)⟩ = ½[(l·l')(r·r') + (l·r')(r·l')] (for atomic atoms (u·u')²), then
  C_a K C_bᵀ for compound; cost O(n_a n_b D), memory O(n_a n_b);
* dense (d, D, D) arrays (small D only): symmetrise, flatten to (d, D²) and take one matrix product
  (memory O(d D²), the forms themselves).

The Hungarian one-to-one matching of the same forms lives in :mod:`solvers.form_matching`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.quadric_geometry import FactoredForms, symmetrise

__all__ = ["form_gram", "form_norms_sq", "subspace_similarity"]

Forms = FactoredForms | ArrayLike


def _flat(forms: ArrayLike) -> NDArray[np.float64]:
    W = np.asarray(forms, dtype=np.float64)
    if W.ndim != 3 or W.shape[1] != W.shape[2] or W.shape[0] < 1:
        raise ValueError(f"dense forms must have shape (d, D, D) with d >= 1, got {W.shape}")
    if not np.all(np.isfinite(W)):
        raise ValueError("forms contain NaN or inf")
    return symmetrise(W).reshape(W.shape[0], -1)


def form_gram(a: Forms, b: Forms) -> NDArray[np.float64]:
    """G_jl = ⟨sym W_j^a, sym W_l^b⟩_F, shape (d_a, d_b); both factored or both dense."""
    if isinstance(a, FactoredForms) and isinstance(b, FactoredForms):
        return a.gram(b)
    if isinstance(a, FactoredForms) or isinstance(b, FactoredForms):
        raise ValueError("give both dictionaries as FactoredForms or both as dense (d, D, D) arrays")
    fa, fb = _flat(a), _flat(b)
    if fa.shape[1] != fb.shape[1]:
        raise ValueError(f"forms live in different dimensions: D² = {fa.shape[1]} and {fb.shape[1]}")
    return fa @ fb.T


def form_norms_sq(forms: Forms) -> NDArray[np.float64]:
    """‖sym W_j‖_F² for every form (the Gram diagonal, computed without the full Gram)."""
    if isinstance(forms, FactoredForms):
        return forms.frobenius_sq()
    f = _flat(forms)
    return np.einsum("ij,ij->i", f, f)


def subspace_similarity(a: Forms, b: Forms) -> float:
    """sim(a, b) = 2√N_ab/(√N_aa + √N_bb) (module docstring). ValueError if either dictionary is zero."""
    n_ab = float(np.mean(form_gram(a, b) ** 2))
    n_aa = float(np.mean(form_gram(a, a) ** 2))
    n_bb = float(np.mean(form_gram(b, b) ** 2))
    if n_aa == 0.0 or n_bb == 0.0:
        raise ValueError("subspace similarity is undefined for an all-zero dictionary")
    return 2.0 * np.sqrt(n_ab) / (np.sqrt(n_aa) + np.sqrt(n_bb))
