"""Synthetic activations with known features and the properties of SynthSAEBench (docs/ecosystem.md §6).

A model holds n_features unit feature vectors f_g in R^d (ROWS of ``features``; superposition when
n_features > d), a bias b and, per feature, a firing probability p_g and a magnitude distribution. A sample is

    a_t = h(m_t ⊙ s_t),   x_t = a_tᵀ F + b,

where s_tg ∈ {0, 1} says which features fire, m_tg = max(0, μ_g + σ_g ε_tg) (ε standard normal) their
magnitudes, and h the hierarchy's rules. Each property is one field of :class:`SyntheticSpec`:

* **Zipfian firing** (:class:`ZipfFiring`): p_g = p_min + (p_max − p_min)(g^−α − n^−α)/(1 − n^−α) for the
  features g = 1..n in index order (the most frequent first).
* **Low-rank correlation** (rank r > 0): s_tg = 1[u_tg > Φ⁻¹(1 − p_g)] with u_t = L e_t + diag(√δ) η_t,
  e_t ~ N(0, I_r), η_t ~ N(0, I_n) (a Gaussian copula): L (n, r) has entries N(0, scale²), rows rescaled so
  that δ_g = 1 − ‖L_g‖² ≥ 0.01, so u_tg ~ N(0, 1) and P(s_tg = 1) = p_g exactly; corr(u) = L Lᵀ off the
  diagonal. Rank 0: independent Bernoulli(p_g).
* **Hierarchy** (:class:`HierarchySpec`): a forest of ``roots`` trees, each node with ``branching`` children,
  ``depth`` levels below the roots, feature indices assigned breadth first (roots 0..R−1, then their
  children, ...). Level by level from the top: a child whose parent is inactive (a = 0) is set to 0; then, in
  each group of siblings whose parent is marked mutually exclusive (a fraction ``exclusive_fraction`` of the
  parents, chosen by the seed), if more than one is active one of them, drawn uniformly, is kept. With
  ``compensate`` the firing probability of a child c of parent q is multiplied by 1/p_q (gating) and, for an
  exclusive group, by (1 + Σ_{j ≠ c} p_j / p_q) (the expected number of competitors), clipped at 1: the first
  order correction that keeps the marginal rates near p.
* **Magnitudes**: μ_g linear from ``magnitude_mean[0]`` (most frequent feature) to ``magnitude_mean[1]``;
  σ_g either one number or drawn per feature from a folded normal |N(m, s²)| (:class:`FoldedNormal`).
* **Superposition**: f_g Gaussian directions normalised; ``orthogonalise_steps`` of projected gradient descent
  on Σ_{g ≠ h} (f_gᵀ f_h)² (step ``orthogonalise_lr``, rows renormalised after each step) lower the overlaps
  (reported as ρ_mm = mean_g max_{h ≠ g} |f_gᵀ f_h|).
* **Bias**: b a Gaussian direction of norm ``bias_norm`` (0: no bias).

These are the definitions of ``sae_lens.synthetic`` (SyntheticModel, SynthSAEBench) implemented here so
that dictcheck needs no SAELens; the statistics of both are compared in the benchmark venv
(tests/test_synthetic_bench.py). Deterministic under ``seed`` (numpy generators of their own, never a
global one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.special import ndtri

__all__ = ["FoldedNormal", "HierarchySpec", "SyntheticBatch", "SyntheticModel", "SyntheticSpec", "ZipfFiring",
           "synthsaebench_spec"]

#: Smallest diagonal δ_g of the copula's covariance (rows of L are shrunk to keep it).
MIN_COPULA_DIAG = 0.01
#: Dense (rows × features) entries a sampling block holds at once.
_BLOCK_ENTRIES = 1 << 22


@dataclass(frozen=True)
class ZipfFiring:
    """Firing probabilities p_g = p_min + (p_max − p_min)(g^−α − n^−α)/(1 − n^−α), g = 1..n (module docstring)."""

    exponent: float = 1.0
    p_max: float = 0.3
    p_min: float = 0.01

    def __post_init__(self) -> None:
        if not self.exponent > 0:
            raise ValueError(f"Zipf exponent must be > 0, got {self.exponent}")
        if not 0 < self.p_min < self.p_max <= 1:
            raise ValueError(f"need 0 < p_min < p_max <= 1, got p_min={self.p_min}, p_max={self.p_max}")

    def probabilities(self, n: int) -> NDArray[np.float64]:
        if n == 1:
            return np.array([self.p_max])
        r = np.arange(1, n + 1, dtype=np.float64) ** -self.exponent
        return self.p_min + (self.p_max - self.p_min) * (r - r[-1]) / (r[0] - r[-1])


@dataclass(frozen=True)
class FoldedNormal:
    """Per-feature values |N(mean, std²)| (the magnitudes' standard deviations)."""

    mean: float = 0.0
    std: float = 0.1

    def draw(self, n: int, rng: np.random.Generator) -> NDArray[np.float64]:
        return np.abs(self.mean + self.std * rng.standard_normal(n))


@dataclass(frozen=True)
class HierarchySpec:
    """A forest: ``roots`` trees, ``branching`` children per node, ``depth`` levels below the roots; the
    children of a fraction ``exclusive_fraction`` of the parents are mutually exclusive; ``compensate`` raises
    the children's probabilities for the gating (module docstring)."""

    roots: int
    branching: int
    depth: int = 1
    exclusive_fraction: float = 1.0
    compensate: bool = False

    def __post_init__(self) -> None:
        if self.roots < 1 or self.branching < 2 or self.depth < 1:
            raise ValueError(f"hierarchy needs roots >= 1, branching >= 2, depth >= 1, got {self}")
        if not 0.0 <= self.exclusive_fraction <= 1.0:
            raise ValueError(f"exclusive_fraction must be in [0, 1], got {self.exclusive_fraction}")


@dataclass(frozen=True)
class SyntheticSpec:
    """What a :class:`SyntheticModel` is built from (module docstring; one field per property)."""

    n_features: int
    d: int
    firing: ZipfFiring = field(default_factory=ZipfFiring)
    hierarchy: HierarchySpec | None = None
    correlation_rank: int = 0
    correlation_scale: float = 0.1
    magnitude_mean: tuple[float, float] = (1.0, 1.0)
    magnitude_std: float | FoldedNormal = 0.0
    orthogonalise_steps: int = 0
    orthogonalise_lr: float = 0.01
    bias_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_features < 1 or self.d < 1:
            raise ValueError(f"n_features and d must be >= 1, got {self.n_features}, {self.d}")
        if self.correlation_rank < 0 or self.correlation_scale < 0:
            raise ValueError("correlation_rank and correlation_scale must be >= 0")
        if min(self.magnitude_mean) <= 0:
            raise ValueError(f"magnitude means must be > 0, got {self.magnitude_mean}")


def synthsaebench_spec(n_features: int = 16384, d: int = 768, *, seed: int = 0, **changes: Any) -> SyntheticSpec:
    """SynthSAEBench-16k's configuration (SAELens' docs "SynthSAEBench"): Zipf α = 0.5, p_max 0.4, p_min 5e-4;
    128 roots, branching 4, depth 3, every parent exclusive, probabilities compensated (true L0 ≈ 34.6; 13.5
    without the compensation); correlation rank 25, scale 0.1; magnitude means linear 5 → 4, standard deviations
    |N(0.5, 0.5²)|. At other sizes the roots scale with n_features (n_features/128 of them). ``changes`` override
    fields."""
    spec = SyntheticSpec(
        n_features=n_features, d=d, firing=ZipfFiring(0.5, 0.4, 5e-4),
        hierarchy=HierarchySpec(roots=max(1, n_features // 128), branching=4, depth=3, exclusive_fraction=1.0,
                                compensate=True),
        correlation_rank=25, correlation_scale=0.1, magnitude_mean=(5.0, 4.0), magnitude_std=FoldedNormal(0.5, 0.5),
        bias_norm=1.0, seed=seed)
    return SyntheticSpec(**{**spec.__dict__, **changes})


@dataclass(frozen=True)
class SyntheticBatch:
    """Tokens ``x`` (n, d) as rows and the true activations ``acts`` (n, n_features), sparse."""

    x: NDArray[np.float64]
    acts: sp.csr_array


@dataclass(frozen=True)
class _Forest:
    parent: NDArray[np.int64]  # (n_features,), −1 for roots and features outside the forest
    levels: list[NDArray[np.int64]]  # features of levels 1, 2, ... (children)
    groups: list[NDArray[np.int64]]  # per level: (n_groups, branching) exclusive sibling groups


def _forest(n: int, spec: HierarchySpec, rng: np.random.Generator) -> _Forest:
    """Breadth-first indices (module docstring); the parents of exclusive groups drawn by ``rng``."""
    parent = np.full(n, -1, dtype=np.int64)
    frontier = np.arange(min(spec.roots, n))
    nxt = frontier.size
    levels, families = [], []
    for _ in range(spec.depth):
        kids, fams = [], []
        for q in frontier:
            c = np.arange(nxt, min(nxt + spec.branching, n))
            nxt += c.size
            if c.size:
                parent[c] = q
                kids.append(c)
                if c.size == spec.branching:
                    fams.append(c)
        if not kids:
            break
        levels.append(np.concatenate(kids))
        families.append(np.array(fams, dtype=np.int64).reshape(-1, spec.branching))
        frontier = levels[-1]
    sizes = [f.shape[0] for f in families]
    chosen = np.zeros(sum(sizes), dtype=bool)
    chosen[rng.permutation(chosen.size)[:int(chosen.size * spec.exclusive_fraction)]] = True
    offsets = np.cumsum([0, *sizes])
    groups = [f[chosen[offsets[i]:offsets[i + 1]]] for i, f in enumerate(families)]
    return _Forest(parent=parent, levels=levels, groups=groups)


class SyntheticModel:
    """A synthetic data generator with known features (module docstring). Attributes: ``features`` (n, d)
    unit rows, ``bias`` (d,), ``p`` (the firing probabilities, after any compensation), ``p_target`` (before),
    ``mean``, ``std`` (magnitudes), ``factor`` (n, r) and ``diag`` (n,) of the copula (None at rank 0)."""

    def __init__(self, spec: SyntheticSpec) -> None:
        self.spec = spec
        n, d = spec.n_features, spec.d
        seeds = np.random.SeedSequence(spec.seed).spawn(5)
        rng_f, rng_h, rng_c, rng_m, self._rng_b = (np.random.default_rng(s) for s in seeds)
        F = rng_f.standard_normal((n, d))
        self.features = _orthogonalised(F / np.linalg.norm(F, axis=1, keepdims=True), spec.orthogonalise_steps,
                                        spec.orthogonalise_lr)
        bias = rng_f.standard_normal(d)
        self.bias = bias / np.linalg.norm(bias) * spec.bias_norm
        self.p_target = spec.firing.probabilities(n)
        self.forest = None if spec.hierarchy is None else _forest(n, spec.hierarchy, rng_h)
        self.p = self.p_target.copy()
        if self.forest is not None and spec.hierarchy.compensate:
            self.p = np.minimum(1.0, self.p_target * self._compensation())
        self.factor = self.diag = None
        if spec.correlation_rank > 0:
            L = rng_c.standard_normal((n, spec.correlation_rank)) * spec.correlation_scale
            sq = np.sum(L * L, axis=1)
            big = sq > 1.0 - MIN_COPULA_DIAG
            L[big] *= np.sqrt((1.0 - MIN_COPULA_DIAG) / sq[big])[:, None]
            self.factor, self.diag = L, 1.0 - np.sum(L * L, axis=1)
        self.mean = np.linspace(*spec.magnitude_mean, n)
        s = spec.magnitude_std
        self.std = s.draw(n, rng_m) if isinstance(s, FoldedNormal) else np.full(n, float(s))

    def _compensation(self) -> NDArray[np.float64]:
        f, p = self.forest, self.p_target
        factor = np.ones_like(p)
        for lvl in f.levels:
            factor[lvl] = 1.0 / p[f.parent[lvl]]
        for g in f.groups:
            if g.size:
                q = p[f.parent[g[:, 0]]][:, None]
                factor[g] *= 1.0 + (p[g].sum(axis=1, keepdims=True) - p[g]) / q
        return factor

    @property
    def n_features(self) -> int:
        return self.spec.n_features

    def sample(self, n: int, rng: np.random.Generator | None = None) -> SyntheticBatch:
        """``n`` tokens and their true activations, drawn with ``rng`` (default: the model's own stream, so
        successive calls continue it)."""
        rng = self._rng_b if rng is None else rng
        block = max(1, _BLOCK_ENTRIES // self.n_features)
        parts = [self._sample_block(min(block, n - i), rng) for i in range(0, n, block)]
        acts = sp.csr_array(sp.vstack(parts, format="csr")) if parts else sp.csr_array((0, self.n_features))
        x = np.asarray(acts @ self.features) + self.bias
        return SyntheticBatch(x=x, acts=acts)

    def _sample_block(self, m: int, rng: np.random.Generator) -> sp.csr_array:
        n = self.n_features
        if self.factor is None:
            fire = rng.random((m, n)) < self.p
        else:
            u = rng.standard_normal((m, self.factor.shape[1])) @ self.factor.T
            u += rng.standard_normal((m, n)) * np.sqrt(self.diag)
            fire = u > ndtri(1.0 - self.p)
        a = np.zeros((m, n))
        rows, cols = np.nonzero(fire)
        a[rows, cols] = np.maximum(0.0, self.mean[cols] + self.std[cols] * rng.standard_normal(rows.size))
        if self.forest is not None:
            for lvl, groups in zip(self.forest.levels, self.forest.groups):
                a[:, lvl] *= a[:, self.forest.parent[lvl]] > 0
                if groups.size:
                    _one_per_group(a, groups, rng)
        return sp.csr_array(a)

    def statistics(self, n: int = 20000, seed: int = 0) -> dict[str, Any]:
        """What characterises the model, on ``n`` fresh tokens: per-feature firing rates, true L0, the
        overlap ρ_mm, the RMS correlation of the copula (closed form), the fraction of active children whose
        parent is inactive and of exclusive groups with two active members (both 0 by construction)."""
        batch = self.sample(n, np.random.default_rng(seed))
        on = batch.acts > 0
        rates = np.asarray(on.sum(axis=0)).ravel() / n
        stats: dict[str, Any] = {"firing_rates": rates, "true_l0": on.sum() / n,
                                 "rho_mm": float(np.mean(_max_overlaps(self.features)))}
        if self.factor is not None:
            G = self.factor.T @ self.factor
            row_sq = np.sum(self.factor ** 2, axis=1)
            off = float(np.sum(G * G) - np.sum(row_sq ** 2))
            stats["rms_correlation"] = float(np.sqrt(max(off, 0.0) / (self.n_features * (self.n_features - 1))))
        if self.forest is not None:
            dense_on = on.toarray()
            kids = np.concatenate(self.forest.levels)
            orphans = dense_on[:, kids] & ~dense_on[:, self.forest.parent[kids]]
            stats["orphan_fraction"] = float(orphans.sum() / max(dense_on[:, kids].sum(), 1))
            groups = [g for g in self.forest.groups if g.size]
            clashes = sum(int(np.sum(dense_on[:, g].sum(axis=2) > 1)) for g in groups)
            stats["exclusive_clashes"] = clashes
        return stats


def _one_per_group(a: NDArray, groups: NDArray[np.int64], rng: np.random.Generator) -> None:
    """In every (token, group) with more than one active sibling keep one drawn uniformly (in place)."""
    active = a[:, groups] > 0  # (m, G, k)
    clash = active.sum(axis=2) > 1
    if not clash.any():
        return
    t, g = np.nonzero(clash)
    score = np.where(active[t, g], rng.random((t.size, groups.shape[1])), -1.0)
    lose = active[t, g] & (np.arange(groups.shape[1]) != np.argmax(score, axis=1)[:, None])
    i, j = np.nonzero(lose)
    a[t[i], groups[g[i], j]] = 0.0


def _max_overlaps(F: NDArray, block: int = 1024) -> NDArray[np.float64]:
    """max_{h ≠ g} |f_gᵀ f_h| for every row g (blocks of rows)."""
    out = np.empty(F.shape[0])
    for lo in range(0, F.shape[0], block):
        c = np.abs(F[lo:lo + block] @ F.T)
        c[np.arange(c.shape[0]), lo + np.arange(c.shape[0])] = 0.0
        out[lo:lo + block] = c.max(axis=1)
    return out


def _orthogonalised(F: NDArray, steps: int, lr: float, block: int = 1024) -> NDArray[np.float64]:
    """``steps`` of projected gradient descent on Σ_{g ≠ h}(f_gᵀf_h)², rows renormalised after each (the
    gradient 4 Σ_{h ≠ g} (f_gᵀf_h) f_h computed for blocks of rows)."""
    for _ in range(steps):
        grad = np.empty_like(F)
        for lo in range(0, F.shape[0], block):
            C = F[lo:lo + block] @ F.T
            C[np.arange(C.shape[0]), lo + np.arange(C.shape[0])] = 0.0
            grad[lo:lo + block] = 4.0 * (C @ F)
        F = F - lr * grad
        F /= np.linalg.norm(F, axis=1, keepdims=True)
    return F
