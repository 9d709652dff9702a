"""Compiled active-set solver of the non-negative lasso on a candidate set of atoms (docs/theory.md §1).

For one point x̃ (= x − b) and unit atoms w_j, the exact code solves

    min_{z ≥ 0}  ‖x̃ − W z‖² + 2λ ‖z‖₁ ,     g = Wᵀr − λ1 ,  r = x̃ − Wz ,
    (KKT-z):  g_j = 0 on supp z,  g_j ≤ 0 off it,

problem (P_i) of :mod:`dictcheck.solvers.lasso_codes`, whose scheduler proposes, per point, a small set C of
candidate atoms and checks (KKT-z) over all atoms after each call. :func:`solve_on_candidates` solves the
problem restricted to C exactly (up to rounding), in compiled code (numba, ``nogil``), from the support of
the previous call:

1. **Gram block of the candidates.** The rows of C are gathered in float64 (w_j = s_j · a_j from the stored
   rows a_j in their dtype and the scales s_j); the entries of G_CC = W_CᵀW_C and q_C = W_Cᵀx̃ − λ for the
   atoms that joined C since the last call are dot products of these rows, or, for G_CC, read from the
   caller's cache of the whole Gram matrix when it keeps one (small dictionaries). G_CC and q_C persist
   between calls, so every entry is set once. (Plain loops, not BLAS: a BLAS call per point from several
   threads let the library's own thread pool contend with them.)
2. **Lawson–Hanson on C with block additions** (Lawson & Hanson 1974, ch. 23, in Gram form; Bro & De Jong
   1997). The iterate z ≥ 0 is optimal on the support P. Up to max(4, |P|/4) atoms of C with the largest
   restricted gradient w = q_C − G_CP z_P > ``eps`` enter P at once (Cholesky factor of G_PP appended row by
   row); the unconstrained solution s of G_PP s = q_P is taken if s > 0, else z moves to the last feasible
   point on the segment z → s, the atoms that reach 0 leave P, and the factor is rebuilt from the first
   removed row. When a block makes no progress, one atom enters alone (the classical single addition).
   It ends when no atom of C has w > ``eps``.
3. **Residual and exact support gradient** in float64: r = x̃ − Σ_{t∈P} z_t w_t and g_t = w_tᵀr − λ on P,
   the quantities the scheduler's check uses; if max |g_P| exceeds ``tol_abs``, one Newton step
   z_P += G_PP⁻¹ g_P (when it keeps z_P > 0) and both are recomputed.

Status per point: 0 optimal on C; 1 G_PP not numerically positive definite (linearly dependent atoms: the
scheduler hands the point to its exact fallback); 2 the solve budget (4·|C| + 100) ran out (cycling).

Floating point: float64 throughout. ``fastmath`` allows only re-association and fused multiply-adds (so
reductions vectorise), never assumptions about NaN or infinities. A point's result depends only on the
point, its candidates and its previous support, never on its batch or thread.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from dictcheck.solvers.row_topk import kth_largest

__all__ = ["solve_on_candidates", "solve_points_gram", "classify_pairs", "write_rows", "STATUS_OPTIMAL", "STATUS_DEPENDENT", "STATUS_BUDGET"]

_FASTMATH = {"reassoc", "contract"}
_JIT = dict(cache=True, nogil=True, fastmath=_FASTMATH)

#: Status of a point after :func:`solve_on_candidates`.
STATUS_OPTIMAL, STATUS_DEPENDENT, STATUS_BUDGET = 0, 1, 2

# Block additions: at most max(_ADD_MIN, |P| // _ADD_DIV) atoms enter P per Lawson–Hanson step.
_ADD_MIN = 4
_ADD_DIV = 4
# At most max(_JOIN_MIN, |P|) of a point's largest violators outside C join C per check.
_JOIN_MIN = 16


@nb.njit(**_JIT)
def _chol_rows(L, k0, k, P, G):
    """Rows k0..k−1 of the Cholesky factor of G_PP (P local indices into the candidate block G), given rows
    0..k0−1. Returns the number of rows done: k − k0, or the position (from k0) of the first atom whose pivot
    is not positive (dependent on the earlier ones); rows before it are valid. L's diagonal holds the
    reciprocals 1/ℓ_ii, so no substitution divides."""
    for i in range(k0):
        li = L[i]
        r = li[i]
        gi = G[P[i]]
        for m in range(k0, k):
            lm = L[m]
            acc = gi[P[m]]
            for t in range(i):
                acc -= li[t] * lm[t]
            lm[i] = acc * r
    for m in range(k0, k):
        lm = L[m]
        gm = G[P[m]]
        for i in range(k0, m):
            li = L[i]
            acc = gm[P[i]]
            for t in range(i):
                acc -= li[t] * lm[t]
            lm[i] = acc * li[i]
        g_diag = gm[P[m]]
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
def _solve_on_support(L, k, q, P, qP, yq, ny, s, y):
    """s = G_PP⁻¹ q_P from the factor L. yq[:ny] holds L⁻¹ q_P already (rows of the factor and of q_P stay
    when atoms are appended), so only rows ny..k−1 of the forward substitution are computed. Returns k."""
    for t in range(ny, k):
        qP[t] = q[P[t]]
    _forward(L, ny, k, qP, yq)
    for t in range(k):
        y[t] = yq[t]
    _backward(L, k, y, s)
    return k


@nb.njit(**_JIT)
def _restricted_gradient(q, nC, G, P, zP, k, wC):
    """w_C = q_C − G_CP z_P."""
    for c in range(nC):
        wC[c] = q[c]
    for t in range(k):
        zt = zP[t]
        row = G[P[t]]
        for c in range(nC):
            wC[c] -= zt * row[c]


@nb.njit(inline="always", **_JIT)
def _dot_row(rows, scale, j, v):
    """w_jᵀv in float64, w_j = s_j a_j widened from the stored row."""
    a = rows[j]
    s = scale[j]
    acc = 0.0
    for d in range(v.shape[0]):
        acc += (a[d] * s) * v[d]
    return acc


@nb.njit(**_JIT)
def _fill_candidates(rows, scale, gram, C, lo, n, x, lam, G, q):
    """The entries of G = W_CᵀW_C and q = W_Cᵀx − λ for the candidates C[lo:n]: G's from the cached Gram
    matrix ``gram`` when it is given (non-empty), else dot products of the unit rows; each entry is set once
    and mirrored, so G is exactly symmetric."""
    cached = gram.shape[0] > 0
    D = rows.shape[1]
    wc = np.empty(D)
    for c in range(lo, n):
        j = C[c]
        sj = scale[j]
        rj = rows[j]
        for d in range(D):
            wc[d] = rj[d] * sj
        gc = G[c]
        if cached:
            gr = gram[j]
            for b in range(c + 1):
                gc[b] = gr[C[b]]
        else:
            for b in range(c + 1):
                gc[b] = _dot_row(rows, scale, C[b], wc)
        for b in range(c + 1):
            G[b, c] = gc[b]
        acc = 0.0
        for d in range(D):
            acc += wc[d] * x[d]
        q[c] = acc - lam


@nb.njit(**_JIT)
def _residual_and_support_gradient(rows, scale, C, P, zP, k, x, lam, r, gP):
    """r = x − Σ_t z_t w_{C[P_t]} and g_t = w_{C[P_t]}ᵀr − λ in float64; returns max |g_P|."""
    D = x.shape[0]
    for d in range(D):
        r[d] = x[d]
    for t in range(k):
        j = C[P[t]]
        zs = zP[t] * scale[j]
        a = rows[j]
        for d in range(D):
            r[d] -= zs * a[d]
    worst = 0.0
    for t in range(k):
        gP[t] = _dot_row(rows, scale, C[P[t]], r) - lam
        worst = max(worst, abs(gP[t]))
    return worst


@nb.njit(**_JIT)
def _lawson_hanson_scratch(M):
    """The scratch vectors of :func:`_lawson_hanson` for up to M candidates: qP, yq, s, y, wC and the mask isP
    (False on entry, as it requires)."""
    return (np.empty(M), np.empty(M), np.empty(M), np.empty(M), np.empty(M), np.zeros(M, dtype=np.bool_))


@nb.njit(**_JIT)
def _lawson_hanson(G, q, nC, P, zP, k, factored, isP, L, qP, yq, s, y, wC, eps):
    """Step 2 of the module docstring on the candidate block (G, q) from the support P[:k] (local indices).
    ``factored``: L already holds the Cholesky factor of G_PP and z_P is optimal on P (a previous call's
    result); otherwise z_P is only a guess and the start solves on P, dropping atoms with s ≤ 0, until
    feasible. Returns (|P|, status)."""
    ny = 0
    while k > 0 and not factored:
        if _chol_rows(L, 0, k, P, G) < k:
            return k, STATUS_DEPENDENT
        ny = _solve_on_support(L, k, q, P, qP, yq, 0, s, y)
        m = 0
        for t in range(k):
            if s[t] > 0:
                P[m] = P[t]
                zP[m] = s[t]
                m += 1
            else:
                isP[P[t]] = False
        if m == k:
            break
        k = m
    n_solves = 0
    max_solves = 4 * nC + 100
    _restricted_gradient(q, nC, G, P, zP, k, wC)
    single = False
    while True:
        n_max = 1 if single else max(_ADD_MIN, k // _ADD_DIV)
        n_in = 0  # the entering atoms, by decreasing w, at P[k:k + n_in]
        while n_in < n_max:
            best = eps
            cb = -1
            for c in range(nC):
                if wC[c] > best and not isP[c]:
                    best = wC[c]
                    cb = c
            if cb < 0:
                break
            isP[cb] = True
            P[k + n_in] = cb
            zP[k + n_in] = 0.0
            n_in += 1
        if n_in == 0:
            return k, STATUS_OPTIMAL
        n_new = _chol_rows(L, k, k + n_in, P, G)
        for t in range(k + n_new, k + n_in):  # dependent on the atoms before: not added
            isP[P[t]] = False
        k += n_new
        if n_new == 0:
            return k, STATUS_DEPENDENT
        progress = False
        while True:
            n_solves += 1
            if n_solves > max_solves:
                return k, STATUS_BUDGET
            ny = _solve_on_support(L, k, q, P, qP, yq, ny, s, y)
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
                    isP[P[t]] = False
                    first_out = min(first_out, t)
                    continue
                P[m] = P[t]
                zP[m] = v
                m += 1
            k = m
            if _chol_rows(L, first_out, k, P, G) < k - first_out:
                return k, STATUS_DEPENDENT
            ny = min(ny, first_out)
        if single and not progress:
            return k, STATUS_BUDGET
        single = not progress
        _restricted_gradient(q, nC, G, P, zP, k, wC)


@nb.njit(**_JIT)
def solve_on_candidates(rows, scale, gram, X, lam, C, nC, filled, G, q, L, factored, P, zP, k, R, gP, status,
                        eps, tol_abs, which, lo, hi):
    """Exact codes restricted to each point's candidates, for the points which[lo:hi] (module docstring).

    rows (d_z, D) float32 or float64 stored atom rows a_j and scale (d_z,) float64 (unit atoms w_j = s_j a_j);
    gram: the (d_z, d_z) float64 Gram matrix of the unit atoms when it is cached, else an empty (0, 0) array;
    X (n, D) the centred points x̃ (float64); per point i: C[i, :nC[i]] candidate atoms, of which the first
    filled[i] have their entries in the persistent G (n, M, M) and q (n, M) already (updated here); P[i, :k[i]]
    the support as local indices into C with codes zP (updated here); L (n, M, M) the Cholesky factors of G_PP,
    valid where factored[i] (set here when the point ends optimal on C). Writes the residual R[i] (n, D), the
    exact support gradient gP[i, :k[i]] and status[i]. eps: the threshold on w for adding an atom; tol_abs:
    the absolute accuracy asked of g on the support (tol·λ)."""
    D = X.shape[1]
    M = G.shape[1]
    qP, yq, s, y, wC, isP = _lawson_hanson_scratch(M)
    for t_point in range(lo, hi):
        i = which[t_point]
        n = nC[i]
        Gi = G[i]
        qi = q[i]
        Pi = P[i]
        zi = zP[i]
        _fill_candidates(rows, scale, gram, C[i], filled[i], n, X[i], lam, Gi, qi)
        filled[i] = n
        for t in range(k[i]):
            isP[Pi[t]] = True
        Li = L[i]
        kk, st = _lawson_hanson(Gi, qi, n, Pi, zi, k[i], factored[i], isP, Li, qP, yq, s, y, wC, eps)
        factored[i] = st == STATUS_OPTIMAL
        if st == STATUS_OPTIMAL:
            sup = _residual_and_support_gradient(rows, scale, C[i], Pi, zi, kk, X[i], lam, R[i], gP[i])
            if sup > tol_abs:  # accuracy on P only: one Newton step, kept when z_P stays positive
                for t in range(kk):
                    qP[t] = gP[i, t]
                _forward(Li, 0, kk, qP, y)
                _backward(Li, kk, y, s)
                positive = True
                for t in range(kk):
                    if not zi[t] + s[t] > 0:
                        positive = False
                if positive:
                    for t in range(kk):
                        zi[t] += s[t]
                    _residual_and_support_gradient(rows, scale, C[i], Pi, zi, kk, X[i], lam, R[i], gP[i])
        for t in range(n):
            isP[t] = False
        k[i] = kk
        status[i] = st


# --------------------------------------------------------------------------------------------
# With the Gram matrix cached: one call per point, the checks of all atoms inside
# --------------------------------------------------------------------------------------------


@nb.njit(**_JIT)
def _join(G, rows, scale, C, nC, inC, GCC, qC, x, lam, viol_idx, viol_val, n_viol, n_join):
    """The n_join largest of the n_viol violators (viol_idx, values viol_val) join C with their rows of G_CC
    (read from the cached G) and exact q_j = w_jᵀx − λ; returns the new |C|. With more violators than places
    they are picked by an in-place quickselect (ties by the order found, which is by atom)."""
    if n_viol > n_join:
        kth_largest(viol_val, n_viol, n_join, viol_idx)
    n0 = nC
    for r in range(n_join):
        j = viol_idx[r]
        inC[j] = nC
        C[nC] = j
        nC += 1
    for c in range(n0, nC):
        row = G[C[c]]
        for b in range(c + 1):
            v = row[C[b]]
            GCC[c, b] = v
            GCC[b, c] = v
        qC[c] = _dot_row(rows, scale, C[c], x) - lam
    return nC


@nb.njit(inline="always", **_JIT)
def _screen_gradient(gs, Gs, C, P, zs, k):
    """gs −= Σ_{t<k} zs[t] Gs[C[P[t]], :] in the screen's precision, four Gram rows per pass over gs. The
    grouping changes no rounding bound: each of the k + 1 terms passes through at most k + 2 roundings."""
    t = 0
    while t + 4 <= k:
        r0, r1, r2, r3 = Gs[C[P[t]]], Gs[C[P[t + 1]]], Gs[C[P[t + 2]]], Gs[C[P[t + 3]]]
        z0, z1, z2, z3 = zs[t], zs[t + 1], zs[t + 2], zs[t + 3]
        for j in range(gs.shape[0]):
            gs[j] -= (z0 * r0[j] + z1 * r1[j]) + (z2 * r2[j] + z3 * r3[j])
        t += 4
    for t in range(t, k):
        row = Gs[C[P[t]]]
        zt = zs[t]
        for j in range(gs.shape[0]):
            gs[j] -= zt * row[j]


@nb.njit(**_JIT)
def _solve_point_gram(G, Gs, qs, x, rows, scale, lam, eq, guess, cand, eps, tol_abs, max_checks, u, c2,
                      C, inC, GCC, qC, P, zP, isP, L, qP, yq, s, y, wC, gs, zs, viol_idx, viol_val):
    """One point with the Gram matrix cached (see :func:`solve_points_gram`). Returns (|P|, checks, exact
    absolute violation, ok); the code is z_P on C[P[:|P|]]. inC must be −1 and isP False on entry (restored)."""
    d_z = qs.shape[0]
    M = GCC.shape[0]
    nC = 0
    k = 0
    for t in range(cand.shape[0]):
        j = cand[t]
        if inC[j] < 0 and nC < M:
            inC[j] = nC
            C[nC] = j
            nC += 1
    for t in range(guess.shape[0]):
        j = guess[t]
        if j >= d_z:
            continue
        if inC[j] < 0:
            if nC >= M:
                continue
            inC[j] = nC
            C[nC] = j
            nC += 1
        if not isP[inC[j]]:
            isP[inC[j]] = True
            P[k] = inC[j]
            zP[k] = 0.0
            k += 1
    for c in range(nC):
        row = G[C[c]]
        for b in range(c + 1):
            v = row[C[b]]
            GCC[c, b] = v
            GCC[b, c] = v
        qC[c] = _dot_row(rows, scale, C[c], x) - lam
    qabs = 0.0
    for j in range(d_z):
        qabs = max(qabs, abs(qs[j]))
    qabs += eq
    checks = 0
    viol = np.inf
    ok = True
    factored = False
    while True:
        k, st = _lawson_hanson(GCC, qC, nC, P, zP, k, factored, isP, L, qP, yq, s, y, wC, eps)
        if st != STATUS_OPTIMAL:
            ok = False
            break
        factored = True
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
        _screen_gradient(gs, Gs, C, P, zs, k)
        for t in range(k):
            gs[C[P[t]]] = -np.inf
        # Atoms outside C that the screen alone proves to violate (g̃ > eps + B) join C and Lawson–Hanson
        # resumes; the exact re-evaluation waits for a screen that shows none.
        n_sure = 0
        for j in range(d_z):
            if gs[j] > eps + bound and inC[j] < 0:
                viol_idx[n_sure] = j
                viol_val[n_sure] = gs[j]
                n_sure += 1
        n_join = min(n_sure, max(_JOIN_MIN, k), M - nC)
        if n_join > 0 and checks < max_checks:
            nC = _join(G, rows, scale, C, nC, inC, GCC, qC, x, lam, viol_idx, viol_val, n_sure, n_join)
            continue
        off = 0.0
        n_viol = 0
        for j in range(d_z):
            if gs[j] > -bound:
                row = G[j]
                g = _dot_row(rows, scale, j, x) - lam
                for t in range(k):
                    g -= zP[t] * row[C[P[t]]]
                off = max(off, g)
                if g > eps and inC[j] < 0:
                    viol_idx[n_viol] = j
                    viol_val[n_viol] = g
                    n_viol += 1
        added = min(n_viol, max(_JOIN_MIN, k), M - nC)
        nC = _join(G, rows, scale, C, nC, inC, GCC, qC, x, lam, viol_idx, viol_val, n_viol, added)
        sup = 0.0
        for t in range(k):  # exact g_P = q_P − G_PP z_P
            acc = qC[P[t]]
            row = GCC[P[t]]
            for v in range(k):
                acc -= row[P[v]] * zP[v]
            qP[t] = acc
            sup = max(sup, abs(acc))
        viol = max(sup, off)
        if viol <= tol_abs:
            break
        if checks >= max_checks or (off > eps and added == 0):
            ok = False
            break
        if off <= eps:  # only the accuracy on P: one Newton step
            _forward(L, 0, k, qP, y)
            _backward(L, k, y, s)
            for t in range(k):
                zP[t] += s[t]
                if not zP[t] > 0:
                    ok = False
            if not ok:
                break
    for c in range(nC):
        inC[C[c]] = -1
        isP[c] = False
    return k, checks, viol, ok


@nb.njit(**_JIT)
def solve_points_gram(G, Gs, Qs, X, rows, scale, lam, eq, guess, cand, eps, tol_abs, max_checks, u, c2, cap):
    """Exact codes of the points X (n, D) = the centred x̃_i, one after another, with the Gram matrix of the
    unit atoms cached: G (d_z, d_z) float64 and its screening copy Gs (float32, or G with u = 0).

    Per point: C = the ``cand`` atoms (the caller's top of each row of Qs) ∪ the warm-start guess, G_CC read
    from G; Lawson–Hanson on C (:func:`_lawson_hanson`); then a full check over all d_z atoms: the screened
    gradient g̃ = q̃ − Σ_{t∈P} z_t Gs[t, :] (q̃ = Qs, within eq of q entrywise) with the rounding bound of
    :mod:`dictcheck.solvers.lasso_codes` (Higham §3.1) plus eq. Atoms the screen alone proves to violate join
    C at once (no exact re-evaluation spent on a check that must fail); otherwise every atom with g̃ > −B is
    re-evaluated in float64 and the violation recorded is exact. The largest violators outside C (at most
    max(16, |P|)) join C and Lawson–Hanson resumes; a point whose only defect is accuracy on P gets one Newton
    step. ``ok`` is False (hand over to the caller's fallback) when G_PP is not numerically positive definite,
    after ``max_checks`` checks or when violators remain that C (capacity ``cap``) cannot take.

    Returns idx (n, cap) int64 with d_z in unused slots, val (n, cap), viol (n,) the exact absolute KKT
    violation, checks (n,), ok (n,) bool.
    """
    n, d_z = Qs.shape
    D = X.shape[1]
    M = cap
    idx = np.full((n, M), d_z, dtype=np.int64)
    val = np.zeros((n, M))
    viol = np.zeros(n)
    checks = np.zeros(n, dtype=np.int64)
    ok = np.zeros(n, dtype=np.bool_)
    C = np.empty(M, dtype=np.int64)
    inC = np.full(d_z, -1, dtype=np.int64)
    GCC = np.empty((M, M))
    qC = np.empty(M)
    P = np.empty(M, dtype=np.int64)
    zP = np.empty(M)
    L = np.zeros((M, M))
    qP, yq, s, y, wC, isP = _lawson_hanson_scratch(M)
    gs = np.empty(d_z, dtype=Gs.dtype)
    zs = np.empty(M, dtype=Gs.dtype)
    viol_idx = np.empty(d_z, dtype=np.int64)
    viol_val = np.empty(d_z)
    for i in range(n):
        k, chk, v, good = _solve_point_gram(G, Gs, Qs[i], X[i], rows, scale, lam, eq[i], guess[i], cand[i], eps,
                                            tol_abs, max_checks, u, c2, C, inC, GCC, qC, P, zP, isP, L, qP, yq, s,
                                            y, wC, gs, zs, viol_idx, viol_val)
        checks[i] = chk
        viol[i] = v
        ok[i] = good
        for t in range(k):
            idx[i, t] = C[P[t]]
            val[i, t] = zP[t]
    return idx, val, viol, checks, ok


@nb.njit(**_JIT)
def classify_pairs(pi, pj, g, which, C, nC, P, k, gP, d_z):
    """For checked pairs (row t = which-index, atom pj, g = w_jᵀr − λ) sorted by t: whether each atom is on its
    point's support, or among its candidates; and per point the exact violation max(|g_P|, max (g)₊ off P).
    Returns (on_support, in_candidates, violation)."""
    n = which.shape[0]
    on_support = np.zeros(pi.shape[0], dtype=np.bool_)
    in_cand = np.zeros(pi.shape[0], dtype=np.bool_)
    viol = np.zeros(n)
    stamp = np.full(d_z, -1, dtype=np.int64)
    supp = np.full(d_z, -1, dtype=np.int64)
    p = 0
    for t in range(n):
        i = which[t]
        for c in range(nC[i]):
            stamp[C[i, c]] = t
        worst = 0.0
        for u in range(k[i]):
            supp[C[i, P[i, u]]] = t
            worst = max(worst, abs(gP[i, u]))
        while p < pi.shape[0] and pi[p] == t:
            j = pj[p]
            in_cand[p] = stamp[j] == t
            if supp[j] == t:
                on_support[p] = True
            elif g[p] > worst:
                worst = g[p]
            p += 1
        viol[t] = worst
    return on_support, in_cand, viol


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
