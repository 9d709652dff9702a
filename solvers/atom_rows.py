"""The atoms of a dictionary as stored rows, and their products with points in a low precision with rigorous
error bounds (docs/theory.md §1, §6).

A dictionary of d_z atoms in R^D is held as its stored rows a_j (a (d_z, D) array in float32 or float64, for
an SAE its decoder as saved, possibly memory-mapped) and scales s_j (float64): the atoms the theory uses are
w_j = s_j a_j (unit atoms of a decoder: s_j = 1/‖a_j‖). Nothing of size d_z² or d_z × N is formed here.

**Screened products.** The exact codes and the diagnostics need, for points r_i (float64) and *every* atom,
only which products h_ij = w_jᵀr_i lie above or below a threshold, and the exact values of the few that do.
:class:`Screen` computes h̃_ij in a low precision (bfloat16 inputs where the processor multiplies them fast,
else float32) with a bound E_i ≥ |h̃_ij − h_ij| for every atom j, so that each decision is certain and the
entries that matter are re-evaluated in float64 (:func:`exact_products`): the results never depend on the
screen's precision, only the time does. Each row is first scaled by a power of two ρ_i ≈ ‖r_i‖ (exact), so
the bound is relative and no data scale overflows or underflows the screen. With unit roundoffs u_r, u_a of
the rounded inputs (0 where an input is exact), u of the float32 accumulation of D terms, u_o of the output
and γ = D·u/(1 − D·u), the standard dot-product bound (Higham, *Accuracy and Stability of Numerical
Algorithms*, §3.1, any summation order, with or without FMA) and Σ_d |r_d a_d| ≤ ‖r‖‖a‖ give

    |h̃_ij − h_ij| ≤ ρ_i ‖r̂_i‖ max_j‖w_j‖ · [ β(1 + u_s)² + 2u_s + u_s² ] + (D + 4)·2⁻¹²⁰ · ρ_i · max_j s_j ,
    β = (u_r + u_a + u_r·u_a) + (1 + u_r)(1 + u_a)(γ + u_o(1 + γ)) ,

where u_s covers the float32 rounding of s_j and of the product by it when the products are taken with the
stored rows and scaled afterwards (u_s = 0 otherwise), and the last term covers gradual underflow; the bound
used is twice this. Products run at float32's own precision only: the bound assumes no TF32 or bfloat16
shortcut inside float32 products and float32 accumulation of bfloat16 ones, which :func:`exact_matmul_mode`
enforces for the duration of a screen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numba as nb
import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

__all__ = ["AtomRows", "Screen", "ScreenedPairs", "exact_matmul_mode", "exact_products", "power_of_two_scales",
           "run_in_threads", "screen_pairs", "atom_max_products"]

_JIT = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"})

#: Unit roundoffs (round to nearest).
U_BF16 = 2.0 ** -8
U_FP32 = 2.0 ** -24
#: Bytes of one screened product block (rows × atoms) at a time.
BLOCK_BYTES = 256 << 20
#: Rows of stored atoms whose norms lie outside [2^-60, 2^60] are screened from a unit copy instead.
_SANE_NORM = 2.0 ** 60


def power_of_two_scales(norms: NDArray[np.float64]) -> NDArray[np.float64]:
    """ρ_i = 2^e with ‖r_i‖/ρ_i in [0.5, 1) (1 where ‖r_i‖ = 0): dividing by ρ_i is exact in floating point."""
    mant, expo = np.frexp(norms)
    return np.where(norms > 0, np.ldexp(1.0, expo), 1.0)


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bfloat16 products run on matrix units here (CUDA, or a CPU with AMX tiles)."""
    if device.type == "cuda":
        return True
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


class AtomRows:
    """Unit atoms w_j = s_j a_j (module docstring). ``rows`` (d_z, D) float32 or float64, C-contiguous (a
    memory map is fine: rows are read, never written); ``scale`` (d_z,) float64. ValueError for non-finite
    rows or scales."""

    def __init__(self, rows: NDArray, scale: NDArray[np.float64], device: str | torch.device = "cpu") -> None:
        if rows.ndim != 2 or rows.dtype not in (np.float32, np.float64) or not rows.flags.c_contiguous:
            raise ValueError("atom rows must be a C-contiguous (d_z, D) float32 or float64 array")
        scale = np.ascontiguousarray(scale, dtype=np.float64)
        if scale.shape != (rows.shape[0],) or not np.all(np.isfinite(scale)) or np.any(scale < 0):
            raise ValueError("atom scales must be finite, non-negative, one per row")
        self.rows, self.scale, self.device = rows, scale, torch.device(device)
        #: Atoms per block of a screened product (None: as many as keep a block near BLOCK_BYTES).
        self.block_atoms: int | None = None
        self._screens: dict[str, Screen] = {}
        norms = self.norms_of_stored_rows()
        self.unit_norm_max = float(np.max(norms * scale, initial=0.0)) * (1.0 + 1e-12)

    @classmethod
    def from_columns(cls, W: NDArray[np.float64], device: str | torch.device = "cpu") -> AtomRows:
        """The atoms as given, columns of W (D, d_z) float64 (any norms; s_j = 1)."""
        return cls(np.ascontiguousarray(W.T), np.ones(W.shape[1]), device)

    @classmethod
    def unit_rows_of(cls, rows: NDArray, device: str | torch.device = "cpu") -> AtomRows:
        """Unit atoms w_j = a_j/‖a_j‖ from stored rows (d_z, D) (a decoder as saved; float16 and bfloat16 are
        widened to float32, float32 and float64 used as they are). ValueError for a zero row."""
        if rows.dtype not in (np.float32, np.float64):
            rows = np.asarray(rows, dtype=np.float32)
        rows = np.ascontiguousarray(rows)
        norms = _row_norms(rows)
        if np.any(norms == 0):
            raise ValueError(f"atoms {np.flatnonzero(norms == 0)[:10].tolist()} are zero and cannot be normalised")
        return cls(rows, 1.0 / norms, device)

    @property
    def n_atoms(self) -> int:
        return int(self.rows.shape[0])

    @property
    def dim(self) -> int:
        return int(self.rows.shape[1])

    def norms_of_stored_rows(self) -> NDArray[np.float64]:
        return _row_norms(self.rows)

    def unit_block(self, lo: int, hi: int) -> NDArray[np.float64]:
        """w_j for j = lo … hi − 1 as float64 rows (hi − lo, D)."""
        return np.asarray(self.rows[lo:hi], dtype=np.float64) * self.scale[lo:hi, None]

    def unit_rows(self, idx: ArrayLike) -> NDArray[np.float64]:
        """w_j for the given atoms as float64 rows."""
        idx = np.asarray(idx, dtype=np.int64)
        return np.asarray(self.rows[idx], dtype=np.float64) * self.scale[idx, None]

    def columns(self) -> NDArray[np.float64]:
        """All atoms as columns (D, d_z) float64 (d_z·D floats: for small dictionaries)."""
        return self.unit_block(0, self.n_atoms).T

    def screen(self, precision: str) -> Screen:
        """The :class:`Screen` in ``"bf16"`` or ``"fp32"`` (built once, kept)."""
        if precision not in self._screens:
            self._screens[precision] = Screen.build(self, precision)
        return self._screens[precision]

    def fast_screen(self) -> Screen:
        """bfloat16 where it is fast here, else float32."""
        return self.screen("bf16" if bf16_is_fast(self.device) else "fp32")


def _row_norms(rows: NDArray, block: int = 8192) -> NDArray[np.float64]:
    """‖a_j‖ in float64, a block of rows at a time."""
    out = np.empty(rows.shape[0])
    for lo in range(0, rows.shape[0], block):
        out[lo:lo + block] = np.linalg.norm(np.asarray(rows[lo:lo + block], dtype=np.float64), axis=1)
    return out


@dataclass(frozen=True, eq=False)
class Screen:
    """Atoms in a screening precision for products with every atom (module docstring). ``W`` (d_z, D) torch
    rows on the device; ``post_scale`` (d_z,) float32 column scales applied after the product (the stored
    float32 rows used as they are), or None (``W`` holds rounded unit atoms); ``rel`` the bracket of the
    module docstring's bound (times ρ‖r̂‖ max‖w‖); ``absolute`` its underflow term (times ρ)."""

    W: torch.Tensor
    post_scale: torch.Tensor | None
    rel: float
    absolute: float
    wmax: float
    precision: str

    @classmethod
    def build(cls, atoms: AtomRows, precision: str) -> Screen:
        D = atoms.dim
        u_acc = U_FP32
        gamma = D * u_acc / (1.0 - D * u_acc)
        stored_norms = atoms.norms_of_stored_rows()
        sane = bool(np.all((stored_norms == 0) | ((stored_norms < _SANE_NORM) & (stored_norms > 1.0 / _SANE_NORM))))
        if precision == "bf16":
            W = _blockwise(atoms, torch.bfloat16)
            u_r = u_a = u_o = U_BF16
            post, u_s = None, 0.0
        elif precision == "fp32" and atoms.rows.dtype == np.float32 and sane:
            W = torch.from_numpy(np.asarray(atoms.rows)).to(atoms.device)  # the stored rows, no copy on the CPU
            u_r, u_a, u_o = U_FP32, 0.0, 0.0
            post, u_s = torch.from_numpy(atoms.scale.astype(np.float32)).to(atoms.device), U_FP32
        elif precision == "fp32":
            W = _blockwise(atoms, torch.float32)
            u_r = u_a = U_FP32
            u_o, post, u_s = 0.0, None, 0.0
        else:
            raise ValueError(f"unknown screen precision {precision!r}")
        bracket = (u_r + u_a + u_r * u_a) + (1.0 + u_r) * (1.0 + u_a) * (gamma + u_o * (1.0 + gamma))
        smax = float(np.max(atoms.scale, initial=0.0)) if post is not None else 1.0
        return cls(W=W, post_scale=post, rel=2.0 * (bracket * (1.0 + u_s) ** 2 + 2.0 * u_s + u_s * u_s),
                   absolute=2.0 * (D + 4) * 2.0 ** -120 * max(smax, 1.0), wmax=atoms.unit_norm_max,
                   precision=precision)

    @property
    def dtype(self) -> torch.dtype:
        return self.W.dtype

    def bounds(self, rho: NDArray[np.float64], rhat_norm: NDArray[np.float64]) -> NDArray[np.float64]:
        """E_i ≥ |h̃_ij − h_ij| for every atom j, for rows scaled by ρ_i with ‖r̂_i‖ = rhat_norm."""
        return rho * (self.rel * rhat_norm * self.wmax + self.absolute)

    def blocks(self, Rhat: torch.Tensor, step: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """(j0, H̃) with H̃ = r̂ᵢ·w_j for j = j0 … j0 + step − 1, the scaled rows ``Rhat`` (n, D) already in the
        screen's dtype on its device; ``step`` atoms per block (None: blocks of about :data:`BLOCK_BYTES`)."""
        hi = self.W.shape[0]
        n = max(1, Rhat.shape[0])
        step = step or max(256, int(BLOCK_BYTES // (n * Rhat.element_size())))
        for j0 in range(0, hi, step):
            j1 = min(hi, j0 + step)
            with exact_matmul_mode():
                H = Rhat @ self.W[j0:j1].T
            if self.post_scale is not None:
                H.mul_(self.post_scale[j0:j1])
            yield j0, H

    def prepare(self, R: NDArray[np.float64]) -> tuple[torch.Tensor, NDArray[np.float64], NDArray[np.float64]]:
        """(R̂ in the screen's dtype on its device, ρ, bound E) for float64 rows R (n, D)."""
        norms = np.linalg.norm(R, axis=1)
        rho = power_of_two_scales(norms)
        Rhat = R / rho[:, None]
        rhat_norm = norms / rho * (1.0 + 1e-12)
        return (torch.from_numpy(Rhat).to(device=self.W.device, dtype=self.W.dtype), rho,
                self.bounds(rho, rhat_norm))


@contextmanager
def exact_matmul_mode() -> Iterator[None]:
    """float32 products at float32 precision (no TF32 or bfloat16 inside, CPU or CUDA) and bfloat16 products
    accumulated in float32 (no reduced-precision reductions on CUDA), restored afterwards."""
    precision = torch.get_float32_matmul_precision()
    cuda = torch.backends.cuda.matmul
    flags = (cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction) if torch.cuda.is_available() else None
    torch.set_float32_matmul_precision("highest")
    if flags is not None:
        cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction = False, False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        if flags is not None:
            cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction = flags


def _blockwise(atoms: AtomRows, dtype: torch.dtype, block: int = 8192) -> torch.Tensor:
    """The unit atoms rounded to ``dtype``, built a block of rows at a time (no full float64 copy)."""
    out = torch.empty((atoms.n_atoms, atoms.dim), dtype=dtype, device=atoms.device)
    for lo in range(0, atoms.n_atoms, block):
        hi = min(atoms.n_atoms, lo + block)
        out[lo:hi] = torch.from_numpy(atoms.unit_block(lo, hi)).to(device=atoms.device, dtype=dtype)
    return out


@nb.njit(**_JIT)
def _exact_products_range(rows, scale, R, pi, pj, out, lo, hi):
    D = R.shape[1]
    for t in range(lo, hi):
        i = pi[t]
        j = pj[t]
        s = scale[j]
        a = rows[j]
        r = R[i]
        acc = 0.0
        for d in range(D):
            acc += (a[d] * s) * r[d]
        out[t] = acc


def exact_products(atoms: AtomRows, R: NDArray[np.float64], pi: NDArray[np.int64], pj: NDArray[np.int64],
                   workers: int = 1) -> NDArray[np.float64]:
    """h_t = w_{pj[t]}ᵀ r_{pi[t]} in float64 for the pairs (pi, pj) (rows of R (n, D)), the atom entries
    widened and scaled exactly as :mod:`dictcheck.solvers.active_set` does; split over ``workers`` threads."""
    out = np.empty(pi.size)
    if pi.size == 0:
        return out
    R = np.ascontiguousarray(R, dtype=np.float64)
    run_in_threads(lambda lo, hi: _exact_products_range(atoms.rows, atoms.scale, R, pi, pj, out, lo, hi),
                   pi.size, workers)
    return out


def run_in_threads(fn, n: int, workers: int, parts_per_worker: int = 1) -> None:
    """fn(lo, hi) over ``workers · parts_per_worker`` contiguous parts of range(n), taken in order by
    ``workers`` threads as they come free (fn releases the GIL); in the calling thread when workers is 1."""
    workers = max(1, min(workers, n))
    if workers == 1:
        fn(0, n)
        return
    from concurrent.futures import ThreadPoolExecutor

    parts = min(n, workers * parts_per_worker)
    cuts = [n * w // parts for w in range(parts + 1)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda w: fn(cuts[w], cuts[w + 1]), range(parts)))


def _bf16_round(t32: NDArray[np.float32], up: bool) -> NDArray[np.float32]:
    """float32 values rounded to bfloat16 (the upper 16 bits), down (or up) to the nearest representable."""
    bits = t32.view(np.uint32)
    trunc = (bits & np.uint32(0xFFFF0000)).view(np.float32)  # towards zero
    away = ((bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32)
    inexact = trunc != t32
    wrong_way = (t32 > 0) if up else (t32 < 0)
    return np.where(inexact & wrong_way & np.isfinite(t32), away, trunc)


def threshold_below(t: NDArray[np.float64], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """t rounded down to ``dtype`` (float32 or bfloat16): a comparison h̃ > t̃ in that dtype then keeps every
    h̃ > t (per-row thresholds, compared without promoting the products)."""
    t32 = t.astype(np.float32)
    t32 = np.where(t32.astype(np.float64) > t, np.nextafter(t32, np.float32(-np.inf)), t32)
    if dtype == torch.bfloat16:
        t32 = _bf16_round(t32, up=False)
    return torch.from_numpy(t32).to(dtype)


def threshold_above(t: NDArray[np.float64], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """t rounded up to ``dtype`` (h̃ < t̃ keeps every h̃ < t)."""
    t32 = t.astype(np.float32)
    t32 = np.where(t32.astype(np.float64) < t, np.nextafter(t32, np.float32(np.inf)), t32)
    if dtype == torch.bfloat16:
        t32 = _bf16_round(t32, up=True)
    return torch.from_numpy(t32).to(dtype)


@dataclass(frozen=True)
class ScreenedPairs:
    """The pairs (row i, atom j) a screened product h̃_ij ≈ w_jᵀr_i cannot rule out of a query
    (:func:`screen_pairs`), sorted by row then atom, with h̃ scaled back to the rows' scale (``screened``), the
    bound E_i per row, and ``certain``: per row, the atoms with h̃_ij > above_i + margin + E_i (so for sure
    w_jᵀr_i > above_i + margin)."""

    rows: NDArray[np.int64]
    atoms: NDArray[np.int64]
    screened: NDArray[np.float64]
    bound: NDArray[np.float64]
    certain: NDArray[np.int64]


def screen_pairs(atoms: AtomRows, R: NDArray[np.float64], *, above: NDArray[np.float64] | None = None,
                 margin: float = 0.0, below: NDArray[np.float64] | None = None, top: str | tuple[str, ...] = (),
                 exclude: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None,
                 scale: NDArray[np.float64] | None = None) -> ScreenedPairs:
    """Every (i, j) whose product h_ij = w_jᵀr_i may satisfy one of the queries, for rows R (n, D) float64:

    * ``above``: h_ij > above_i (pairs with h̃_ij > above_i − E_i);
    * ``below``: h_ij < below_i (h̃_ij < below_i + E_i);
    * ``top`` "max", "min" or "abs" (or several): j may attain the row's largest h_ij (smallest h_ij, largest
      |h_ij|) over the atoms not in ``exclude`` (pairs (rows, atoms)): for "max", h̃_ij ≥ max_j' h̃_ij' − 2E_i,
      kept from a running maximum over the blocks of atoms and filtered by the final one.

    The others are certain not to (module docstring's bound E_i), so re-evaluating the pairs in float64
    (:func:`exact_products`) answers each query exactly. A row uses the bfloat16 screen when that is fast here
    and its bfloat16 bound is at most a quarter of ``scale_i`` (the magnitude its thresholds are compared at;
    default ‖r_i‖), else float32."""
    n = R.shape[0]
    empty = np.zeros(0, np.int64)
    bound = np.zeros(n)
    certain = np.zeros(n, np.int64)
    if n == 0:
        return ScreenedPairs(empty, empty.copy(), np.zeros(0), bound, certain)
    rho, rhat_norm = _scaled_norms(R)
    fast = atoms.fast_screen()
    if fast.precision == "bf16":
        limit = 0.25 * (rho * rhat_norm if scale is None else scale)
        narrow = fast.bounds(rho, rhat_norm) <= limit
        groups = [(fast, np.flatnonzero(narrow)), (atoms.screen("fp32"), np.flatnonzero(~narrow))]
    else:
        groups = [(fast, np.arange(n))]
    if exclude is not None:
        ex_order = np.argsort(exclude[1], kind="stable")
        ex_rows, ex_atoms = exclude[0][ex_order], exclude[1][ex_order]
    parts: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]] = []
    for screen, sel in groups:
        if sel.size == 0:
            continue
        Rhat, rho_s, E = screen.prepare(R[sel])
        bound[sel] = E
        dev = Rhat.device
        local = np.full(n, -1, np.int64)
        local[sel] = np.arange(sel.size)
        lo = None
        if above is not None:
            lo = threshold_below((above[sel] - E) / rho_s, screen.dtype).to(dev).unsqueeze(1)
        lo_below = (None if below is None else
                    threshold_above((below[sel] + E) / rho_s, screen.dtype).to(dev).unsqueeze(1))
        two_e = torch.from_numpy(2.0 * E / rho_s).to(dev)
        tops = (top,) if isinstance(top, str) else tuple(top)
        run_max = {kind: torch.full((sel.size,), -np.inf, dtype=torch.float64, device=dev) for kind in tops}
        top_parts: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {kind: [] for kind in tops}
        for j0, H in screen.blocks(Rhat, atoms.block_atoms):
            j1 = j0 + H.shape[1]
            mask = None
            if lo is not None:
                mask = H > lo
            if lo_below is not None:
                mask = (H < lo_below) if mask is None else mask | (H < lo_below)
            if mask is not None:
                r, c = torch.nonzero(mask, as_tuple=True)
                if r.numel():
                    parts.append(_pairs_of(sel, r, c, j0, H, rho_s))
            if tops and exclude is not None:
                a, b = np.searchsorted(ex_atoms, [j0, j1])
                rr = local[ex_rows[a:b]]
                ok = rr >= 0
                ex_r, ex_c = torch.from_numpy(rr[ok]).to(dev), torch.from_numpy(ex_atoms[a:b][ok] - j0).to(dev)
            for kind in tops:
                Hm = H.abs() if kind == "abs" else (-H if kind == "min" else H.clone())
                if exclude is not None:
                    Hm[ex_r, ex_c] = -np.inf
                run_max[kind] = torch.maximum(run_max[kind], Hm.amax(dim=1).double())
                band = threshold_below((run_max[kind] - two_e).cpu().numpy(), screen.dtype).to(dev)
                r, c = torch.nonzero(Hm >= band.unsqueeze(1), as_tuple=True)
                if r.numel():
                    top_parts[kind].append((r, c + j0, Hm[r, c].double(), H[r, c].double()))
        for kind, tp in top_parts.items():
            if not tp:
                continue
            r = torch.cat([p[0] for p in tp])
            c = torch.cat([p[1] for p in tp])
            v = torch.cat([p[2] for p in tp])
            keep = v >= (run_max[kind] - two_e)[r]
            h = torch.cat([p[3] for p in tp])[keep].cpu().numpy()
            r, c = r[keep].cpu().numpy(), c[keep].cpu().numpy()
            parts.append((sel[r], c, h * rho_s[r]))
    if not parts:
        return ScreenedPairs(empty, empty.copy(), np.zeros(0), bound, certain)
    pi = np.concatenate([p[0] for p in parts])
    pj = np.concatenate([p[1] for p in parts])
    hv = np.concatenate([p[2] for p in parts])
    key = pi * atoms.n_atoms + pj
    key, first = np.unique(key, return_index=True)  # a pair in several queries once, sorted by row then atom
    pi, pj, hv = pi[first], pj[first], hv[first]
    if above is not None:  # h̃ > above + margin + E: the screened value is exact in float64 (ρ is a power of two)
        sure = hv > (above + margin + bound)[pi]
        certain = np.bincount(pi[sure], minlength=n).astype(np.int64)
    return ScreenedPairs(pi, pj, hv, bound, certain)


def _pairs_of(sel, r: torch.Tensor, c: torch.Tensor, j0: int, H: torch.Tensor, rho: NDArray[np.float64]):
    """(rows, atoms, screened values scaled back) of a block's selected entries."""
    r_np = r.cpu().numpy()
    return sel[r_np], c.cpu().numpy() + j0, H[r, c].double().cpu().numpy() * rho[r_np]


def _scaled_norms(R: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(ρ, ‖r̂‖) of :meth:`Screen.prepare` without scaling the rows."""
    norms = np.linalg.norm(R, axis=1)
    rho = power_of_two_scales(norms)
    return rho, norms / rho * (1.0 + 1e-12)


def exact_extremes(atoms: AtomRows, R: NDArray[np.float64], rows: NDArray[np.int64], cols: NDArray[np.int64],
                   screened: NDArray[np.float64], bound: NDArray[np.float64], tops: tuple[str, ...],
                   need: NDArray[np.bool_] | None = None, workers: int = 1) -> NDArray[np.float64]:
    """Exact products h = w_colᵀr_row (float64, :func:`exact_products`) of the screened pairs that may attain
    their row's largest h ("max"), smallest ("min") or largest |h| ("abs") among the given pairs, and of those
    marked in ``need``; NaN for the pairs left out. Per row and kind the best screened pair is evaluated first:
    its exact value L is attained, and only pairs whose screened key reaches L − E_row can exceed it
    (|h̃ − h| ≤ E_row), so only they are evaluated too."""
    h = np.full(rows.size, np.nan)

    def evaluate(mask: NDArray[np.bool_]) -> None:
        idx = np.flatnonzero(mask & np.isnan(h))
        h[idx] = exact_products(atoms, R, rows[idx], cols[idx], workers)

    def key(kind: str, v: NDArray[np.float64]) -> NDArray[np.float64]:
        return {"max": v, "min": -v, "abs": np.abs(v)}[kind]

    first = np.zeros(rows.size, dtype=bool)
    for kind in tops:
        order = np.lexsort((-key(kind, screened), rows))
        first[order[np.unique(rows[order], return_index=True)[1]]] = True
    evaluate(first)
    wanted = first if need is None else first | need
    for kind in tops:
        done = ~np.isnan(h)
        attained = np.full(R.shape[0], -np.inf)
        np.maximum.at(attained, rows[done], key(kind, h[done]))
        wanted |= key(kind, screened) >= (attained - bound)[rows]
    evaluate(wanted)
    return h


def atom_max_products(atoms: AtomRows, V: NDArray[np.float64], workers: int = 1,
                      block: int = 4096) -> NDArray[np.float64]:
    """max_k |w_kᵀv_d| over every atom k, exactly, for each row v_d of V (n, D), blocks of rows: the screened
    products keep the atoms that may attain it (:func:`screen_pairs`, ``top="abs"``) and :func:`exact_extremes`
    re-evaluates those that still may once the best one is known."""
    out = np.zeros(V.shape[0])
    for lo in range(0, V.shape[0], block):
        Vb = np.ascontiguousarray(V[lo:lo + block])
        p = screen_pairs(atoms, Vb, top="abs")
        h = exact_extremes(atoms, Vb, p.rows, p.atoms, p.screened, p.bound, ("abs",), workers=workers)
        done = ~np.isnan(h)
        res = np.zeros(Vb.shape[0])
        np.maximum.at(res, p.rows[done], np.abs(h[done]))
        out[lo:lo + block] = res
    return out