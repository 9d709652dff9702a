"""Checking a given dictionary against the local optimality conditions (docs/theory.md §3, §6).

``check_dictionary`` normalises the atoms, computes exact non-negative lasso codes for the
dictionary (solvers.lasso_codes), optionally learns the bias that is optimal for that dictionary,
and evaluates every diagnostic of theory.diagnostics plus the numeric ones that need a solver:
the distance from each atom's cosine vector to the hull of its points' φ_i (spec §8 candidates),
the best-new-atom search of S6, and the wide-limit gap and certificate of §2.3.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize

from dictcheck.solvers.hull_distance import HullCandidateDistances, hull_candidate_distances
from dictcheck.solvers.atom_rows import AtomRows
from dictcheck.solvers.lasso_codes import ExactCodes, exact_codes
from dictcheck.solvers.medians import huber_median
from dictcheck.solvers.new_atom_search import NewAtomSearchResult, best_new_atom
from dictcheck.solvers.stream_diagnostics import SparseCodes, batch_size_for, column_batches, stream_diagnostics
from dictcheck.theory.certificate import certified_gap
from dictcheck.theory.diagnostics import DiagnosticTolerances, DictionaryDiagnostics, residuals
from dictcheck.theory.objective import centred
from dictcheck.theory.scaling import canonical_scale

#: Atoms whose norm differs from 1 by more than this are reported as renormalised.
UNIT_NORM_RTOL = 1e-12


def require_exact(codes: ExactCodes, what: str = "the exact codes") -> ExactCodes:
    """``codes`` if they met their tolerance or at least the diagnostics' KKT tolerance (1e-6, the level every
    verdict of docs/theory.md §6 is judged at); ValueError otherwise: a verdict on codes that are not exact would be
    the solver's, not the dictionary's. In float64 the codes reach a relative KKT violation of about ε·‖x̃‖/λ at best
    (docs/theory.md §1.1), so this refuses data more than ~10⁹ times λ (a λ too small for the data)."""
    if not codes.converged and codes.kkt_violation > DiagnosticTolerances().kkt:
        raise ValueError(f"{what} reach a relative KKT violation of only {codes.kkt_violation:.3g} (asked for "
                         f"{codes.tol:g}; verdicts are judged at {DiagnosticTolerances().kkt:g}): λ is too small for "
                         "the data to be solved in float64 (the accuracy is about 2.2e-16·‖x̃‖/λ); give a larger λ")
    return codes


@dataclass(frozen=True)
class LearnedBias:
    """The bias minimising objective (1) for a fixed dictionary, and its stationarity ‖R1‖/N."""

    b: NDArray[np.float64]
    codes: ExactCodes
    residual_mean_norm: float
    iterations: int


def learn_bias(W: NDArray, X: NDArray, lam: float, *, b0: ArrayLike | None = None, tol: float = 1e-8) -> LearnedBias:
    """argmin_b (1/N) Σ_i min_{z ≥ 0} [‖x_i − b − W z‖² + 2λ‖z‖₁] for fixed unit atoms W.

    The inner minimum is convex and C¹ in b with gradient −(2/N) R1 (envelope theorem), so
    L-BFGS on b with exact codes at every evaluation converges to the optimal bias. It stops when
    ‖R1‖/N ≤ λ·tol (the learned-bias condition Σ_i r_i = 0 of spec §3 (4)). L-BFGS's first step has unit length,
    so it runs at the canonical scale σ = :func:`dictcheck.theory.scaling.canonical_scale` (λ) (X, b₀ and λ divided
    by σ, the bias, codes and ‖R1‖/N multiplied back).
    """
    X = np.asarray(X, dtype=np.float64)
    sigma = canonical_scale(lam)
    fitted = _learn_bias(W, X / sigma, lam / sigma, None if b0 is None else np.asarray(b0, dtype=np.float64) / sigma,
                         tol)
    return LearnedBias(b=fitted.b * sigma, codes=replace(fitted.codes, Z=fitted.codes.Z * sigma),
                       residual_mean_norm=fitted.residual_mean_norm * sigma, iterations=fitted.iterations)


def _learn_bias(W: NDArray, X: NDArray, lam: float, b0: NDArray | None, tol: float) -> LearnedBias:
    """:func:`learn_bias` at the canonical scale."""
    N = X.shape[1]
    b0 = np.mean(X, axis=1) if b0 is None else b0
    cache: dict[bytes, ExactCodes] = {}

    def value_and_grad(b: NDArray) -> tuple[float, NDArray]:
        codes = exact_codes(W, X, b, lam, tol=min(tol, 1e-10))
        cache[b.tobytes()] = codes
        R = residuals(W, codes.Z, b, X)
        value = (np.sum(R * R) + 2.0 * lam * np.sum(codes.Z)) / N
        return float(value), -2.0 * R.sum(axis=1) / N

    result = minimize(value_and_grad, b0, jac=True, method="L-BFGS-B",
                      options={"gtol": 2.0 * lam * tol, "ftol": 1e-16, "maxiter": 500})
    b = np.asarray(result.x, dtype=np.float64)
    codes = cache.get(b.tobytes()) or exact_codes(W, X, b, lam, tol=min(tol, 1e-10))
    R = residuals(W, codes.Z, b, X)
    return LearnedBias(b=b, codes=codes, residual_mean_norm=float(np.linalg.norm(R.sum(axis=1)) / N),
                       iterations=int(result.nit))


@dataclass(frozen=True)
class DictionaryCheck:
    """Everything ``dictcheck check-dict`` reports about one dictionary."""

    W: NDArray[np.float64]
    column_norms: NDArray[np.float64]
    renormalised: bool
    b: NDArray[np.float64]
    bias_mode: str
    codes_kkt_violation: float
    diagnostics: DictionaryDiagnostics
    best_new_atom: NewAtomSearchResult
    hull: HullCandidateDistances | None
    wide_gap: float
    certified_gap: float
    seconds: float


def check_dictionary(
    W: NDArray, X: NDArray, lam: float, *, b: ArrayLike | None = None, learn: bool = False,
    tol: float = 1e-8, hull_candidates: bool = False, progress: bool = False, device: str = "cpu",
) -> DictionaryCheck:
    """Diagnose dictionary W (D, d_z) on data X (D, N) at λ (docs/theory.md §6).

    Columns of W are normalised first (their norms are reported). The bias is ``b`` if given, the
    optimal bias for W if ``learn``, else zero. Codes are kept sparse and the diagnostics are streamed
    over batches of points (:func:`dictcheck.solvers.stream_diagnostics.stream_diagnostics`), so memory
    is O(nnz + D·d_z) beyond X itself. ``hull_candidates`` adds the four hull distances of §8 Q1 (one
    QP per atom; dense codes). Raises ValueError on a zero atom or bad shapes. ``progress`` shows a
    progress bar over the batches of the exact-code solve.
    """
    start = time.perf_counter()
    W = np.asarray(W, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    if W.ndim != 2 or W.shape[1] == 0:
        raise ValueError(f"dictionary must have shape (D, d_z) with d_z >= 1, got {W.shape}")
    if W.shape[0] != X.shape[0]:
        raise ValueError(f"dictionary has D = {W.shape[0]} rows but the data have D = {X.shape[0]}")
    norms = np.linalg.norm(W, axis=0)
    if np.any(norms == 0):
        raise ValueError(f"atoms {np.flatnonzero(norms == 0).tolist()} have zero norm and cannot be normalised")
    W_unit = W / norms
    if learn and b is not None:
        raise ValueError("give a bias or ask to learn it, not both")
    if learn:
        fitted = learn_bias(W_unit, X, lam, tol=tol)
        bias, codes, mode = fitted.b, require_exact(fitted.codes), "learned"
    else:
        bias = np.zeros(X.shape[0]) if b is None else np.asarray(b, dtype=np.float64).reshape(-1)
        if bias.size != X.shape[0]:
            raise ValueError(f"bias has {bias.size} entries but the data have D = {X.shape[0]}")
        codes = require_exact(exact_codes(W_unit, X, bias, lam, tol=tol, progress=progress, sparse_output=True))
        mode = "given" if b is not None else "zero"
    sparse = SparseCodes.from_matrix(codes.Z)
    R = centred(X, bias) - sparse.decode(W_unit)
    search = best_new_atom(R, lam, W_unit)
    diag = stream_diagnostics(AtomRows.from_columns(W_unit, device), sparse, bias,
                              column_batches(X, batch_size_for(X.shape[1])), lam, learned_bias=learn).diagnostics
    hull = (hull_candidate_distances(W_unit, sparse.to_dense(), bias, X, lam, tau_act=diag.tau_act)
            if hull_candidates else None)
    optimum = huber_median(X, lam).objective
    gap = certified_gap(diag.objective, bias, X, lam, learned_bias=learn)
    return DictionaryCheck(
        W=W_unit, column_norms=norms, renormalised=bool(np.any(np.abs(norms - 1) > UNIT_NORM_RTOL)), b=bias,
        bias_mode=mode, codes_kkt_violation=codes.kkt_violation, diagnostics=diag, best_new_atom=search, hull=hull,
        wide_gap=diag.objective - optimum, certified_gap=gap.certified_gap, seconds=time.perf_counter() - start,
    )
