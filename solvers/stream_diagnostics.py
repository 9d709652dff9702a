"""The §3/§6 diagnostics of a dictionary, streamed over the points in batches (docs/theory.md §3, §6).

:func:`dictcheck.theory.diagnostics.dictionary_diagnostics` is the reference: it holds R, Φ = ŴᵀR/λ and
Z as dense (·, N) matrices and the cosine matrix as (d_z, d_z). At real sizes (d_z = 131 072 atoms,
N = 10⁵ points) those are terabytes. :func:`stream_diagnostics` computes the same numbers reading the data
one batch of points at a time, with memory that grows like d_z·D (the atoms, as stored rows:
:class:`~dictcheck.solvers.atom_rows.AtomRows`) plus n_live·D (one accumulator row per live atom) and the
codes (O(nnz)); no (d_z, N), (d_z, B) or (d_z, d_z) array is formed:

* residuals r_i = x̃_i − Σ_d z_di w_d per batch, from the sparse codes;
* Φ never whole: the screened products of :func:`~dictcheck.solvers.atom_rows.screen_pairs` give, for each
  point, every atom whose φ_id may exceed 1 (KKT-z), may lie below −1 (the antipode gain
  λ²Σ_i (−φ_id − 1)₊²), and may attain the largest φ_id among the atoms not active at i ((5′) min summand),
  and those entries are re-evaluated in float64; the entries on the active sets are evaluated exactly;
* the bias identity (4) uses Σ_{i∉A_d} φ_id = ŵ_dᵀ(Σ_i r_i)/λ − Σ_{i∈A_d} φ_id;
* S1 and R2 use m_d = Σ_i π_di r_i/λ = (Σ_i z_di r_i)/(λ‖z_d·‖₁), and identity (5) the same sum over A_d;
  ``hull_per_atom[d]`` = ‖Ŵᵀ(ŵ_d − that)‖_∞ and (5′) ``hull_prime_per_atom[j]`` = ‖Ŵᵀ(ŵ_j − m_j)‖_∞ are
  exact maxima over all atoms from the screened products of those vectors (blocks of live atoms);
* nested pairs A_d ⊆ A_j from the co-occurrence of supports: the candidates of d are the atoms active at its
  first point, intersected with the supports of its other points (O(nnz·L0), never a d_z² bitset).

Every quantity is a sum, maximum or minimum over points, so batching changes nothing but the order of
floating-point additions (tests compare with the reference to 1e-12). The activity threshold
τ_act = 10⁻⁶·max z (docs/theory.md §1) comes from the codes before the data are read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numba as nb
import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray

from dictcheck.solvers.atom_rows import AtomRows, atom_max_products, exact_products, screen_pairs
from dictcheck.solvers.reductions import LOCAL, Reduction
from dictcheck.theory.diagnostics import (
    ACTIVITY_RTOL,
    DiagnosticTolerances,
    DictionaryDiagnostics,
    unit_atom_norm_check,
)

__all__ = ["SparseCodes", "StreamedDiagnostics", "stream_diagnostics", "candidate_gains", "nested_pairs_of_codes",
           "batch_size_for", "column_batches"]

#: A cosine matrix is returned only up to this many atoms (d_z² floats).
COSINES_MAX_ATOMS = 4096
_JIT = dict(cache=True, nogil=True)


@dataclass(frozen=True)
class SparseCodes:
    """Codes of N points in coordinate form: point ``points[k]`` has code ``values[k]`` > 0 on atom
    ``atoms[k]``; entries are sorted by point. ``n_points`` × ``n_atoms`` is the dense shape (d_z, N)."""

    points: NDArray[np.int64]
    atoms: NDArray[np.int64]
    values: NDArray[np.float64]
    n_points: int
    n_atoms: int

    @classmethod
    def from_dense(cls, Z: ArrayLike, offset: int = 0, n_points: int | None = None) -> SparseCodes:
        """From dense (d_z, B) codes of points offset … offset + B − 1 (zero entries dropped)."""
        Z = np.asarray(Z, dtype=np.float64)
        pts, ats = np.nonzero(Z.T)
        return cls(points=pts.astype(np.int64) + offset, atoms=ats.astype(np.int64), values=Z[ats, pts],
                   n_points=Z.shape[1] if n_points is None else n_points, n_atoms=Z.shape[0])

    @classmethod
    def from_matrix(cls, Z: ArrayLike | sp.sparray | sp.spmatrix, offset: int = 0) -> SparseCodes:
        """From (d_z, N) codes, dense or scipy sparse (zero entries dropped)."""
        if not sp.issparse(Z):
            return cls.from_dense(Z, offset)
        C = sp.csc_array(Z)
        C.eliminate_zeros()
        C.sort_indices()
        counts = np.diff(C.indptr)
        return cls(points=np.repeat(np.arange(C.shape[1], dtype=np.int64), counts) + offset,
                   atoms=C.indices.astype(np.int64), values=C.data.astype(np.float64), n_points=C.shape[1],
                   n_atoms=C.shape[0])

    @classmethod
    def concatenate(cls, parts: list[SparseCodes], n_points: int, n_atoms: int) -> SparseCodes:
        """Parts of consecutive point ranges, in order."""
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty.copy(), np.zeros(0), n_points, n_atoms)
        return cls(points=np.concatenate([p.points for p in parts]), atoms=np.concatenate([p.atoms for p in parts]),
                   values=np.concatenate([p.values for p in parts]), n_points=n_points, n_atoms=n_atoms)

    @property
    def nnz(self) -> int:
        return int(self.values.size)

    def max_value(self) -> float:
        return float(self.values.max()) if self.values.size else 0.0

    def mass(self) -> NDArray[np.float64]:
        """‖z_d·‖₁ per atom."""
        return np.bincount(self.atoms, weights=self.values, minlength=self.n_atoms)

    def range_slice(self, start: int, stop: int) -> slice:
        lo, hi = np.searchsorted(self.points, [start, stop])
        return slice(int(lo), int(hi))

    def dense(self, start: int, stop: int) -> NDArray[np.float64]:
        """Dense (d_z, stop − start) codes of points start … stop − 1."""
        s = self.range_slice(start, stop)
        Z = np.zeros((self.n_atoms, stop - start))
        Z[self.atoms[s], self.points[s] - start] = self.values[s]
        return Z

    def to_dense(self) -> NDArray[np.float64]:
        return self.dense(0, self.n_points)

    def to_matrix(self) -> sp.csc_array:
        """The codes as a scipy.sparse (d_z, N) array (what :func:`exact_codes` takes as a warm start)."""
        return sp.csc_array((self.values, (self.atoms, self.points)), shape=(self.n_atoms, self.n_points))

    def to_dense_points(self, points: NDArray) -> NDArray[np.float64]:
        """Dense (d_z, len(points)) codes of the given sorted point indices."""
        points = np.asarray(points, dtype=np.int64)
        keep = np.isin(self.points, points)
        Z = np.zeros((self.n_atoms, points.size))
        Z[self.atoms[keep], np.searchsorted(points, self.points[keep])] = self.values[keep]
        return Z

    def decode_points(self, W: NDArray | AtomRows, points: NDArray) -> NDArray[np.float64]:
        """W Z for the given sorted point indices, (D, len(points))."""
        points = np.asarray(points, dtype=np.int64)
        keep = np.isin(self.points, points)
        return _decode(W, np.searchsorted(points, self.points[keep]), self.atoms[keep], self.values[keep],
                       points.size).T

    def decode(self, W: NDArray | AtomRows, start: int = 0, stop: int | None = None) -> NDArray[np.float64]:
        """W Z for points start … stop − 1, (D, stop − start), without forming the dense codes."""
        stop = self.n_points if stop is None else stop
        s = self.range_slice(start, stop)
        return _decode(W, self.points[s] - start, self.atoms[s], self.values[s], stop - start).T


def _decode(W: NDArray | AtomRows, rows: NDArray[np.int64], atoms: NDArray[np.int64], values: NDArray[np.float64],
            n: int) -> NDArray[np.float64]:
    """Σ_k values[k] w_{atoms[k]} into row rows[k] of an (n, D) array, reading only the atoms used."""
    used, local = np.unique(atoms, return_inverse=True)
    Wu = W.unit_rows(used) if isinstance(W, AtomRows) else np.asarray(W, dtype=np.float64)[:, used].T
    Z = sp.csr_array((values, (rows, local)), shape=(n, used.size))
    return np.asarray(Z @ Wu) if used.size else np.zeros((n, Wu.shape[1]))


#: Points per batch of the streamed passes (their (B, D) residuals; the screened products run in blocks of
#: atoms of their own size).
STREAM_BATCH = 4096


def batch_size_for(n_points: int) -> int:
    """Points per batch for the streamed passes: :data:`STREAM_BATCH`, or all of them when fewer."""
    return int(max(1, min(n_points, STREAM_BATCH)))


@nb.njit(**_JIT)
def _nested_pairs(starts, points, atoms, sup_start, sup_atoms, live):
    """(d, j) with A_d ⊆ A_j, d ≠ j: atoms grouped by atom (starts, points) and supports grouped by point
    (sup_start, sup_atoms, sorted); each d's candidates are the support of its first point, intersected with
    the supports of the others."""
    out_d = []
    out_j = []
    cand = np.empty(sup_atoms.shape[0] if sup_atoms.shape[0] else 1, np.int64)
    for d in range(starts.shape[0] - 1):
        lo, hi = starts[d], starts[d + 1]
        if lo == hi or not live[d]:
            continue
        p0 = points[lo]
        nc = 0
        for t in range(sup_start[p0], sup_start[p0 + 1]):
            if sup_atoms[t] != d:
                cand[nc] = sup_atoms[t]
                nc += 1
        for u in range(lo + 1, hi):
            if nc == 0:
                break
            p = points[u]
            a, b = sup_start[p], sup_start[p + 1]
            m = 0
            c = 0
            while c < nc and a < b:  # both sorted: merge
                if cand[c] == sup_atoms[a]:
                    cand[m] = cand[c]
                    m += 1
                    c += 1
                    a += 1
                elif cand[c] < sup_atoms[a]:
                    c += 1
                else:
                    a += 1
            nc = m
        for c in range(nc):
            out_d.append(d)
            out_j.append(cand[c])
    return out_d, out_j


def _agreed_nested_pairs(codes: SparseCodes, tau: float, reduce: Reduction) -> list[tuple[int, int]]:
    """:func:`nested_pairs_of_codes` of all processes' points: A_d ⊆ A_j holds for the union of the points when
    it holds on every process where A_d has a point, so a pair is kept when each of those processes has it."""
    local = nested_pairs_of_codes(codes, tau)
    if reduce.size == 1:
        return local
    d_z = codes.n_atoms
    live = np.zeros(d_z, dtype=np.int64)
    live[codes.atoms[codes.values > tau]] = 1
    parts = reduce.gather(np.array(local, dtype=np.int64).reshape(-1, 2))
    need = reduce.sum(live)
    keys, counts = np.unique(np.concatenate([p[:, 0] * d_z + p[:, 1] for p in parts]), return_counts=True)
    d = keys // d_z
    keep = counts == need[d]
    return sorted(zip((d[keep]).tolist(), (keys[keep] % d_z).tolist()))


def nested_pairs_of_codes(codes: SparseCodes, tau: float) -> list[tuple[int, int]]:
    """All (d, j), d ≠ j, with A_d ≠ ∅ and A_d ⊆ A_j, where A_d = {i : z_di > τ} (docs/theory.md §3 S4), from
    the co-occurrence of supports: O(nnz·L0) time, O(nnz) memory."""
    keep = codes.values > tau
    pts, ats = codes.points[keep], codes.atoms[keep]
    d_z, N = codes.n_atoms, codes.n_points
    by_atom = np.lexsort((pts, ats))
    starts = np.searchsorted(ats[by_atom], np.arange(d_z + 1))
    by_point = np.lexsort((ats, pts))
    sup_start = np.searchsorted(pts[by_point], np.arange(N + 1))
    live = np.zeros(d_z, dtype=np.bool_)
    live[ats] = True
    d, j = _nested_pairs(starts, pts[by_atom], ats[by_atom], sup_start, ats[by_point], live)
    return sorted(zip([int(v) for v in d], [int(v) for v in j]))


@dataclass(frozen=True, eq=False)
class StreamedDiagnostics:
    """The reference diagnostics (``cosines`` empty above :data:`COSINES_MAX_ATOMS` atoms), for each candidate
    new atom u given, gain(u) = Σ_i (uᵀr_i − λ)₊² over all points (docs/theory.md §3 S6), and, when sample
    points were named, the antipode gains restricted to them (sums, not means)."""

    diagnostics: DictionaryDiagnostics
    candidate_gains: NDArray[np.float64]
    sample_antipode_gains: NDArray[np.float64]


def _as_atoms(W: ArrayLike | AtomRows) -> AtomRows:
    return W if isinstance(W, AtomRows) else AtomRows.from_columns(np.asarray(W, dtype=np.float64))


def _batch_residuals(atoms: AtomRows, codes: SparseCodes, b: NDArray, start: int, Xb: NDArray
                     ) -> tuple[NDArray[np.float64], slice]:
    """Rows r_i = x_i − b − Σ_d z_di w_d (B, D) of the batch's points, and its slice of the codes."""
    B = Xb.shape[1]
    sl = codes.range_slice(start, start + B)
    R = np.asarray(Xb, dtype=np.float64).T - b
    if sl.stop > sl.start:
        R = R - _decode(atoms, codes.points[sl] - start, codes.atoms[sl], codes.values[sl], B)
    return np.ascontiguousarray(R), sl


def stream_diagnostics(
    W: ArrayLike | AtomRows,
    codes: SparseCodes,
    b: ArrayLike,
    batches: Iterable[tuple[int, NDArray]],
    lam: float,
    *,
    tau_act: float | None = None,
    learned_bias: bool = False,
    tolerances: DiagnosticTolerances | None = None,
    candidates: ArrayLike | None = None,
    sample_points: ArrayLike | None = None,
    workers: int = 1,
    reduce: Reduction = LOCAL,
) -> StreamedDiagnostics:
    """Every §3/§6 diagnostic of unit atoms W ((D, d_z) columns, or :class:`AtomRows`) with the given codes and
    bias on the points that ``batches`` yields as (first point index, (D, B) columns), in order, covering
    0 … N − 1 (module docstring).

    Equal to :func:`dictcheck.theory.diagnostics.dictionary_diagnostics` (same verdict, same tolerances) up to
    the order of floating-point sums. ``candidates`` (D, S) unit columns get their exact gain over all points;
    ``sample_points`` (sorted indices) get their own antipode gains. ValueError for bad shapes, a zero λ, or
    batches that do not cover the points in order.

    With ``reduce`` over P processes, each holds the codes and batches of its own points (indices local to it)
    and every sum, maximum and minimum is combined over the processes (the masses and τ_act before the pass,
    the per-point sums after it; the per-atom conditions are split over the processes by blocks of atoms and
    gathered; nested pairs keep a pair that every process where the atom is active has): every process
    returns the diagnostics of all points, equal to one process's up to the order of the sums.
    """
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    tol = tolerances or DiagnosticTolerances()
    atoms = _as_atoms(W)
    D, d_z = atoms.dim, atoms.n_atoms
    if codes.n_atoms != d_z:
        raise ValueError(f"codes have {codes.n_atoms} atoms, the dictionary {d_z}")
    if codes.values.size and codes.values.min() < 0:
        raise ValueError("codes must be non-negative (objective (1))")
    mass = reduce.sum(codes.mass())
    _check_unit_atoms(atoms, mass)
    N_local = codes.n_points
    N = int(reduce.sum(np.array([N_local], dtype=np.int64))[0])
    if N == 0:
        raise ValueError("no data points")
    bv = np.asarray(b, dtype=np.float64).reshape(-1)
    U = None if candidates is None else np.asarray(candidates, dtype=np.float64)
    sample = np.zeros(0, np.int64) if sample_points is None else np.asarray(sample_points, dtype=np.int64)
    max_z = float(reduce.max(np.array([codes.max_value()]))[0])
    tau = ACTIVITY_RTOL * max_z if tau_act is None else float(tau_act)
    on_all = codes.values > tau
    n_on = reduce.sum(np.bincount(codes.atoms[on_all], minlength=d_z).astype(np.float64))
    live = n_on > 0
    live_idx = np.full(d_z, -1, np.int64)
    live_idx[live] = np.arange(int(live.sum()))
    inv_mass = np.where(mass > 0, 1.0 / np.where(mass > 0, mass, 1.0), 0.0)

    szr = np.zeros((int(live.sum()), D))  # row live_idx[d]: Σ_i z_di r_i
    below: list[tuple[NDArray[np.int64], NDArray[np.float64]]] = []  # Σ over entries 0 < z ≤ τ of live atoms
    sum_sq = max_rnorm = 0.0
    sum_r = np.zeros(D)
    on_phi_sum = np.zeros(d_z)
    kkt = np.zeros(d_z)
    antipode = np.zeros(d_z)
    sample_antipode = np.zeros(d_z)
    gains = np.zeros(0 if U is None else U.shape[1])
    prime_min = math.inf
    seen = 0
    for start, Xb in batches:
        B = Xb.shape[1]
        if start != seen or Xb.shape[0] != D:
            raise ValueError(f"batches must cover the points in order with D = {D} rows: got points from {start} "
                             f"(expected {seen}) with {Xb.shape[0]} rows")
        R, sl = _batch_residuals(atoms, codes, bv, start, Xb)
        pts, ats, vals = codes.points[sl] - start, codes.atoms[sl], codes.values[sl]
        on = vals > tau
        rnorm = np.linalg.norm(R, axis=1)
        sum_sq += float(rnorm @ rnorm)
        max_rnorm = max(max_rnorm, float(rnorm.max(initial=0.0)))
        sum_r += R.sum(axis=0)
        if ats.size:  # Σ_i z_di r_i for the live atoms of the batch, and the sub-threshold part of it
            used, local = np.unique(ats, return_inverse=True)
            blk = sp.csr_array((vals, (local, pts)), shape=(used.size, B)) @ R
            ok = live_idx[used] >= 0
            szr[live_idx[used[ok]]] += blk[ok]
            sub = ~on & live[ats]
            if sub.any():
                u2, l2 = np.unique(ats[sub], return_inverse=True)
                below.append((u2, sp.csr_array((vals[sub], (l2, pts[sub])), shape=(u2.size, B)) @ R))
        # φ on the active entries, exactly: |φ − 1| for KKT-z, and Σ_{i∈A_d} φ_id for (4)
        phi_on = exact_products(atoms, R, pts[on], ats[on], workers) / lam
        np.maximum.at(kkt, ats[on], np.abs(phi_on - 1.0))
        np.add.at(on_phi_sum, ats[on], phi_on)
        # the screened entries: φ > 1, φ < −1, and each point's largest φ among the atoms not active there
        lam_b = np.full(B, lam)
        pairs = screen_pairs(atoms, R, above=lam_b, below=-lam_b, top="max", exclude=(pts[on], ats[on]),
                             scale=lam_b)
        phi = exact_products(atoms, R, pairs.rows, pairs.atoms, workers) / lam
        np.maximum.at(kkt, pairs.atoms, np.maximum(phi - 1.0, 0.0))
        neg = np.maximum(-phi - 1.0, 0.0)
        np.add.at(antipode, pairs.atoms, neg * neg * lam * lam)
        if sample.size:
            in_sample = np.isin(pairs.rows + start, sample)
            np.add.at(sample_antipode, pairs.atoms[in_sample], (neg * neg * lam * lam)[in_sample])
        if U is not None:
            gains += (np.maximum(R @ U - lam, 0.0) ** 2).sum(axis=0)
        prime_min = min(prime_min, _prime_min_summand(pairs.rows, pairs.atoms, phi, pts[on], ats[on],
                                                      vals[on] * inv_mass[ats[on]], B, d_z))
        seen += B
    if seen != N_local:
        raise ValueError(f"batches covered {seen} points, the codes have {N_local}")
    sums = reduce.sum(np.concatenate([[sum_sq], sum_r, on_phi_sum, antipode, sample_antipode, gains]))
    sum_sq, sum_r = float(sums[0]), sums[1:1 + D]
    on_phi_sum, antipode, sample_antipode, gains = np.split(sums[1 + D:], np.cumsum([d_z, d_z, d_z]))
    max_rnorm = float(reduce.max(np.array([max_rnorm]))[0])
    prime_min = float(reduce.min(np.array([prime_min]))[0])
    kkt = reduce.max(kkt)
    szr = reduce.sum(szr)
    below_atoms, below_sums = _merge_rows([part for parts in reduce.gather(below) for part in parts], D)

    live_atoms = np.flatnonzero(live)
    s1, r2, hull, hull_prime = _per_atom_conditions(atoms, szr, live_atoms, lam * mass, below_atoms,
                                                    below_sums, workers, reduce)
    n_off = N - n_on
    ok = (n_on > 0) & (n_off > 0)
    all_phi_sum = _all_atoms_products(atoms, sum_r) / lam  # Σ_i φ_id = ŵ_dᵀ(Σ_i r_i)/λ
    off_mean = np.where(ok, (all_phi_sum - on_phi_sum) / np.where(ok, n_off, 1.0), np.nan)
    p = n_on / N
    target = np.where(ok, -p / np.where(ok, 1.0 - p, 1.0), np.nan)
    bias_violation = np.abs(off_mean - target)
    r1 = float(np.linalg.norm(sum_r)) / N
    pairs = _agreed_nested_pairs(codes, tau, reduce)
    cos_of_pairs = _pair_cosines(atoms, pairs)

    def nanmax(v: NDArray) -> float:
        v = v[np.isfinite(v)]
        return float(v.max()) if v.size else 0.0

    checks = {"kkt": float(kkt.max(initial=0.0)) <= tol.kkt, "stationarity": nanmax(s1) <= tol.stationarity,
              "hull": nanmax(hull) <= tol.hull}
    bias_max = nanmax(bias_violation)
    if learned_bias:
        checks["bias_identity"] = bias_max <= tol.bias
        checks["bias_residual"] = r1 / lam <= tol.bias_residual
    Wc = atoms.columns() if d_z <= COSINES_MAX_ATOMS else None
    diag = DictionaryDiagnostics(
        lam=float(lam), n_points=int(N), n_atoms=int(d_z), tau_act=tau, tau_act_given=tau_act is not None,
        learned_bias=bool(learned_bias), tolerances=tol,
        objective=(sum_sq + 2.0 * lam * float(mass.sum())) / N,
        cert_ratio=max_rnorm / lam,
        firing_fraction=n_on / N,
        live_atoms=tuple(int(d) for d in live_atoms),
        dead_atoms=tuple(int(d) for d in np.flatnonzero(~live)),
        kkt_violation=float(kkt.max(initial=0.0)), kkt_violation_per_atom=kkt,
        stationarity_violation=nanmax(s1), stationarity_per_atom=s1,
        r2_violation=nanmax(r2), r2_per_atom=r2,
        bias_identity_violation=bias_max, bias_off_mean=off_mean, bias_target=target,
        bias_identity_per_atom=bias_violation, bias_residual_mean_norm=r1,
        hull_violation=nanmax(hull), hull_per_atom=hull,
        hull_prime_violation=nanmax(hull_prime), hull_prime_per_atom=hull_prime,
        hull_prime_min_summand=prime_min,
        cosines=Wc.T @ Wc if Wc is not None else np.zeros((0, 0)),
        nested_pairs=tuple(pairs), nesting_cosine_defect=1.0 - cos_of_pairs,
        antipode_gain=antipode / N, checks=checks,
    )
    return StreamedDiagnostics(diagnostics=diag, candidate_gains=gains, sample_antipode_gains=sample_antipode)


def _merge_rows(parts: list[tuple[NDArray[np.int64], NDArray[np.float64]]], D: int
                ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Sum row blocks (atoms, rows) of several batches by atom: (sorted atoms, their summed rows)."""
    if not parts:
        return np.zeros(0, np.int64), np.zeros((0, D))
    a = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    u, inv = np.unique(a, return_inverse=True)
    out = np.zeros((u.size, D))
    np.add.at(out, inv, rows)
    return u, out


def _per_atom_conditions(atoms: AtomRows, szr: NDArray[np.float64], live_atoms: NDArray[np.int64],
                         lam_mass: NDArray[np.float64], below_atoms: NDArray[np.int64],
                         below_sums: NDArray[np.float64], workers: int, reduce: Reduction = LOCAL,
                         block: int = 4096) -> tuple[NDArray, NDArray, NDArray, NDArray]:
    """S1, R2, (5) and (5′) per atom (NaN for dead atoms) from the sums szr (row t: Σ_i z_di r_i of the live atom
    d = live_atoms[t]) and the sub-threshold parts of them (below_atoms, below_sums), a block of live atoms at a
    time: m_d = szr_d/(λ‖z_d·‖₁), S1 = ‖ŵ_d − m_d‖, R2 = ‖m_d − ŵ_d(ŵ_dᵀm_d)‖, (5) = ‖Ŵᵀ(ŵ_d − a_d)‖_∞ with
    a_d the same mean over A_d, (5′) = ‖Ŵᵀ(ŵ_d − m_d)‖_∞ (equal to (5) when no code is below τ). Over several
    processes each takes every size-th block and the values are gathered."""
    d_z = atoms.n_atoms
    s1, r2, hull, hull_prime = (np.full(d_z, np.nan) for _ in range(4))
    for lo in range(reduce.rank * block, live_atoms.size, reduce.size * block):
        idx = live_atoms[lo:lo + block]
        Wb = atoms.unit_rows(idx)
        mb = szr[lo:lo + block] / lam_mass[idx, None]
        s1[idx] = np.linalg.norm(Wb - mb, axis=1)
        along = np.sum(Wb * mb, axis=1)
        r2[idx] = np.linalg.norm(mb - Wb * along[:, None], axis=1)
        hull_prime[idx] = atom_max_products(atoms, Wb - mb, workers)
        pos = np.searchsorted(below_atoms, idx)
        has = (pos < below_atoms.size) & (below_atoms[np.minimum(pos, max(below_atoms.size - 1, 0))] == idx) \
            if below_atoms.size else np.zeros(idx.size, dtype=bool)
        if has.any():
            ab = mb.copy()
            ab[has] -= below_sums[pos[has]] / lam_mass[idx[has], None]
            hull[idx] = atom_max_products(atoms, Wb - ab, workers)
        else:
            hull[idx] = hull_prime[idx]
    if reduce.size > 1:
        for part in reduce.gather(np.stack([s1, r2, hull, hull_prime])):
            done = np.isfinite(part[0])
            for target, values in zip((s1, r2, hull, hull_prime), part):
                target[done] = values[done]
    return s1, r2, hull, hull_prime


def _pair_cosines(atoms: AtomRows, pairs: list[tuple[int, int]], block: int = 65536) -> NDArray[np.float64]:
    """ŵ_dᵀŵ_j for each pair, in blocks."""
    out = np.empty(len(pairs))
    for lo in range(0, len(pairs), block):
        P = np.array(pairs[lo:lo + block], dtype=np.int64).reshape(-1, 2)
        out[lo:lo + P.shape[0]] = np.sum(atoms.unit_rows(P[:, 0]) * atoms.unit_rows(P[:, 1]), axis=1)
    return out


def _check_unit_atoms(atoms: AtomRows, mass: NDArray[np.float64], block: int = 8192) -> None:
    """Every atom with a code has unit norm (:func:`dictcheck.theory.diagnostics.unit_atom_norm_check`), a
    block of atoms at a time."""
    for lo in range(0, atoms.n_atoms, block):
        hi = min(atoms.n_atoms, lo + block)
        unit_atom_norm_check(atoms.unit_block(lo, hi).T, (mass[lo:hi] != 0)[:, None])


def _prime_min_summand(rows, atoms_, phi, on_rows, on_atoms, pi, B: int, d_z: int) -> float:
    """The (5′) min summand over the batch's points (theory.diagnostics.hull_prime_min_summand): for point i
    with 0 < |S_i| < d_z, a_i·max_j π_ji if a_i < 0 else a_i·min_j π_ji, where a_i = min over atoms not
    active at i of (1 − φ_id), the exact largest φ among the screened pairs outside S_i."""
    if on_rows.size == 0:
        return math.inf
    key_on = on_rows * d_z + on_atoms
    off = ~np.isin(rows * d_z + atoms_, key_on)
    phi_max = np.full(B, -np.inf)
    np.maximum.at(phi_max, rows[off], phi[off])
    slack = 1.0 - phi_max
    pi_max = np.full(B, -np.inf)
    pi_min = np.full(B, np.inf)
    np.maximum.at(pi_max, on_rows, pi)
    np.minimum.at(pi_min, on_rows, pi)
    n_active = np.bincount(on_rows, minlength=B)
    ok = (n_active > 0) & (n_active < d_z)
    summand = np.where(slack < 0, slack * pi_max, slack * pi_min)
    return float(summand[ok].min()) if ok.any() else math.inf


def _all_atoms_products(atoms: AtomRows, v: NDArray[np.float64], block: int = 8192) -> NDArray[np.float64]:
    """w_dᵀv for every atom d in float64, a block of atoms at a time."""
    out = np.empty(atoms.n_atoms)
    for lo in range(0, atoms.n_atoms, block):
        hi = min(atoms.n_atoms, lo + block)
        out[lo:hi] = atoms.unit_block(lo, hi) @ v
    return out


def candidate_gains(W: ArrayLike | AtomRows, codes: SparseCodes, b: ArrayLike, batches: Iterable[tuple[int, NDArray]],
                    lam: float, U: ArrayLike, reduce: Reduction = LOCAL) -> NDArray[np.float64]:
    """gain(u) = Σ_i (uᵀr_i − λ)₊² for each unit column u of U (D, S) over the points of ``batches``
    (docs/theory.md §3 S6): one cheap pass (the residuals from the sparse codes, one (B, S) product)."""
    atoms = _as_atoms(W)
    U = np.asarray(U, dtype=np.float64)
    bv = np.asarray(b, dtype=np.float64).reshape(-1)
    gains = np.zeros(U.shape[1])
    for start, Xb in batches:
        R, _ = _batch_residuals(atoms, codes, bv, start, Xb)
        gains += (np.maximum(R @ U - lam, 0.0) ** 2).sum(axis=0)
    return reduce.sum(gains)


def column_batches(X: NDArray, batch: int) -> Iterator[tuple[int, NDArray]]:
    """(start, X[:, start:start + batch]) over the columns of X (D, N)."""
    for start in range(0, X.shape[1], batch):
        yield start, X[:, start:start + batch]
