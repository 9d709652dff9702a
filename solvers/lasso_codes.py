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

Algorithm (:class:`CodeSolver`)
-------------------------------
Memory grows with d_z·D (the atoms as stored rows, :class:`~dictcheck.solvers.atom_rows.AtomRows`) and with
the batch of points; neither the Gram matrix WᵀW nor a dense (N, d_z) array is ever formed. Points are
processed in batches; each keeps a small candidate set C of atoms, the Gram block G_CC and q_C = W_Cᵀx̃ − λ
among them (each entry computed once), and its support P ⊆ C. Rounds alternate:

1. **Solve on C** (:func:`dictcheck.solvers.active_set.solve_on_candidates`, compiled, one point at a time in
   worker threads): Lawson–Hanson from the previous support gives the exact minimiser restricted to C, its
   residual r_i and the exact gradient g_P = W_Pᵀr_i − λ on the support.
2. **Check every atom** (:class:`~dictcheck.solvers.atom_rows.Screen`): h̃_ij ≈ w_jᵀr_i for all atoms, one
   product of the batch's residuals with the atoms in bfloat16 or float32, with a rigorous bound E_i on its
   error. Every atom with h̃_ij > λ − E_i is re-evaluated in float64; the others certainly have
   g_ij = w_jᵀr_i − λ < 0. So each point's violation max(‖g_P‖_∞, max_{j∉P} (g_ij)₊)/λ is exact, never
   assumed.
3. A point is done when its violation is ≤ tol. Otherwise its largest exact violators outside C (at most
   max(16, |P|)) join C and the next round solves on the larger set.

The cold start (no guess) is the check at z = 0 (h = Wᵀx̃); a warm start (``init``, a guess of each point's
support) starts C and P from the guess. A point whose candidates outgrow its batch's capacity continues in
a batch of twice the capacity. Points the compiled solver cannot finish (G_PP not numerically positive
definite: duplicate or linearly dependent atoms; cycling) continue with the same rounds but an exact
least-distance solve on C: the optimal residual is the projection of x̃ onto {r : W_Cᵀr ≤ λ1}, and
min ‖u‖ s.t. −W_Cᵀu ≥ q_C (u = r − x̃) is solved through scipy's Lawson–Hanson NNLS,
min_{w≥0} ‖[−W_C; q_Cᵀ] w − e_{D+1}‖, z = w / (1 − q_Cᵀw) (Lawson & Hanson 1974, ch. 23), which handles
dependent atoms and supports of size D.

A point's candidates grow by its own exact violators only, so the codes do not depend on the batches, the
threads, the screen's precision or the warm start (the minimiser is unique when the atoms of its support are
linearly independent); typically 1e-13 to 1e-15 relative violation. Deterministic for a given input and
machine. ``device="cuda"`` runs the screening products on the GPU; the per-point solves run on the CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from numpy.typing import ArrayLike, NDArray

from dictcheck.solvers.active_set import STATUS_OPTIMAL, classify_pairs, solve_on_candidates, write_rows
from dictcheck.solvers.atom_rows import U_FP32, AtomRows, exact_products, run_in_threads, screen_pairs
from dictcheck.theory.scaling import canonical_scale

__all__ = ["CodeSolver", "ExactCodes", "exact_codes", "kkt_violation"]


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
# Rounds: solve on the candidates, check every atom, grow the candidates
# --------------------------------------------------------------------------------------------

# At most max(_JOIN_MIN, |P|) of a point's largest exact violators outside C join C per check.
_JOIN_MIN = 16
_JOIN_DIV = 4
# A first batch's candidate capacity: the widest guess plus _CAP_SLACK, at least _CAP_MIN; a point that
# outgrows it continues in a batch of twice the capacity, up to _CAP_MAX (beyond: the exact fallback).
_CAP_MIN = 128
_CAP_SLACK = 64
# The cold start's first candidates: each point's this many largest screened correlations.
_COLD_CANDIDATES = 32
_CAP_MAX = 4096
# A batch holds at most this many entries of Gram blocks and as many of their Cholesky factors (n·M² float64
# each: 64 MiB).
_GRAM_ENTRIES = 1 << 23

def _join_count(k: NDArray[np.int64], count: NDArray[np.int64]) -> NDArray[np.int64]:
    """How many of a point's ``count`` violators outside C join C, with |P| = k."""
    return np.maximum(np.maximum(_JOIN_MIN, k), count // _JOIN_DIV)


#: The Gram matrix of a dictionary and its float32 copy are cached for the solves when they fit in this many
#: bytes (d_z ≤ 4729): a fixed cap, so memory never grows like d_z² (module docstring).
GRAM_CACHE_BYTES = 256 << 20

# A point's state in its batch.
_ACTIVE, _DONE, _FALLBACK, _OVERFLOW = 0, 1, 2, 3


def exact_violations(atoms: AtomRows, R: NDArray[np.float64], lam: float, workers: int = 1,
                     ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
    """Every (i, j) the screen cannot rule out of g_ij = w_jᵀr_i − λ > 0 (module docstring, step 2), with g_ij
    in float64: (rows, atoms, g); the other atoms certainly have g_ij < 0."""
    lam_n = np.full(R.shape[0], lam)
    pairs = screen_pairs(atoms, R, above=lam_n, scale=lam_n)
    return pairs.rows, pairs.atoms, exact_products(atoms, R, pairs.rows, pairs.atoms, workers) - lam


def top_screened(atoms: AtomRows, R: NDArray[np.float64], m: int) -> NDArray[np.int64]:
    """For each row r_i, the m atoms of largest screened h̃_ij ≈ w_jᵀr_i (−1 where fewer than m are positive),
    ordered by atom: a block of atoms at a time, the running top m merged with each block's (never the whole
    (n, d_z) product)."""
    screen = atoms.fast_screen()
    Rhat, _, _ = screen.prepare(R)
    best_v = torch.full((R.shape[0], 0), -np.inf, device=Rhat.device)
    best_j = torch.zeros((R.shape[0], 0), dtype=torch.int64, device=Rhat.device)
    for j0, H in screen.blocks(Rhat, atoms.block_atoms):
        v, j = torch.topk(H.float(), min(m, H.shape[1]), dim=1)
        best_v, order = torch.topk(torch.cat([best_v, v], dim=1), min(m, best_v.shape[1] + v.shape[1]), dim=1)
        best_j = torch.gather(torch.cat([best_j, j + j0], dim=1), 1, order)
    best_j = torch.where(best_v > 0, best_j, torch.full_like(best_j, -1))
    return np.sort(best_j.cpu().numpy(), axis=1)


@dataclass
class _Batch:
    """Per-point state of a batch of points (module docstring): candidates C[:, :nC] (their Gram block G and
    q filled for the first ``filled``), support P (local indices into C) with codes zP and the Cholesky factor
    L of G_PP (valid where ``factored``), residual R, exact support gradient gP, the compiled solver's
    status, the exact absolute violation, checks done, state."""

    pts: NDArray[np.int64]
    X: NDArray[np.float64]
    C: NDArray[np.int64]
    nC: NDArray[np.int64]
    filled: NDArray[np.int64]
    G: NDArray[np.float64]
    q: NDArray[np.float64]
    L: NDArray[np.float64]
    factored: NDArray[np.bool_]
    P: NDArray[np.int64]
    zP: NDArray[np.float64]
    k: NDArray[np.int64]
    R: NDArray[np.float64]
    gP: NDArray[np.float64]
    status: NDArray[np.int8]
    viol: NDArray[np.float64]
    checks: NDArray[np.int64]
    state: NDArray[np.int8]

    @classmethod
    def start(cls, pts: NDArray[np.int64], X: NDArray[np.float64], guesses: list[NDArray[np.int64]],
              supports: list[NDArray[np.int64]], codes: list[NDArray[np.float64]], M: int,
              checks: NDArray[np.int64]) -> _Batch:
        """A batch whose point t starts with candidates guesses[t] (global atoms) and support supports[t] ⊆ it
        (local indices) with codes codes[t] (0 for a guess)."""
        n, D = X.shape
        b = cls(pts=pts, X=X, C=np.zeros((n, M), np.int64), nC=np.zeros(n, np.int64), filled=np.zeros(n, np.int64),
                G=np.empty((n, M, M)), q=np.empty((n, M)), L=np.empty((n, M, M)), factored=np.zeros(n, np.bool_), P=np.zeros((n, M), np.int64), zP=np.zeros((n, M)),
                k=np.zeros(n, np.int64), R=np.empty((n, D)), gP=np.zeros((n, M)), status=np.zeros(n, np.int8),
                viol=np.full(n, np.inf), checks=checks.copy(), state=np.zeros(n, np.int8))
        for t in range(n):
            g = guesses[t]
            b.C[t, :g.size] = g
            b.nC[t] = g.size
            s = supports[t]
            b.P[t, :s.size] = s
            b.zP[t, :s.size] = codes[t]
            b.k[t] = s.size
        return b

    def grown(self, rows: NDArray[np.int64], M: int) -> _Batch:
        """The points ``rows`` of this batch with their whole state, in a batch of candidate capacity M."""
        n, m = rows.size, self.M
        b = _Batch.start(self.pts[rows], self.X[rows], [np.zeros(0, np.int64)] * n, [np.zeros(0, np.int64)] * n,
                         [np.zeros(0)] * n, M, self.checks[rows])
        b.C[:, :m], b.P[:, :m], b.zP[:, :m], b.gP[:, :m] = self.C[rows], self.P[rows], self.zP[rows], self.gP[rows]
        b.G[:, :m, :m], b.q[:, :m], b.L[:, :m, :m] = self.G[rows], self.q[rows], self.L[rows]
        for name in ("nC", "filled", "factored", "k", "R", "viol"):
            getattr(b, name)[:] = getattr(self, name)[rows]
        return b

    @property
    def M(self) -> int:
        return int(self.C.shape[1])

    def support(self, t: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        k = self.k[t]
        return self.C[t, self.P[t, :k]], self.zP[t, :k]


class CodeSolver:
    """:func:`exact_codes` for one dictionary and many calls (data, λ, bias, warm start): the atoms as stored
    rows (:class:`~dictcheck.solvers.atom_rows.AtomRows`) and their screening copies are made once, here.
    ``W`` (D, d_z) as :func:`exact_codes` takes it, or ``atoms`` (an SAE decoder's unit atoms, memory-mapped
    in their stored dtype). ValueError for a W that :func:`exact_codes` refuses."""

    def __init__(self, W: ArrayLike | None = None, *, atoms: AtomRows | None = None,
                 device: str | torch.device = "cpu") -> None:
        if (W is None) == (atoms is None):
            raise ValueError("give exactly one of W and atoms")
        if atoms is None:
            Wn = _as_float64_matrix(W, "W")
            if Wn.shape[0] == 0 or Wn.shape[1] == 0:
                raise ValueError(f"W must have at least one row and one atom; got shape {Wn.shape}")
            atoms = AtomRows.from_columns(Wn, device)
        self.atoms = atoms
        self.device = atoms.device
        self._gram: tuple[NDArray[np.float64], NDArray[np.float32]] | None = None

    def gram(self) -> tuple[NDArray[np.float64], NDArray[np.float32]] | None:
        """(G, Gs): the Gram matrix of the atoms (exactly symmetric) and its float32 copy, when both fit
        :data:`GRAM_CACHE_BYTES` (built once), else None."""
        d_z = self.atoms.n_atoms
        if self._gram is None and 12 * d_z * d_z <= GRAM_CACHE_BYTES:
            Wt = torch.from_numpy(self.atoms.unit_block(0, d_z))
            G = (Wt @ Wt.T).numpy()
            G = np.ascontiguousarray(np.triu(G) + np.triu(G, 1).T)
            self._gram = (G, G.astype(np.float32))
        return self._gram

    @property
    def W(self) -> NDArray[np.float64]:
        """The atoms as columns (D, d_z) float64 (d_z·D floats: for small dictionaries)."""
        return self.atoms.columns()

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
        D, d_z = self.atoms.dim, self.atoms.n_atoms
        Xn = _as_float64_matrix(X, "X")
        if Xn.shape[0] != D:
            raise ValueError(f"X must have shape (D, N) = ({D}, N) with points as columns; got {Xn.shape}")
        bv = _as_bias(b, D)
        lam = _as_lambda(lam)
        tol = _as_positive_float(tol, "tol")
        max_iter = _as_positive_int(max_iter, "max_iter")
        batch_size = None if batch_size is None else _as_positive_int(batch_size, "batch_size")
        workers = torch.get_num_threads() if workers is None else _as_positive_int(workers, "workers")
        N = Xn.shape[1]
        guess = None if init is None else _as_guess(init, d_z, N)
        # The canonical scale (theory.scaling, docs/theory.md §1.1): x̃ and λ divided by the power of two σ nearest
        # λ, the codes multiplied by σ at the end; exact, so the result is homogeneous by construction.
        sigma = canonical_scale(lam)
        lam_s, b_s = lam / sigma, bv / sigma
        gram = self.gram()
        rounds = _Rounds(self.atoms, np.zeros((0, 0)) if gram is None else gram[0], lam_s, tol, max_iter, workers)
        width = 0 if guess is None else int(np.diff(guess.indptr).max(initial=0))
        M = int(min(d_z, max(_CAP_MIN, min(width, D) + _CAP_SLACK)))
        B = batch_size or int(max(64, min(4096, _GRAM_ENTRIES // (M * M))))
        bar = _progress_bar(progress, N)
        out = _Collected(N, d_z, sparse_output)
        for s in range(0, N, B):
            e = min(N, s + B)
            pts = np.arange(s, e)
            Xc = np.multiply(Xn[:, s:e].T, 1.0 / sigma, order="C") - b_s
            guesses = [np.zeros(0, np.int64)] * (e - s) if guess is None else _guess_rows(guess, s, e, min(M, D))
            if gram is not None:
                pts, Xc, guesses = _gram_pass(self.atoms, gram, Xc, pts, guesses, rounds, out)
            if pts.size:
                rounds.run(pts, Xc, guesses, M, out)
            bar.update(e - s)
        bar.close()
        return out.result(tol, lam_s, sigma, time.perf_counter() - t0)


# The float32 screen with the Gram matrix cached is used while the correlations and the screen's products stay
# below this (far below float32's 3.4e38); beyond it the checks run in float64.
_SCREEN_MAX = 1e30
# With the Gram matrix cached, each point's first candidates are its top this many atoms of q̃.
_CANDIDATES = 12
# ... and its candidate capacity at most this (C's local Gram block: 32 MiB per thread).
_GRAM_CAP = 2048


def _gram_pass(atoms: AtomRows, gram: tuple[NDArray[np.float64], NDArray[np.float32]], Xc: NDArray[np.float64],
               pts: NDArray[np.int64], guesses: list[NDArray[np.int64]], rounds: _Rounds, out: _Collected,
               ) -> tuple[NDArray[np.int64], NDArray[np.float64], list[NDArray[np.int64]]]:
    """The points' codes with the Gram matrix cached (:func:`~dictcheck.solvers.active_set.solve_points_gram`:
    one compiled call per point, checks of all atoms through Gram rows): the points it finishes go to ``out``;
    returns the others (points, centred rows, their supports so far as guesses) for the rounds. q̃ = X̃Wᵀ − λ
    comes from the float32 screen, within eq_i = E_i + 2u(ρ_i‖r̂_i‖ max‖w‖(1 + rel) + λ) of q (the screen's
    bound plus the float32 rounding of the subtraction)."""
    from dictcheck.solvers.active_set import solve_points_gram
    from dictcheck.solvers.row_topk import topk_rows

    G, Gs = gram
    lam, d_z, D = rounds.lam, atoms.n_atoms, atoms.dim
    screen = atoms.screen("fp32")
    Rhat, rho, E = screen.prepare(Xc)
    H = torch.cat([h for _, h in screen.blocks(Rhat, atoms.block_atoms)], dim=1).double().numpy()
    rhat_norm = np.linalg.norm(Xc, axis=1) / rho
    q_bound = rho * rhat_norm * screen.wmax * (1.0 + screen.rel) + lam
    if float(q_bound.max(initial=0.0)) * screen.wmax * D < _SCREEN_MAX:
        Qs = (H * rho[:, None] - lam).astype(np.float32)
        eq = E + 2.0 * U_FP32 * q_bound
        u = U_FP32
    else:  # correlations beyond float32's range: the whole check in float64 (exact, no bound)
        Qs = Xc @ atoms.unit_block(0, d_z).T - lam
        Gs, eq, u = G, np.zeros(Xc.shape[0]), 0.0
    n = pts.size
    m = min(d_z, _CANDIDATES)
    cand = np.empty((n, m), dtype=np.int64)
    topk_rows(Qs, m, np.empty((n, m), dtype=Qs.dtype), cand)
    K = max([g.size for g in guesses] + [1])
    guess = np.full((n, K), d_z, dtype=np.int64)
    for t, g in enumerate(guesses):
        guess[t, :g.size] = g
    cap = int(min(d_z, max(4 * (m + K), 4 * min(D, d_z)), _GRAM_CAP))
    results: list[tuple[int, tuple]] = []

    def part(lo: int, hi: int) -> None:
        results.append((lo, solve_points_gram(G, Gs, Qs[lo:hi], Xc[lo:hi], atoms.rows, atoms.scale, lam, eq[lo:hi],
                                              guess[lo:hi], cand[lo:hi], rounds.eps, rounds.tol * lam,
                                              rounds.max_iter, u, screen.wmax ** 2, cap)))

    run_in_threads(part, n, rounds.workers, parts_per_worker=4)
    left = np.zeros(n, dtype=bool)
    for lo, (idx, val, viol, checks, ok) in results:
        for t in range(idx.shape[0]):
            keep = idx[t] < d_z
            if ok[t]:
                out.add(int(pts[lo + t]), idx[t][keep], val[t][keep], float(viol[t]), int(checks[t]))
            else:
                left[lo + t] = True
                guesses[lo + t] = np.sort(idx[t][keep & (val[t] > 0)])
    rest = np.flatnonzero(left)
    return pts[rest], Xc[rest], [guesses[t] for t in rest]


class _Rounds:
    """The rounds of the module docstring for one call (λ, tol, check budget, worker threads)."""

    def __init__(self, atoms: AtomRows, gram: NDArray[np.float64], lam: float, tol: float, max_iter: int,
                 workers: int) -> None:
        self.atoms, self.gram, self.lam, self.tol, self.max_iter, self.workers = atoms, gram, lam, tol, max_iter, workers
        self.eps = 0.5 * tol * lam

    def run(self, pts: NDArray[np.int64], X: NDArray[np.float64], guesses: list[NDArray[np.int64]], M: int,
            out: _Collected) -> None:
        """Codes of the points pts (centred rows X) from their guessed supports, into ``out``."""
        n = pts.size
        cold = np.flatnonzero([g.size == 0 for g in guesses])
        if cold.size:  # the cold start: each point's largest screened correlations h̃ = w_jᵀx̃ form its first C
            top = top_screened(self.atoms, X[cold], min(M, self.atoms.n_atoms, _COLD_CANDIDATES))
            for t, i in enumerate(cold):
                guesses[i] = top[t][top[t] >= 0]
        batch = _Batch.start(pts, X, guesses, [np.zeros(0, np.int64)] * n, [np.zeros(0)] * n, M,
                             np.zeros(n, np.int64))
        fallback: list[tuple[int, NDArray[np.float64], NDArray[np.int64], int]] = []
        while True:
            self._rounds(batch)
            for t in np.flatnonzero(batch.state == _DONE):
                atoms_t, z_t = batch.support(t)
                out.add(int(batch.pts[t]), atoms_t, z_t, float(batch.viol[t]), int(batch.checks[t]))
            for t in np.flatnonzero(batch.state == _FALLBACK):
                fallback.append((int(batch.pts[t]), batch.X[t], batch.C[t, :batch.nC[t]].copy(), int(batch.checks[t])))
            over = np.flatnonzero(batch.state == _OVERFLOW)
            if over.size == 0:
                break
            M2 = min(self.atoms.n_atoms, 2 * batch.M)
            if M2 > _CAP_MAX or M2 == batch.M:
                for t in over:
                    fallback.append((int(batch.pts[t]), batch.X[t], batch.C[t, :batch.nC[t]].copy(),
                                     int(batch.checks[t])))
                break
            batch = batch.grown(over, M2)
        if fallback:
            self._least_distance(fallback, out)

    def _rounds(self, batch: _Batch) -> None:
        """Solve and check every active point of the batch until each is done, clipped at ``max_iter`` checks
        (kept as done with its measured violation), handed to the fallback, or out of capacity."""
        a = self.atoms
        while True:
            act = np.flatnonzero(batch.state == _ACTIVE)
            if act.size == 0:
                return
            run_in_threads(lambda lo, hi: solve_on_candidates(
                a.rows, a.scale, self.gram, batch.X, self.lam, batch.C, batch.nC, batch.filled, batch.G, batch.q, batch.L, batch.factored, batch.P,
                batch.zP, batch.k, batch.R, batch.gP, batch.status, self.eps, self.tol * self.lam, act, lo, hi),
                act.size, self.workers, parts_per_worker=4)
            broken = act[batch.status[act] != STATUS_OPTIMAL]
            batch.state[broken] = _FALLBACK
            act = act[batch.status[act] == STATUS_OPTIMAL]
            self._check(batch, act)

    def _check(self, batch: _Batch, act: NDArray[np.int64]) -> None:
        """Steps 2–3 of the module docstring for the batch's points ``act``. A point the screen alone proves
        to violate (an atom with h̃ > λ + eps + E) is not evaluated exactly: its candidates grow by its largest
        screened values outside C. For the others every pair the screen cannot rule out is re-evaluated in
        float64, which gives the exact violation and the violators."""
        if act.size == 0:
            return
        d_z, lam = self.atoms.n_atoms, self.lam
        R = batch.R[act]
        lam_n = np.full(act.size, lam)
        pairs = screen_pairs(self.atoms, R, above=lam_n, margin=self.eps, scale=lam_n)
        pi, pj = pairs.rows, pairs.atoms
        last = batch.checks[act] + 1 >= self.max_iter  # the last check measures every point exactly
        proven = (pairs.certain > 0) & ~last
        sure = proven[pi]
        value = pairs.screened - lam  # g̃ on rows with sure violators, exact g on the others
        exact = ~sure
        value[exact] = exact_products(self.atoms, R, pi[exact], pj[exact], self.workers) - lam
        on_support, in_cand, viol = classify_pairs(pi, pj, value, act, batch.C, batch.nC, batch.P, batch.k,
                                                   batch.gP, d_z)
        viol[proven] = np.inf  # not measured: known to exceed eps
        batch.viol[act] = viol
        batch.checks[act] += 1
        done = viol <= self.tol * lam
        clipped = last
        finished = done | clipped
        batch.state[act[finished]] = _DONE
        # the largest violators outside C join C (by exact value, or by screened value where proven)
        v = ~on_support & ~in_cand & (value > self.eps) & ~finished[pi]
        pi, pj, gv = pi[v], pj[v], value[v]
        order = np.lexsort((pj, -gv, pi))
        pi, pj = pi[order], pj[order]
        first = np.searchsorted(pi, np.arange(act.size))
        count = np.searchsorted(pi, np.arange(act.size), side="right") - first
        room = batch.M - batch.nC[act]
        n_join = np.minimum(np.minimum(_join_count(batch.k[act], count), room), count)
        rank = np.arange(pi.size) - first[pi]
        take = rank < n_join[pi]
        rows = act[pi[take]]
        batch.C[rows, batch.nC[rows] + rank[take]] = pj[take]
        batch.nC[act] += n_join
        open_ = ~finished
        batch.state[act[open_ & (count > 0) & (room == 0)]] = _OVERFLOW
        batch.state[act[open_ & (count == 0)]] = _FALLBACK  # nothing outside C to add: only the exact solve helps

    def _least_distance(self, points: list[tuple[int, NDArray[np.float64], NDArray[np.int64], int]],
                        out: _Collected) -> None:
        """The exact fallback (module docstring): rounds of least-distance NNLS solves on C and checks."""
        lam, tol = self.lam, self.tol
        live = [[p, x, np.unique(c), chk] for p, x, c, chk in points]
        while live:
            sols = [_ldp_codes(self.atoms, x, S, lam) for _, x, S, _ in live]
            R = np.stack([x - (z @ self.atoms.unit_rows(S) if S.size else 0.0) for (_, x, S, _), z in zip(live, sols)])
            pi, pj, g = exact_violations(self.atoms, R, lam, self.workers)
            nxt = []
            for t, ((p, x, S, chk), z) in enumerate(zip(live, sols)):
                sel = pi == t
                on = S[z > 0]
                g_t, j_t = g[sel], pj[sel]
                on_mask = np.isin(j_t, on)
                gS = self.atoms.unit_rows(on) @ R[t] - lam if on.size else np.zeros(0)
                viol = max(np.abs(gS).max(initial=0.0), np.maximum(g_t[~on_mask], 0.0).max(initial=0.0))
                chk += 1
                new = j_t[(g_t > self.eps) & ~np.isin(j_t, S)]
                if viol <= tol * lam or chk >= self.max_iter or new.size == 0:
                    out.add(p, on, z[z > 0], float(viol), chk)
                    continue
                top = new[np.argsort(-g_t[(g_t > self.eps) & ~np.isin(j_t, S)], kind="stable")]
                nxt.append([p, x, np.union1d(S, top[:max(_JOIN_MIN, on.size)]), chk])
            live = nxt


def _ldp_codes(atoms: AtomRows, x: NDArray[np.float64], S: NDArray[np.int64], lam: float) -> NDArray[np.float64]:
    """Exact codes of one point restricted to the atoms S, from the least-distance form of (P_i) (module
    docstring): any atoms, dependent or not."""
    from scipy.optimize import nnls

    if S.size == 0:
        return np.zeros(0)
    WS = atoms.unit_rows(S)  # (|S|, D)
    q = WS @ x - lam
    D = x.size
    # E stacks −W_S (the atoms' scale) on qᵀ (the data's): NNLS loses accuracy as ‖q‖² when the two differ, so
    # the program is solved for q/α (its codes are z/α: homogeneity, docs/theory.md §1.1), α a power of two
    # near max |q| (exact).
    alpha = canonical_scale(float(np.max(np.abs(q)))) if np.any(q) else 1.0
    E = np.empty((D + 1, S.size))
    E[:D] = -WS.T
    E[D] = q / alpha
    f = np.zeros(D + 1)
    f[D] = 1.0
    w, _ = nnls(E, f, maxiter=max(100, 50 * S.size))
    den = 1.0 - float(E[D] @ w)
    if not (den > 0.0 and np.isfinite(den)):  # cannot happen: {r : W_Sᵀr ≤ λ} contains r with W_Sᵀr = 0
        return np.zeros(S.size)
    return w * (alpha / den)


class _Collected:
    """The codes of all points as they finish: coordinates for a sparse result, or rows of a dense one."""

    def __init__(self, N: int, d_z: int, sparse_output: bool) -> None:
        self.N, self.d_z, self.sparse = N, d_z, sparse_output
        self.rows: list[NDArray[np.int64]] = []
        self.cols: list[NDArray[np.int64]] = []
        self.vals: list[NDArray[np.float64]] = []
        self.viol = np.zeros(N)
        self.checks = np.zeros(N, np.int64)

    def add(self, point: int, atoms: NDArray[np.int64], values: NDArray[np.float64], viol: float, checks: int) -> None:
        keep = values > 0
        self.rows.append(atoms[keep].astype(np.int64))
        self.cols.append(np.full(int(keep.sum()), point, np.int64))
        self.vals.append(values[keep].astype(np.float64))
        self.viol[point] = viol
        self.checks[point] = checks

    def result(self, tol: float, lam: float, sigma: float, seconds: float) -> ExactCodes:
        """The codes (values times the canonical scale σ they were solved at) and the violations (absolute
        ones at that scale, relative to its λ)."""
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)
        cols = np.concatenate(self.cols) if self.cols else np.zeros(0, np.int64)
        vals = np.concatenate(self.vals) * sigma if self.vals else np.zeros(0)
        Zs = sp.csc_array((vals, (rows, cols)), shape=(self.d_z, self.N))
        Zs.sort_indices()
        if self.sparse:
            Z = Zs
        else:
            Zt = np.zeros((self.N, self.d_z))
            csr = Zs.T.tocsr()
            idx = np.full((self.N, max(1, int(np.diff(csr.indptr).max(initial=0)))), self.d_z, np.int64)
            val = np.zeros(idx.shape)
            for i in range(self.N):
                lo, hi = csr.indptr[i], csr.indptr[i + 1]
                idx[i, :hi - lo] = csr.indices[lo:hi]
                val[i, :hi - lo] = csr.data[lo:hi]
            write_rows(Zt, 0, idx, val)
            Z = Zt.T
        worst = float(self.viol.max(initial=0.0)) / lam
        return ExactCodes(Z=Z, kkt_violation=worst, iterations=int(self.checks.max(initial=0)),
                          converged=bool(worst <= tol), seconds=seconds, tol=tol,
                          n_unconverged=int(np.count_nonzero(self.viol > tol * lam)),
                          mean_support=vals.size / self.N if self.N else 0.0)


def _progress_bar(enabled: bool, total: int):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="exact_codes", unit="pt", unit_scale=True)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _as_positive_float(value: float, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a positive number; got {value!r}") from exc
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be finite and > 0; got {value!r}")
    return v


def _as_positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def _as_guess(init: ArrayLike, d_z: int, N: int) -> sp.csc_array:
    """A warm-start guess (d_z, N) — dense, torch or scipy.sparse; its non-zero entries are the guessed
    supports — as a CSC array with sorted indices. ValueError for the wrong shape or non-finite values."""
    if sp.issparse(init):
        A = sp.csc_array(init).astype(np.float64)
        if A.nnz and not np.all(np.isfinite(A.data)):
            raise ValueError("init contains non-finite values (nan or inf)")
    else:
        A = init.detach().cpu().numpy() if isinstance(init, torch.Tensor) else np.asarray(init)
        if A.dtype != np.bool_:
            A = _as_float64_matrix(A, "init")
        if A.shape != (d_z, N):
            raise ValueError(f"init must have shape (d_z, N) = ({d_z}, {N}); got {A.shape}")
        A = sp.csc_array(A.astype(np.float64))
    if A.shape != (d_z, N):
        raise ValueError(f"init must have shape (d_z, N) = ({d_z}, {N}); got {A.shape}")
    A.eliminate_zeros()
    A.sort_indices()
    return A


def _guess_rows(guess: sp.csc_array, s: int, e: int, cap: int) -> list[NDArray[np.int64]]:
    """Each point's guessed support for points s … e − 1: the atoms of its non-zero entries, at most ``cap``
    of them (those of largest |value|, ties by atom), sorted."""
    out = []
    for i in range(s, e):
        lo, hi = guess.indptr[i], guess.indptr[i + 1]
        atoms, vals = guess.indices[lo:hi].astype(np.int64), np.abs(guess.data[lo:hi])
        if atoms.size > cap:
            atoms = np.sort(atoms[np.lexsort((atoms, -vals))[:cap]])
        out.append(atoms)
    return out


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
    progress: bool = False,
    sparse_output: bool = False,
    workers: int | None = None,
    init: ArrayLike | None = None,
) -> ExactCodes:
    """Exact non-negative lasso codes for fixed (W, b): objective (1) of docs/theory.md §1.

    Solves, independently for every point i (column of X),

        z_i = argmin_{z ≥ 0} ‖x_i − b − W z‖² + 2λ‖z‖₁

    for any dictionary W (atoms of any norm; zero atoms get zero codes), i.e. the codes that minimise
    objective (1) with W and b held fixed (spec §1, "Codes for fixed (W, b)"). The result satisfies (KKT-z)
    to relative accuracy ``tol`` (see :func:`kkt_violation` for the measure), the minimiser of
    scikit-learn's ``sparse_encode(X.T, W.T, algorithm='lasso_cd', alpha=λ, positive=True)``.
    Algorithm: module docstring (rounds of exact solves on candidate atoms and screened checks of all atoms).

    Parameters
    ----------
    W : (D, d_z) dictionary, atoms as columns.  X : (D, N) data, points as columns.
    b : (D,) bias.  lam : λ > 0 of objective (1) (penalty 2λ‖z‖₁).
    tol : target relative KKT violation (default 1e-8, relative to λ).
    max_iter : most checks of all atoms (rounds) per point; a point not within ``tol`` by then keeps its
        feasible codes and measured violation, and the result has ``converged=False`` (no error).
    batch_size : points per batch (default: as many as keep the batch's Gram blocks near 128 MiB, at most
        4096). Memory is O(batch · (D + capacity²)) plus the atoms' screening copy (d_z·D).
    device : torch device of the screening products ("cuda": on the GPU; the solves run on the CPU).
    progress : a tqdm progress bar over the points.
    sparse_output : Z as a scipy.sparse.csc_array (d_z, N) instead of a dense float64 array
        (d_z·N·8 bytes: for large problems use the sparse result).
    init : optional warm start, (d_z, N) dense, torch or scipy.sparse, whose non-zero entries in column i
        are a guess of point i's support (an SAE encoder's active latents, the codes at a nearby λ; values
        only choose the min(D, capacity) largest |entries| of an overfull column). It changes the time,
        never the answer.
    workers : threads of the per-point solves and exact re-evaluations (default torch's thread count).

    Returns
    -------
    ExactCodes with Z (d_z, N), kkt_violation, iterations, converged, seconds, tol, n_unconverged,
    mean_support.

    Raises
    ------
    ValueError for bad shapes, non-finite inputs, λ ≤ 0, tol ≤ 0, max_iter < 1, batch_size < 1 or
    workers < 1. Deterministic for a given input and machine.
    """
    return CodeSolver(W, device=device).codes(
        X, b, lam, tol=tol, max_iter=max_iter, batch_size=batch_size, progress=progress,
        sparse_output=sparse_output, workers=workers, init=init)
