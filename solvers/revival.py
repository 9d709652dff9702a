"""The reference learner with revival of redundant latents (docs/theory.md §2.4).

At a width d_z the reference learner (:func:`dictcheck.solvers.reference_learner.fit_reference`) can end
at a stationary point that uses fewer than d_z distinct atoms: a latent whose code row reached 0 (the
zero-row trap of §2.2), or two latents with the same unit atom (they serve their points as one atom
whose code is the sum, at exactly the same objective (1)). Such a point is **reducible**. When in
addition its certificate fails (max_i ‖r_i‖ > λ, §2.3), it is not a local minimum of (1) at width d_z:
the spare latent can take the new atom u = argmax gain (S6) with codes (uᵀr_i − λ)₊ and the sum loss
drops by gain(u) > 0 (gain lemma). :func:`fit_with_revival` takes that step and refits, until the
point is irreducible (all d_z latents live and distinct) or certified (max_i ‖r_i‖ ≤ λ(1 + tol)).

This module imports only :mod:`theory` and :mod:`solvers` (layer contract).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.solvers.new_atom_search import best_new_atom
from dictcheck.solvers.reference_learner import ReferenceFit, fit_reference, fit_residuals
from dictcheck.theory.diagnostics import new_atom_codes

#: Two unit atoms with cosine above this are one atom (their latents are merged, codes summed).
DUPLICATE_COSINE = 1.0 - 1e-9
#: The certificate max_i ‖r_i‖/λ ≤ 1 + CERT_TOL counts as holding: at stops with duplicated atoms the learner's
#: residual norms at the optimum come out up to ~3e-7 above λ (the objective itself to ~1e-16).
CERT_TOL = 1e-6


def distinct_atoms(W: NDArray, Z: NDArray) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The live latents of unit atoms W (D, d_z) and unit-atom codes Z (d_z, N), with duplicated atoms merged:
    (W (D, k), Z (k, N)), k ≤ d_z. A latent is live when its atom and its code row are non-zero.

    Merging two latents with the same unit atom and summing their codes leaves W Z and Σ‖z_i‖₁, hence
    objective (1), unchanged.
    """
    W, Z = np.asarray(W, dtype=np.float64), np.asarray(Z, dtype=np.float64)
    if W.ndim != 2 or Z.ndim != 2 or W.shape[1] != Z.shape[0]:
        raise ValueError(f"W (D, d_z) and Z (d_z, N) disagree: {W.shape}, {Z.shape}")
    live = (np.linalg.norm(W, axis=0) > 0) & (Z.sum(axis=1) > 0)
    W, Z = W[:, live], Z[live].copy()
    keep: list[int] = []
    for d in range(W.shape[1]):
        twin = next((k for k in keep if float(W[:, k] @ W[:, d]) > DUPLICATE_COSINE), None)
        if twin is None:
            keep.append(d)
        else:
            Z[twin] += Z[d]
    return W[:, keep], Z[keep]


def cert_ratio_of(fit: ReferenceFit, X: NDArray) -> float:
    """max_i ‖r_i‖/λ at the fit (the §2.3 certificate holds iff ≤ 1)."""
    return float(np.max(np.linalg.norm(fit_residuals(fit, X), axis=0)) / fit.lam)


@dataclass(frozen=True)
class RevivalFit:
    """Result of :func:`fit_with_revival`.

    fit: the final reference fit. first_objective: objective (1) where the learner stopped from the start
    given, before any revival. revivals: how many revivals were taken. first_reducible: whether that first
    stopping point used fewer than d_z distinct atoms. first_cert_ratio / cert_ratio: max_i ‖r_i‖/λ there
    and at the end. distinct: distinct atoms at the end. irreducible_uncertified: the end is a stationary
    point with d_z distinct live atoms whose certificate fails (a candidate non-global local minimum).
    """

    fit: ReferenceFit
    first_objective: float
    revivals: int
    first_reducible: bool
    first_dead: bool
    first_cert_ratio: float
    cert_ratio: float
    distinct: int
    irreducible_uncertified: bool


def fit_with_revival(
    X: NDArray, lam: float, W0: NDArray, Z0: NDArray, *, b0: ArrayLike, learn_bias: bool, max_revivals: int = 20
) -> RevivalFit:
    """Fit from (W0, Z0, b0) at width d_z = W0.shape[1]; while the end point is reducible and uncertified,
    revive one latent at the best new atom (:func:`best_new_atom`, codes (uᵀr_i − λ)₊) and refit from there.

    The revived start keeps the distinct atoms and their codes; any further spare latents start as zero
    atoms with zero codes (the learner's 1e-3 offset makes every start strictly positive). Raises
    ValueError if W0 and Z0 disagree in width or ``max_revivals`` is negative.
    """
    d_z = W0.shape[1]
    if Z0.shape[0] != d_z:
        raise ValueError(f"W0 has {d_z} atoms but Z0 has {Z0.shape[0]} code rows")
    if max_revivals < 0:
        raise ValueError(f"max_revivals must be >= 0, got {max_revivals}")
    D, N = X.shape
    fit = fit_reference(X, lam, W0=W0, Z0=Z0, b0=b0, learn_bias=learn_bias)
    first_objective, first_cert = fit.objective, cert_ratio_of(fit, X)
    W, Z = distinct_atoms(fit.W, fit.Z)
    first_reducible, first_dead = W.shape[1] < d_z, bool(not fit.live.all())
    revivals = 0
    while W.shape[1] < d_z and cert_ratio_of(fit, X) > 1.0 + CERT_TOL and revivals < max_revivals:
        R = fit_residuals(fit, X)
        u = best_new_atom(R, lam, W=W).u
        spare = d_z - W.shape[1] - 1
        W_start = np.column_stack([W, u, np.zeros((D, spare))])
        Z_start = np.vstack([Z, new_atom_codes(u, R, lam), np.zeros((spare, N))])
        fit = fit_reference(X, lam, W0=W_start, Z0=Z_start, b0=fit.b, learn_bias=learn_bias)
        W, Z = distinct_atoms(fit.W, fit.Z)
        revivals += 1
    cert = cert_ratio_of(fit, X)
    return RevivalFit(fit=fit, first_objective=first_objective, revivals=revivals, first_reducible=first_reducible,
                      first_dead=first_dead, first_cert_ratio=first_cert, cert_ratio=cert, distinct=int(W.shape[1]),
                      irreducible_uncertified=W.shape[1] == d_z and cert > 1.0 + CERT_TOL)
