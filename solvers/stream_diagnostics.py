"""The §3/§6 diagnostics of a dictionary, streamed over the points in batches (docs/theory.md §3, §6).

:func:`dictcheck.theory.diagnostics.dictionary_diagnostics` is the reference: it holds R, Φ = ŴᵀR/λ and
Z as dense (·, N) matrices and the cosine matrix as (d_z, d_z). At real sizes (d_z = 16 384 atoms,
N = 10⁵ points) those are tens of GB. :func:`stream_diagnostics` computes the same numbers from
sums over the points, reading the data one batch of columns at a time and keeping only

* the codes in coordinate form (:class:`SparseCodes`, O(nnz)),
* (D, d_z) accumulators Σ_i z_di r_i and Σ_{i∈A_d} z_di r_i, and O(d_z) per-atom sums and maxima.

Every quantity below is a sum, a maximum or a minimum over points, so batching changes nothing but
the order of floating-point additions (tests compare with the reference to 1e-12):

* S1 and R2 use m_d = Σ_i π_di r_i/λ = (Σ_i z_di r_i)/(λ‖z_d·‖₁);
* identity (5): Σ_{i∈A_d} π_di φ_i = Ŵᵀ(Σ_{i∈A_d} z_di r_i)/(λ‖z_d·‖₁), so ``hull_per_atom[d]`` =
  ‖Ŵᵀ(ŵ_d − that)‖_∞, and (5′): column j of M = ΦΠᵀ is Ŵᵀm_j, so ``hull_prime_per_atom[j]`` =
  ‖Ŵᵀ(ŵ_j − m_j)‖_∞; both are evaluated at the end in column blocks of Ŵᵀ (never d_z × d_z at once);
* (5′) min summand: for point i the smallest π_ji(1 − φ_id) over j ∈ S_i, d ∉ S_i is a_i·max_j π_ji
  when a_i = min_{d∉S_i}(1 − φ_id) < 0, else a_i·min_j π_ji;
* nested pairs A_d ⊆ A_j: a bitset per atom, AND-ed over the supports of the points where it is active.

The activity threshold τ_act = 10⁻⁶·max z (docs/theory.md §1) needs the global maximum, which the
codes give before the data are read. torch float64 on ``device`` (CUDA when asked).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.diagnostics import (
    ACTIVITY_RTOL,
    DiagnosticTolerances,
    DictionaryDiagnostics,
    unit_atom_norm_check,
)

__all__ = ["SparseCodes", "StreamedDiagnostics", "stream_diagnostics", "nested_pairs_of_codes", "batch_size_for",
           "column_batches"]

#: Column blocks of Ŵᵀ in the end-of-stream products (memory: D·d_z + d_z·block floats).
_BLOCK = 2048
#: A cosine matrix is returned only up to this many atoms (d_z² floats).
COSINES_MAX_ATOMS = 4096


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

    def decode_points(self, W: NDArray, points: NDArray) -> NDArray[np.float64]:
        """W Z for the given sorted point indices, (D, len(points))."""
        points = np.asarray(points, dtype=np.int64)
        keep = np.isin(self.points, points)
        rows = np.searchsorted(points, self.points[keep])
        Zs = sp.csr_array((self.values[keep], (rows, self.atoms[keep])), shape=(points.size, self.n_atoms))
        return np.asarray((Zs @ np.asarray(W, dtype=np.float64).T).T)

    def decode(self, W: NDArray, start: int = 0, stop: int | None = None) -> NDArray[np.float64]:
        """W Z for points start … stop − 1, (D, stop − start), without forming the dense codes."""
        stop = self.n_points if stop is None else stop
        s = self.range_slice(start, stop)
        Zs = sp.csr_array((self.values[s], (self.points[s] - start, self.atoms[s])), shape=(stop - start, self.n_atoms))
        return np.asarray((Zs @ np.asarray(W, dtype=np.float64).T).T)


def batch_size_for(n_atoms: int, n_points: int, budget_bytes: float = 512e6) -> int:
    """Points per batch so that the (d_z, B) float64 blocks of a batch (codes, Φ, masks) fit ``budget``."""
    return int(max(1, min(n_points, budget_bytes // (4 * 8 * max(n_atoms, 1)))))


def nested_pairs_of_codes(codes: SparseCodes, tau: float, chunk_points: int = 512) -> list[tuple[int, int]]:
    """All (d, j), d ≠ j, with A_d ≠ ∅ and A_d ⊆ A_j, where A_d = {i : z_di > τ} (docs/theory.md §3 S4).

    One bitset of candidate j per atom d, AND-ed with the support of every point where d is active:
    O(nnz·d_z/64) word operations and d_z²/8 bytes."""
    d_z = codes.n_atoms
    words = (d_z + 63) // 64
    cand = np.full((d_z, words), np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    keep = codes.values > tau
    pts, ats = codes.points[keep], codes.atoms[keep]
    live = np.zeros(d_z, dtype=bool)
    live[ats] = True
    bit = np.left_shift(np.uint64(1), (ats & 63).astype(np.uint64))
    bounds = np.searchsorted(pts, np.arange(0, codes.n_points + chunk_points, chunk_points))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if lo == hi:
            continue
        p, a, w = pts[lo:hi], ats[lo:hi], bit[lo:hi]
        uniq, local = np.unique(p, return_inverse=True)
        masks = np.zeros((uniq.size, words), dtype=np.uint64)
        np.bitwise_or.at(masks, (local, a >> 6), w)
        order = np.argsort(a, kind="stable")
        a_sorted = a[order]
        starts = np.flatnonzero(np.r_[True, a_sorted[1:] != a_sorted[:-1]])
        reduced = np.bitwise_and.reduceat(masks[local[order]], starts, axis=0)
        cand[a_sorted[starts]] &= reduced
    pairs: list[tuple[int, int]] = []
    live_idx = np.flatnonzero(live)
    for lo in range(0, live_idx.size, 1024):
        rows = live_idx[lo:lo + 1024]
        bits = np.unpackbits(cand[rows].view(np.uint8), axis=1, bitorder="little")[:, :d_z].astype(bool)
        bits[np.arange(rows.size), rows] = False
        r, j = np.nonzero(bits)
        pairs.extend(zip(rows[r].tolist(), j.tolist()))
    return sorted(pairs)


@dataclass(frozen=True, eq=False)
class StreamedDiagnostics:
    """The reference diagnostics (``cosines`` empty above :data:`COSINES_MAX_ATOMS` atoms) and, for each
    candidate new atom u given, gain(u) = Σ_i (uᵀr_i − λ)₊² over all points (docs/theory.md §3 S6)."""

    diagnostics: DictionaryDiagnostics
    candidate_gains: NDArray[np.float64]


def _csr(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A sparse CSR matrix from distinct coordinates, for fast sparse × dense products."""
    order = torch.argsort(rows, stable=True)
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols[order], vals[order], shape, check_invariants=False)


def _column_blocks_max(W: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """max_k |(Wᵀ V)_kd| per column d, in column blocks (never the full d_z × d_z product)."""
    out = torch.empty(V.shape[1], dtype=V.dtype, device=V.device)
    for lo in range(0, V.shape[1], _BLOCK):
        block = W.T @ V[:, lo:lo + _BLOCK]
        out[lo:lo + _BLOCK] = block.abs().amax(dim=0) if block.numel() else 0.0
    return out


def stream_diagnostics(
    W: ArrayLike,
    codes: SparseCodes,
    b: ArrayLike,
    batches: Iterable[tuple[int, NDArray]],
    lam: float,
    *,
    tau_act: float | None = None,
    learned_bias: bool = False,
    tolerances: DiagnosticTolerances | None = None,
    candidates: ArrayLike | None = None,
    device: str | torch.device = "cpu",
) -> StreamedDiagnostics:
    """Every §3/§6 diagnostic of unit atoms W (D, d_z) with the given codes and bias on the points that
    ``batches`` yields as (first point index, (D, B) columns), in order, covering 0 … N − 1.

    Equal to :func:`dictcheck.theory.diagnostics.dictionary_diagnostics` (same verdict, same tolerances)
    up to the order of floating-point sums. ``candidates`` (D, S) unit columns get their exact gain over
    all points. ValueError for bad shapes, a zero λ, or batches that do not cover the points in order.
    """
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    tol = tolerances or DiagnosticTolerances()
    W_np = np.asarray(W, dtype=np.float64)
    D, d_z = W_np.shape
    if codes.n_atoms != d_z:
        raise ValueError(f"codes have {codes.n_atoms} atoms, the dictionary {d_z}")
    unit_atom_norm_check(W_np, (codes.mass() != 0)[:, None])
    if codes.values.size and codes.values.min() < 0:
        raise ValueError("codes must be non-negative (objective (1))")
    N = codes.n_points
    if N == 0:
        raise ValueError("no data points")
    dev = torch.device(device)
    f64 = torch.float64
    Wt = torch.as_tensor(W_np, dtype=f64, device=dev)
    bt = torch.as_tensor(np.asarray(b, dtype=np.float64).reshape(-1), device=dev)
    U = None if candidates is None else torch.as_tensor(np.asarray(candidates, dtype=np.float64), device=dev)
    tau = ACTIVITY_RTOL * codes.max_value() if tau_act is None else float(tau_act)
    mass_np = codes.mass()
    mass = torch.as_tensor(mass_np, dtype=f64, device=dev)

    sum_sq = torch.zeros((), dtype=f64, device=dev)
    max_rnorm = torch.zeros((), dtype=f64, device=dev)
    sum_r = torch.zeros(D, dtype=f64, device=dev)
    szr_t = torch.zeros((d_z, D), dtype=f64, device=dev)  # row d: Σ_i z_di r_i
    szr_act_t = torch.zeros((d_z, D), dtype=f64, device=dev)  # row d: Σ_{i∈A_d} z_di r_i
    n_on = torch.zeros(d_z, dtype=f64, device=dev)
    off_sum = torch.zeros(d_z, dtype=f64, device=dev)
    kkt = torch.zeros(d_z, dtype=f64, device=dev)
    antipode = torch.zeros(d_z, dtype=f64, device=dev)
    gains = torch.zeros(0 if U is None else U.shape[1], dtype=f64, device=dev)
    prime_min = math.inf
    inv_mass = torch.where(mass > 0, 1.0 / torch.where(mass > 0, mass, 1.0), torch.zeros_like(mass))

    seen = 0
    for start, Xb in batches:
        Xb = torch.as_tensor(np.asarray(Xb, dtype=np.float64), device=dev)
        B = Xb.shape[1]
        if start != seen or Xb.shape[0] != D:
            raise ValueError(f"batches must cover the points in order with D = {D} rows: got points from {start} "
                             f"(expected {seen}) with {Xb.shape[0]} rows")
        sl = codes.range_slice(start, start + B)
        pts = torch.as_tensor(codes.points[sl] - start, device=dev)
        ats = torch.as_tensor(codes.atoms[sl], device=dev)
        vals = torch.as_tensor(codes.values[sl], dtype=f64, device=dev)
        on = vals > tau
        # R = X̃ − WZ and the sums Σ_i z_di r_i as sparse (CSR) products with the batch's entries: never the
        # dense (d_z, B) codes
        R = (Xb - bt[:, None]) - (_csr(pts, ats, vals, (B, d_z)) @ Wt.T).T
        Phi = (Wt.T @ R).div_(lam)
        rnorm = R.norm(dim=0)
        sum_sq += (rnorm * rnorm).sum()
        max_rnorm = torch.maximum(max_rnorm, rnorm.max())
        sum_r += R.sum(dim=1)
        szr_t += _csr(ats, pts, vals, (d_z, B)) @ R.T
        szr_act_t += _csr(ats[on], pts[on], vals[on], (d_z, B)) @ R.T
        n_on.index_add_(0, ats[on], torch.ones_like(vals[on]))
        phi_on = Phi[ats[on], pts[on]]
        off_sum += Phi.sum(dim=1) - torch.zeros_like(off_sum).index_add_(0, ats[on], phi_on)
        # KKT-z: max over points of (φ − 1)₊ = (max φ − 1)₊ (≤ |φ − 1|, so it never hides an active entry),
        # and |φ − 1| on A_d
        kkt = torch.maximum(kkt, (Phi.amax(dim=1) - 1.0).clamp_min(0.0))
        kkt.scatter_reduce_(0, ats[on], (phi_on - 1.0).abs(), reduce="amax")
        neg = torch.neg(Phi).sub_(1.0).clamp_min_(0.0)  # (−φ − 1)₊: the antipode's codes over λ
        antipode += neg.mul_(neg).sum(dim=1).mul_(lam * lam)
        del neg
        if U is not None:
            gains += (U.T @ R - lam).clamp_min(0.0).pow(2).sum(dim=1)
        # (5′) min summand, per point: a_i = min over atoms off at i of (1 − φ_id), times max/min π_ji over
        # the atoms on at i
        Phi[ats[on], pts[on]] = -math.inf
        slack = 1.0 - Phi.amax(dim=0)
        pi = vals[on] * inv_mass[ats[on]]
        pi_max = torch.full((B,), -math.inf, dtype=f64, device=dev).scatter_reduce_(0, pts[on], pi, reduce="amax")
        pi_min = torch.full((B,), math.inf, dtype=f64, device=dev).scatter_reduce_(0, pts[on], pi, reduce="amin")
        n_active = torch.zeros(B, dtype=f64, device=dev).index_add_(0, pts[on], torch.ones_like(pi))
        summand = torch.where(slack < 0, slack * pi_max, slack * pi_min)
        ok = (n_active > 0) & (n_active < d_z)
        if bool(ok.any()):
            prime_min = min(prime_min, float(summand[ok].min()))
        seen += B
    if seen != N:
        raise ValueError(f"batches covered {seen} points, the codes have {N}")

    live = (n_on > 0).cpu().numpy()
    safe_mass = torch.where(mass > 0, mass, torch.ones_like(mass))
    mean_res = szr_t.T / (lam * safe_mass)  # column d: Σ_i π_di r_i / λ
    s1 = torch.linalg.vector_norm(Wt - mean_res, dim=0)
    along = (Wt * mean_res).sum(dim=0)
    r2 = torch.linalg.vector_norm(mean_res - Wt * along, dim=0)
    hull = _column_blocks_max(Wt, Wt - szr_act_t.T / (lam * safe_mass))
    hull_prime = _column_blocks_max(Wt, Wt - mean_res)
    n_off = N - n_on
    ok = (n_on > 0) & (n_off > 0)
    off_mean = torch.where(ok, off_sum / torch.where(ok, n_off, torch.ones_like(n_off)), torch.full_like(n_on, math.nan))
    p = n_on / N
    target = torch.where(ok, -p / torch.where(ok, 1.0 - p, torch.ones_like(p)), torch.full_like(p, math.nan))

    def nan_dead(v: torch.Tensor) -> NDArray[np.float64]:
        return np.where(live, v.cpu().numpy(), np.nan)

    s1_np, r2_np, hull_np = nan_dead(s1), nan_dead(r2), nan_dead(hull)
    bias_violation = (off_mean - target).abs().cpu().numpy()
    r1 = float(torch.linalg.vector_norm(sum_r)) / N
    pairs = nested_pairs_of_codes(codes, tau)
    cos_of_pairs = np.array([float(W_np[:, d] @ W_np[:, j]) for d, j in pairs], dtype=np.float64)

    def nanmax(v: NDArray) -> float:
        v = v[np.isfinite(v)]
        return float(v.max()) if v.size else 0.0

    kkt_np = kkt.cpu().numpy()
    checks = {"kkt": float(kkt_np.max(initial=0.0)) <= tol.kkt, "stationarity": nanmax(s1_np) <= tol.stationarity,
              "hull": nanmax(hull_np) <= tol.hull}
    bias_max = nanmax(bias_violation)
    if learned_bias:
        checks["bias_identity"] = bias_max <= tol.bias
        checks["bias_residual"] = r1 / lam <= tol.bias_residual
    diag = DictionaryDiagnostics(
        lam=float(lam), n_points=int(N), n_atoms=int(d_z), tau_act=tau, tau_act_given=tau_act is not None,
        learned_bias=bool(learned_bias), tolerances=tol,
        objective=(float(sum_sq) + 2.0 * lam * float(mass_np.sum())) / N,
        cert_ratio=float(max_rnorm) / lam,
        firing_fraction=(n_on / N).cpu().numpy(),
        live_atoms=tuple(int(d) for d in np.flatnonzero(live)),
        dead_atoms=tuple(int(d) for d in np.flatnonzero(~live)),
        kkt_violation=float(kkt_np.max(initial=0.0)), kkt_violation_per_atom=kkt_np,
        stationarity_violation=nanmax(s1_np), stationarity_per_atom=s1_np,
        r2_violation=nanmax(r2_np), r2_per_atom=r2_np,
        bias_identity_violation=bias_max, bias_off_mean=off_mean.cpu().numpy(), bias_target=target.cpu().numpy(),
        bias_identity_per_atom=bias_violation, bias_residual_mean_norm=r1,
        hull_violation=nanmax(hull_np), hull_per_atom=hull_np,
        hull_prime_violation=nanmax(nan_dead(hull_prime)), hull_prime_per_atom=nan_dead(hull_prime),
        hull_prime_min_summand=prime_min,
        cosines=W_np.T @ W_np if d_z <= COSINES_MAX_ATOMS else np.zeros((0, 0)),
        nested_pairs=tuple(pairs), nesting_cosine_defect=1.0 - cos_of_pairs,
        antipode_gain=antipode.cpu().numpy() / N, checks=checks,
    )
    return StreamedDiagnostics(diagnostics=diag, candidate_gains=gains.cpu().numpy())


def column_batches(X: NDArray, batch: int) -> Iterator[tuple[int, NDArray]]:
    """(start, X[:, start:start + batch]) over the columns of X (D, N)."""
    for start in range(0, X.shape[1], batch):
        yield start, X[:, start:start + batch]
