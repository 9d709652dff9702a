"""The synthetic manifold benchmark: sums of embedded circles, spheres and tori (docs/bsf.md §5).

LAYOUT: samples are ROWS. ``X`` is (N, D), like the training loop and :mod:`empirics.metrics.reconstruction`.

Model (spec §5, every default is the spec's):

    x_i = Σ_{j ∈ S_i} m_ij + ε_i,   m_ij = s_j E_j φ_j(u_ij),   ε_i ~ N(0, σ² I_D)

* Types and linear dimensions n_j: ``circle`` φ = (cos θ, sin θ) (n = 2); ``sphere`` φ = g/‖g‖,
  g ~ N(0, I₃) (n = 3); ``torus`` (flat Clifford torus) φ = (cos α, sin α, cos β, sin β)/√2
  (n = 4); optional ``donut`` φ = ((1 + 0.4 cos β) cos α, (1 + 0.4 cos β) sin α, 0.4 sin β)
  (radii (1, 0.4), n = 3, not unit norm). Angles are uniform on [0, 2π). Every other φ has unit norm.
* Frames E_j ∈ R^{D×n_j}: ``orthogonal`` (default) — one QR of a D × Σn_j Gaussian, split into
  consecutive column groups (mutually orthogonal subspaces; needs Σn_j ≤ D); ``independent`` — one
  QR of a D × n_j Gaussian per manifold. QR signs are fixed so that diag(R) > 0.
* Support S_i: ``exact`` (default) — exactly k_true manifolds, uniform without replacement;
  ``bernoulli`` — each manifold independently with probability k_true/n_m.
* s_j = ``scale`` (default 1), σ = 0.01, N_train = 50 000, N_eval = 10 000 (an independent draw
  from the same frames).

Drawing order with rng = default_rng(seed): the frames (one ``standard_normal((D, Σn))``, or one
``standard_normal((D, n_j))`` per manifold in order); then the training split, then the evaluation
split. Each split draws, in order: the support (``random((N, n_m))``: exact → the k_true columns
with the smallest values per row; Bernoulli → values < k_true/n_m), the intrinsic coordinates of
every manifold j = 0..n_m−1 for ALL N samples (circle ``uniform(0, 2π, N)``; sphere
``standard_normal((N, 3))``; torus and donut ``uniform(0, 2π, (N, 2))`` for (α, β)), then the
noise ``normal(0, σ, (N, D))``.

Ground truth is kept compactly: the frames (D, Σn) with column offsets, the support (N, n_m),
the embedding coordinates φ (N, Σn) and the intrinsic coordinates per manifold;
:meth:`ManifoldSplit.contribution` materialises m_ij (N, D) for one j.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["MANIFOLD_DIMS", "ManifoldConfig", "ManifoldSplit", "ManifoldBenchmark", "make_manifold_benchmark",
           "planted_config", "sample_manifold"]

#: Linear dimension n_j of each manifold type (the dimension of its span).
MANIFOLD_DIMS: dict[str, int] = {"circle": 2, "sphere": 3, "torus": 4, "donut": 3}
DONUT_RADII = (1.0, 0.4)
FRAME_MODES = ("orthogonal", "independent")
SUPPORT_MODES = ("exact", "bernoulli")


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class ManifoldConfig:
    """Generator parameters (spec §5 defaults). ``counts``: (type, how many) in manifold order."""

    D: int = 128
    counts: tuple[tuple[str, int], ...] = (("circle", 8), ("sphere", 8), ("torus", 8))
    frames: str = "orthogonal"
    k_true: int = 3
    support: str = "exact"
    sigma: float = 0.01
    n_train: int = 50_000
    n_eval: int = 10_000
    scale: float = 1.0

    def validate(self) -> None:
        """ValueError (one line) on a bad parameter."""
        _positive_int("D", self.D)
        if not self.counts:
            raise ValueError("counts must name at least one manifold type")
        for item in self.counts:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError(f"counts entries must be (type, count) pairs, got {item!r}")
            kind, count = item
            if kind not in MANIFOLD_DIMS:
                raise ValueError(f"manifold type must be one of {sorted(MANIFOLD_DIMS)}, got {kind!r}")
            _positive_int(f"count of {kind}", count)
        if self.frames not in FRAME_MODES:
            raise ValueError(f"frames must be one of {list(FRAME_MODES)}, got {self.frames!r}")
        if self.support not in SUPPORT_MODES:
            raise ValueError(f"support must be one of {list(SUPPORT_MODES)}, got {self.support!r}")
        n_m = len(self.types)
        k = _positive_int("k_true", self.k_true)
        if k > n_m:
            raise ValueError(f"k_true must be <= the number of manifolds {n_m}, got {k}")
        if max(self.dims) > self.D:
            raise ValueError(f"every manifold dimension must be <= D = {self.D}, got {max(self.dims)}")
        if self.frames == "orthogonal" and sum(self.dims) > self.D:
            raise ValueError(f"orthogonal frames need sum of manifold dimensions {sum(self.dims)} <= D = {self.D}")
        for name in ("sigma", "scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if self.sigma < 0 or self.scale <= 0:
            raise ValueError(f"need sigma >= 0 and scale > 0, got sigma={self.sigma!r}, scale={self.scale!r}")
        _positive_int("n_train", self.n_train)
        _positive_int("n_eval", self.n_eval)

    @property
    def types(self) -> tuple[str, ...]:
        """Type of each manifold j = 0..n_m−1."""
        return tuple(kind for kind, count in self.counts for _ in range(int(count)))

    @property
    def dims(self) -> tuple[int, ...]:
        """Linear dimension n_j of each manifold."""
        return tuple(MANIFOLD_DIMS[t] for t in self.types)


def planted_config(kind: str, count: int, **overrides: Any) -> ManifoldConfig:
    """A benchmark whose manifolds all have one type, hence one planted linear dimension."""
    return ManifoldConfig(counts=((kind, count),), **overrides)


@dataclass(frozen=True, eq=False)
class ManifoldSplit:
    """One draw of N samples with its ground truth (samples are rows).

    X (N, D) data; support (N, n_m) bool, S_i as a row; phi (N, Σn) embedding coordinates φ_j(u_ij)
    of every manifold for every sample (also where j is inactive), manifold j in columns
    offsets[j]:offsets[j+1]; coords[j] the intrinsic coordinates (circle: θ (N, 1); sphere: the
    unit vector (N, 3); torus and donut: (α, β) (N, 2)); noise (N, D) the ε added.
    """

    X: NDArray[np.float64]
    support: NDArray[np.bool_]
    phi: NDArray[np.float64]
    coords: tuple[NDArray[np.float64], ...]
    noise: NDArray[np.float64]
    frames: NDArray[np.float64] = field(repr=False)
    offsets: NDArray[np.int64] = field(repr=False)
    scales: NDArray[np.float64] = field(repr=False)

    @property
    def N(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_m(self) -> int:
        return int(self.support.shape[1])

    def frame(self, j: int) -> NDArray[np.float64]:
        """E_j (D, n_j)."""
        return self.frames[:, self.offsets[j]:self.offsets[j + 1]]

    def embedding(self, j: int) -> NDArray[np.float64]:
        """s_j φ_j(u_ij) masked by the support, (N, n_j): m_ij = E_j · this row."""
        sl = slice(self.offsets[j], self.offsets[j + 1])
        return self.scales[j] * self.phi[:, sl] * self.support[:, j:j + 1]

    def contribution(self, j: int) -> NDArray[np.float64]:
        """m_ij for every sample i, (N, D); zero rows where j is inactive."""
        if not 0 <= int(j) < self.n_m:
            raise ValueError(f"manifold index must be in [0, {self.n_m}), got {j!r}")
        return self.embedding(j) @ self.frame(j).T

    def clean(self) -> NDArray[np.float64]:
        """Σ_j m_ij, the noise-free data (N, D)."""
        return self.X - self.noise


@dataclass(frozen=True, eq=False)
class ManifoldBenchmark:
    """The benchmark: its config and seed, the manifold types and frames, and the two splits."""

    config: ManifoldConfig
    seed: int
    types: tuple[str, ...]
    frames: NDArray[np.float64]
    offsets: NDArray[np.int64]
    train: ManifoldSplit
    eval: ManifoldSplit

    @property
    def n_m(self) -> int:
        return len(self.types)


def _orthonormal(G: NDArray[np.float64]) -> NDArray[np.float64]:
    """Q of the reduced QR of G with diag(R) > 0."""
    Q, R = np.linalg.qr(G)
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return Q * signs


def _draw_frames(rng: np.random.Generator, cfg: ManifoldConfig) -> NDArray[np.float64]:
    if cfg.frames == "orthogonal":
        return _orthonormal(rng.standard_normal((cfg.D, sum(cfg.dims))))
    return np.hstack([_orthonormal(rng.standard_normal((cfg.D, n))) for n in cfg.dims])


def sample_manifold(rng: np.random.Generator, kind: str, N: int) -> tuple[NDArray, NDArray]:
    """(φ (N, n), intrinsic coordinates) for N uniform draws on one manifold of type ``kind`` (spec §5)."""
    if kind not in MANIFOLD_DIMS:
        raise ValueError(f"manifold type must be one of {sorted(MANIFOLD_DIMS)}, got {kind!r}")
    _positive_int("N", N)
    if kind == "circle":
        theta = rng.uniform(0.0, 2.0 * np.pi, N)
        return np.column_stack([np.cos(theta), np.sin(theta)]), theta[:, None]
    if kind == "sphere":
        g = rng.standard_normal((N, 3))
        u = g / np.linalg.norm(g, axis=1, keepdims=True)
        return u, u.copy()
    ab = rng.uniform(0.0, 2.0 * np.pi, (N, 2))
    a, b = ab[:, 0], ab[:, 1]
    if kind == "torus":
        return np.column_stack([np.cos(a), np.sin(a), np.cos(b), np.sin(b)]) / np.sqrt(2.0), ab
    R, r = DONUT_RADII
    return np.column_stack([(R + r * np.cos(b)) * np.cos(a), (R + r * np.cos(b)) * np.sin(a), r * np.sin(b)]), ab


def _draw_split(rng: np.random.Generator, cfg: ManifoldConfig, frames: NDArray, offsets: NDArray,
                N: int) -> ManifoldSplit:
    types = cfg.types
    n_m = len(types)
    u = rng.random((N, n_m))
    if cfg.support == "exact":
        support = np.zeros((N, n_m), dtype=bool)
        np.put_along_axis(support, np.argsort(u, axis=1)[:, :cfg.k_true], True, axis=1)
    else:
        support = u < cfg.k_true / n_m
    phis, coords = [], []
    for kind in types:
        phi, c = sample_manifold(rng, kind, N)
        phis.append(phi)
        coords.append(c)
    phi = np.hstack(phis)
    noise = rng.normal(0.0, cfg.sigma, (N, cfg.D))
    scales = np.full(n_m, float(cfg.scale))
    mask = np.repeat(support, np.diff(offsets), axis=1)
    clean = (phi * mask * np.repeat(scales, np.diff(offsets))) @ frames.T
    return ManifoldSplit(X=clean + noise, support=support, phi=phi, coords=tuple(coords), noise=noise,
                         frames=frames, offsets=offsets, scales=scales)


def make_manifold_benchmark(config: ManifoldConfig | None = None, seed: int = 0) -> ManifoldBenchmark:
    """Draw the frames, then the training and evaluation splits (see the module docstring)."""
    cfg = ManifoldConfig() if config is None else config
    cfg.validate()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    frames = _draw_frames(rng, cfg)
    offsets = np.concatenate([[0], np.cumsum(cfg.dims)]).astype(np.int64)
    train = _draw_split(rng, cfg, frames, offsets, cfg.n_train)
    evaluation = _draw_split(rng, cfg, frames, offsets, cfg.n_eval)
    return ManifoldBenchmark(config=cfg, seed=int(seed), types=cfg.types, frames=frames, offsets=offsets,
                             train=train, eval=evaluation)
