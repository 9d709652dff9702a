"""Exact minimisation over the bias of the 1-D L0 objective (docs/theory.md §5.5).

For an atom set A ⊂ {+u, −u} the mean cost (1/N) Σ_i cost_i(b) of
:func:`dictcheck.theory.dense_scalar.l0_point_costs` is piecewise quadratic in b: a point is *free* (pays
(s_i − b)²) when its residual lies in (lo, hi) with lo = −√c if −u ∈ A else −∞ and hi = √c if +u ∈ A else
+∞, and pays c otherwise. Between consecutive breakpoints s_i − lo, s_i − hi the free points are one
contiguous run of the sorted s, so each piece is minimised in closed form (b = mean of the free points,
clipped to the piece); the smallest piece minimum is the global one (the cost is continuous in b).
O(N log N) with prefix sums.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from dictcheck.theory.dense_scalar import L0_ATOM_SETS, l0_point_costs


@dataclass(frozen=True)
class L0ScalarFit:
    """The minimum over b of the mean L0 cost for one atom set: ``b``, ``objective`` (mean over points)."""

    atoms: str
    b: float
    objective: float


@dataclass(frozen=True)
class L0ScalarOptimum:
    """The best atom set (the fewest atoms among those within ``tie`` of the minimum) and every set's fit."""

    best: L0ScalarFit
    fits: dict[str, L0ScalarFit]

    @property
    def n_latents(self) -> int:
        return _n_atoms(self.best.atoms)


def l0_fit(s: ArrayLike, c: float, atoms: str) -> L0ScalarFit:
    """min_b (1/N) Σ_i cost_i(b) for the atom set ``atoms`` (exact; see the module docstring)."""
    if atoms not in L0_ATOM_SETS:
        raise ValueError(f"atoms must be one of {L0_ATOM_SETS}, got {atoms!r}")
    x = np.sort(np.asarray(s, dtype=np.float64).reshape(-1))
    if x.size == 0 or not np.all(np.isfinite(x)) or not (np.isfinite(c) and c > 0):
        raise ValueError("need a non-empty finite sample and a finite price c > 0")
    n, r = x.size, float(np.sqrt(c))
    lo = -r if "-u" in atoms else -np.inf
    hi = r if "+u" in atoms else np.inf
    cuts = np.unique(np.concatenate([x - lo if np.isfinite(lo) else [], x - hi if np.isfinite(hi) else []]))
    left = np.concatenate([[-np.inf], cuts])
    right = np.concatenate([cuts, [np.inf]])
    with np.errstate(invalid="ignore"):  # the outer pieces are unbounded; one piece when there are no cuts
        mid = np.where(np.isfinite(left) & np.isfinite(right), (left + right) / 2,
                       np.where(np.isfinite(left), left + 1.0, right - 1.0))
    mid = np.where(np.isfinite(mid), mid, 0.0)
    i0 = np.searchsorted(x, mid + lo, side="right") if np.isfinite(lo) else np.zeros(mid.size, dtype=int)
    i1 = np.searchsorted(x, mid + hi, side="left") if np.isfinite(hi) else np.full(mid.size, n)
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])
    k = i1 - i0
    S1, S2 = s1[i1] - s1[i0], s2[i1] - s2[i0]
    b = np.clip(np.divide(S1, k, out=mid.copy(), where=k > 0), left, right)
    cost = (c * (n - k) + S2 - 2.0 * b * S1 + k * b * b) / n
    j = int(np.argmin(cost))
    b_best = float(b[j])
    # Re-evaluate at the chosen b with the per-point costs (removes prefix-sum cancellation).
    return L0ScalarFit(atoms=atoms, b=b_best, objective=float(np.mean(l0_point_costs(x, b_best, c, atoms))))


def l0_fit_exhaustive(s: ArrayLike, c: float, atoms: str) -> float:
    """Brute force for small samples (2^N assignments): min over the set A of points that buy a latent (price c
    each) and over b of (1/N)[Σ_{i∉A}(s_i − b)² + c|A|], b constrained so that every bought residual has a sign
    an atom of ``atoms`` covers (+u: b ≤ min_A s; −u: b ≥ max_A s). Independent of :func:`l0_fit`."""
    x = np.asarray(s, dtype=np.float64).reshape(-1)
    if x.size > 16:
        raise ValueError(f"exhaustive search takes at most 16 points, got {x.size}")
    best = np.inf
    for mask in itertools.product((False, True), repeat=x.size):
        A = np.array(mask)
        if atoms == "none" and A.any():
            continue
        free = x[~A]
        b = free.mean() if free.size else 0.0
        if atoms == "+u" and A.any():
            b = min(b, x[A].min()) if free.size else x[A].min()
        if atoms == "-u" and A.any():
            b = max(b, x[A].max()) if free.size else x[A].max()
        best = min(best, (np.sum((free - b) ** 2) + c * A.sum()) / x.size)
    return float(best)


def l0_optimum(s: ArrayLike, c: float, tie: float = 1e-12) -> L0ScalarOptimum:
    """Every atom set's exact fit and the best one: among the sets within ``tie`` (relative) of the minimum,
    the one with the fewest atoms, so 'the second latent pays' means a strictly lower cost."""
    fits = {a: l0_fit(s, c, a) for a in L0_ATOM_SETS}
    low = min(f.objective for f in fits.values())
    near = [a for a in L0_ATOM_SETS if fits[a].objective <= low + tie * max(abs(low), 1.0)]
    return L0ScalarOptimum(best=fits[min(near, key=_n_atoms)], fits=fits)


def _n_atoms(atoms: str) -> int:
    return 0 if atoms == "none" else len(atoms.split(","))
