"""Compiled per-point active-set solver for the non-negative lasso in Gram form (docs/theory.md §1).

For one point, with G = WᵀW and q = Wᵀx̃ − λ1, the exact code solves

    min_{z ≥ 0}  ½ zᵀGz − qᵀz ,          g = q − Gz ,  (KKT-z): g = 0 on supp z, g ≤ 0 off it,

problem (P_i)/2 of :mod:`dictcheck.solvers.lasso_codes`. :func:`solve_points` is that module's
phase A on the CPU in float64: the same tolerances, and the points it returns with ``ok`` False go
to its exact fallbacks (phases B and C). Per point, in compiled code (numba, ``nogil``, so the
caller's worker threads run batches in parallel), which removes the per-step Python and batching
overhead of the batched phase A (benchmarks/RESULTS.md §3):

The correlations q come in the screening precision only (q̃, float32, within e of q entrywise:
``lasso_codes._correlation_bound``); every q_j the kernel uses exactly, it computes in float64 as
⟨w_j, x̃⟩ − λ: for the atoms of C when they join it, and for the screen's band.

1. **Candidates.** C = the ``cand`` atoms (the caller's top-M of q̃) ∪ the warm-start guess. The
   Gram block G_CC is kept in a local copy, each entry read from G once, when the later of its
   two atoms joins C; so the restricted gradient w_C = q_C − G_CP z_P is a dense product on
   contiguous rows, and an atom entering P reads nothing from G. |C| is at most
   min(d_z, 4·max(M + K, kcap), _C_CAP) (K the guess width).
2. **Lawson–Hanson on C with block additions** (Lawson & Hanson 1974, ch. 23, in Gram form;
   Bro & De Jong 1997). The iterate z ≥ 0 is optimal on P. Up to max(4, |P|/4) atoms of C with
   the largest w > ``eps`` enter P at once (Cholesky factor of G_PP appended row by row); the
   unconstrained solution s of G_PP s = q_P is taken if s > 0, else z moves to the last feasible
   point on the segment z → s, the atom that reaches 0 first (and every atom with s ≤ 0 that is at
   0) leaves P, and the factor is rebuilt from the first removed row. When a block makes no
   progress, one atom (the largest w) enters alone: the classical single addition. Ends when no
   atom of C has w > ``eps``.
3. **Full check**, over all d_z atoms: the screened gradient g̃ = q̃ − Σ_{t∈P} z_t G[t, :] in the
   precision of ``Gs`` (float32), with the rounding bound of ``lasso_codes._screen_bound`` plus e
   (so B ≥ |g̃ − g| for every atom).
   If the screen alone proves atoms outside C to violate (g̃ > eps + B, so g > eps), the largest
   of them (at most max(8, |P|)) join C and step 2 resumes at once: no exact re-evaluation is
   spent on a check that must fail (measured 12–20 % of the kernel's time, benchmarks/RESULTS.md
   §3). Otherwise every atom with g̃ > −B is re-evaluated exactly in float64, and on P the exact
   g_P = q_P − G_PP z_P, so the recorded violation is exact. The largest exact violators outside
   C (at most max(8, |P|)) join C and step 2 resumes. A point whose only defect is accuracy on P
   gets one Newton step z_P += G_PP⁻¹ g_P. Screen-only checks count towards ``max_checks``.
4. **Hand-over.** ``ok`` is False when G_PP is not numerically positive definite, after
   ``max_checks`` full checks or ``4·kcap + 100`` solves, when C is full, or when a single
   addition stalls with nothing new to add.

Floating point: float64 throughout except the screen and q̃. ``fastmath`` allows only re-association and
fused multiply-adds (so reductions vectorise), never assumptions about NaN or infinities. A point's
result depends only on the point, not on its batch or thread.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from dictcheck.solvers.row_topk import kth_largest

__all__ = ["solve_points", "write_rows"]


_FASTMATH = {"reassoc", "contract"}
_JIT = dict(cache=True, nogil=True, fastmath=_FASTMATH)

# Block additions: at most max(_ADD_MIN, |P| // _ADD_DIV) atoms enter P per Lawson–Hanson step.
_ADD_MIN = 4
_ADD_DIV = 4
# Full check: at most max(_JOIN_MIN, |P|) of the largest violators outside C join C (8 against
# 16: 2 % faster on the RESULTS.md §3 problem, 1 % on the large one, paired rounds).
_JOIN_MIN = 8
# At most this many candidates per point (C full: hand over), so that the local G_CC stays within
# 32 MiB per thread; the RESULTS.md §3 problem ends with |C| ≈ 43, the large one well below.
_C_CAP = 2048


@nb.njit(**_JIT)
def _chol_rows(L, k0, k, P, GCC, inC):
    """Rows k0..k−1 of the Cholesky factor of G_PP, given rows 0..k0−1 (the atoms P[k0:k] appended
    to, or re-entered into, the factor; G_PP read from the local G_CC). Returns the number
    of rows done: k − k0, or the position (from k0) of the first atom whose pivot is not positive
    (dependent on the earlier ones); rows before it are valid.

    Row m is solved against rows 0..k0−1 for all new atoms together, one factor row at a time,
    so their k − k0 substitution chains interleave (the chains, not the arithmetic, bound a single
    row's cost), then against the new rows before it. Each entry is the same sum in the same order
    as one row at a time. L's diagonal holds the reciprocals 1/ℓ_ii, so no substitution divides
    (both measured on the RESULTS.md §3 problem)."""
    for i in range(k0):
        li = L[i]
        r = li[i]
        gi = GCC[inC[P[i]]]
        for m in range(k0, k):
            lm = L[m]
            acc = gi[inC[P[m]]]
            for t in range(i):
                acc -= li[t] * lm[t]
            lm[i] = acc * r
    for m in range(k0, k):
        lm = L[m]
        gm = GCC[inC[P[m]]]
        for i in range(k0, m):
            li = L[i]
            acc = gm[inC[P[i]]]
            for t in range(i):
                acc -= li[t] * lm[t]
            lm[i] = acc * li[i]
        g_diag = gm[inC[P[m]]]
        d = g_diag
        for t in range(m):
            d -= lm[t] * lm[t]
        if not d > 1e-12 * g_diag:
            return m - k0
        lm[m] = 1.0 / math.sqrt(d)
    return k - k0


@nb.njit(inline="always", **_JIT)
def _forward(L, lo, k, rhs, y):
    """Rows lo..k−1 of y = L⁻¹ rhs (rows before lo already hold it)."""
    for i in range(lo, k):
        acc = rhs[i]
        for t in range(i):
            acc -= L[i, t] * y[t]
        y[i] = acc * L[i, i]


@nb.njit(inline="always", **_JIT)
def _backward(L, k, y, out):
    """out = L⁻ᵀ y on the leading k entries, column-oriented (y is overwritten)."""
    for i in range(k - 1, -1, -1):
        v = y[i] * L[i, i]
        out[i] = v
        for t in range(i):
            y[t] -= v * L[i, t]


@nb.njit(**_JIT)
def _chol_solve(L, k, rhs, out, y):
    """out = (L Lᵀ)⁻¹ rhs on the leading k entries (y is scratch)."""
    _forward(L, 0, k, rhs, y)
    _backward(L, k, y, out)


@nb.njit(**_JIT)
def _fill_gram(G, C, lo, hi, GCC):
    """The local Gram block G_CC for the candidates that joined C at local indices lo..hi−1: row
    C[c] of G at C[:c + 1], mirrored (G is exactly symmetric). Each entry of G_CC is read from G
    once, when the later of its two atoms joins C, instead of once per atom entering P (a Gram
    row at all of C) and once per atom joining C (a column at P): ~40 % fewer scattered reads
    of G, measured on the RESULTS.md §3 problem."""
    for c in range(lo, hi):
        row = G[C[c]]
        gc = GCC[c]
        for b in range(c + 1):
            v = row[C[b]]
            gc[b] = v
            GCC[b, c] = v


@nb.njit(inline="always", **_JIT)
def _exact_q(WT, j, x, lam):
    """q_j = ⟨w_j, x̃⟩ − λ in float64 (w_j = row j of WT)."""
    w = WT[j]
    acc = w[0] * x[0]
    for d in range(1, x.shape[0]):
        acc += w[d] * x[d]
    return acc - lam


@nb.njit(**_JIT)
def _exact_qs(WT, C, lo, hi, x, lam, qC):
    """qC[c] = q_j = ⟨w_j, x̃⟩ − λ in float64 for the atoms j = C[c], c = lo..hi−1, four rows of WT
    at a time: their four streams of loads overlap (one row at a time waited on each row's first
    cache misses; measured on the RESULTS.md §3 problem)."""
    for c in range(lo, hi, 4):
        w0 = WT[C[c]]
        w1 = WT[C[min(c + 1, hi - 1)]]
        w2 = WT[C[min(c + 2, hi - 1)]]
        w3 = WT[C[min(c + 3, hi - 1)]]
        a0 = a1 = a2 = a3 = 0.0
        for d in range(x.shape[0]):
            xd = x[d]
            a0 += w0[d] * xd
            a1 += w1[d] * xd
            a2 += w2[d] * xd
            a3 += w3[d] * xd
        qC[c] = a0 - lam
        if c + 1 < hi:
            qC[c + 1] = a1 - lam
        if c + 2 < hi:
            qC[c + 2] = a2 - lam
        if c + 3 < hi:
            qC[c + 3] = a3 - lam


@nb.njit(inline="always", **_JIT)
def _enter_candidate(j, C, nC, inC):
    """Atom j joins C at local index nC (its q_j comes from :func:`_exact_qs`); returns the new |C|."""
    inC[j] = nC
    C[nC] = j
    return nC + 1


@nb.njit(**_JIT)
def _join_candidates(G, C, nC, inC, qC, WT, x, lam, GCC, viol_idx, viol_val, n_viol, n_join):
    """The n_join largest of the n_viol violators (viol_idx, values viol_val) join C, with their
    rows of G_CC and exact q_j; returns the new |C|. With more violators than places they are
    picked by an in-place quickselect (a full argsort, with its allocations, was ~9 % of the
    kernel's cycles on the RESULTS.md §3 problem)."""
    if n_viol > n_join:
        kth_largest(viol_val, n_viol, n_join, viol_idx)
    n0 = nC
    for r in range(n_join):
        nC = _enter_candidate(viol_idx[r], C, nC, inC)
    _fill_gram(G, C, n0, nC, GCC)
    _exact_qs(WT, C, n0, nC, x, lam, qC)
    return nC


@nb.njit(**_JIT)
def _solve_on_support(L, k, qC, inC, P, qP, yq, ny, s, y):
    """s = G_PP⁻¹ q_P from the current factor L. yq[:ny] holds L⁻¹ q_P already: rows of the
    factor and of q_P stay as they are when atoms are appended, so only rows ny..k−1 of the
    forward substitution are computed. Returns k, the new count of valid rows of yq."""
    for t in range(ny, k):
        qP[t] = qC[inC[P[t]]]
    _forward(L, ny, k, qP, yq)
    for t in range(k):
        y[t] = yq[t]
    _backward(L, k, y, s)
    return k


@nb.njit(inline="always", **_JIT)
def _screen_gradient(gs, Gs, P, zs, k):
    """gs −= Σ_{t<k} zs[t] Gs[P[t], :] in the screen's precision, four Gram rows per pass over gs
    (a quarter of the loads and stores of gs; measured 10–27 % of the kernel, RESULTS.md §3).
    The grouping changes no rounding bound: each of the k + 1 terms still passes through at most
    k + 2 roundings, the m_terms of the screen bound B."""
    t = 0
    while t + 4 <= k:
        r0, r1, r2, r3 = Gs[P[t]], Gs[P[t + 1]], Gs[P[t + 2]], Gs[P[t + 3]]
        z0, z1, z2, z3 = zs[t], zs[t + 1], zs[t + 2], zs[t + 3]
        for j in range(gs.shape[0]):
            gs[j] -= (z0 * r0[j] + z1 * r1[j]) + (z2 * r2[j] + z3 * r3[j])
        t += 4
    for t in range(t, k):
        row = Gs[P[t]]
        zt = zs[t]
        for j in range(gs.shape[0]):
            gs[j] -= zt * row[j]


@nb.njit(**_JIT)
def _restricted_gradient(qC, nC, GCC, P, inC, zP, k, wC):
    """w_C = q_C − G_CP z_P from the local rows of G_CC."""
    for c in range(nC):
        wC[c] = qC[c]
    for t in range(k):
        zt = zP[t]
        row = GCC[inC[P[t]]]
        for c in range(nC):
            wC[c] -= zt * row[c]


@nb.njit(**_JIT)
def _support_gradient(qC, P, k, GCC, inC, zP, gP):
    """Exact g_P = q_P − G_PP z_P (float64); returns max |g_P|."""
    worst = 0.0
    for t in range(k):
        acc = qC[inC[P[t]]]
        row = GCC[inC[P[t]]]
        for v in range(k):
            acc -= row[inC[P[v]]] * zP[v]
        gP[t] = acc
        worst = max(worst, abs(acc))
    return worst


@nb.njit(**_JIT)
def _solve_point(G, Gs, qs, x, WT, lam, eq, guess, cand, eps, tol_abs, kcap, max_checks, u, c2,
                 P, zP, L, qP, yq, s, y, C, inC, isP, wC, gs, zs, GCC, viol_idx, viol_val, qC):
    """One point (see the module docstring). Returns (|P|, full checks, exact violation, ok); the
    code is z_P on P[:|P|]. Scratch: inC must be −1 and isP False on entry; both are restored."""
    d_z = qs.shape[0]
    Mcap = GCC.shape[1]
    nC = 0
    k = 0
    for t in range(cand.shape[0]):
        j = cand[t]
        if inC[j] < 0 and nC < Mcap:
            nC = _enter_candidate(j, C, nC, inC)
    for t in range(guess.shape[0]):
        j = guess[t]
        if j >= d_z or k >= kcap:
            continue
        if inC[j] < 0:
            if nC >= Mcap:
                continue
            nC = _enter_candidate(j, C, nC, inC)
        if not isP[inC[j]]:
            isP[inC[j]] = True
            P[k] = j
            k += 1
    _fill_gram(G, C, 0, nC, GCC)
    _exact_qs(WT, C, 0, nC, x, lam, qC)
    ok = True
    ny = 0  # rows of yq = L⁻¹ q_P that are valid
    # Feasible start: solve on the guess, drop the atoms with s ≤ 0, repeat.
    while k > 0:
        if _chol_rows(L, 0, k, P, GCC, inC) < k:
            ok = False
            break
        ny = _solve_on_support(L, k, qC, inC, P, qP, yq, 0, s, y)
        m = 0
        for t in range(k):
            if s[t] > 0:
                P[m] = P[t]
                zP[m] = s[t]
                m += 1
            else:
                isP[inC[P[t]]] = False
        if m == k:
            break
        k = m
    qabs = 0.0
    for j in range(d_z):
        qabs = max(qabs, abs(qs[j]))
    qabs += eq
    checks = 0
    viol = np.inf
    n_solves = 0
    max_solves = 4 * kcap + 100
    while ok:
        _restricted_gradient(qC, nC, GCC, P, inC, zP, k, wC)
        single = False
        stuck = False
        while True:  # Lawson–Hanson on C
            n_max = 1 if single else max(_ADD_MIN, k // _ADD_DIV)
            n_in = 0  # the entering atoms, by decreasing w, at P[k:k + n_in]
            capped = False
            while n_in < n_max:
                best = eps
                cb = -1
                for c in range(nC):
                    if wC[c] > best and not isP[c]:
                        best = wC[c]
                        cb = c
                if cb < 0:
                    break
                if k + n_in >= kcap:
                    capped = True
                    break
                isP[cb] = True
                P[k + n_in] = C[cb]
                zP[k + n_in] = 0.0
                n_in += 1
            n_new = _chol_rows(L, k, k + n_in, P, GCC, inC)
            for t in range(k + n_new, k + n_in):  # dependent on the atoms before: not added
                isP[inC[P[t]]] = False
            k += n_new
            if n_new == 0:
                ok = not (capped or n_in > 0)
                break
            progress = False
            while True:
                n_solves += 1
                if n_solves > max_solves:
                    ok = False
                    break
                ny = _solve_on_support(L, k, qC, inC, P, qP, yq, ny, s, y)
                feasible = True
                for t in range(k):
                    if s[t] <= 0:
                        feasible = False
                        break
                if feasible:
                    for t in range(k):
                        zP[t] = s[t]
                    progress = True
                    break
                alpha = 1.0
                t_min = -1
                for t in range(k):
                    if s[t] <= 0:
                        a = zP[t] / (zP[t] - s[t])
                        if t_min < 0 or a < alpha:
                            alpha = a
                            t_min = t
                if alpha > 0:
                    progress = True
                m = 0
                first_out = k
                for t in range(k):
                    v = zP[t] + alpha * (s[t] - zP[t])
                    if t == t_min or (s[t] <= 0 and v <= 0):
                        isP[inC[P[t]]] = False
                        first_out = min(first_out, t)
                        continue
                    P[m] = P[t]
                    zP[m] = v
                    m += 1
                k = m
                if _chol_rows(L, first_out, k, P, GCC, inC) < k - first_out:
                    ok = False
                    break
                ny = min(ny, first_out)
            if not ok:
                break
            if single and not progress:
                stuck = True
                break
            single = not progress
            _restricted_gradient(qC, nC, GCC, P, inC, zP, k, wC)
        if not ok:
            break
        # Full check over all atoms: screened, then exact where the screen cannot decide.
        checks += 1
        zl1 = 0.0
        for t in range(k):
            zl1 += zP[t]
        if u > 0.0:
            m_terms = k + 2
            gamma = m_terms * u / (1.0 - m_terms * u)
            bound = 2.0 * (gamma + 2.0 * u) * (c2 * zl1 + qabs) + (m_terms + 2) * 2.0**-149 + eq
        else:
            bound = 0.0
        for j in range(d_z):
            gs[j] = qs[j]
        for t in range(k):
            zs[t] = zP[t]
        _screen_gradient(gs, Gs, P, zs, k)
        for t in range(k):
            gs[P[t]] = -np.inf
        # Atoms outside C that the screen alone proves to violate (g̃ > eps + B) join C and
        # Lawson–Hanson resumes; the exact re-evaluation waits for a screen that shows none.
        n_sure = 0
        for j in range(d_z):
            if gs[j] > eps + bound and inC[j] < 0:
                viol_idx[n_sure] = j
                viol_val[n_sure] = gs[j]
                n_sure += 1
        n_join = min(n_sure, max(_JOIN_MIN, k), Mcap - nC)
        if n_join > 0 and checks < max_checks:
            nC = _join_candidates(G, C, nC, inC, qC, WT, x, lam, GCC, viol_idx, viol_val, n_sure, n_join)
            continue
        off = 0.0
        n_viol = 0
        for j in range(d_z):
            if gs[j] > -bound:
                row = G[j]
                g = _exact_q(WT, j, x, lam)
                for t in range(k):
                    g -= zP[t] * row[P[t]]
                off = max(off, g)
                if g > eps and inC[j] < 0:
                    viol_idx[n_viol] = j
                    viol_val[n_viol] = g
                    n_viol += 1
        # The largest violators join C: at most max(_JOIN_MIN, |P|) per check, within C's capacity.
        added = min(n_viol, max(_JOIN_MIN, k), Mcap - nC)
        nC = _join_candidates(G, C, nC, inC, qC, WT, x, lam, GCC, viol_idx, viol_val, n_viol, added)
        sup = _support_gradient(qC, P, k, GCC, inC, zP, qP)
        viol = max(sup, off)
        if viol <= tol_abs:
            break
        if checks >= max_checks or (stuck and added == 0) or (off > eps and added == 0):
            ok = False
            break
        if off <= eps:  # only the accuracy on P: one Newton step
            _chol_solve(L, k, qP, s, y)
            for t in range(k):
                zP[t] += s[t]
                if not zP[t] > 0:
                    ok = False
    for c in range(nC):
        inC[C[c]] = -1
        isP[c] = False
    return k, checks, viol, ok


@nb.njit(**_JIT)
def solve_points(G, Gs, Qs, X, WT, lam, eq, guess, cand, eps, tol_abs, kcap, max_checks, u, c2):
    """Exact codes of the points X (n, D) = the centred x̃_i (module docstring), one after another.

    G (≥ d_z, ≥ d_z) float64 Gram matrix (a null row and column beyond d_z are ignored); Gs its
    screening copy (float32, or G itself with u = 0); Qs (n, d_z) the correlations q = X̃W − λ in
    the screening precision, within eq (n,) of the exact ones (entrywise); WT (d_z, D) float64,
    the atoms as rows, from which every q_j the kernel uses exactly is computed (in float64: the
    atoms of C, and the screen's band); guess (n, K) warm-start supports padded with any index
    ≥ d_z; cand (n, M) candidate atoms (the caller's top-M of each row of Qs); eps the threshold
    for adding an atom, tol_abs the absolute KKT tolerance (tol·λ); kcap = min(D, d_z); u the unit
    roundoff of Gs (0 for exact screening); c2 the largest squared atom norm.

    Returns idx (n, kcap) int64 with d_z in unused slots, val (n, kcap), viol (n,) the exact
    absolute KKT violation, checks (n,) full checks per point, ok (n,) bool (False: hand over).
    """
    n, d_z = Qs.shape
    m_cap = min(d_z, max(4 * (cand.shape[1] + guess.shape[1]), 4 * kcap), _C_CAP)
    idx = np.full((n, kcap), d_z, dtype=np.int64)
    val = np.zeros((n, kcap))
    viol = np.zeros(n)
    checks = np.zeros(n, dtype=np.int64)
    ok = np.zeros(n, dtype=np.bool_)
    P = np.empty(kcap, dtype=np.int64)
    zP = np.empty(kcap)
    L = np.zeros((kcap, kcap))
    qP = np.empty(kcap)
    yq = np.empty(kcap)
    s = np.empty(kcap)
    y = np.empty(kcap)
    C = np.empty(m_cap, dtype=np.int64)
    inC = np.full(d_z, -1, dtype=np.int64)
    isP = np.zeros(m_cap, dtype=np.bool_)
    wC = np.empty(m_cap)
    gs = np.empty(d_z, dtype=Gs.dtype)
    zs = np.empty(kcap, dtype=Gs.dtype)
    GCC = np.empty((m_cap, m_cap))
    viol_idx = np.empty(d_z, dtype=np.int64)
    viol_val = np.empty(d_z)
    qC = np.empty(m_cap)
    for i in range(n):
        k, chk, v, good = _solve_point(G, Gs, Qs[i], X[i], WT, lam, eq[i], guess[i], cand[i], eps, tol_abs,
                                       kcap, max_checks, u, c2, P, zP, L, qP, yq, s, y, C, inC, isP, wC, gs,
                                       zs, GCC, viol_idx, viol_val, qC)
        checks[i] = chk
        viol[i] = v
        ok[i] = good
        for t in range(k):
            idx[i, t] = P[t]
            val[i, t] = zP[t]
    return idx, val, viol, checks, ok


@nb.njit(**_JIT)
def write_rows(Z, s, idx, val):
    """Z[s + i, idx[i, t]] = val[i, t] for the entries of the padded codes (idx, val) with
    idx < d_z (= Z.shape[1], the null atom) and val > 0; returns their number. Compiled and without
    the GIL, so the worker threads fill their own rows of a dense output in parallel (its first
    touch faults the pages in)."""
    d_z = Z.shape[1]
    nnz = 0
    for i in range(idx.shape[0]):
        row = Z[s + i]
        for t in range(idx.shape[1]):
            j = idx[i, t]
            if j < d_z and val[i, t] > 0:
                row[j] = val[i, t]
                nnz += 1
    return nnz
