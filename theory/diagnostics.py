"""Diagnostics of a dictionary at given codes: the local optimality conditions (docs/theory.md §3, §6).

Inputs follow the shared conventions (docs/README.md): X (D, N) points as columns, W (D, d_z) unit
atoms as columns, Z (d_z, N) **unit-atom** codes ≥ 0, b (D,), λ of objective (1). From them

    r_i = x_i − b − W z_i,     φ_i = Ŵᵀ r_i / λ ∈ R^{d_z},     A_d = {i : z_di > τ_act},
    p_d = |A_d| / N,           π_di = z_di / Σ_m z_dm,          c_dj = ŵ_dᵀ ŵ_j.

Every function below evaluates one identity of §3 at the codes it is given. Whether those codes are
exact lasso codes (§1), an encoder's codes (§7) or a learner's codes is the caller's business; the
§6 diagnostics are defined with exact codes of the given decoder.

Decisions (documented here and reported in the output):

* **Activity threshold.** τ_act defaults to 10⁻⁶ · max_{d,i} z_di (the reference runs of §1); the
  value used is reported as ``tau_act``. If every code is 0 the threshold is 0 and no atom is live.
* **Live / dead.** Atom d is *live* iff A_d ≠ ∅ and *dead* otherwise. Dead atoms satisfy S1 and (5)
  vacuously (§3); they are listed in ``dead_atoms`` and their per-atom S1/R2/(5) values are NaN.
  (KKT-z, the antipode gain and the cosines are still evaluated for them.)
* **Weights.** π_di = z_di / Σ_m z_dm uses *all* codes, as in §0. S1 and (5′) sum over all i; (5)
  sums over i ∈ A_d exactly as written in §6. Sub-threshold codes therefore enter (5) as a
  discrepancy of at most their π-mass.
* **Zero atoms.** A zero column of W (as produced by ``theory.objective.to_unit_atoms`` for a dead
  latent) is accepted only with an all-zero code row; every other column must have unit norm (to
  1e-6). Tiny negative codes (≥ −1e-12·max|z|, solver round-off) are clipped to 0; larger negative
  codes raise ``ValueError``.

numpy only (layer contract: theory imports nothing outside theory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.certificate import cert_ratio
from dictcheck.theory.objective import centred, check_lam, sae_objective

#: Relative factor of the default activity threshold τ_act = ACTIVITY_RTOL · max z (spec §1).
ACTIVITY_RTOL = 1e-6

_UNIT_NORM_ATOL = 1e-6
_NEGATIVE_CODE_RTOL = 1e-12


# --------------------------------------------------------------------------------------------------
# Basic quantities
# --------------------------------------------------------------------------------------------------


def unit_atom_norm_check(W: NDArray, Z: NDArray) -> NDArray[np.float64]:
    """Validate that every column of W is a unit atom or a zero column with zero codes.

    Objective (1) uses unit atoms (spec §1); convert other dictionaries first with
    ``theory.objective.to_unit_atoms`` (spec §2.1). Returns W as float64.
    """
    W = np.asarray(W, dtype=np.float64)
    norms = np.linalg.norm(W, axis=0)
    zero = norms == 0.0
    bad_norm = ~zero & (np.abs(norms - 1.0) > _UNIT_NORM_ATOL)
    if np.any(bad_norm):
        raise ValueError(
            f"columns {np.flatnonzero(bad_norm).tolist()} of W are not unit atoms "
            f"(norms {norms[bad_norm].tolist()}); use theory.objective.to_unit_atoms first"
        )
    if np.any(zero & np.any(np.asarray(Z) != 0, axis=1)):
        raise ValueError("a zero column of W has non-zero codes")
    return W


def clean_codes(Z: ArrayLike) -> NDArray[np.float64]:
    """Return Z ≥ 0 as float64: round-off negatives (≥ −1e-12·max|z|) are clipped, others raise."""
    Z = np.asarray(Z, dtype=np.float64)
    if Z.size and Z.min() < 0.0:
        scale = float(np.max(np.abs(Z)))
        if Z.min() < -_NEGATIVE_CODE_RTOL * scale:
            raise ValueError(f"codes must be non-negative (objective (1)); min z = {Z.min():.3e}")
        Z = np.maximum(Z, 0.0)
    return Z


def residuals(W: NDArray, Z: NDArray, b: ArrayLike, X: NDArray) -> NDArray[np.float64]:
    """R = X̃ − W Z, i.e. r_i = x_i − b − W z_i (docs/README.md, shared notation)."""
    return centred(X, b) - np.asarray(W, dtype=np.float64) @ np.asarray(Z, dtype=np.float64)


def default_activity_threshold(Z: NDArray) -> float:
    """τ_act = 10⁻⁶ · max_{d,i} z_di, the threshold of the reference runs (spec §1); 0 if Z is empty or 0."""
    Z = np.asarray(Z, dtype=np.float64)
    return float(ACTIVITY_RTOL * Z.max()) if Z.size else 0.0


def active_sets(Z: NDArray, tau_act: float | None = None) -> tuple[NDArray[np.bool_], float]:
    """Activity mask M_di = [z_di > τ_act] (row d is A_d, column i is S_i) and the τ_act used (spec §0, §1)."""
    Z = np.asarray(Z, dtype=np.float64)
    tau = default_activity_threshold(Z) if tau_act is None else float(tau_act)
    return Z > tau, tau


def firing_fractions(active: NDArray[np.bool_]) -> NDArray[np.float64]:
    """p_d = |A_d| / N for every atom (spec §0); counts points, not activation mass."""
    return active.mean(axis=1).astype(np.float64)


def correlations(W_hat: NDArray, R: NDArray, lam: float) -> NDArray[np.float64]:
    """Φ = ŴᵀR/λ, shape (d_z, N): column i is φ_i, entry (d, i) is φ_id = ŵ_dᵀ r_i / λ (spec §0)."""
    return np.asarray(W_hat, dtype=np.float64).T @ np.asarray(R, dtype=np.float64) / lam


def activation_weights(Z: NDArray) -> NDArray[np.float64]:
    """Π with π_di = z_di / Σ_m z_dm (spec §0); rows of atoms with z_d· = 0 are zero."""
    Z = np.asarray(Z, dtype=np.float64)
    mass = Z.sum(axis=1, keepdims=True)
    return np.divide(Z, mass, out=np.zeros_like(Z), where=mass > 0)


def cosine_matrix(W_hat: NDArray) -> NDArray[np.float64]:
    """C = ŴᵀŴ, c_dj = ŵ_dᵀŵ_j (spec §0)."""
    W_hat = np.asarray(W_hat, dtype=np.float64)
    return W_hat.T @ W_hat


def most_antipodal_pair(W_hat: NDArray, candidates: NDArray[np.bool_] | None = None) -> tuple[int, int, float] | None:
    """The pair (d, j) of distinct atoms (among ``candidates``, default all) with the smallest cosine c_dj,
    and that cosine; None with fewer than two candidates (spec §3 S6: antipodal pairs have c_dj → −1)."""
    idx = np.arange(np.shape(W_hat)[1]) if candidates is None else np.flatnonzero(candidates)
    if idx.size < 2:
        return None
    C = cosine_matrix(np.asarray(W_hat)[:, idx])
    np.fill_diagonal(C, np.inf)
    a, c = np.unravel_index(np.argmin(C), C.shape)
    return int(idx[a]), int(idx[c]), float(C[a, c])


# --------------------------------------------------------------------------------------------------
# (R1) KKT-z, (S1), (R2)
# --------------------------------------------------------------------------------------------------


def kkt_violations(Phi: NDArray, active: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Entrywise (R1)/(KKT-z) violation: |φ_id − 1| if z_di > τ_act, else (φ_id − 1)₊ (spec §1, §3, §6)."""
    return np.where(active, np.abs(Phi - 1.0), np.maximum(Phi - 1.0, 0.0))


def kkt_violation(Phi: NDArray, active: NDArray[np.bool_]) -> float:
    """``kkt_violation`` = max over (i, d) of the entrywise KKT-z violation (spec §6); 0 if empty."""
    v = kkt_violations(Phi, active)
    return float(v.max()) if v.size else 0.0


def stationarity_violations(
    W_hat: NDArray, Z: NDArray, R: NDArray, lam: float, live: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """(S1) per atom: ‖ŵ_d − Σ_i π_di r_i / λ‖₂ for live d, NaN for dead d (spec §3 S1, §6).

    S1 (Σ_i z_di r_i = λ‖z_d·‖₁ ŵ_d) is sphere-stationarity of atom d given KKT-z on A_d. The value
    is dimensionless (ŵ_d is a unit vector and r_i/λ is measured in units of the threshold λ).
    """
    mean_res = R @ activation_weights(Z).T / lam  # column d: Σ_i π_di r_i / λ
    out = np.linalg.norm(np.asarray(W_hat) - mean_res, axis=0)
    return np.where(live, out, np.nan)


def r2_violations(
    W_hat: NDArray, Z: NDArray, R: NDArray, lam: float, live: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """(R2) per atom: ‖Σ_i z_di (I − ŵ_dŵ_dᵀ) r_i‖ / (λ‖z_d·‖₁) for live d, NaN for dead d (spec §3 R2).

    Normalisation (Decision): dividing by λ‖z_d·‖₁ turns R2 into the component of the S1 residual
    ŵ_d − Σ_i π_di r_i/λ perpendicular to ŵ_d. It is dimensionless, invariant to rescaling the codes
    of one atom and never exceeds the S1 value of that atom; it is 0 at every stationary point.
    """
    W_hat = np.asarray(W_hat, dtype=np.float64)
    mean_res = R @ activation_weights(Z).T / lam
    along = np.sum(W_hat * mean_res, axis=0)
    perp = mean_res - W_hat * along
    return np.where(live, np.linalg.norm(perp, axis=0), np.nan)


# --------------------------------------------------------------------------------------------------
# (4) Bias identity
# --------------------------------------------------------------------------------------------------


def bias_residual_mean_norm(R: NDArray) -> float:
    """‖R1‖/N = ‖(1/N) Σ_i r_i‖, zero at a stationary learned bias (spec §2.3, §3 (4), §6). Units of x."""
    R = np.asarray(R, dtype=np.float64)
    return float(np.linalg.norm(R.mean(axis=1))) if R.shape[1] else 0.0


@dataclass(frozen=True, eq=False)
class BiasIdentity:
    """Identity (4) per atom: off-mean of φ_id versus −p_d/(1 − p_d) (spec §3 (4)).

    ``off_mean``/``target``/``violation`` are NaN for atoms with p_d ∈ {0, 1}.
    """

    off_mean: NDArray[np.float64]
    target: NDArray[np.float64]
    violation: NDArray[np.float64]

    @property
    def max_violation(self) -> float:
        v = self.violation[np.isfinite(self.violation)]
        return float(v.max()) if v.size else 0.0


def bias_identity(Phi: NDArray, active: NDArray[np.bool_]) -> BiasIdentity:
    """Identity (4): mean_{i∉A_d} φ_id = −p_d/(1 − p_d) for 0 < p_d < 1 (spec §3 (4), §6).

    With a learned bias Σ_i r_i = 0, so Σ_i φ_id = 0; with φ_id = 1 on A_d (KKT-z) this gives
    |A_d| + Σ_{i∉A_d} φ_id = 0. ``bias_identity_violation`` is the max over d of
    |mean_{i∉A_d} φ_id + p_d/(1 − p_d)|. Meaningful only at a stationary b; note the factor
    1/(1 − p_d): an error ε in Σ_i φ_id / N shows up as ε/(1 − p_d).
    """
    n_atoms, N = active.shape
    n_on = active.sum(axis=1)
    n_off = N - n_on
    ok = (n_on > 0) & (n_off > 0)
    off_sum = np.where(active, 0.0, Phi).sum(axis=1)
    safe_off = np.where(ok, n_off, 1)
    off_mean = np.where(ok, off_sum / safe_off, np.nan)
    p = n_on / max(N, 1)
    target = np.where(ok, -p / np.where(ok, 1.0 - p, 1.0), np.nan)
    return BiasIdentity(off_mean=off_mean, target=target, violation=np.abs(off_mean - target))


# --------------------------------------------------------------------------------------------------
# (5), (5′) hull identities, (S4) nesting
# --------------------------------------------------------------------------------------------------


def hull_identity_violations(
    W_hat: NDArray, Phi: NDArray, Z: NDArray, active: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """(5) per atom: ‖c_d· − Σ_{i∈A_d} π_di φ_i‖_∞ for live d, NaN for dead d (spec §3 (5), §6).

    (5) is Ŵᵀ applied to S1: the cosine vector c_d· = Ŵᵀŵ_d is the π_d-weighted average of the
    φ_i over A_d, hence lies in conv{φ_i : i ∈ A_d}. (The Euclidean distance to that hull is the QP
    of ``solvers.hull_distance``.)
    """
    C = cosine_matrix(W_hat)
    Pi = np.where(active, activation_weights(Z), 0.0)
    combo = Phi @ Pi.T  # column d: Σ_{i∈A_d} π_di φ_i
    out = np.max(np.abs(C - combo), axis=0) if C.size else np.zeros(0)
    return np.where(active.any(axis=1), out, np.nan)


def hull_prime_matrix(Phi: NDArray, Z: NDArray) -> NDArray[np.float64]:
    """M with M_dj = Σ_i π_ji φ_id = Σ_i π_ji ŵ_dᵀr_i/λ, the right side of (5′) (spec §3 (5′)).

    At a stationary point M_dj = c_dj for every d and every live j (apply S1 for atom j). Columns
    of dead j are 0.
    """
    return np.asarray(Phi) @ activation_weights(Z).T


def hull_prime_violations(W_hat: NDArray, Phi: NDArray, Z: NDArray, live: NDArray[np.bool_]) -> NDArray[np.float64]:
    """|c_dj − Σ_i π_ji φ_id| per pair (d, j), NaN in columns of dead j (spec §3 (5′)).

    Since c_dj − M_dj = ŵ_dᵀ(ŵ_j − Σ_i π_ji r_i/λ), column j is bounded by the S1 value of atom j.
    """
    V = np.abs(cosine_matrix(W_hat) - hull_prime_matrix(Phi, Z))
    return np.where(live[None, :], V, np.nan)


def hull_prime_summands(Phi: NDArray, Z: NDArray, active: NDArray[np.bool_], d: int, j: int) -> NDArray[np.float64]:
    """The summands π_ji (1 − φ_id), i ∈ A_j \\ A_d, of 1 − c_dj in (5′) (spec §3 (5′)).

    At a stationary point they are all ≥ 0 (φ_id ≤ 1 off A_d by KKT-z) and sum to 1 − c_dj: the
    angle between two atoms is paid only by points where j is on and d is off. Ordered by i.
    """
    Pi = activation_weights(Z)
    idx = np.flatnonzero(active[j] & ~active[d])
    return Pi[j, idx] * (1.0 - np.asarray(Phi)[d, idx])


def hull_prime_min_summand(Phi: NDArray, Z: NDArray, active: NDArray[np.bool_]) -> float:
    """min over pairs d ≠ j and i ∈ A_j \\ A_d of π_ji (1 − φ_id); +inf if there is no summand (spec §3 (5′)).

    Non-negative at a stationary point; a negative value −ε means some π_ji·(φ_id − 1) = ε > 0, a
    KKT-z violation weighted by j's activation share.
    """
    Pi = np.where(active, activation_weights(Z), 0.0)
    Phi = np.asarray(Phi)
    best = np.inf
    for d in range(Phi.shape[0]):
        slack = 1.0 - Phi[d]  # (N,)
        mask = active & ~active[d][None, :]
        mask[d] = False
        if not mask.any():
            continue
        vals = np.where(mask, Pi * slack[None, :], np.inf)
        best = min(best, float(vals.min()))
    return best


def nested_pairs(active: NDArray[np.bool_]) -> list[tuple[int, int]]:
    """All (d, j), d ≠ j, with A_d ≠ ∅ and A_d ⊆ A_j (spec §3 S4, §6 ``nested_pairs``).

    By (5) such a pair forces c_dj = 1 at a stationary point (S4: nesting ⇒ absorption).
    """
    A = np.asarray(active, dtype=np.int64)
    size = A.sum(axis=1)
    inter = A @ A.T  # |A_d ∩ A_j|
    nested = (inter == size[:, None]) & (size[:, None] > 0)
    np.fill_diagonal(nested, False)
    return [(int(d), int(j)) for d, j in zip(*np.nonzero(nested))]


def nesting_cosine_defects(W_hat: NDArray, pairs: list[tuple[int, int]]) -> NDArray[np.float64]:
    """1 − c_dj for every nested pair (S4 corollary: 0 at a stationary point) (spec §3 S4)."""
    C = cosine_matrix(W_hat)
    return np.array([1.0 - C[d, j] for d, j in pairs], dtype=np.float64)


# --------------------------------------------------------------------------------------------------
# (S6) gain of a new atom, antipode gain
# --------------------------------------------------------------------------------------------------


def new_atom_codes(u: ArrayLike, R: NDArray, lam: float) -> NDArray[np.float64]:
    """Optimal codes t_i = (uᵀr_i − λ)₊ of a new unit atom u with everything else fixed (spec §3 S6).

    They solve min_{t≥0} ‖r_i − t u‖² + 2λt, whose value is ‖r_i‖² − (uᵀr_i − λ)₊².
    """
    return np.maximum(np.asarray(u, dtype=np.float64) @ np.asarray(R, dtype=np.float64) - lam, 0.0)


def gain(u: ArrayLike, R: NDArray, lam: float) -> float:
    """gain(u) = Σ_i (uᵀr_i − λ)₊², the drop of the *sum* loss O_Σ from adding unit atom u (spec §3 S6).

    Gain lemma: min_{t≥0} ‖r − t u‖² + 2λt = ‖r‖² − (uᵀr − λ)₊² for ‖u‖ = 1. The mean objective (1)
    drops by gain(u)/N. Raises ValueError unless ‖u‖ = 1 (to 1e-8).
    """
    u = np.asarray(u, dtype=np.float64)
    if abs(np.linalg.norm(u) - 1.0) > 1e-8:
        raise ValueError(f"gain(u) needs a unit vector, got ‖u‖ = {np.linalg.norm(u)}")
    return float(np.sum(new_atom_codes(u, R, lam) ** 2))


def antipode_gains(W_hat: NDArray, R: NDArray, lam: float) -> NDArray[np.float64]:
    """``antipode_gain`` per atom: gain(−ŵ_d)/N = (1/N) Σ_i (−ŵ_dᵀr_i − λ)₊² (spec §3 S6, §6).

    Positive for every atom with p_d > 1/2 at a stationary learned bias (the 50% rule). A zero
    column (dead latent) has gain 0.
    """
    R = np.asarray(R, dtype=np.float64)
    N = R.shape[1]
    proj = -np.asarray(W_hat, dtype=np.float64).T @ R  # (d_z, N)
    return np.sum(np.maximum(proj - lam, 0.0) ** 2, axis=1) / max(N, 1)


# --------------------------------------------------------------------------------------------------
# Aggregate
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiagnosticTolerances:
    """Default tolerances of the ``stationary`` flag (Decision; spec §6).

    All quantities are dimensionless (φ and r/λ are in units of the threshold λ, ŵ is unit).
    The reference learner of §2.2 reaches about 1e-8 in S1, (5) and (4); exact lasso codes reach
    KKT-z to about 1e-9. 1e-6 leaves two orders of magnitude of headroom for conditioning (S1 divides
    by an atom's activation mass, (4) by 1 − p_d) while staying far below the O(1e-2–1e-1) values of
    non-stationary dictionaries (e.g. the ground-truth start of the hierarchy toy, §5.2).

    * ``kkt``: ``kkt_violation``.
    * ``stationarity``: ``stationarity_violation`` (S1; R2 and (5′) are bounded by it, see their
      docstrings, and are reported but not tested separately).
    * ``hull``: ``hull_violation`` (identity (5)).
    * ``bias`` and ``bias_residual``: only with ``learned_bias``: ``bias_identity_violation`` and
      ‖R1‖/(Nλ) (the dimensionless form of ‖R1‖/N).
    """

    kkt: float = 1e-6
    stationarity: float = 1e-6
    hull: float = 1e-6
    bias: float = 1e-6
    bias_residual: float = 1e-6


def _nanmax(v: NDArray) -> float:
    v = np.asarray(v, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.max()) if v.size else 0.0


@dataclass(frozen=True, eq=False)
class DictionaryDiagnostics:
    """All §3/§6 diagnostics of (W, Z, b) on X at λ. Per-atom arrays have length d_z.

    Scalars named as the §6 JSON keys: ``kkt_violation``, ``stationarity_violation``,
    ``hull_violation``, ``bias_identity_violation``, ``firing_fraction``, ``antipode_gain``,
    ``nested_pairs``, ``stationary``. Everything else is supporting detail.
    """

    lam: float
    n_points: int
    n_atoms: int
    tau_act: float
    learned_bias: bool
    tolerances: DiagnosticTolerances
    objective: float
    cert_ratio: float
    firing_fraction: NDArray[np.float64]
    live_atoms: tuple[int, ...]
    dead_atoms: tuple[int, ...]
    kkt_violation: float
    kkt_violation_per_atom: NDArray[np.float64]
    stationarity_violation: float
    stationarity_per_atom: NDArray[np.float64]
    r2_violation: float
    r2_per_atom: NDArray[np.float64]
    bias_identity_violation: float
    bias_off_mean: NDArray[np.float64]
    bias_target: NDArray[np.float64]
    bias_identity_per_atom: NDArray[np.float64]
    bias_residual_mean_norm: float
    hull_violation: float
    hull_per_atom: NDArray[np.float64]
    hull_prime_violation: float
    hull_prime_per_atom: NDArray[np.float64]
    hull_prime_min_summand: float
    cosines: NDArray[np.float64]
    nested_pairs: tuple[tuple[int, int], ...]
    nesting_cosine_defect: NDArray[np.float64]
    antipode_gain: NDArray[np.float64]
    checks: dict[str, bool] = field(default_factory=dict)
    tau_act_given: bool = False

    @property
    def stationary(self) -> bool:
        """All tested violations ≤ their tolerances (see ``DiagnosticTolerances``)."""
        return all(self.checks.values())

    @property
    def failed_checks(self) -> tuple[str, ...]:
        return tuple(k for k, ok in self.checks.items() if not ok)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict with the §6 keys; NaN becomes None, +inf becomes None."""

        def clean(v: Any) -> Any:
            if isinstance(v, np.ndarray):
                return [clean(x) for x in v.tolist()]
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            if isinstance(v, (float, np.floating)):
                return float(v) if np.isfinite(v) else None
            if isinstance(v, (np.integer,)):
                return int(v)
            if isinstance(v, (np.bool_,)):
                return bool(v)
            return v

        return {
            "lam": self.lam,
            "n_points": self.n_points,
            "n_atoms": self.n_atoms,
            "tau_act": self.tau_act,
            "tau_act_rule": "given" if self.tau_act_given else f"{ACTIVITY_RTOL:g} * max z",
            "learned_bias": self.learned_bias,
            "objective": clean(self.objective),
            "cert_ratio": clean(self.cert_ratio),
            "kkt_violation": clean(self.kkt_violation),
            "kkt_violation_per_atom": clean(self.kkt_violation_per_atom),
            "stationarity_violation": clean(self.stationarity_violation),
            "stationarity_per_atom": clean(self.stationarity_per_atom),
            "r2_violation": clean(self.r2_violation),
            "r2_per_atom": clean(self.r2_per_atom),
            "hull_violation": clean(self.hull_violation),
            "hull_per_atom": clean(self.hull_per_atom),
            "hull_prime_violation": clean(self.hull_prime_violation),
            "hull_prime_per_atom": clean(self.hull_prime_per_atom),
            "hull_prime_min_summand": clean(self.hull_prime_min_summand),
            "bias_identity_violation": clean(self.bias_identity_violation),
            "bias_off_mean": clean(self.bias_off_mean),
            "bias_target": clean(self.bias_target),
            "bias_residual_mean_norm": clean(self.bias_residual_mean_norm),
            "firing_fraction": clean(self.firing_fraction),
            "live_atoms": list(self.live_atoms),
            "dead_atoms": list(self.dead_atoms),
            "antipode_gain": clean(self.antipode_gain),
            "nested_pairs": [list(p) for p in self.nested_pairs],
            "nesting_cosine_defect": clean(self.nesting_cosine_defect),
            "tolerances": {
                "kkt": self.tolerances.kkt,
                "stationarity": self.tolerances.stationarity,
                "hull": self.tolerances.hull,
                "bias": self.tolerances.bias,
                "bias_residual": self.tolerances.bias_residual,
            },
            "checks": dict(self.checks),
            "stationary": self.stationary,
        }


def dictionary_diagnostics(
    W: NDArray,
    Z: NDArray,
    b: ArrayLike,
    X: NDArray,
    lam: float,
    tau_act: float | None = None,
    *,
    learned_bias: bool = False,
    tolerances: DiagnosticTolerances | None = None,
) -> DictionaryDiagnostics:
    """Evaluate every §3 identity of (W, Z, b) on X at λ and the §6 ``stationary`` verdict.

    W (D, d_z) unit atoms (zero columns allowed for dead latents with zero codes), Z (d_z, N)
    unit-atom codes ≥ 0, b (D,), X (D, N). ``tau_act`` defaults to 10⁻⁶·max z (spec §1).
    ``learned_bias`` adds (4) and ‖R1‖/(Nλ) to the ``stationary`` verdict; both are always reported.
    The verdict tests KKT-z, S1 and (5) (plus (4) and R1 with a learned bias); see
    ``DiagnosticTolerances`` for the defaults and their justification.

    Cost: O(d_z·D·N + d_z²·N) time and O(d_z² + d_z·N) memory (the cosine matrix and Φ are dense).
    ``hull_prime_per_atom[j]`` is max_d |c_dj − Σ_i π_ji φ_id| (column j of (5′)).
    """
    lam = check_lam(lam)
    Z = clean_codes(Z)
    W = unit_atom_norm_check(W, Z)
    X = np.asarray(X, dtype=np.float64)
    D, N = X.shape
    if W.shape[0] != D or Z.shape != (W.shape[1], N):
        raise ValueError(f"shape mismatch: X {X.shape}, W {W.shape}, Z {Z.shape} (want W (D, d_z), Z (d_z, N))")
    if N == 0:
        raise ValueError("no data points")
    tol = tolerances or DiagnosticTolerances()

    R = residuals(W, Z, b, X)
    active, tau = active_sets(Z, tau_act)
    live = active.any(axis=1)
    Phi = correlations(W, R, lam)

    kkt_entries = kkt_violations(Phi, active)
    kkt_per_atom = kkt_entries.max(axis=1) if N else np.zeros(W.shape[1])
    s1 = stationarity_violations(W, Z, R, lam, live)
    r2 = r2_violations(W, Z, R, lam, live)
    bias = bias_identity(Phi, active)
    r1 = bias_residual_mean_norm(R)
    hull = hull_identity_violations(W, Phi, Z, active)
    hull_prime = hull_prime_violations(W, Phi, Z, live)
    pairs = nested_pairs(active)

    checks = {
        "kkt": float(kkt_entries.max(initial=0.0)) <= tol.kkt,
        "stationarity": _nanmax(s1) <= tol.stationarity,
        "hull": _nanmax(hull) <= tol.hull,
    }
    if learned_bias:
        checks["bias_identity"] = bias.max_violation <= tol.bias
        checks["bias_residual"] = r1 / lam <= tol.bias_residual

    return DictionaryDiagnostics(
        lam=float(lam),
        n_points=int(N),
        n_atoms=int(W.shape[1]),
        tau_act=tau,
        tau_act_given=tau_act is not None,
        learned_bias=bool(learned_bias),
        tolerances=tol,
        objective=sae_objective(W, Z, b, X, lam),
        cert_ratio=cert_ratio(R, lam),
        firing_fraction=firing_fractions(active),
        live_atoms=tuple(int(d) for d in np.flatnonzero(live)),
        dead_atoms=tuple(int(d) for d in np.flatnonzero(~live)),
        kkt_violation=float(kkt_entries.max(initial=0.0)),
        kkt_violation_per_atom=kkt_per_atom,
        stationarity_violation=_nanmax(s1),
        stationarity_per_atom=s1,
        r2_violation=_nanmax(r2),
        r2_per_atom=r2,
        bias_identity_violation=bias.max_violation,
        bias_off_mean=bias.off_mean,
        bias_target=bias.target,
        bias_identity_per_atom=bias.violation,
        bias_residual_mean_norm=r1,
        hull_violation=_nanmax(hull),
        hull_per_atom=hull,
        hull_prime_violation=_nanmax(hull_prime),
        hull_prime_per_atom=np.array([_nanmax(col) if live[j] else np.nan for j, col in enumerate(hull_prime.T)]),
        hull_prime_min_summand=hull_prime_min_summand(Phi, Z, active),
        cosines=cosine_matrix(W),
        nested_pairs=tuple(pairs),
        nesting_cosine_defect=nesting_cosine_defects(W, pairs),
        antipode_gain=antipode_gains(W, R, lam),
        checks=checks,
    )
