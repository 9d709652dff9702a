"""Exact non-negative lasso codes for a fixed dictionary and bias (spec/theory.md §1).

For fixed (W, b) objective (1) separates over points. Code ``z_i`` of point ``i`` solves

    min_{z ≥ 0}  ‖x̃_i − W z‖² + 2λ ‖z‖₁ ,        x̃_i = x_i − b,                      (P_i)

a strictly convex problem whenever the atoms on the support are linearly independent (the
generic case). With the residual r_i = x̃_i − W z_i its optimality conditions are (KKT-z) of
spec §1, written here for atoms of any norm:

    w_dᵀ r_i = λ   if z_di > 0 ,        w_dᵀ r_i ≤ λ   if z_di = 0 .

For unit atoms this is φ_id = 1 on S_i and φ_id ≤ 1 off S_i (spec §0/§1). The relative KKT
violation reported everywhere in this module is

    kkt = max_{i,d}  { |w_dᵀ r_i − λ| / λ   if z_di > 0 ;   (w_dᵀ r_i − λ)₊ / λ   if z_di = 0 } ,

which for unit-norm atoms equals spec's ``kkt_violation`` = max |φ_id − 1| on S_i, (φ_id − 1)₊ off.

scikit-learn's ``sparse_encode(algorithm='lasso_cd', positive=True, alpha=α)`` minimises
½‖r‖² + α‖z‖₁, which has the same minimiser as (P_i) with α = λ (spec §1, conversion table).

Algorithm (``exact_codes``)
---------------------------
Write G = WᵀW and c_i = Wᵀx̃_i. Up to a constant, (P_i)/2 is the non-negative quadratic program
min_{z≥0} ½ zᵀGz − q_iᵀz with q_i = c_i − λ1, and g_i = q_i − G z_i = Wᵀr_i − λ1 is the
quantity the KKT conditions constrain (g = 0 on the support, g ≤ 0 off it).

Points are processed in batches (one matmul X̃ᵀW per batch for the correlations). Per point a
*working set* of atoms is kept (padded to a common width inside a chunk):

1. Start from the atoms with the largest q_id > 0 (the count is learnt from earlier batches).
2. Solve the QP restricted to the working set **exactly** with block principal pivoting
   (Júdice & Pires 1994; Kim & Park 2011): guess the support F, solve G_FF z_F = q_F by a batched
   Cholesky factorisation (plus one step of iterative refinement), exchange every infeasible
   index (z_d < 0 on F, g_d > 0 off F), and fall back to Murty's single-exchange rule when the
   number of infeasible indices stops decreasing; this rule terminates finitely for positive
   definite G_FF. Singular systems (linearly dependent atoms) fall back to an eigen-pseudo-inverse.
3. Compute the full gradient g_i = q_i − G z_i over all atoms (sparse-times-dense product with the
   Gram matrix, or the residual route Wᵀ(x̃ − Wz) when that is cheaper), and the relative KKT
   violation. Points with violation ≤ ``tol`` are done.
4. Otherwise the new working set is the current support plus the most violating atoms (at most
   max(8, |support|) of them), and step 2 repeats. The previous support stays in the working
   set and a violating atom is added, so the objective strictly decreases and no support repeats:
   the outer loop terminates finitely when the inner solves are exact.

The result is exact up to floating-point rounding: the reported violation is typically 1e-13 to
1e-15. Everything runs in float64 by default; ``device`` may be a CUDA device.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

__all__ = ["ExactCodes", "exact_codes", "kkt_violation"]


# --------------------------------------------------------------------------------------------
# Standalone KKT measure (numpy)
# --------------------------------------------------------------------------------------------


def kkt_violation(
    W: ArrayLike, Z: ArrayLike, X: ArrayLike, b: ArrayLike, lam: float, *, chunk: int = 4096
) -> float:
    """Relative KKT violation of codes Z for fixed (W, b) (spec/theory.md §1, KKT-z).

    With r_i = x_i − b − W z_i, returns

        max_{i,d} { |w_dᵀ r_i − λ|/λ  if z_di > 0 ;  (w_dᵀ r_i − λ)₊/λ  if z_di = 0 },

    i.e. spec's ``kkt_violation`` (max |φ_id − 1| on the support, (φ_id − 1)₊ off it) when the
    atoms have unit norm. Atoms may have any norm; the support is z_di > 0 exactly (no τ_act).
    0.0 is exact optimality of every code for objective (1) with W and b held fixed.

    Shapes: W (D, d_z), Z (d_z, N) dense or scipy.sparse, X (D, N), b (D,). Computed in
    float64, ``chunk`` points at a time, so memory stays O(d_z · chunk).
    Raises ValueError for bad shapes, non-finite input, negative codes or λ ≤ 0.
    """
    W = _as_float64_matrix(W, "W")
    X = _as_float64_matrix(X, "X")
    D, d_z = W.shape
    if X.shape[0] != D:
        raise ValueError(f"X must have shape (D, N) = ({D}, N); got {X.shape}")
    bv = _as_bias(b, D)
    lam = _as_lambda(lam)
    N = X.shape[1]
    try:
        import scipy.sparse as sp

        is_sparse = sp.issparse(Z)
    except ImportError:  # pragma: no cover - scipy is a dependency
        is_sparse = False
    if is_sparse:
        Zs = Z.tocsc()
        if Zs.shape != (d_z, N):
            raise ValueError(f"Z must have shape (d_z, N) = ({d_z}, {N}); got {Zs.shape}")
        if Zs.nnz and (not np.all(np.isfinite(Zs.data)) or np.any(Zs.data < 0)):
            raise ValueError("Z must be finite and non-negative")
    else:
        Zd = np.asarray(Z, dtype=np.float64)
        if Zd.shape != (d_z, N):
            raise ValueError(f"Z must have shape (d_z, N) = ({d_z}, {N}); got {Zd.shape}")
        if not np.all(np.isfinite(Zd)):
            raise ValueError("Z must be finite")
        if np.any(Zd < 0):
            raise ValueError("Z must be non-negative (objective (1) has Z ≥ 0)")
    worst = 0.0
    for s in range(0, N, max(1, int(chunk))):
        e = min(N, s + max(1, int(chunk)))
        Zc = Zs[:, s:e].toarray() if is_sparse else Zd[:, s:e]
        R = X[:, s:e] - bv[:, None] - W @ Zc
        g = (W.T @ R - lam) / lam
        v = np.where(Zc > 0, np.abs(g), np.maximum(g, 0.0))
        if v.size:
            worst = max(worst, float(v.max()))
    return worst


# --------------------------------------------------------------------------------------------
# Result type
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExactCodes:
    """Result of :func:`exact_codes`.

    Attributes
    ----------
    Z : ndarray (d_z, N) float64, or scipy.sparse.csc_array when ``sparse_output=True``
        Non-negative codes, one column per point. The dense array is a transposed view of a
        C-contiguous (N, d_z) buffer (Fortran order for (d_z, N)).
    kkt_violation : float
        Relative KKT violation reached (max over all points and atoms; see module docstring),
        computed as max |q − Gz| on the support and (q − Gz)₊ off it, divided by λ.
    iterations : int
        Largest number of outer (working-set) iterations any batch needed.
    converged : bool
        kkt_violation ≤ tol.
    seconds : float
        Wall-clock time of the call.
    tol : float
        The requested tolerance.
    n_unconverged : int
        Number of points whose own violation is above tol (0 when converged).
    mean_support : float
        Mean number of atoms with z_di > 0 per point (the L0 of the codes).
    """

    Z: NDArray[np.float64]
    kkt_violation: float
    iterations: int
    converged: bool
    seconds: float
    tol: float
    n_unconverged: int
    mean_support: float


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


def _as_float64_matrix(A: ArrayLike, name: str) -> NDArray[np.float64]:
    if isinstance(A, torch.Tensor):
        A = A.detach().cpu().numpy()
    A = np.asarray(A)
    if A.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array; got shape {A.shape}")
    if not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
        raise ValueError(f"{name} must be a real numeric array; got dtype {A.dtype}")
    A = A.astype(np.float64, copy=False)
    if not np.all(np.isfinite(A)):
        raise ValueError(f"{name} contains non-finite values (nan or inf)")
    return A


def _as_bias(b: ArrayLike, D: int) -> NDArray[np.float64]:
    if isinstance(b, torch.Tensor):
        b = b.detach().cpu().numpy()
    bv = np.asarray(b)
    if bv.shape not in ((D,), (D, 1)):
        raise ValueError(f"b must have shape (D,) = ({D},); got {bv.shape}")
    if not np.issubdtype(bv.dtype, np.number) or np.iscomplexobj(bv):
        raise ValueError(f"b must be a real numeric array; got dtype {bv.dtype}")
    bv = bv.astype(np.float64).reshape(D)
    if not np.all(np.isfinite(bv)):
        raise ValueError("b contains non-finite values (nan or inf)")
    return bv


def _as_lambda(lam: float) -> float:
    try:
        lam_f = float(lam)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"lam must be a real number; got {lam!r}") from exc
    if not math.isfinite(lam_f) or lam_f <= 0.0:
        raise ValueError(f"lam must be finite and > 0; got {lam!r}")
    return lam_f


# --------------------------------------------------------------------------------------------
# Batched linear algebra helpers
# --------------------------------------------------------------------------------------------

# Phase A (see module docstring): at most this many full KKT checks before the fallback.
_PHASE_A_ITERS = 30
# Phase A growth: add at most max(_ADD_MIN, ceil(_ADD_FRAC · |F|)) violating atoms per step.
_ADD_MIN = 8
_ADD_FRAC = 0.25
# Phase A hands a point to phase B when its count of infeasible indices stalls this long.
_STALL = 5
# Entries of one chunk of (n, k, k) systems (bounds the memory of the small solves).
_CHUNK_ENTRIES = 1 << 23


@dataclass
class _Ctx:
    """Per-call constants. ``Gz`` is the Gram matrix with a zero row and column appended: index
    d_z is the *null atom* used to pad working sets to a common width."""

    W: torch.Tensor  # (D, d_z)
    Gz: torch.Tensor  # (d_z + 1, d_z + 1)
    lam: float
    tol: float
    eps: float  # absolute tolerance on g = Wᵀr − λ off the support inside the solvers

    @property
    def d_z(self) -> int:
        return int(self.W.shape[1])

    @property
    def D(self) -> int:
        return int(self.W.shape[0])

    @property
    def rank_cap(self) -> int:
        """Largest support on which the atoms can be linearly independent."""
        return min(self.D, self.d_z)

    @property
    def G(self) -> torch.Tensor:
        return self.Gz[: self.d_z, : self.d_z]


def _gram_product(ctx: _Ctx, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """(G z_i)_i for codes in padded form: atom indices idx (n, K) (null = d_z) and values val."""
    n = idx.shape[0]
    d_z, D = ctx.d_z, ctx.D
    nz = (idx < d_z) & (val != 0)
    nnz = int(nz.sum())
    if nnz == 0:
        return torch.zeros(n, d_z, dtype=val.dtype, device=val.device)
    # Sparse route: reads one Gram row per non-zero (memory bound: ~1 ns per entry while the Gram
    # matrix fits in cache, ~2 ns beyond). Dense route: min(4·D, 2·d_z)·d_z flops per point at
    # ~20-30 flop/ns. Crossover measured on a 2-core CPU (benchmarks/RESULTS_lasso_codes.md).
    per_entry = 2 if 8 * d_z * d_z > (16 << 20) else 1
    if nnz * 20 * per_entry < n * min(4 * D, 2 * d_z):
        counts = nz.sum(dim=1)
        crow = torch.zeros(n + 1, dtype=torch.int64, device=idx.device)
        crow[1:] = torch.cumsum(counts, 0)
        r, c = nz.nonzero(as_tuple=True)  # row-major
        cols = idx[r, c]
        vals = val[r, c]
        order = torch.argsort(r * (d_z + 1) + cols)  # CSR wants sorted columns within a row
        Zs = torch.sparse_csr_tensor(crow, cols[order], vals[order], size=(n, d_z), check_invariants=False)
        return torch.sparse.mm(Zs, ctx.G)
    Zd = torch.zeros(n, d_z + 1, dtype=val.dtype, device=val.device)
    Zd.scatter_add_(1, idx, torch.where(nz, val, torch.zeros_like(val)))  # add: pads never overwrite
    Zd = Zd[:, :d_z]
    if 2 * D < d_z:
        return (Zd @ ctx.W.T) @ ctx.W
    return Zd @ ctx.G


def _gradient(ctx: _Ctx, Q: torch.Tensor, F: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """g = q − Gz = Wᵀr − λ1 for each row, returned as (m, d_z + 1) with −inf in the null column."""
    m = Q.shape[0]
    g = torch.empty(m, ctx.d_z + 1, dtype=Q.dtype, device=Q.device)
    torch.sub(Q, _gram_product(ctx, F, z), out=g[:, : ctx.d_z])
    g[:, ctx.d_z] = -math.inf
    return g


def _pinv_solve(M: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Least-squares / minimum-norm solve of symmetric PSD systems via eigh (rank-deficient ok)."""
    evals, evecs = torch.linalg.eigh(M)
    cutoff = evals.abs().amax(dim=-1, keepdim=True) * (M.shape[-1] * torch.finfo(M.dtype).eps)
    inv = torch.where(evals > cutoff, 1.0 / evals, torch.zeros_like(evals))
    coef = (evecs.transpose(-1, -2) @ rhs.unsqueeze(-1)).squeeze(-1) * inv
    return (evecs @ coef.unsqueeze(-1)).squeeze(-1)


def _spd_solve(M: torch.Tensor, rhs: torch.Tensor, refine: bool = False) -> torch.Tensor:
    """Batched solve of symmetric positive (semi)definite systems M z = rhs, (n, k, k), (n, k).

    Cholesky with two triangular solves (optionally one step of iterative refinement); systems
    whose factorisation fails (singular: linearly dependent atoms) use an eigen-pseudo-inverse.
    """
    L, info = torch.linalg.cholesky_ex(M)
    b = rhs.unsqueeze(-1)
    z = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, b, upper=False), upper=True)
    if refine:
        res = b - M @ z
        z = z + torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, res, upper=False), upper=True)
    z = z.squeeze(-1)
    bad = (info != 0) | ~torch.isfinite(z).all(dim=1)
    if bool(bad.any()):
        bi = bad.nonzero().squeeze(1)
        z[bi] = _pinv_solve(M[bi], rhs[bi])
    return z


def _gather_systems(ctx: _Ctx, F: torch.Tensor) -> torch.Tensor:
    """G_FF for padded index sets F (n, k); null slots become identity rows/columns."""
    M = ctx.Gz[F.unsqueeze(2), F.unsqueeze(1)]
    M.diagonal(dim1=1, dim2=2).add_((F == ctx.d_z).to(M.dtype))
    return M


def _chunks(widths: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Split points, sorted by working-set width, into chunks of bounded n·k² (k = chunk max)."""
    m = widths.numel()
    order = torch.argsort(widths, stable=True)
    w_sorted = widths[order].tolist()
    out = []
    pos = 0
    while pos < m:
        k_first = max(1, w_sorted[pos])
        end = min(m, pos + max(1, _CHUNK_ENTRIES // (k_first * k_first)))
        k_c = max(1, w_sorted[end - 1])
        if (end - pos) * k_c * k_c > _CHUNK_ENTRIES:
            end = pos + max(1, _CHUNK_ENTRIES // (k_c * k_c))
            k_c = max(1, w_sorted[end - 1])
        out.append((order[pos:end], k_c))
        pos = end
    return out


def _sort_sets(F: torch.Tensor, null: int) -> torch.Tensor:
    """Sort each row of a padded index set (null last) and drop all-null trailing columns."""
    F, _ = torch.sort(F, dim=1)
    k = int((F < null).sum(dim=1).max()) if F.numel() else 0
    return F[:, : max(1, k)].contiguous()


def _kkt(ctx: _Ctx, g: torch.Tensor, F: torch.Tensor, z: torch.Tensor):
    """Per-point relative KKT violation at codes (F, z) with gradient g = q − Gz (m, d_z + 1).

    **Overwrites g** (in place) with g_out: g with the members of F set to −inf, for choosing
    atoms to add. Returns (kkt, n_infeasible, off_max, g_F, g_out): n_infeasible counts
    F-members with z < 0 plus atoms with z = 0 and g > eps, off_max = max (g)₊ over atoms with
    z = 0, and g_F the gradient on F (0 in null slots).
    """
    null = ctx.d_z
    valid = F < null
    pos = valid & (z > 0)
    g_F = torch.gather(g, 1, F)
    g_F = torch.where(valid, g_F, torch.zeros_like(g_F))
    sup_err = torch.where(pos, g_F.abs(), torch.zeros_like(g_F)).amax(dim=1)
    g.scatter_(1, torch.where(pos, F, torch.full_like(F, null)), -math.inf)  # off-support view
    off_max = g.amax(dim=1).clamp_min(0.0)
    kkt = torch.maximum(sup_err, off_max) / ctx.lam
    n_inf = (valid & (z < 0)).sum(dim=1) + (g > ctx.eps).sum(dim=1)
    g.scatter_(1, F, -math.inf)
    return kkt, n_inf, off_max, g_F, g


def _top_violators(ctx: _Ctx, g_out: torch.Tensor, n_add: torch.Tensor) -> torch.Tensor:
    """Up to n_add[i] atoms with the largest g > eps per point, padded with the null atom."""
    null = ctx.d_z
    a = int(min(null, max(1, int(n_add.max()))))
    av, ai = torch.topk(g_out[:, :null], a, dim=1, sorted=True)
    ok = (av > ctx.eps) & (torch.arange(a, device=g_out.device).unsqueeze(0) < n_add.unsqueeze(1))
    return torch.where(ok, ai, torch.full_like(ai, null))


class _Results:
    """Collects finished points of one batch as padded (idx, val) rows."""

    def __init__(self, n: int, ctx: _Ctx, device, dtype):
        self.n, self.ctx = n, ctx
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.viol = torch.zeros(n, dtype=dtype, device=device)

    def add(self, pts: torch.Tensor, F: torch.Tensor, z: torch.Tensor, kkt: torch.Tensor) -> None:
        if pts.numel():
            keep = (F < self.ctx.d_z) & (z > 0)
            self.parts.append((pts, torch.where(keep, F, torch.full_like(F, self.ctx.d_z)), torch.where(keep, z, torch.zeros_like(z))))
            self.viol[pts] = kkt

    def padded(self):
        null = self.ctx.d_z
        K = max([int(p[1].shape[1]) for p in self.parts] + [1])
        dev, dt = self.viol.device, self.viol.dtype
        idx = torch.full((self.n, K), null, dtype=torch.long, device=dev)
        val = torch.zeros(self.n, K, dtype=dt, device=dev)
        for p, i, v in self.parts:
            idx[p, : i.shape[1]] = i
            val[p, : v.shape[1]] = v
        return idx, val, self.viol


# --------------------------------------------------------------------------------------------
# Phase A: block principal pivoting on the full problem with limited additions
# --------------------------------------------------------------------------------------------


def _phase_a(ctx: _Ctx, Q: torch.Tensor, m0: int, T: int, res: _Results):
    """Semismooth-Newton / principal pivoting on all atoms, adding few violators per step.

    State: a guessed support F per point and z_F = G_FF⁻¹ q_F (z may be negative). Each step
    checks (KKT-z) with the full gradient g = q − Gz, drops F-members with z < 0 and adds the
    atoms with the largest g > 0 (at most max(8, |F|/4), m0 at the first step, keeping
    |F| ≤ min(D, d_z)). Points whose only defect is accuracy on the support get a Newton
    refinement step on the same F. A point whose number of infeasible indices has not improved
    for ``_STALL`` steps (cycling) is handed to phase B, as is every point left after T checks.
    Returns ([(pts, F, z), ...] handed over, number of checks used).
    """
    null = ctx.d_z
    n = Q.shape[0]
    dev, dt = Q.device, Q.dtype
    zcol = torch.zeros(n, 1, dtype=dt, device=dev)
    Q0 = torch.cat([Q, zcol], dim=1)  # null atom → rhs 0
    pts = torch.arange(n, device=dev)
    F = torch.full((n, 1), null, dtype=torch.long, device=dev)
    z = torch.zeros(n, 1, dtype=dt, device=dev)
    g = torch.cat([Q, torch.full((n, 1), -math.inf, dtype=dt, device=dev)], dim=1)
    best = torch.full((n,), 1 << 62, dtype=torch.long, device=dev)
    stall = torch.zeros(n, dtype=torch.long, device=dev)
    handed: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    used = 0
    for t in range(1, T + 1):
        used = t
        kkt, n_inf, off_max, g_F, g_out = _kkt(ctx, g, F, z)
        valid = F < null
        has_neg = (valid & (z < 0)).any(dim=1)
        fin = (~has_neg) & (kkt <= ctx.tol)
        if bool(fin.any()):
            res.add(pts[fin], F[fin], z[fin], kkt[fin])
        improved = n_inf < best
        best = torch.where(improved, n_inf, best)
        stall = torch.where(improved, torch.zeros_like(stall), stall + 1)
        kept = torch.where(valid & (z >= 0), F, torch.full_like(F, null))
        n_kept = (kept < null).sum(dim=1)
        if t == 1:
            n_add = torch.full_like(n_kept, max(1, m0))
        else:
            n_add = torch.clamp(torch.ceil(_ADD_FRAC * n_kept).long(), min=_ADD_MIN)
        n_add = torch.minimum(n_add, (ctx.rank_cap - n_kept).clamp_min(0))
        refine = (~has_neg) & (off_max <= ctx.eps)  # only the support equations are inaccurate
        stuck = (~has_neg) & (~refine) & (n_add == 0)
        out = (~fin) & ((stall >= _STALL) | stuck)
        if t == T:
            out = ~fin
        if bool(out.any()):
            handed.append((pts[out], F[out], z[out]))
        keep = ~(fin | out)
        if not bool(keep.any()):
            break
        add = _top_violators(ctx, g_out, n_add)  # on all rows: avoids copying g_out
        del g, g_out
        if not bool(keep.all()):
            pts, F, z, g_F, kept, add = pts[keep], F[keep], z[keep], g_F[keep], kept[keep], add[keep]
            best, stall, refine = best[keep], stall[keep], refine[keep]
        F_new = _sort_sets(torch.cat([kept, add], dim=1), null)
        m, K = F_new.shape
        z_new = torch.zeros(m, K, dtype=dt, device=dev)
        any_ref = bool(refine.any())
        if any_ref:
            # refined points keep F unchanged (same sorted order): align old z and g_F to width K
            pad = max(0, K - z.shape[1])
            z_old = torch.nn.functional.pad(z, (0, pad))[:, :K]
            gF_old = torch.nn.functional.pad(g_F, (0, pad))[:, :K]
        rows = pts * (null + 1)
        widths = (F_new < null).sum(dim=1)
        for sel, k in _chunks(widths):
            Fc = F_new[sel, :k]
            M = _gather_systems(ctx, Fc)
            rhs = torch.take(Q0, rows[sel].unsqueeze(1) + Fc)
            rf = refine[sel] if any_ref else None
            if any_ref and bool(rf.any()):
                # Newton form on an unchanged F: z ← z + G_FF⁻¹ (q − Gz)_F
                rhs = torch.where(rf.unsqueeze(1), gF_old[sel, :k], rhs)
                zc = _spd_solve(M, rhs)
                zc = torch.where(rf.unsqueeze(1), z_old[sel, :k] + zc, zc)
            else:
                zc = _spd_solve(M, rhs)
            z_new[sel, :k] = torch.where(Fc < null, zc, torch.zeros_like(zc))
        F, z = F_new, z_new
        g = _gradient(ctx, Q[pts], F, z)
    return handed, used


# --------------------------------------------------------------------------------------------
# Phase B (fallback, finite termination): working sets with exact block principal pivoting
# --------------------------------------------------------------------------------------------


def _bpp(
    H: torch.Tensor, q: torch.Tensor, F0: torch.Tensor, eps: float, max_inner: int
) -> torch.Tensor:
    """Block principal pivoting for min_{z≥0} ½zᵀHz − qᵀz on a batch of small dense problems.

    H (n, K, K) symmetric PSD, q (n, K), F0 (n, K) initial guess of the support. Padding slots
    must have H row/column 0, H_kk = 1 and q_k < 0 (they are then never selected).
    Feasibility: z_F ≥ 0 and g = q − Hz ≤ eps off F. Full exchanges while the number of
    infeasible indices decreases (3 tries otherwise), then Murty's single exchange of the
    largest infeasible index (finite for positive definite H; Júdice & Pires 1994, Kim & Park
    2011). Points not finished after ``max_inner`` solves return their last iterate clipped at 0.
    """
    n, K = q.shape
    dev = q.device
    z_out = torch.zeros_like(q)
    F = F0.clone()
    best = torch.full((n,), K + 1, dtype=torch.long, device=dev)
    budget = torch.full((n,), 3, dtype=torch.long, device=dev)
    act = torch.arange(n, device=dev)
    slot = torch.arange(K, device=dev)
    for it in range(1, max_inner + 1):
        Ha, qa, Fa = H[act], q[act], F[act]
        f = Fa.to(H.dtype)
        M = Ha * f.unsqueeze(2) * f.unsqueeze(1)
        M.diagonal(dim1=1, dim2=2).add_(1.0 - f)
        za = _spd_solve(M, qa * f, refine=True) * f
        ga = qa - (Ha @ za.unsqueeze(-1)).squeeze(-1)
        infeas = (Fa & (za < 0)) | (~Fa & (ga > eps))
        nv = infeas.sum(dim=1)
        ok = nv == 0
        last = it == max_inner
        keep = torch.ones_like(ok) if last else ok
        if bool(keep.any()):
            z_out[act[keep]] = za[keep].clamp_min(0.0)
        if last:
            break
        nk = ~ok
        act, Fa, infeas, nv = act[nk], Fa[nk], infeas[nk], nv[nk]
        if act.numel() == 0:
            break
        b_best, b_budget = best[act], budget[act]
        improved = nv < b_best
        full = improved | (b_budget > 0)
        best[act] = torch.where(improved, nv, b_best)
        budget[act] = torch.where(improved, torch.full_like(b_budget, 3), b_budget - (~improved).long())
        last_slot = (infeas.long() * slot).argmax(dim=1)
        single = torch.zeros_like(infeas)
        single[torch.arange(act.numel(), device=dev), last_slot] = True
        F[act] = Fa ^ torch.where(full.unsqueeze(1), infeas, single)
    return z_out


def _solve_working_sets(ctx: _Ctx, Qm: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """Exact NNQP restricted to each point's working set ws (m, K) (null padded, sorted).

    Qm is q with an extra column −1 for the null atom. Returns z ≥ 0 aligned with ws.
    """
    null = ctx.d_z
    m, K = ws.shape
    z_out = torch.zeros(m, K, dtype=Qm.dtype, device=Qm.device)
    widths = (ws < null).sum(dim=1)
    for sel, k in _chunks(widths):
        Fc = ws[sel, :k]
        H = _gather_systems(ctx, Fc)
        q = torch.gather(Qm[sel], 1, Fc)
        z = _bpp(H, q, Fc < null, ctx.eps, max_inner=max(50, 3 * k))
        z_out[sel, :k] = torch.where(Fc < null, z, torch.zeros_like(z))
    return z_out


def _phase_b(ctx: _Ctx, Q: torch.Tensor, pts: torch.Tensor, ws: torch.Tensor, T: int, res: _Results):
    """Working-set loop with exact subproblem solves; finite termination (strict decrease).

    Each step solves the problem restricted to the working set exactly (``_bpp``), checks
    (KKT-z) over all atoms, and keeps the support plus at most max(8, |support|) violators.
    Points still above tol after T steps are recorded with the violation they reached.
    """
    null = ctx.d_z
    used = 0
    Qm_all = torch.cat([Q, torch.full((Q.shape[0], 1), -1.0, dtype=Q.dtype, device=Q.device)], dim=1)
    for t in range(1, T + 1):
        used = t
        z_ws = _solve_working_sets(ctx, Qm_all[pts], ws)
        F = torch.where(z_ws > 0, ws, torch.full_like(ws, null))
        F, order = torch.sort(F, dim=1)
        z = torch.gather(z_ws, 1, order)
        k = max(1, int((F < null).sum(dim=1).max()))
        F, z = F[:, :k].contiguous(), z[:, :k].contiguous()
        z = torch.where(F < null, z, torch.zeros_like(z))
        g = _gradient(ctx, Q[pts], F, z)
        kkt, _, _, _, g_out = _kkt(ctx, g, F, z)
        fin = kkt <= ctx.tol
        if t == T:
            fin = torch.ones_like(fin)
        res.add(pts[fin], F[fin], z[fin], kkt[fin])
        if bool(fin.all()):
            break
        keep = ~fin
        pts, F, g_out = pts[keep], F[keep], g_out[keep]
        n_supp = (F < null).sum(dim=1)
        # at most max(8, |S|) violators, keeping |WS| ≤ min(D, d_z) when possible (≥ 1 added)
        n_add = torch.minimum(torch.clamp(n_supp, min=8), (ctx.rank_cap - n_supp).clamp_min(1))
        add = _top_violators(ctx, g_out, n_add)
        ws = _sort_sets(torch.cat([F, add], dim=1), null)
    return used


def _solve_batch(ctx: _Ctx, Xc: torch.Tensor, max_iter: int, state: "_State"):
    """Codes for one batch of centred points Xc (n, D): padded (idx, val), violations, checks."""
    n = Xc.shape[0]
    null = ctx.d_z
    Q = Xc @ ctx.W - ctx.lam  # q_i = Wᵀx̃_i − λ1, (n, d_z)
    res = _Results(n, ctx, Q.device, Q.dtype)
    T_a = min(max_iter, _PHASE_A_ITERS)
    handed, used = _phase_a(ctx, Q, state.k0, T_a, res)
    if handed:
        pts = torch.cat([h[0] for h in handed])
        K = max(int(h[1].shape[1]) for h in handed)
        F = torch.cat([torch.nn.functional.pad(h[1], (0, K - h[1].shape[1]), value=null) for h in handed])
        z = torch.cat([torch.nn.functional.pad(h[2], (0, K - h[2].shape[1]), value=0.0) for h in handed])
        if max_iter > used:
            ws = _sort_sets(F, null)
            used += _phase_b(ctx, Q, pts, ws, max_iter - used, res)
        else:
            # out of iterations: report the feasible point z₊ and its violation
            z = z.clamp_min(0.0)
            g = _gradient(ctx, Q[pts], F, z)
            kkt = _kkt(ctx, g, F, z)[0]
            res.add(pts, F, z, kkt)
    idx, val, viol = res.padded()
    # learn the initial working-set width for the next batch from the support sizes
    sizes = ((idx < null) & (val > 0)).sum(dim=1).to(torch.float64)
    if sizes.numel():
        q90 = float(torch.quantile(sizes, 0.9)) if sizes.numel() > 1 else float(sizes[0])
        state.k0 = int(min(ctx.d_z, max(8, math.ceil(1.25 * q90) + 4)))
    return idx, val, viol, used


@dataclass
class _State:
    """Carried between batches: initial working-set width learnt from finished batches."""

    k0: int


# --------------------------------------------------------------------------------------------
# Main entry point
# --------------------------------------------------------------------------------------------


def _default_batch(D: int, d_z: int) -> int:
    # A batch holds X̃ (B, D), q (B, d_z) and a few (B, d_z) gradient buffers: about 32 MB
    # per (B, d_z) float64 buffer.
    return int(max(256, min(8192, (1 << 22) // max(d_z, D, 1))))


def exact_codes(
    W: ArrayLike,
    X: ArrayLike,
    b: ArrayLike,
    lam: float,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    batch_size: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float64,
    progress: bool = False,
    sparse_output: bool = False,
) -> ExactCodes:
    """Exact non-negative lasso codes for fixed (W, b): objective (1) of spec/theory.md §1.

    Solves, independently for every point i (column of X),

        z_i = argmin_{z ≥ 0} ‖x_i − b − W z‖² + 2λ‖z‖₁

    for any dictionary W (atoms of any norm; zero atoms get zero codes), i.e. the codes that
    minimise objective (1) with W and b held fixed (spec §1, "Codes for fixed (W, b)"). The
    result satisfies (KKT-z) to relative accuracy ``tol``: see :func:`kkt_violation` for the
    exact measure. This is the same minimiser as scikit-learn's
    ``sparse_encode(X.T, W.T, algorithm='lasso_cd', alpha=λ, positive=True)`` (½‖r‖² + λ‖z‖₁).

    Algorithm (module docstring): batched principal pivoting on all atoms with limited
    additions (phase A), then, for the rare points it does not finish, a working-set method
    with exact block-principal-pivoting subproblem solves that terminates finitely (phase B).
    Both use the Gram matrix WᵀW and one correlation matmul X̃ᵀW per batch.

    Parameters
    ----------
    W : (D, d_z) dictionary, atoms as columns.  X : (D, N) data, points as columns.
    b : (D,) bias.  lam : λ > 0 of objective (1) (penalty 2λ‖z‖₁).
    tol : target relative KKT violation (default 1e-8, relative to λ).
    max_iter : maximum number of full KKT checks (outer iterations) per batch. If the target is
        not reached, the result has ``converged=False`` and reports the violation reached (no
        error); callers decide.
    batch_size : points per batch (default about 2²² / max(d_z, D), between 256 and 8192).
        Memory is O(batch_size · (D + d_z)) plus the (d_z + 1)² Gram matrix.
    device, dtype : torch device and floating dtype of the computation (float64 by default;
        with float32 a tolerance of 1e-8 is generally not reachable).
    progress : show a tqdm progress bar over batches.
    sparse_output : return Z as a scipy.sparse.csc_array (d_z, N) instead of a dense array.
        The default is a dense float64 array of d_z·N·8 bytes (3.3 GB for 10⁵ × 4096), which
        the caller must be able to hold; codes are sparse, so ``sparse_output=True`` is the
        memory-efficient choice for large problems.

    Returns
    -------
    ExactCodes with Z (d_z, N), kkt_violation, iterations, converged, seconds, tol,
    n_unconverged, mean_support.

    Raises
    ------
    ValueError for bad shapes, non-finite inputs, λ ≤ 0, tol ≤ 0, max_iter < 1, batch_size < 1
    or an unsupported dtype. Deterministic for a given input, device and thread count.
    """
    t0 = time.perf_counter()
    Wn = _as_float64_matrix(W, "W")
    Xn = _as_float64_matrix(X, "X")
    D, d_z = Wn.shape
    if D == 0 or d_z == 0:
        raise ValueError(f"W must have at least one row and one atom; got shape {Wn.shape}")
    if Xn.shape[0] != D:
        raise ValueError(f"X must have shape (D, N) = ({D}, N) with points as columns; got {Xn.shape}")
    bv = _as_bias(b, D)
    lam = _as_lambda(lam)
    try:
        tol = float(tol)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tol must be a positive number; got {tol!r}") from exc
    if not math.isfinite(tol) or tol <= 0.0:
        raise ValueError(f"tol must be finite and > 0; got {tol!r}")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer; got {max_iter!r}")
    max_iter = int(max_iter)
    if batch_size is not None and (
        isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive integer or None; got {batch_size!r}")
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"dtype must be torch.float64 or torch.float32; got {dtype!r}")
    N = Xn.shape[1]
    B = int(batch_size) if batch_size is not None else _default_batch(D, d_z)
    dev = torch.device(device)

    Wt = torch.as_tensor(Wn, device=dev).to(dtype)  # (D, d_z)
    Gz = torch.zeros(d_z + 1, d_z + 1, dtype=dtype, device=dev)
    G = Wt.T @ Wt
    Gz[:d_z, :d_z] = 0.5 * (G + G.T)
    del G
    ctx = _Ctx(W=Wt, Gz=Gz, lam=lam, tol=tol, eps=0.5 * tol * lam)
    bt = torch.as_tensor(bv, device=dev).to(dtype)

    if sparse_output:
        rows_l: list[np.ndarray] = []
        cols_l: list[np.ndarray] = []
        vals_l: list[np.ndarray] = []
    else:
        Zt = np.zeros((N, d_z), dtype=np.float64)

    state = _State(k0=min(d_z, 32))
    worst = 0.0
    iters = 0
    n_bad = 0
    nnz_total = 0
    starts = range(0, N, B)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, total=math.ceil(N / B) if N else 0, desc="exact_codes", unit="batch")
    for s in starts:
        e = min(N, s + B)
        Xc = torch.as_tensor(np.ascontiguousarray(Xn[:, s:e].T), device=dev).to(dtype) - bt
        idx, val, viol, it = _solve_batch(ctx, Xc, max_iter, state)
        iters = max(iters, it)
        worst = max(worst, float(viol.max()))
        n_bad += int((viol > tol).sum())
        idx_np = idx.cpu().numpy()
        val_np = val.to(torch.float64).cpu().numpy()
        pr, pc = np.nonzero((idx_np < d_z) & (val_np > 0))
        nnz_total += pr.size
        if sparse_output:
            rows_l.append(idx_np[pr, pc])
            cols_l.append(pr + s)
            vals_l.append(val_np[pr, pc])
        else:
            Zt[pr + s, idx_np[pr, pc]] = val_np[pr, pc]

    if sparse_output:
        import scipy.sparse as sp

        rows = np.concatenate(rows_l) if rows_l else np.zeros(0, dtype=np.int64)
        cols = np.concatenate(cols_l) if cols_l else np.zeros(0, dtype=np.int64)
        vals = np.concatenate(vals_l) if vals_l else np.zeros(0)
        Z = sp.csc_array((vals, (rows, cols)), shape=(d_z, N))
    else:
        Z = Zt.T
    return ExactCodes(
        Z=Z,
        kkt_violation=worst,
        iterations=iters,
        converged=bool(worst <= tol),
        seconds=time.perf_counter() - t0,
        tol=tol,
        n_unconverged=n_bad,
        mean_support=nnz_total / N if N else 0.0,
    )
