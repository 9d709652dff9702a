"""Toy data generators: one home and one interface for all toy data (docs/theory.md §4, §5).

Every generator takes ``seed`` (deterministic presets accept and ignore it) and keyword parameters
whose defaults are the spec's, and returns a frozen :class:`Toy`. Data follow the project
convention (docs/README.md): ``X`` is (D, N) float64 with one point per *column*; true atoms are
columns of ``ground_truth["W_true"]`` (D, k) and true codes ``ground_truth["Z_true"]`` are (k, N).

Random draws use ``numpy.random.default_rng(seed)``. Where the spec describes a generator in words,
each docstring states the exact drawing order used, so that a stream can be reproduced. Use
:func:`make_toy` (or the :data:`TOYS` registry) to build a toy by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, eq=False)
class Toy:
    """A toy data set.

    name: registry name. X: (D, N) float64 data, points as columns. lam: the spec's λ of
    objective (1) for this toy. learn_bias: whether the spec learns b (False: b is fixed at
    ``ground_truth["b_true"]``, which is the value to pass as the fixed bias). ground_truth: what
    the generator knows (true atoms ``W_true`` (D, k), codes ``Z_true`` (k, N), ``b_true`` (D,),
    labels, and for deterministic presets the spec's reference values under ``reference``).
    params: every parameter used, seed included.
    """

    name: str
    X: NDArray[np.float64]
    lam: float
    learn_bias: bool
    ground_truth: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def D(self) -> int:
        return int(self.X.shape[0])

    @property
    def N(self) -> int:
        return int(self.X.shape[1])

    @property
    def b_fixed(self) -> NDArray[np.float64]:
        """The bias to hold fixed when ``learn_bias`` is False (the generator's b_true, else 0)."""
        b = self.ground_truth.get("b_true")
        return np.zeros(self.D) if b is None else np.asarray(b, dtype=np.float64).copy()


def _as_X(X: NDArray) -> NDArray[np.float64]:
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64))
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (D, N), got {X.shape}")
    return X


# ---------------------------------------------------------------------------------------------
# §5.3 Independent features
# ---------------------------------------------------------------------------------------------


def independent_features(
    seed: int = 0,
    *,
    N: int = 150,
    D: int = 3,
    k: int = 3,
    p: float = 0.3,
    amp_range: tuple[float, float] = (1.0, 2.0),
    noise: float = 0.01,
    lam: float = 0.1,
) -> Toy:
    """§5.3: k features, each on independently w.p. p with amplitude U[amp_range], mixed by a random
    orthonormal D×k matrix (QR of a Gaussian), plus N(0, noise²) per coordinate; λ = 0.1, b learned.

    Drawing order with rng = default_rng(seed): for each feature j = 0..k−1 in turn
    ``rng.random(N) < p`` then ``rng.uniform(*amp_range, N)``; then the mixing matrix
    ``np.linalg.qr(rng.standard_normal((D, k)))[0]`` (numpy's Q, no sign fix); then the noise
    ``rng.normal(0, noise, (D, N))``.
    """
    if k > D:
        raise ValueError(f"need k <= D for an orthonormal mix, got k={k}, D={D}")
    rng = np.random.default_rng(seed)
    Z_true = np.zeros((k, N))
    for j in range(k):
        on = rng.random(N) < p
        amp = rng.uniform(amp_range[0], amp_range[1], N)
        Z_true[j] = on * amp
    W_true = np.linalg.qr(rng.standard_normal((D, k)))[0]
    eps = rng.normal(0.0, noise, (D, N))
    X = W_true @ Z_true + eps
    return Toy(
        name="independent_features",
        X=_as_X(X),
        lam=float(lam),
        learn_bias=True,
        ground_truth={"W_true": W_true, "Z_true": Z_true, "b_true": np.zeros(D), "active": Z_true > 0,
                      "noise": eps},
        params={"seed": seed, "N": N, "D": D, "k": k, "p": p, "amp_range": tuple(amp_range),
                "noise": noise, "lam": lam},
    )


# ---------------------------------------------------------------------------------------------
# §5.2 Parent/child hierarchy
# ---------------------------------------------------------------------------------------------


def parent_child(
    seed: int = 0,
    *,
    n_parent_only: int = 60,
    n_child1: int = 30,
    n_child2: int = 30,
    parent_range: tuple[float, float] = (1.0, 2.0),
    child_range: tuple[float, float] = (1.0, 2.0),
    lam: float = 0.1,
) -> Toy:
    """§5.2: D = 3, λ = 0.1, b = 0 fixed. Parent amplitude a ~ U[1, 2] on e₁ for every point;
    n_parent_only points (a, 0, 0), then n_child1 points (a, c, 0), then n_child2 points (a, 0, c),
    with c ~ U[1, 2] (points in that order).

    Drawing order with rng = default_rng(seed): ``rng.uniform(*parent_range, N)`` for all parent
    amplitudes (point order), then ``rng.uniform(*child_range, n_child1 + n_child2)`` for the child
    amplitudes (child-1 points first). Noise-free.
    ground_truth: W_true = I₃ (parent, child 1, child 2), Z_true, labels (0 parent-only, 1 child-1,
    2 child-2), b_true = 0.
    """
    N = n_parent_only + n_child1 + n_child2
    rng = np.random.default_rng(seed)
    a = rng.uniform(parent_range[0], parent_range[1], N)
    c = rng.uniform(child_range[0], child_range[1], n_child1 + n_child2)
    labels = np.repeat([0, 1, 2], [n_parent_only, n_child1, n_child2])
    Z_true = np.zeros((3, N))
    Z_true[0] = a
    Z_true[1, labels == 1] = c[:n_child1]
    Z_true[2, labels == 2] = c[n_child1:]
    W_true = np.eye(3)
    return Toy(
        name="parent_child",
        X=_as_X(W_true @ Z_true),
        lam=float(lam),
        learn_bias=False,
        ground_truth={"W_true": W_true, "Z_true": Z_true, "b_true": np.zeros(3), "labels": labels},
        params={"seed": seed, "n_parent_only": n_parent_only, "n_child1": n_child1, "n_child2": n_child2,
                "parent_range": tuple(parent_range), "child_range": tuple(child_range), "lam": lam},
    )


# ---------------------------------------------------------------------------------------------
# §5.1 Dense scalar (rank-1)
# ---------------------------------------------------------------------------------------------

_AMPLITUDES = ("constant", "uniform", "gaussian")


def dense_scalar(
    seed: int = 0,
    *,
    p: float = 0.3,
    N: int = 1000,
    amplitude: str = "constant",
    a: float = 2.0,
    amp_range: tuple[float, float] = (1.0, 3.0),
    D: int = 1,
    u: Sequence[float] | None = None,
    offset: float | Sequence[float] = 0.0,
    lam: float = 0.1,
) -> Toy:
    """§5.1: rank-1 data x_i = s_i u + offset, b learned. Default D = 1 with u = (1,); for D > 1, u
    defaults to e₁ (pass ``u`` for another direction; it is normalised).

    amplitude:
      * 'constant' (deterministic, seed unused): exactly k = round(pN) points have s = a, the
        first k in point order; the rest are 0 (the spec's deterministic table, a = 2, N = 1000).
      * 'uniform': s_i = 0 w.p. 1 − p, else U[amp_range] (spec: U[1, 3]). Drawing order:
        ``rng.random(N) < p`` then ``rng.uniform(*amp_range, N)``.
      * 'gaussian': s ~ N(0, 1) via ``rng.standard_normal(N)`` (p unused).
    offset: a scalar (times u) or a D-vector added to every point; stored as b_true.
    ground_truth: u (D,), s (N,), W_true = u (D, 1), Z_true = s (1, N), b_true, p_hat (empirical
    share of s ≠ 0).
    """
    if amplitude not in _AMPLITUDES:
        raise ValueError(f"amplitude must be one of {_AMPLITUDES}, got {amplitude!r}")
    if u is None:
        u_vec = np.zeros(D)
        u_vec[0] = 1.0
    else:
        u_vec = np.asarray(u, dtype=np.float64).reshape(-1)
        if u_vec.size != D:
            raise ValueError(f"u must have D={D} entries, got {u_vec.size}")
        u_vec = u_vec / np.linalg.norm(u_vec)
    rng = np.random.default_rng(seed)
    if amplitude == "constant":
        k = int(round(p * N))
        s = np.zeros(N)
        s[:k] = a
    elif amplitude == "uniform":
        on = rng.random(N) < p
        s = on * rng.uniform(amp_range[0], amp_range[1], N)
    else:
        s = rng.standard_normal(N)
    off = np.asarray(offset, dtype=np.float64)
    b_true = off * u_vec if off.ndim == 0 else off.reshape(D)
    X = np.outer(u_vec, s) + b_true[:, None]
    return Toy(
        name="dense_scalar",
        X=_as_X(X),
        lam=float(lam),
        learn_bias=True,
        ground_truth={"u": u_vec, "s": s, "W_true": u_vec[:, None], "Z_true": s[None, :], "b_true": b_true,
                      "p_hat": float(np.mean(s != 0))},
        params={"seed": seed, "p": p, "N": N, "amplitude": amplitude, "a": a, "amp_range": tuple(amp_range),
                "D": D, "u": u_vec.tolist(), "offset": np.asarray(offset).tolist(), "lam": lam},
    )


# ---------------------------------------------------------------------------------------------
# §5.4 Dense feature in a narrow dictionary
# ---------------------------------------------------------------------------------------------


def dense_feature(
    seed: int = 1,
    *,
    N: int = 200,
    p_dense: float = 0.7,
    dense_range: tuple[float, float] = (1.0, 3.0),
    n_sparse: int = 2,
    p_sparse: float = 0.2,
    sparse_range: tuple[float, float] = (1.0, 2.0),
    noise: float = 0.01,
    lam: float = 0.1,
) -> Toy:
    """§5.4: D = 1 + n_sparse (= 3), λ = 0.1, b learned. Coordinate 0 is dense (on w.p. 0.7, value
    U[1, 3]); coordinates 1..n_sparse are sparse (on w.p. 0.2, value U[1, 2]); noise N(0, 0.01²).

    Drawing order with rng = default_rng(seed), seed default 1 as in the spec's reference: for
    each coordinate in turn (dense first, then the sparse ones) ``rng.random(N) < p`` then
    ``rng.uniform(lo, hi, N)`` (value drawn for every point, kept where on); then the noise
    ``rng.normal(0, noise, (D, N))``. With seed 1 this gives 139 dense-on points (p = 0.695) and
    34 on-points for each sparse coordinate (p = 0.17), and the reference learner reproduces the
    spec's seeded values (sums 70.40 for d_z = 3, 53.57 for d_z = 4, wide limit 45.10, pair
    firing 0.455 / 0.465, b₁ = 1.486), so this appears to be the reference's stream.
    ground_truth: W_true = I_D, Z_true, b_true = 0, dense_on (N,) mask, noise.
    """
    D = 1 + n_sparse
    rng = np.random.default_rng(seed)
    Z_true = np.zeros((D, N))
    specs = [(p_dense, dense_range)] + [(p_sparse, sparse_range)] * n_sparse
    for j, (pj, (lo, hi)) in enumerate(specs):
        on = rng.random(N) < pj
        val = rng.uniform(lo, hi, N)
        Z_true[j] = on * val
    eps = rng.normal(0.0, noise, (D, N))
    X = Z_true + eps
    return Toy(
        name="dense_feature",
        X=_as_X(X),
        lam=float(lam),
        learn_bias=True,
        ground_truth={"W_true": np.eye(D), "Z_true": Z_true, "b_true": np.zeros(D), "dense_on": Z_true[0] > 0,
                      "noise": eps},
        params={"seed": seed, "N": N, "p_dense": p_dense, "dense_range": tuple(dense_range), "n_sparse": n_sparse,
                "p_sparse": p_sparse, "sparse_range": tuple(sparse_range), "noise": noise, "lam": lam},
    )


# ---------------------------------------------------------------------------------------------
# Generic geometric toys
# ---------------------------------------------------------------------------------------------


def rank_one(
    seed: int = 0,
    *,
    N: int = 100,
    D: int = 2,
    signed: bool = True,
    amp_range: tuple[float, float] = (0.5, 2.0),
    direction: Sequence[float] | None = None,
    noise: float = 0.0,
    lam: float = 0.1,
    learn_bias: bool = False,
) -> Toy:
    """Points along one line through the origin: x_i = s_i u + N(0, noise²) per coordinate.

    |s_i| ~ U[amp_range]; with ``signed`` each s_i gets a random sign (points on both rays of the
    line), otherwise s_i > 0 (one ray). b defaults to fixed at 0 (``learn_bias`` False).
    Drawing order: u = normalised ``rng.standard_normal(D)`` (skipped if ``direction`` is given),
    ``rng.uniform(*amp_range, N)``, signs ``rng.choice([-1, 1], N)`` (only if signed), noise
    ``rng.normal(0, noise, (D, N))`` (only if noise > 0).
    ground_truth: u, s, W_true = u (D, 1), Z_true = s (1, N) (signed), b_true = 0.
    """
    rng = np.random.default_rng(seed)
    if direction is None:
        u = rng.standard_normal(D)
    else:
        u = np.asarray(direction, dtype=np.float64).reshape(-1)
        if u.size != D:
            raise ValueError(f"direction must have D={D} entries, got {u.size}")
    u = u / np.linalg.norm(u)
    s = rng.uniform(amp_range[0], amp_range[1], N)
    if signed:
        s = s * rng.choice(np.array([-1.0, 1.0]), N)
    X = np.outer(u, s)
    if noise > 0:
        X = X + rng.normal(0.0, noise, (D, N))
    return Toy(
        name="rank_one",
        X=_as_X(X),
        lam=float(lam),
        learn_bias=bool(learn_bias),
        ground_truth={"u": u, "s": s, "W_true": u[:, None], "Z_true": s[None, :], "b_true": np.zeros(D)},
        params={"seed": seed, "N": N, "D": D, "signed": signed, "amp_range": tuple(amp_range),
                "direction": None if direction is None else list(map(float, direction)), "noise": noise,
                "lam": lam, "learn_bias": learn_bias},
    )


#: Spec §4.4 reference (D): three rays from 0 at these angles (rad) with these radii, one near point.
REFERENCE_D_ANGLES = (0.0, 2.0, 4.0)
REFERENCE_D_RADII = ((0.7, 1.5, 2.4), (1.0, 2.0), (0.5, 1.2, 1.9))
REFERENCE_D_NEAR = ((0.1, 0.15),)
REFERENCE_D_LAM = 0.3


def rays(
    seed: int = 0,
    *,
    centre: Sequence[float] = (0.0, 0.0),
    angles: Sequence[float] | None = REFERENCE_D_ANGLES,
    directions: NDArray | None = None,
    radii: Sequence[Sequence[float]] | None = REFERENCE_D_RADII,
    n_per_ray: int = 3,
    radius_range: tuple[float, float] = (0.5, 2.5),
    near_points: Sequence[Sequence[float]] | None = REFERENCE_D_NEAR,
    noise: float = 0.0,
    lam: float = REFERENCE_D_LAM,
    learn_bias: bool = False,
) -> Toy:
    """Points on given rays from a centre: x = centre + r · dir, plus optional extra (near) points.

    Directions: ``directions`` (D, n_rays), normalised, or else ``angles`` in the plane (D = 2).
    Radii: ``radii`` (one sequence per ray), or if None ``n_per_ray`` radii U[radius_range] per
    ray drawn with ``rng.uniform`` ray by ray. near_points: extra points given *relative to the
    centre*. Noise N(0, noise²) per coordinate is drawn last (only if noise > 0); then the points no
    longer lie exactly on the rays. Point order: ray 0's radii, ray 1's, ..., then the near points.
    b is fixed at the centre by default (``learn_bias`` False).

    The defaults reproduce spec §4.4 reference (D) exactly (deterministic, N = 9, λ = 0.3); see
    also :func:`rays_reference`. ground_truth: directions (D, n_rays) = W_true, centre = b_true,
    ray (label per point, −1 for near points), radius per point (NaN for near points).
    """
    c = np.asarray(centre, dtype=np.float64).reshape(-1)
    if directions is not None:
        dirs = np.asarray(directions, dtype=np.float64)
        if dirs.ndim != 2 or dirs.shape[0] != c.size:
            raise ValueError(f"directions must be (D={c.size}, n_rays), got {dirs.shape}")
        dirs = dirs / np.linalg.norm(dirs, axis=0)
    elif angles is not None:
        if c.size != 2:
            raise ValueError("angles need a 2-D centre; pass directions for D != 2")
        ang = np.asarray(angles, dtype=np.float64)
        dirs = np.vstack([np.cos(ang), np.sin(ang)])
    else:
        raise ValueError("give angles or directions")
    n_rays = dirs.shape[1]
    rng = np.random.default_rng(seed)
    if radii is None:
        radii_list = [rng.uniform(radius_range[0], radius_range[1], n_per_ray) for _ in range(n_rays)]
    else:
        if len(radii) != n_rays:
            raise ValueError(f"need one radius list per ray ({n_rays}), got {len(radii)}")
        radii_list = [np.asarray(r, dtype=np.float64).reshape(-1) for r in radii]
    cols, ray_lab, rad = [], [], []
    for j, rj in enumerate(radii_list):
        for r in rj:
            cols.append(c + r * dirs[:, j])
            ray_lab.append(j)
            rad.append(float(r))
    for q in near_points or ():
        cols.append(c + np.asarray(q, dtype=np.float64).reshape(c.size))
        ray_lab.append(-1)
        rad.append(np.nan)
    X = np.column_stack(cols)
    if noise > 0:
        X = X + rng.normal(0.0, noise, X.shape)
    return Toy(
        name="rays",
        X=_as_X(X),
        lam=float(lam),
        learn_bias=bool(learn_bias),
        ground_truth={"W_true": dirs, "directions": dirs, "b_true": c, "centre": c, "ray": np.array(ray_lab),
                      "radius": np.array(rad), "n_rays": n_rays},
        params={"seed": seed, "centre": c.tolist(), "angles": None if angles is None else list(map(float, angles)),
                "directions": None if directions is None else np.asarray(directions).tolist(),
                "radii": [r.tolist() for r in radii_list], "n_per_ray": n_per_ray,
                "radius_range": tuple(radius_range),
                "near_points": None if near_points is None else [list(map(float, q)) for q in near_points],
                "noise": noise, "lam": lam, "learn_bias": learn_bias},
    )


def rays_reference(seed: int = 0, *, learn_bias: bool = False) -> Toy:
    """Spec §4.4 reference (D), deterministic (seed unused): λ = 0.3, rays from 0 at 0, 2.0, 4.0 rad
    with radii {0.7, 1.5, 2.4}, {1.0, 2.0}, {0.5, 1.2, 1.9}, plus the point (0.1, 0.15); N = 9.

    ground_truth["reference"] holds the spec's values: at b = 0 mean Σh_λ/N = 0.670278 (sum
    6.0325), n_rays 3; with learned b the Huber median (0.089407, 0.017366), mean 0.668658 (sum
    6.017921), n_rays 8. ``learn_bias`` selects which setting the toy declares (default b = 0).
    """
    toy = rays(seed, learn_bias=learn_bias)
    gt = dict(toy.ground_truth)
    gt["reference"] = {
        "b0_mean_objective": 0.670278, "b0_sum_objective": 6.0325, "b0_n_rays": 3,
        "huber_median": (0.089407, 0.017366), "learned_b_mean_objective": 0.668658,
        "learned_b_sum_objective": 6.017921, "learned_b_n_rays": 8,
    }
    return Toy(name="rays_reference", X=toy.X, lam=toy.lam, learn_bias=toy.learn_bias, ground_truth=gt,
               params={**toy.params, "preset": "docs/theory.md §4.4 reference (D)"})


def clusters(
    seed: int = 0,
    *,
    n_clusters: int = 3,
    n_per_cluster: int = 30,
    D: int = 2,
    centre_scale: float = 2.0,
    spread: float = 0.2,
    lam: float = 0.1,
    learn_bias: bool = True,
) -> Toy:
    """Gaussian clusters: centres ~ N(0, centre_scale²) per coordinate, points = centre +
    N(0, spread²) per coordinate, n_per_cluster points per cluster in cluster order.

    Drawing order: ``rng.normal(0, centre_scale, (D, n_clusters))`` then
    ``rng.normal(0, spread, (D, n_clusters * n_per_cluster))``.
    ground_truth: centres (D, n_clusters), labels (N,), W_true = normalised centres, b_true = 0.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, centre_scale, (D, n_clusters))
    labels = np.repeat(np.arange(n_clusters), n_per_cluster)
    eps = rng.normal(0.0, spread, (D, n_clusters * n_per_cluster))
    X = centres[:, labels] + eps
    norms = np.linalg.norm(centres, axis=0)
    return Toy(
        name="clusters",
        X=_as_X(X),
        lam=float(lam),
        learn_bias=bool(learn_bias),
        ground_truth={"centres": centres, "labels": labels, "W_true": centres / np.where(norms > 0, norms, 1.0),
                      "b_true": np.zeros(D)},
        params={"seed": seed, "n_clusters": n_clusters, "n_per_cluster": n_per_cluster, "D": D,
                "centre_scale": centre_scale, "spread": spread, "lam": lam, "learn_bias": learn_bias},
    )


#: Spec §4.3 reference (C3): six points (rows here; columns of X), λ = 0.8.
CROWDED_MEDIAN_POINTS = ((0.0, 0.0), (0.1, 0.05), (-0.05, 0.1), (3.0, 0.2), (2.5, 2.0), (-2.0, 1.0))


def crowded_median(seed: int = 0, *, lam: float = 0.8) -> Toy:
    """Spec §4.3 reference (C3), deterministic (seed unused): points (0, 0), (0.1, 0.05),
    (−0.05, 0.1), (3.0, 0.2), (2.5, 2.0), (−2.0, 1.0); λ = 0.8; b learned.

    ground_truth["reference"] holds the spec's values (valid for λ = 0.8 only): Huber median
    b* = (0.241520, 0.284281), mean objective 1.855247 (sum 11.131484), distances of the three
    clustered points to b* (0.373, 0.274, 0.345), geometric median (0.070623, 0.071584) with mean
    distance 1.427347, and the Huber objective there 1.898639.
    """
    X = np.array(CROWDED_MEDIAN_POINTS, dtype=np.float64).T
    ref = {
        "huber_median": (0.241520, 0.284281), "mean_objective": 1.855247, "sum_objective": 11.131484,
        "clustered_distances": (0.373, 0.274, 0.345), "geometric_median": (0.070623, 0.071584),
        "geometric_median_mean_distance": 1.427347, "huber_at_geometric_median": 1.898639,
    } if lam == 0.8 else {}
    return Toy(
        name="crowded_median",
        X=_as_X(X),
        lam=float(lam),
        learn_bias=True,
        ground_truth={"b_true": np.zeros(2), "clustered": np.array([True, True, True, False, False, False]),
                      "reference": ref},
        params={"seed": seed, "lam": lam, "preset": "docs/theory.md §4.3 reference (C3)"},
    )


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

TOYS: dict[str, Callable[..., Toy]] = {
    "independent_features": independent_features,
    "parent_child": parent_child,
    "dense_scalar": dense_scalar,
    "dense_feature": dense_feature,
    "rank_one": rank_one,
    "rays": rays,
    "rays_reference": rays_reference,
    "clusters": clusters,
    "crowded_median": crowded_median,
}


def make_toy(name: str, seed: int | None = None, **params: Any) -> Toy:
    """Build the toy ``name`` from :data:`TOYS`; ``seed=None`` uses the generator's default seed.

    Raises ValueError for an unknown name (listing the valid ones) and TypeError for a parameter
    the generator does not take.
    """
    try:
        gen = TOYS[name]
    except KeyError:
        raise ValueError(f"unknown toy {name!r}; valid names: {', '.join(sorted(TOYS))}") from None
    return gen(**params) if seed is None else gen(seed, **params)
