"""Exact non-negative lasso codes for a fixed dictionary and bias (docs/theory.md §1).

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
quantity (KKT-z) constrains (g = 0 on the support, g ≤ 0 off it). Points are processed in
batches: one matmul X̃ᵀW per batch gives q (the one product no exact method avoids; the compiled
CPU phase A computes it in float32 only, with a rigorous bound on its error, and each q_j it
needs exactly in float64), then every step works on the (d_z+1)² Gram matrix (a zero "null atom" pads index sets to a common
width; built once per call, in mirrored blocks) and on each point's guessed support F, held as a
padded index set; small systems are grouped in chunks of similar width.

Phase A (almost every point). On the CPU in float64 it runs in compiled code, one point at a time
(:mod:`dictcheck.solvers.active_set`: Lawson–Hanson with block additions on a candidate set that
starts as the point's top-12 atoms of q, the same screened full check with exact violations, and
the same hand-over to phases B and C; RESULTS.md §3 has its timings against the batched version
and scikit-learn). The batched version, described next,
runs on CUDA and in float32. Principal pivoting / semismooth Newton on all atoms with limited
additions (primal–dual active set). Start from a guessed support F: the warm start's (``init``),
otherwise F = ∅, z = 0. Each step solves G_FF z_F = q_F (batched Cholesky), which also gives the
exact gradient on F, g_F = q_F − G_FF z_F, and checks (KKT-z) off F with a *screened* gradient:
g̃ = q − Gz computed in float32 (sparse codes times the float32 Gram matrix, or the residual
route) with a rigorous bound B_i on its rounding error (``_screen_bound``: the standard
dot-product error bound, Higham §3.1). An atom with g̃ − B > eps certainly violates; when a point
has none and z_F ≥ 0, every atom with g̃ > −B is re-evaluated exactly in float64 (the others
have g ≤ 0 for certain), so the violation recorded is exact, never assumed. A point is done when
z ≥ 0 and the relative violation is ≤ tol. Otherwise the members with z < 0 leave F and the atoms
with the largest g̃ > eps enter (at most max(8, ⌈|F|/4⌉), keeping |F| ≤ min(D, d_z)). A point
whose only defect is accuracy on F gets a Newton refinement z_F += G_FF⁻¹ g_F. With random
dictionaries a point needs about 4–6 solves from the cold start, one from its exact support.
Pivoting can cycle, so a point whose total violation Σ(g̃)₊ + Σ(−z)₊ stalls for 5 steps (or is
still open after 30) goes to phase B.

Phase B (finite termination when atoms are independent). Working sets: solve the problem
restricted to the working set exactly by block principal pivoting (Júdice & Pires 1994; Kim &
Park 2011: full exchanges while the number of infeasible indices drops, else Murty's single
exchange, finite for positive definite G_WW), check (KKT-z) over all atoms, keep the support and
add at most max(8, |support|) violators. The support stays and a violator enters, so the
objective strictly decreases and no support repeats.

Phase C (any W, including duplicate or dependent atoms and supports of size D). Per point,
scipy's Lawson–Hanson NNLS on the least-distance dual: the optimal residual is the projection
of x̃ onto {r : Wᵀr ≤ λ1}; min ‖u‖ s.t. −Wᵀu ≥ q (u = r − x̃) is solved through
min_{w≥0} ‖[−W; qᵀ] w − e_{D+1}‖, and z = w / (1 − qᵀw) (Lawson & Hanson 1974, ch. 23).

Every reported violation is measured with the final codes (exactly in the working dtype where it
can be positive; the float32 screen only certifies atoms whose g is ≤ 0 with its rounding
bound), never assumed. The result is exact up to rounding: typically 1e-13 to 1e-15 for phases A and
B, ~1e-11 for phase C. Runs in float64 by default; ``device`` may name a CUDA device (written
for it, tested on CPU only; phase C always runs on the CPU).
"""

from __future__ import annotations

import math
import time
import warnings
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.scaling import canonical_scale

__all__ = ["ExactCodes", "exact_codes", "kkt_violation"]


# --------------------------------------------------------------------------------------------
# Standalone KKT measure (numpy)
# --------------------------------------------------------------------------------------------


def kkt_violation(
    W: ArrayLike,
    Z: ArrayLike,
    X: ArrayLike,
    b: ArrayLike,
    lam: float,
    *,
    tau_act: float = 0.0,
    chunk: int = 4096,
) -> float:
    """Relative KKT violation of codes Z for fixed (W, b) (docs/theory.md §1, KKT-z).

    With r_i = x_i − b − W z_i, returns

        max_{i,d} { |w_dᵀ r_i − λ|/λ  if z_di > 0 ;  (w_dᵀ r_i − λ)₊/λ  if z_di = 0 },

    i.e. spec's ``kkt_violation`` (max |φ_id − 1| on the support, (φ_id − 1)₊ off it) when the
    atoms have unit norm. Atoms may have any norm. The support is z_di > tau_act (default 0:
    exactly z_di > 0, right for the exact codes of :func:`exact_codes`). Codes from an
    interior-point solver carry tiny positive entries on inactive atoms; pass a threshold such as
    spec's τ_act = 1e-6 · max z for them (the entries still enter the residual).
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
    tau = float(tau_act)
    if not math.isfinite(tau) or tau < 0.0:
        raise ValueError(f"tau_act must be finite and ≥ 0; got {tau_act!r}")
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
        v = np.where(Zc > tau, np.abs(g), np.maximum(g, 0.0))
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
        Largest number of full KKT checks (outer iterations: phase A steps, phase B steps,
        plus one for the phase C fallback) any batch needed; bounded by ``max_iter``.
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
# Compiled phase A: each point's candidate set starts as its this many top atoms of q. Since the
# kernel reads G_CC once per joining atom (2026-12-02), 12 and 8 beat 16 by 4 % on the RESULTS §3
# problem and tie on the large one (paired rounds; 24: 12 % slower). Before that, 16 beat 8, 24,
# 32 and 48; 0, C grown by the screen alone, was 1.5× slower.
_CANDIDATES = 12
# Phase B: at most this many working-set iterations before the per-point fallback (phase C).
_PHASE_B_ITERS = 10
# Phase A hands a point to phase B when its count of infeasible indices stalls this long.
_STALL = 5
# Chunks of (n, k, k) systems: at most this many entries, similar widths (see _chunks).
_CHUNK_ENTRIES = 1 << 20
_CHUNK_SLACK = 0.1
_CHUNK_MIN = 128
# Gram matrix blocks (atoms per block) in _make_ctx.
_GRAM_BLOCK = 2048


@dataclass
class _Ctx:
    """Per-call constants. ``Gz`` is the Gram matrix with a zero row and column appended: index
    d_z is the *null atom* used to pad working sets to a common width. ``Gs``, ``Ws``, ``WTs``
    are the copies used for screened gradients (float32 when ``u_screen`` > 0, else the working
    tensors themselves); ``u_screen`` is their unit roundoff (0: screening is exact)."""

    W: torch.Tensor  # (D, d_z)
    WT: torch.Tensor  # (d_z, D), contiguous
    Gz: torch.Tensor  # (d_z + 1, d_z + 1)
    Gs: torch.Tensor  # (d_z, d_z)
    Ws: torch.Tensor  # (D, d_z)
    WTs: torch.Tensor  # (d_z, D)
    u_screen: float
    cmax2: float  # largest squared atom norm
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


def _make_ctx(Wn: NDArray, lam: float, tol: float, dev: torch.device, dtype: torch.dtype) -> _Ctx:
    """Per-call constants for the dictionary Wn (D, d_z) (see :class:`_Ctx`).

    The Gram matrix is built in blocks of _GRAM_BLOCK atoms, upper blocks only and mirrored, so
    it is exactly symmetric, costs half a GEMM and needs no full-size temporary (d_z = 16384:
    2 GiB in float64). Screened gradients run in float32 with rigorous rounding bounds
    (:func:`_screen_bound`) when the working dtype is float64 and float32 products are true
    IEEE float32 products (no TF32 / bf16 shortcuts, which torch allows below the "highest"
    matmul precision); otherwise the screening copies are the working tensors (bound 0).
    """
    D, d_z = Wn.shape
    Wt = torch.as_tensor(Wn, device=dev).to(dtype)  # (D, d_z)
    Gz = torch.zeros(d_z + 1, d_z + 1, dtype=dtype, device=dev)
    for i in range(0, d_z, _GRAM_BLOCK):
        ie = min(d_z, i + _GRAM_BLOCK)
        for j in range(i, d_z, _GRAM_BLOCK):
            je = min(d_z, j + _GRAM_BLOCK)
            blk = Wt[:, i:ie].T @ Wt[:, j:je]
            if i == j:  # symmetrised in place: one write, no second (transposed) copy
                torch.add(blk, blk.T, out=Gz[i:ie, i:ie]).mul_(0.5)
            else:
                Gz[i:ie, j:je] = blk
                Gz[j:je, i:ie] = blk.T
    screen = dtype == torch.float64 and torch.get_float32_matmul_precision() == "highest"
    if dev.type == "cuda":
        screen = screen and not torch.backends.cuda.matmul.allow_tf32
    WT = Wt.T.contiguous()
    if screen:
        Gs, Ws, WTs = Gz[:d_z, :d_z].float(), Wt.float(), WT.float()
    else:
        Gs, Ws, WTs = Gz[:d_z, :d_z], Wt, WT
    return _Ctx(
        W=Wt, WT=WT, Gz=Gz, Gs=Gs, Ws=Ws, WTs=WTs,
        u_screen=2.0**-24 if screen else 0.0,
        cmax2=float(np.max(np.sum(Wn * Wn, axis=0))),
        lam=lam, tol=tol, eps=0.5 * tol * lam,
    )


#: Largest canonical-scale bound on |q| for which the float32 screen is used: far below float32's 3.4e38, so
#: neither q̃ nor the screen's products G̃z overflow (above it every gradient is computed in float64).
_SCREEN_MAX = 1e30


def _at_scale(ctx: _Ctx, X: NDArray, b: NDArray, lam: float, tol: float, sigma: float) -> _Ctx:
    """The per-call constants at the canonical scale (x̃/σ, λ/σ = ``lam``), with the float32 screen switched
    off when the correlations q = Wᵀx̃/σ − λ could exceed :data:`_SCREEN_MAX` (data beyond ~1e30·λ)."""
    ctx = dataclasses.replace(ctx, lam=lam, tol=tol, eps=0.5 * tol * lam)
    if ctx.u_screen and X.size:
        x_max = max(abs(float(X.max())), abs(float(X.min()))) + float(np.abs(b).max(initial=0.0))
        if x_max / sigma * math.sqrt(ctx.D * ctx.cmax2) + lam > _SCREEN_MAX:
            ctx = dataclasses.replace(ctx, Gs=ctx.G, Ws=ctx.W, WTs=ctx.WT, u_screen=0.0)
    return ctx


def _gram_product(
    ctx: _Ctx, idx: torch.Tensor, val: torch.Tensor, screen: bool = False
) -> tuple[torch.Tensor, int]:
    """(G z_i)_i for codes in padded form: atom indices idx (n, K) (null = d_z, each row sorted
    ascending) and values val; with ``screen`` in the screening precision (``ctx.Gs``…).

    Three routes, chosen by a cost model measured on a 2-core CPU: sparse codes times the Gram
    matrix (reads one Gram row per non-zero: ~1 ns per entry while G fits in cache, ~2 ns
    beyond); the residual route (sparse codes times Wᵀ, then a dense GEMM with W: 2·D·d_z
    flops per point); or dense codes times G (d_z² flops per point) when d_z ≤ 2D.
    Returns the product and the number of terms n_t each of its entries sums in floating point
    (K, K + D or d_z), which :func:`_screen_bound` needs.
    """
    n, K = idx.shape
    d_z, D = ctx.d_z, ctx.D
    G, W, WT = (ctx.Gs, ctx.Ws, ctx.WTs) if screen else (ctx.G, ctx.W, ctx.WT)
    val = val.to(G.dtype)
    nz = (idx < d_z) & (val != 0)
    nnz = int(nz.sum())
    if nnz == 0:
        return torch.zeros(n, d_z, dtype=G.dtype, device=val.device), 0
    per_entry = 2 if 8 * d_z * d_z > (16 << 20) else 1
    gram_route = nnz * 20 * per_entry < n * min(4 * D, 2 * d_z)
    if gram_route or 2 * D < d_z:
        counts = nz.sum(dim=1)
        crow = torch.zeros(n + 1, dtype=torch.int64, device=idx.device)
        crow[1:] = torch.cumsum(counts, 0)
        # Rows of idx are sorted (every index set here goes through torch.sort), so the
        # row-major non-zeros already have sorted columns within each row, as CSR requires.
        r, c = nz.nonzero(as_tuple=True)
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            Zs = torch.sparse_csr_tensor(
                crow, idx[r, c], val[r, c], size=(n, d_z), check_invariants=False
            )
        if gram_route:
            return torch.sparse.mm(Zs, G), K
        return torch.sparse.mm(Zs, WT) @ W, K + D  # (W z_i)ᵀ rows, then Wᵀ(W z_i)
    Zd = torch.zeros(n, d_z + 1, dtype=G.dtype, device=val.device)
    # scatter_add: the padding slots (value 0) never overwrite a real entry
    Zd.scatter_add_(1, idx, torch.where(nz, val, torch.zeros_like(val)))
    return Zd[:, :d_z] @ G, d_z


def _gradient(ctx: _Ctx, Q: torch.Tensor, F: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """g = q − Gz = Wᵀr − λ1 per row, as (m, d_z + 1) with −inf in the null column."""
    m = Q.shape[0]
    g = torch.empty(m, ctx.d_z + 1, dtype=Q.dtype, device=Q.device)
    torch.sub(Q, _gram_product(ctx, F, z)[0], out=g[:, : ctx.d_z])
    g[:, ctx.d_z] = -math.inf
    return g


def _screen_bound(ctx: _Ctx, n_terms: int, z: torch.Tensor, qmax: torch.Tensor) -> torch.Tensor:
    """Rigorous bound B_i ≥ |g̃_id − g_id| for every atom d of the screened gradient of a row.

    g̃ = fl(fl(q) − fl(Gz)) with q, G, z rounded to the screening precision (unit roundoff u) and
    each entry of Gz a sum of n_t products. The standard dot-product bound (Higham, *Accuracy
    and Stability of Numerical Algorithms*, §3.1, any summation order, with or without FMA),
    |fl(Σ a_j b_j) − Σ a_j b_j| ≤ γ_{n+2} Σ |a_j b_j| with γ_m = m u / (1 − m u) (the +2 covers
    rounding the two inputs), and Σ_j |G_dj| z_j ≤ ‖w_d‖ max_j‖w_j‖ ‖z‖₁ ≤ c² ‖z‖₁ (also for
    the residual route, whose two products nest: γ_K + γ_D + γ_Kγ_D ≤ γ_{K+D}), give
    |g̃_d − g_d| ≤ γ_{n_t+2} c²‖z‖₁ + u|q_d| + u|g̃_d| ≤ (γ_{n_t+2} + 2u)(c²‖z‖₁ + max_d|q_d|)
    to first order; the factor 2 returned covers the second-order terms with a wide margin, and
    (n_t + 4)·2⁻¹⁴⁹ the absolute error of gradual underflow (the model above assumes none).
    Overflow gives inf or nan in g̃, which no test below passes (such rows reach the exact
    phase B). 0 when screening is exact (``u_screen`` = 0).
    """
    u = ctx.u_screen
    if u == 0.0:
        return torch.zeros(z.shape[0], dtype=qmax.dtype, device=z.device)
    m = n_terms + 2
    gamma = m * u / (1.0 - m * u)
    l1 = z.abs().sum(dim=1).to(qmax.dtype)
    return 2.0 * (gamma + 2.0 * u) * (ctx.cmax2 * l1 + qmax) + (m + 2) * 2.0**-149


def _screened_gradient(
    ctx: _Ctx, Qs: torch.Tensor, qmax: torch.Tensor, F: torch.Tensor, z: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Screened gradient g̃ ≈ q − Gz of rows (F, z) with the bound B of :func:`_screen_bound`.

    Returns (g̃, B): g̃ (m, d_z + 1) in the screening precision with −inf on the members of F
    and in the null column (the off-support view used to find violators), B (m,) with
    |g̃_id − g_id| ≤ B_i for every atom off F.
    """
    S, n_terms = _gram_product(ctx, F, z, screen=True)
    g = torch.empty(F.shape[0], ctx.d_z + 1, dtype=S.dtype, device=S.device)
    torch.sub(Qs, S, out=g[:, : ctx.d_z])
    del S
    g[:, ctx.d_z] = -math.inf
    g.scatter_(1, F, -math.inf)
    return g, _screen_bound(ctx, n_terms, z, qmax)


def _exact_gradient_at(
    ctx: _Ctx, Q: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, F: torch.Tensor,
    z: torch.Tensor,
) -> torch.Tensor:
    """g = q_{rows, cols} − Σ_k G[cols, F_k] z_k in the working dtype, one value per pair; Q is
    (n, d_z) and the codes (F, z) have one row per pair."""
    stride = ctx.d_z + 1
    Gp = ctx.Gz.reshape(-1).index_select(0, (cols.unsqueeze(1) * stride + F).reshape(-1))
    return Q[rows, cols] - (Gp.reshape(F.shape) * z).sum(dim=1)


def _pinv_solve(M: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """Least-squares / minimum-norm solve of symmetric PSD systems via eigh (rank-deficient ok)."""
    evals, evecs = torch.linalg.eigh(M)
    cutoff = evals.abs().amax(dim=-1, keepdim=True) * (M.shape[-1] * torch.finfo(M.dtype).eps)
    inv = torch.where(evals > cutoff, 1.0 / evals, torch.zeros_like(evals))
    coef = (evecs.transpose(-1, -2) @ rhs.unsqueeze(-1)).squeeze(-1) * inv
    return (evecs @ coef.unsqueeze(-1)).squeeze(-1)


def _spd_solve(
    M: torch.Tensor, rhs: torch.Tensor, refine: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched solve of symmetric positive (semi)definite systems M z = rhs, (n, k, k), (n, k).

    Cholesky with two triangular solves (optionally one step of iterative refinement); systems
    whose factorisation fails (singular: linearly dependent atoms) use an eigen-pseudo-inverse.
    Returns (z, singular) with singular (n,) marking the systems that needed the fallback.
    """
    L, info = torch.linalg.cholesky_ex(M)

    def chol_solve(v: torch.Tensor) -> torch.Tensor:
        y = torch.linalg.solve_triangular(L, v, upper=False)
        return torch.linalg.solve_triangular(L.mT, y, upper=True)

    b = rhs.unsqueeze(-1)
    z = chol_solve(b)
    if refine:
        z = z + chol_solve(b - M @ z)
    z = z.squeeze(-1)
    bad = (info != 0) | ~torch.isfinite(z).all(dim=1)
    if bool(bad.any()):
        bi = bad.nonzero().squeeze(1)
        z[bi] = _pinv_solve(M[bi], rhs[bi])
    return z, bad


def _gather_systems(ctx: _Ctx, F: torch.Tensor) -> torch.Tensor:
    """G_FF for padded index sets F (n, k); null slots become identity rows/columns."""
    n, k = F.shape
    stride = ctx.d_z + 1
    Fi = F.to(torch.int32) if stride * stride < 2**31 else F  # int32 indices gather faster
    flat = (Fi.unsqueeze(2) * stride + Fi.unsqueeze(1)).reshape(-1)
    M = ctx.Gz.reshape(-1).index_select(0, flat).reshape(n, k, k)
    M.diagonal(dim1=1, dim2=2).add_((F == ctx.d_z).to(M.dtype))
    return M


def _chunks(widths: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Split points, sorted by working-set width, into chunks of similar width.

    A chunk's systems are padded to its largest width k and the factorisation costs ~k³, so a
    chunk closes when its width would exceed (1 + _CHUNK_SLACK)·(first width) + 2 (once it
    holds _CHUNK_MIN points) or when it would hold more than _CHUNK_ENTRIES entries n·k².
    """
    m = widths.numel()
    order = torch.argsort(widths, stable=True)
    w_sorted = widths[order].tolist()
    out = []
    pos = 0
    while pos < m:
        k_first = max(1, w_sorted[pos])
        k_lim = int((1.0 + _CHUNK_SLACK) * k_first) + 2
        end = pos + 1
        k_c = k_first
        while end < m:
            k_next = max(1, w_sorted[end])
            if (end - pos + 1) * k_next * k_next > _CHUNK_ENTRIES:
                break
            if k_next > k_lim and end - pos >= _CHUNK_MIN:
                break
            k_c = k_next
            end += 1
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
            F = torch.where(keep, F, torch.full_like(F, self.ctx.d_z))
            self.parts.append((pts, F, torch.where(keep, z, torch.zeros_like(z))))
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


def _solve_sets(ctx: _Ctx, Q0: torch.Tensor, rows: torch.Tensor, F: torch.Tensor,
                refine: torch.Tensor, z_old: torch.Tensor, gF_old: torch.Tensor):
    """z_F = G_FF⁻¹ q_F per row (Cholesky, chunks of similar width), or for the rows marked
    ``refine`` (F unchanged) the Newton step z ← z_old + G_FF⁻¹ g_F(z_old). Also returns the
    exact gradient on F, g_F = q_F − G_FF z_F (0 in null slots). Q0 is q with a zero null
    column, rows the rows of Q0 that the rows of F belong to."""
    null = ctx.d_z
    m, K = F.shape
    z = torch.zeros(m, K, dtype=Q0.dtype, device=Q0.device)
    gF = torch.zeros_like(z)
    any_ref = bool(refine.any())
    flat_rows = rows * (null + 1)
    for sel, k in _chunks((F < null).sum(dim=1)):
        Fc = F[sel, :k]
        M = _gather_systems(ctx, Fc)
        q = torch.take(Q0, flat_rows[sel].unsqueeze(1) + Fc)
        rf = refine[sel] if any_ref else None
        if rf is not None and bool(rf.any()):
            rhs = torch.where(rf.unsqueeze(1), gF_old[sel, :k], q)
            zc = _spd_solve(M, rhs)[0]
            zc = torch.where(rf.unsqueeze(1), z_old[sel, :k] + zc, zc)
        else:
            zc = _spd_solve(M, q)[0]
        zc = torch.where(Fc < null, zc, torch.zeros_like(zc))
        z[sel, :k] = zc
        gF[sel, :k] = q - (M @ zc.unsqueeze(-1)).squeeze(-1)
    return z, gF


def _phase_a(
    ctx: _Ctx, Q: torch.Tensor, Qs: torch.Tensor, qmax: torch.Tensor, F: torch.Tensor, T: int,
    res: _Results,
):
    """Semismooth-Newton / principal pivoting on all atoms, adding few violators per step.

    State: a guessed support F per point (padded, sorted; the initial guess F0 is given) and
    z_F = G_FF⁻¹ q_F (z may be negative), with g_F = q_F − G_FF z_F exact. Each step checks
    (KKT-z) off F with the screened gradient g̃ and its bound B (:func:`_screened_gradient`):
    a point with an atom at g̃ − B > eps certainly violates; for the others every atom with
    g̃ > −B is evaluated exactly (the rest have g ≤ 0 for certain), so the violation recorded
    is exact. Then F-members with z < 0 leave F and the atoms with the largest g̃ > eps enter
    (at most max(8, |F|/4), keeping |F| ≤ min(D, d_z)). Points whose only defect is accuracy
    on the support get a Newton refinement step on the same F. A point whose total violation
    Σ(g̃)₊ + Σ(−z)₊ has not reached a new minimum for ``_STALL`` steps (cycling) is handed to
    phase B, as is every point left after T checks.
    Returns ([(pts, F, z), ...] handed over, number of checks used).
    """
    null = ctx.d_z
    n = Q.shape[0]
    dev, dt = Q.device, Q.dtype
    Q0 = torch.cat([Q, torch.zeros(n, 1, dtype=dt, device=dev)], dim=1)  # null atom → rhs 0
    pts = torch.arange(n, device=dev)
    refine = torch.zeros(n, dtype=torch.bool, device=dev)
    z_old = gF_old = None
    best = torch.full((n,), math.inf, dtype=dt, device=dev)
    stall = torch.zeros(n, dtype=torch.long, device=dev)
    handed: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    used = 0
    for t in range(1, T + 1):
        used = t
        z, gF = _solve_sets(ctx, Q0, pts, F, refine, z_old, gF_old)
        g, B = _screened_gradient(ctx, Qs[pts], qmax[pts], F, z)
        valid = F < null
        has_neg = (valid & (z < 0)).any(dim=1)
        zeros_K = torch.zeros_like(gF)
        sup_err = torch.where(valid & (z > 0), gF.abs(), zeros_K).amax(dim=1)
        mem_off = torch.where(valid & (z == 0), gF, zeros_K).amax(dim=1)  # members at 0
        off_s = g.amax(dim=1).to(dt)
        cand = (~has_neg) & (off_s - B <= ctx.eps)  # no certain violator
        off = off_s.clamp_min(0.0) + B  # upper bound; exact on the candidates below
        if bool(cand.any()):
            ci = cand.nonzero().squeeze(1)
            r, c = (g[ci].to(dt) > -B[ci].unsqueeze(1)).nonzero(as_tuple=True)
            rows = ci[r]
            ge = _exact_gradient_at(ctx, Q, pts[rows], c, F[rows], z[rows]) if rows.numel() else None
            off_c = torch.zeros(ci.numel(), dtype=dt, device=dev)
            if ge is not None:
                off_c.scatter_reduce_(0, r, ge.clamp_min(0.0), "amax")
                g[rows, c] = ge.to(g.dtype)  # exact values for choosing violators
            off[ci] = off_c
        kkt = torch.maximum(torch.maximum(sup_err, mem_off), off) / ctx.lam
        fin = cand & (kkt <= ctx.tol)
        if bool(fin.any()):
            res.add(pts[fin], F[fin], z[fin], kkt[fin])
        viol = g.clamp_min(0.0).sum(dim=1).to(dt) + (-z).clamp_min(0.0).sum(dim=1)
        improved = viol < best
        best = torch.where(improved, viol, best)
        stall = torch.where(improved, torch.zeros_like(stall), stall + 1)
        kept = torch.where(valid & (z >= 0), F, torch.full_like(F, null))
        n_kept = (kept < null).sum(dim=1)
        n_add = torch.clamp(torch.ceil(_ADD_FRAC * n_kept).long(), min=_ADD_MIN)
        n_add = torch.minimum(n_add, (ctx.rank_cap - n_kept).clamp_min(0))
        refine = cand & (~fin) & (torch.maximum(off, mem_off) <= ctx.eps)
        stuck = (~has_neg) & (~refine) & (n_add == 0)
        out = (~fin) & ((stall >= _STALL) | stuck)
        if t == T:
            out = ~fin
        if bool(out.any()):
            handed.append((pts[out], F[out], z[out]))
        keep = ~(fin | out)
        if not bool(keep.any()):
            break
        if not bool(keep.all()):
            pts, F, z, gF, kept, g = pts[keep], F[keep], z[keep], gF[keep], kept[keep], g[keep]
            best, stall, refine, n_add = best[keep], stall[keep], refine[keep], n_add[keep]
        add = _top_violators(ctx, g, torch.where(refine, torch.zeros_like(n_add), n_add))
        del g
        F_new = _sort_sets(torch.cat([kept, add], dim=1), null)
        if bool(refine.any()):
            # refined points keep F unchanged (same sorted order): align old z and g_F to width K
            K = F_new.shape[1]
            pad = max(0, K - z.shape[1])
            z_old = torch.nn.functional.pad(z, (0, pad))[:, :K]
            gF_old = torch.nn.functional.pad(gF, (0, pad))[:, :K]
        F = F_new
    return handed, used


def _phase_a_batched(ctx: _Ctx, Q: torch.Tensor, F0: torch.Tensor, T: int, res: _Results):
    """:func:`_phase_a` with its screening inputs made from q: q in the screening precision and each row's
    max |q_d| for the rounding bound (CUDA and float32; the CPU in float64 runs :func:`_phase_a_compiled`)."""
    qmax = torch.maximum(Q.amax(dim=1), -Q.amin(dim=1)) if ctx.u_screen else Q[:, 0]
    return _phase_a(ctx, Q, Q.to(ctx.Gs.dtype), qmax, F0, T, res)


def _correlation_bound(ctx: _Ctx, Xc: torch.Tensor) -> np.ndarray:
    """(n,) bounds e_i ≥ max_j |q̃_ij − q_ij| for q̃ = fl(fl(X̃) fl(W) − λ) in the screening
    precision (unit roundoff u; 0 when the screen is exact). Products of D terms with rounded
    inputs: |fl(x̃ᵀw) − x̃ᵀw| ≤ γ_{D+2} |x̃|ᵀ|w| ≤ γ_{D+2} ‖x̃‖ ‖w‖ (Higham 2002, §3.1; Cauchy–Schwarz),
    then the subtraction of fl(λ) adds ≤ 2u‖x̃‖‖w‖ + 3uλ, and subnormal rounding ≤ (D + 2)·2⁻¹⁴⁹
    (the same underflow term as :func:`_screen_bound`). ‖w‖ ≤ √c2 over all atoms."""
    u = ctx.u_screen
    n, D = Xc.shape
    if u == 0.0:
        return np.zeros(n)
    gamma = (D + 2) * u / (1.0 - (D + 2) * u)
    norms = torch.linalg.vector_norm(Xc, dim=1).numpy() * (1.0 + 1e-12)  # float64 norm, inflated
    return (gamma + 2.0 * u) * norms * math.sqrt(ctx.cmax2) + 3.0 * u * ctx.lam + (D + 2) * 2.0**-149


def _compiled_inputs(ctx: _Ctx, Xc: torch.Tensor, F0: torch.Tensor, T: int) -> tuple:
    """The arguments of :func:`dictcheck.solvers.active_set.solve_points` for the centred points
    Xc (n, D), float64 on the CPU: q̃ = X̃W − λ in the screening precision, its bound, and each
    point's top-_CANDIDATES atoms of q̃ (:func:`dictcheck.solvers.row_topk.topk_rows`)."""
    from dictcheck.solvers.row_topk import topk_rows

    n = Xc.shape[0]
    lam = ctx.lam  # the λ of q = X̃W − λ, for the screen's q̃ and the kernel's exact q_j alike
    Qs = torch.mm(Xc.to(ctx.Ws.dtype), ctx.Ws).sub_(lam).numpy()
    m = min(ctx.d_z, _CANDIDATES)
    cand = np.empty((n, m), dtype=np.int64)
    topk_rows(Qs, m, np.empty((n, m), dtype=Qs.dtype), cand)
    return (ctx.Gz.numpy(), ctx.Gs.numpy(), Qs, Xc.numpy(), ctx.WT.numpy(), lam, _correlation_bound(ctx, Xc),
            F0.numpy(), cand, ctx.eps, ctx.tol * ctx.lam, ctx.rank_cap, T, ctx.u_screen, ctx.cmax2)


def _phase_a_compiled(ctx: _Ctx, Xc: torch.Tensor, F0: torch.Tensor, T: int, res: _Results):
    """Phase A on the CPU in float64: :func:`dictcheck.solvers.active_set.solve_points`, one point at
    a time in compiled code, from the guess F0 and each point's top-_CANDIDATES atoms of q
    (:func:`dictcheck.solvers.row_topk.topk_rows`). The correlations X̃W − λ are computed in the
    screening precision only (float32: half the float64 GEMM's time, measured 6 against 11 ms per
    1000 points of the RESULTS §3 problem), within :func:`_correlation_bound` of the exact ones,
    which the kernel adds to its screen's bound; every q_j it uses exactly it computes in float64
    from x̃ and w_j. Same contract as :func:`_phase_a`: finished points go to ``res`` with their
    exact violation, the others are returned as [(pts, F, z)] for phase B. Returns (handed over,
    most full checks of a point)."""
    from dictcheck.solvers.active_set import solve_points

    null = ctx.d_z
    n = Xc.shape[0]
    idx, val, viol, checks, ok = solve_points(*_compiled_inputs(ctx, Xc, F0, T))
    width = max(1, int((idx < null).sum(axis=1).max())) if idx.size else 1
    F = torch.from_numpy(idx[:, :width])
    z = torch.from_numpy(val[:, :width])
    done = torch.from_numpy(ok)
    pts = torch.arange(n)
    res.add(pts[done], F[done], z[done], torch.from_numpy(viol)[done] / ctx.lam)
    handed = [] if bool(done.all()) else [(pts[~done], F[~done], z[~done])]
    return handed, int(checks.max()) if checks.size else 0


# --------------------------------------------------------------------------------------------
# Phase B (fallback, finite termination): working sets with exact block principal pivoting
# --------------------------------------------------------------------------------------------


def _bpp(
    H: torch.Tensor, q: torch.Tensor, F0: torch.Tensor, eps: float, max_inner: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block principal pivoting for min_{z≥0} ½zᵀHz − qᵀz on a batch of small dense problems.

    H (n, K, K) symmetric PSD, q (n, K), F0 (n, K) initial guess of the support. Padding slots
    must have H row/column 0, H_kk = 1 and q_k < 0 (they are then never selected).
    Feasibility: z_F ≥ 0 and g = q − Hz ≤ eps off F. Full exchanges while the number of
    infeasible indices decreases (3 tries otherwise), then Murty's single exchange of the
    largest infeasible index: finite termination for positive definite H (Júdice & Pires 1994,
    Kim & Park 2011). Returns (z ≥ 0, failed): failed marks problems that met a singular H_FF
    (linearly dependent atoms, where the guarantee does not hold) or ran out of pivots.
    """
    n, K = q.shape
    dev = q.device
    z_out = torch.zeros_like(q)
    failed = torch.zeros(n, dtype=torch.bool, device=dev)
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
        za, sing = _spd_solve(M, qa * f, refine=True)
        za = za * f
        ga = qa - (Ha @ za.unsqueeze(-1)).squeeze(-1)
        infeas = (Fa & (za < 0)) | (~Fa & (ga > eps))
        nv = infeas.sum(dim=1)
        ok = (nv == 0) & ~sing
        stop = ok | sing | torch.full_like(ok, it == max_inner)
        if bool(stop.any()):
            z_out[act[stop]] = za[stop].clamp_min(0.0)
            failed[act[stop & ~ok]] = True
        go = ~stop
        if not bool(go.any()):
            break
        act, Fa, infeas, nv = act[go], Fa[go], infeas[go], nv[go]
        b_best, b_budget = best[act], budget[act]
        improved = nv < b_best
        full = improved | (b_budget > 0)
        best[act] = torch.where(improved, nv, b_best)
        budget[act] = torch.where(improved, torch.full_like(b_budget, 3), b_budget - 1)
        last_slot = (infeas.long() * slot).argmax(dim=1)
        single = torch.zeros_like(infeas)
        single[torch.arange(act.numel(), device=dev), last_slot] = True
        F[act] = Fa ^ torch.where(full.unsqueeze(1), infeas, single)
    return z_out, failed


def _solve_working_sets(
    ctx: _Ctx, Qm: torch.Tensor, ws: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact NNQP restricted to each point's working set ws (m, K) (null padded, sorted).

    Qm is q with an extra column −1 for the null atom. Returns (z ≥ 0 aligned with ws, failed).
    """
    null = ctx.d_z
    m, K = ws.shape
    z_out = torch.zeros(m, K, dtype=Qm.dtype, device=Qm.device)
    failed = torch.zeros(m, dtype=torch.bool, device=Qm.device)
    widths = (ws < null).sum(dim=1)
    for sel, k in _chunks(widths):
        Fc = ws[sel, :k]
        H = _gather_systems(ctx, Fc)
        q = torch.gather(Qm[sel], 1, Fc)
        z, fl = _bpp(H, q, Fc < null, ctx.eps, max_inner=max(50, 3 * k))
        z_out[sel, :k] = torch.where(Fc < null, z, torch.zeros_like(z))
        failed[sel] = fl
    return z_out, failed


def _phase_b(
    ctx: _Ctx, Q: torch.Tensor, pts: torch.Tensor, ws: torch.Tensor, T: int, res: _Results
):
    """Working-set loop with exact subproblem solves (finite when the solves are exact).

    Each step solves the problem restricted to the working set exactly (``_bpp``), checks
    (KKT-z) over all atoms, and keeps the support plus at most max(8, |support|) violators
    (|working set| ≤ min(D, d_z)). The previous support stays and a violator enters, so the
    objective strictly decreases and no support repeats. Points whose working-set problem is
    degenerate (singular G_FF) or whose support already has min(D, d_z) atoms, and points left
    after T steps, are returned as [(pts, F, z)] for phase C. Returns (left, checks used).
    """
    null = ctx.d_z
    used = 0
    left: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    minus_one = torch.full((Q.shape[0], 1), -1.0, dtype=Q.dtype, device=Q.device)
    Qm_all = torch.cat([Q, minus_one], dim=1)  # the null atom gets q = −1: never selected
    for t in range(1, T + 1):
        used = t
        z_ws, failed = _solve_working_sets(ctx, Qm_all[pts], ws)
        F = torch.where(z_ws > 0, ws, torch.full_like(ws, null))
        F, order = torch.sort(F, dim=1)
        z = torch.gather(z_ws, 1, order)
        k = max(1, int((F < null).sum(dim=1).max()))
        F, z = F[:, :k].contiguous(), z[:, :k].contiguous()
        z = torch.where(F < null, z, torch.zeros_like(z))
        g = _gradient(ctx, Q[pts], F, z)
        kkt, _, _, _, g_out = _kkt(ctx, g, F, z)
        fin = kkt <= ctx.tol
        res.add(pts[fin], F[fin], z[fin], kkt[fin])
        n_supp = (F < null).sum(dim=1)
        full_rank = n_supp >= ctx.rank_cap
        out = (~fin) & (failed | full_rank | torch.full_like(fin, t == T))
        if bool(out.any()):
            left.append((pts[out], F[out], z[out]))
        keep = ~(fin | out)
        if not bool(keep.any()):
            break
        pts, F, g_out, n_supp = pts[keep], F[keep], g_out[keep], n_supp[keep]
        # at most max(8, |S|) violators, keeping |WS| ≤ min(D, d_z)
        n_add = torch.minimum(torch.clamp(n_supp, min=8), ctx.rank_cap - n_supp)
        add = _top_violators(ctx, g_out, n_add)
        ws = _sort_sets(torch.cat([F, add], dim=1), null)
    return left, used


# --------------------------------------------------------------------------------------------
# Phase C (last resort, any W): Lawson–Hanson NNLS on the least-distance dual, per point
# --------------------------------------------------------------------------------------------


def _ldp_codes(W: NDArray, q: NDArray) -> NDArray:
    """Exact codes of one point from the least-distance form of (P_i) (Lawson & Hanson, ch. 23).

    The optimal residual is the projection r = P_C(x̃) onto C = {r : Wᵀr ≤ λ1}: with u = r − x̃
    this is min ‖u‖ s.t. −Wᵀu ≥ q. Its NNLS dual min_{w≥0} ‖[−W; qᵀ] w − e_{D+1}‖ gives
    z = w / (1 − qᵀw) ≥ 0 and r = x̃ − Wz. Lawson–Hanson keeps the passive columns linearly
    independent, so duplicate or dependent atoms and supports of size D are handled exactly.
    """
    from scipy.optimize import nnls

    D, d_z = W.shape
    # E stacks −W (the atoms' scale) on qᵀ (the data's): NNLS loses accuracy as ‖q‖² when the two differ, so
    # the program is solved for q/α (its codes are z/α: homogeneity, docs/theory.md §1.1), α a power of two
    # near max |q| (exact).
    alpha = canonical_scale(float(np.max(np.abs(q)))) if np.any(q) else 1.0
    E = np.empty((D + 1, d_z))
    E[:D] = -W
    E[D] = q / alpha
    f = np.zeros(D + 1)
    f[D] = 1.0
    w, _ = nnls(E, f, maxiter=max(100, 50 * d_z))
    den = 1.0 - float(E[D] @ w)
    if not (den > 0.0 and np.isfinite(den)):  # cannot happen: C contains r with Wᵀr = 0 ≤ λ
        return np.zeros(d_z)
    return w * (alpha / den)


def _phase_c(ctx: _Ctx, Q: torch.Tensor, pts: torch.Tensor, res: _Results) -> None:
    """Per-point exact fallback (scipy NNLS on CPU, float64) for the points phase B leaves."""
    if pts.numel() == 0:
        return
    Wn = ctx.W.detach().to("cpu", torch.float64).numpy()
    Qn = Q[pts].detach().to("cpu", torch.float64).numpy()
    Zc = np.stack([_ldp_codes(Wn, Qn[j]) for j in range(Qn.shape[0])])  # (m, d_z)
    z_t = torch.as_tensor(Zc, device=Q.device).to(Q.dtype)
    k = max(1, int((z_t > 0).sum(dim=1).max()))
    val, idx = torch.topk(z_t, k, dim=1)
    F = torch.where(val > 0, idx, torch.full_like(idx, ctx.d_z))
    F, order = torch.sort(F, dim=1)
    z = torch.where(F < ctx.d_z, torch.gather(val, 1, order), torch.zeros_like(val))
    g = _gradient(ctx, Q[pts], F, z)
    kkt = _kkt(ctx, g, F, z)[0]
    res.add(pts, F, z, kkt)


def _record_clipped(ctx: _Ctx, Q: torch.Tensor, groups, res: _Results) -> None:
    """Out of iterations: record the feasible point z₊ of each unfinished point with its KKT."""
    for pts, F, z in groups:
        z = z.clamp_min(0.0)
        g = _gradient(ctx, Q[pts], F, z)
        res.add(pts, F, z, _kkt(ctx, g, F, z)[0])


def _concat_groups(groups, null: int):
    pts = torch.cat([h[0] for h in groups])
    K = max(int(h[1].shape[1]) for h in groups)
    pad = torch.nn.functional.pad
    F = torch.cat([pad(h[1], (0, K - h[1].shape[1]), value=null) for h in groups])
    z = torch.cat([pad(h[2], (0, K - h[2].shape[1]), value=0.0) for h in groups])
    return pts, F, z


def _as_guess(init: ArrayLike, d_z: int, N: int):
    """Validate a warm-start guess (d_z, N) (dense, torch or scipy.sparse; its non-zero entries
    are the guessed supports) and return a function (s, e) -> dense float64 columns s:e."""
    import scipy.sparse as sp

    if sp.issparse(init):
        A = sp.csc_array(init)
        if A.nnz and not np.all(np.isfinite(A.data)):
            raise ValueError("init contains non-finite values (nan or inf)")
    else:
        A = init.detach().cpu().numpy() if isinstance(init, torch.Tensor) else np.asarray(init)
        A = A if A.dtype == np.bool_ else _as_float64_matrix(A, "init")
    if A.shape != (d_z, N):
        raise ValueError(f"init must have shape (d_z, N) = ({d_z}, {N}); got {A.shape}")
    if sp.issparse(A):
        return lambda s, e: A[:, s:e].toarray().astype(np.float64, copy=False)
    return lambda s, e: np.asarray(A[:, s:e], dtype=np.float64)


def _guess_sets(ctx: _Ctx, cols: NDArray, dev) -> torch.Tensor:
    """Padded index sets from guessed codes (d_z, n): the non-zero entries of each column, at
    most min(D, d_z) of them (those of largest |value|), sorted, null-padded."""
    A = torch.as_tensor(np.ascontiguousarray(np.abs(cols).T), device=dev)  # (n, d_z)
    k = int((A > 0).sum(dim=1).max()) if A.numel() else 0
    k = max(1, min(k, ctx.rank_cap))
    val, idx = torch.topk(A, k, dim=1, sorted=False)
    return _sort_sets(torch.where(val > 0, idx, torch.full_like(idx, ctx.d_z)), ctx.d_z)


def _solve_batch(ctx: _Ctx, Xc: torch.Tensor, max_iter: int, F0: torch.Tensor | None):
    """Codes for one batch of centred points Xc (n, D), starting from the support guess F0
    (padded index sets; None: the cold start F0 = ∅, z = 0, from which the first step adds the
    _ADD_MIN largest violators): padded (idx, val), violations, checks."""
    n = Xc.shape[0]
    null = ctx.d_z
    if F0 is None:
        F0 = torch.full((n, 1), null, dtype=torch.long, device=Xc.device)
    res = _Results(n, ctx, Xc.device, Xc.dtype)
    T = min(max_iter, _PHASE_A_ITERS)
    Q = None
    if Xc.device.type == "cpu" and Xc.dtype == torch.float64:
        handed, used = _phase_a_compiled(ctx, Xc, F0, T, res)
    else:
        Q = (Xc @ ctx.W).sub_(ctx.lam)  # q_i = Wᵀx̃_i − λ1, (n, d_z); in place: no second (n, d_z) tensor
        handed, used = _phase_a_batched(ctx, Q, F0, T, res)
    if handed and Q is None:  # the fallbacks work on the float64 correlations
        Q = (Xc @ ctx.W).sub_(ctx.lam)
    if handed and used < max_iter:
        pts, F, z = _concat_groups(handed, null)
        ws = _sort_sets(F, null)
        handed, used_b = _phase_b(ctx, Q, pts, ws, min(max_iter - used, _PHASE_B_ITERS), res)
        used += used_b
    if handed:
        if used < max_iter:
            used += 1
            _phase_c(ctx, Q, _concat_groups(handed, null)[0], res)
        else:
            _record_clipped(ctx, Q, handed, res)
    idx, val, viol = res.padded()
    return idx, val, viol, used


# --------------------------------------------------------------------------------------------
# Main entry point
# --------------------------------------------------------------------------------------------


def _guided_segments(N: int, B: int, workers: int, floor: int = 256) -> list[tuple[int, int]]:
    """Segments for ``workers`` threads taking them in order as they come free: each holds
    ⌈remaining / (2·workers)⌉ points (guided self-scheduling), at most B and at least ``floor``,
    so the last segments are small and the workers finish together (equal segments left one
    worker alone with up to a whole segment at the end)."""
    segments = []
    s = 0
    while s < N:
        size = min(B, max(floor, math.ceil((N - s) / (2 * workers))))
        segments.append((s, min(N, s + size)))
        s += size
    return segments


def _default_batch(D: int, d_z: int) -> int:
    # A batch holds X̃ (B, D), q (B, d_z) and a few (B, d_z) gradient buffers. 8 MB per
    # (B, d_z) float64 buffer: buffers of 32 MB and more are mmap-ed afresh by glibc on every
    # allocation (its largest dynamic threshold), whose page faults cost ~15 % of the run on
    # the §3 problem of benchmarks/RESULTS.md at B = 4096.
    return int(max(256, min(8192, (1 << 20) // max(d_z, D, 1))))


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
    workers: int | None = None,
    init: ArrayLike | None = None,
) -> ExactCodes:
    """Exact non-negative lasso codes for fixed (W, b): objective (1) of docs/theory.md §1.

    Solves, independently for every point i (column of X),

        z_i = argmin_{z ≥ 0} ‖x_i − b − W z‖² + 2λ‖z‖₁

    for any dictionary W (atoms of any norm; zero atoms get zero codes), i.e. the codes that
    minimise objective (1) with W and b held fixed (spec §1, "Codes for fixed (W, b)"). The
    result satisfies (KKT-z) to relative accuracy ``tol``: see :func:`kkt_violation` for the
    exact measure. This is the same minimiser as scikit-learn's
    ``sparse_encode(X.T, W.T, algorithm='lasso_cd', alpha=λ, positive=True)`` (½‖r‖² + λ‖z‖₁).

    Algorithm (module docstring): an active-set method on all atoms (phase A: compiled and per
    point on the CPU in float64, batched principal pivoting otherwise), then, for the rare points
    it does not finish, a working-set method with exact block-principal-pivoting subproblem solves that terminates finitely (phase B).
    Both use the Gram matrix WᵀW and one correlation matmul X̃ᵀW per batch.

    Parameters
    ----------
    W : (D, d_z) dictionary, atoms as columns.  X : (D, N) data, points as columns.
    b : (D,) bias.  lam : λ > 0 of objective (1) (penalty 2λ‖z‖₁).
    tol : target relative KKT violation (default 1e-8, relative to λ).
    max_iter : maximum number of full KKT checks (outer iterations) per batch. If the target is
        not reached, the result has ``converged=False`` and reports the violation reached (no
        error); callers decide.
    batch_size : points per batch (default about 2²² / max(d_z, D), between 256 and 8192,
        smaller when several workers share the points). Memory is O(workers · batch_size ·
        (D + d_z)) plus the (d_z + 1)² Gram matrix.
    device, dtype : torch device and floating dtype of the computation (float64 by default).
        float32 reaches a relative KKT violation of about 1e-5 only: use tol ≥ 1e-5 with it,
        otherwise every point runs through the slow fallbacks and ends with converged=False.
    progress : show a tqdm progress bar over batches.
    sparse_output : return Z as a scipy.sparse.csc_array (d_z, N) instead of a dense array.
        The default is a dense float64 array of d_z·N·8 bytes (3.3 GB for 10⁵ × 4096), which
        the caller must be able to hold; codes are sparse, so ``sparse_output=True`` is the
        memory-efficient choice for large problems.
    init : optional warm start, (d_z, N) dense array, torch tensor or scipy.sparse matrix whose
        non-zero entries in column i are a guess of point i's support (for example an SAE
        encoder's active latents, or the codes of a previous batch; values are used only to
        keep the min(D, d_z) largest |entries| of an overfull column). The guess replaces the
        cold start (z = 0, F = ∅): it changes the time, never the
        answer (the minimiser is unique when the tight atoms are linearly independent; the
        result meets the same KKT tolerance from any guess).
    workers : CPU worker threads that process batches concurrently, each with one torch
        thread (default: ``torch.get_num_threads()`` on CPU, 1 on CUDA; 1 = process batches
        in order with torch's own intra-op threads). During the call torch's thread count is
        set to 1 in the workers and restored afterwards. The first 256 points are solved first
        and fix the initial support-guess width for all other batches, so the result does not
        depend on ``workers`` or on the scheduling (up to last-bit BLAS differences).

    Returns
    -------
    ExactCodes with Z (d_z, N), kkt_violation, iterations, converged, seconds, tol,
    n_unconverged, mean_support.

    Raises
    ------
    ValueError for bad shapes, non-finite inputs, λ ≤ 0, tol ≤ 0, max_iter < 1, batch_size < 1
    or an unsupported dtype. Deterministic for a given input, device and thread count.
    """
    return CodeSolver(W, device=device, dtype=dtype).codes(
        X, b, lam, tol=tol, max_iter=max_iter, batch_size=batch_size, progress=progress,
        sparse_output=sparse_output, workers=workers, init=init)


class CodeSolver:
    """:func:`exact_codes` for one dictionary W (D, d_z) and many calls (data, λ, bias, warm start): the
    Gram matrix WᵀW (2 GiB and a few seconds at d_z = 16 384) is built once, here. ValueError for a W
    that :func:`exact_codes` refuses."""

    def __init__(self, W: ArrayLike, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64) -> None:
        Wn = _as_float64_matrix(W, "W")
        D, d_z = Wn.shape
        if D == 0 or d_z == 0:
            raise ValueError(f"W must have at least one row and one atom; got shape {Wn.shape}")
        if dtype not in (torch.float64, torch.float32):
            raise ValueError(f"dtype must be torch.float64 or torch.float32; got {dtype!r}")
        self.W, self.device, self.dtype = Wn, torch.device(device), dtype
        self._ctx = _make_ctx(Wn, 1.0, 1.0, self.device, dtype)

    def codes(
        self,
        X: ArrayLike,
        b: ArrayLike,
        lam: float,
        *,
        tol: float = 1e-8,
        max_iter: int = 100,
        batch_size: int | None = None,
        progress: bool = False,
        sparse_output: bool = False,
        workers: int | None = None,
        init: ArrayLike | None = None,
    ) -> ExactCodes:
        """The exact codes of X (D, N) at (b, λ): the parameters and result of :func:`exact_codes`."""
        t0 = time.perf_counter()
        Wn, dev, dtype = self.W, self.device, self.dtype
        D, d_z = Wn.shape
        Xn = _as_float64_matrix(X, "X")
        if Xn.shape[0] != D:
            raise ValueError(
                f"X must have shape (D, N) = ({D}, N) with points as columns; got {Xn.shape}"
            )
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
        if workers is not None and (
            isinstance(workers, bool) or int(workers) != workers or workers < 1
        ):
            raise ValueError(f"workers must be a positive integer or None; got {workers!r}")
        from dictcheck.solvers.active_set import write_rows

        # The canonical scale (theory.scaling, docs/theory.md §1.1): x̃ and λ divided by the power of two σ nearest
        # λ, the codes multiplied by σ at the end; exact, so the result is homogeneous by construction.
        sigma = canonical_scale(lam)
        ctx = _at_scale(self._ctx, Xn, bv, lam / sigma, tol, sigma)
        N = Xn.shape[1]
        init_cols = None if init is None else _as_guess(init, d_z, N)
        B = int(batch_size) if batch_size is not None else _default_batch(D, d_z)
        bt = torch.as_tensor(bv / sigma, device=dev).to(dtype)

        if sparse_output:
            rows_l: list[np.ndarray] = []
            cols_l: list[np.ndarray] = []
            vals_l: list[np.ndarray] = []
        else:
            Zt = np.zeros((N, d_z), dtype=np.float64)

        # Every point is solved from its own guess alone, so the result does not depend on the
        # batches or on their processing order.
        if workers is None:
            workers = torch.get_num_threads() if dev.type == "cpu" else 1
        if batch_size is None and workers > 1 and N > 0:
            segments = _guided_segments(N, B, workers)
        else:
            segments = [(s, min(N, s + B)) for s in range(0, N, B)]
        workers = max(1, min(workers, len(segments)))

        worst = 0.0
        iters = 0
        n_bad = 0
        nnz_total = 0

        def run(seg):
            """Solve one segment; dense codes are written into its rows of Zt here, in compiled
            code without the GIL, so the output's page faults and scatter run in the workers."""
            s, e = seg
            Xc = torch.as_tensor(np.multiply(Xn[:, s:e].T, 1.0 / sigma, order="C"), device=dev).to(dtype) - bt
            F0 = None if init_cols is None else _guess_sets(ctx, init_cols(s, e), dev)
            idx, val, viol, it = _solve_batch(ctx, Xc, max_iter, F0)
            idx_np = idx.cpu().numpy()
            val_np = val.to(torch.float64).cpu().numpy() * sigma
            if sparse_output:
                pr, pc = np.nonzero((idx_np < d_z) & (val_np > 0))
                return (idx_np[pr, pc], pr + s, val_np[pr, pc]), pr.size, viol, it
            return None, write_rows(Zt, s, idx_np, val_np), viol, it

        def collect(out):
            nonlocal worst, iters, n_bad, nnz_total
            entries, nnz, viol, it = out
            iters = max(iters, it)
            worst = max(worst, float(viol.max()))
            n_bad += int((viol > tol).sum())
            nnz_total += nnz
            if sparse_output:
                rows_l.append(entries[0])
                cols_l.append(entries[1])
                vals_l.append(entries[2])

        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(segments), desc="exact_codes", unit="batch")
        if workers > 1:
            # One torch thread per worker: the per-point steps are many small kernels, which
            # scale better across batches than inside one (measured: ~1.3× on 2 cores).
            from concurrent.futures import ThreadPoolExecutor

            n_threads = torch.get_num_threads()
            try:
                pool = ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,))
                with pool:
                    for out in pool.map(run, segments):
                        collect(out)
                        if bar is not None:
                            bar.update(1)
            finally:
                torch.set_num_threads(n_threads)
        else:
            for sg in segments:
                collect(run(sg))
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()

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
