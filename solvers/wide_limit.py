"""The wide-limit solver: optimal bias, value, Q*, and the narrowest optimal dictionary.

docs/theory.md §4.2–§4.4 and the certificate procedure of §2.3.

* b* is the Huber median (learned bias) or the given b.
* The optimum of (1) over all widths is H(b*) = (1/N) Σ_i h_λ(‖x_i − b*‖), with
  Q* = diag((ρ_i − λ)₊) in balanced codes.
* Ray clustering: the points with ρ_i > λ are grouped by their direction from b; a direction
  within angle τ_ray of a ray's leader joins that ray (leader clustering). Decision: τ_ray =
  1e-6 rad by default.
  Each ray gets the unit atom along the code-weighted mean direction of its points and each point
  the unit-atom code (ŵᵀx̃_i − λ)₊ on its own ray's atom. The objective (1) that this dictionary
  attains with those codes is reported, never assumed: it equals the optimum exactly only when
  merged rays are exactly shared.
* certified_gap (spec §2.3 steps 4–6): attained objective − H(b), plus ‖∇H(b)‖·max_i‖x_i − b‖
  when b is learned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import sparse

from dictcheck.solvers.medians import huber_median
from dictcheck.theory.certificate import certified_gap
from dictcheck.theory.objective import centred
from dictcheck.theory.wide_limit import wide_optimum_at_bias

DEFAULT_RAY_TOL = 1e-6


@dataclass(frozen=True)
class RayClustering:
    """Atoms (D, n_rays), each point's ray (−1: no atom needed) and its unit-atom code on that ray.

    Each point uses at most one atom, so codes are stored per point; ``codes()`` builds the
    sparse (n_rays, N) code matrix Z of objective (1).
    """

    atoms: NDArray[np.float64]
    assignment: NDArray[np.int64]
    point_codes: NDArray[np.float64]
    tolerance: float

    @property
    def n_rays(self) -> int:
        return int(self.atoms.shape[1])

    def codes(self) -> sparse.csc_array:
        """Z (n_rays, N) as a sparse matrix with one entry per represented point."""
        used = np.flatnonzero(self.assignment >= 0)
        shape = (self.n_rays, self.assignment.size)
        return sparse.csc_array((self.point_codes[used], (self.assignment[used], used)), shape=shape)

    def objective(self, X: NDArray, b: ArrayLike, lam: float) -> float:
        """Objective (1) attained by these atoms and codes: (1/N) Σ_i ‖x̃_i − z_i ŵ_{k_i}‖² + 2λ z_i."""
        Xc = centred(X, b)
        used = np.flatnonzero(self.assignment >= 0)
        R = Xc.copy()
        R[:, used] -= self.atoms[:, self.assignment[used]] * self.point_codes[used]
        return float((np.sum(R * R) + 2.0 * lam * np.sum(self.point_codes)) / Xc.shape[1])


def _leader_labels(directions: NDArray[np.float64], chord: float) -> NDArray[np.int64]:
    """Leader clustering of unit directions (n, D): a direction joins the first ray whose leader lies
    within chord distance, else it leads a new ray.

    Points are visited in the order of a fixed projection s = Uv (v a deterministic unit vector);
    since |s_u − s_v| ≤ ‖u − v‖, only leaders whose projection lies within the chord can match, so
    each point is compared with a short window of leaders: O(n log n) for generic data.
    """
    n, D = directions.shape
    v = np.random.default_rng(0).standard_normal(D)
    v /= np.linalg.norm(v)
    proj = directions @ v
    order = np.argsort(proj, kind="stable")
    labels = np.empty(n, dtype=np.int64)
    leader_rows: list[int] = []
    leader_proj: list[float] = []
    first = 0  # leaders before this index have projections more than chord below the current point
    for i in order:
        s_i = proj[i]
        while first < len(leader_proj) and leader_proj[first] < s_i - chord:
            first += 1
        label = -1
        if first < len(leader_rows):
            window = np.asarray(leader_rows[first:])
            dist = np.linalg.norm(directions[window] - directions[i], axis=1)
            hits = np.flatnonzero(dist <= chord)
            if hits.size:
                label = first + int(hits[0])
        if label < 0:
            label = len(leader_rows)
            leader_rows.append(int(i))
            leader_proj.append(float(s_i))
        labels[i] = label
    return labels


def cluster_rays(X: NDArray, b: ArrayLike, lam: float, tol: float = DEFAULT_RAY_TOL) -> RayClustering:
    """Group the points beyond λ from b into rays whose directions lie within tol radians of a leader.

    Two unit directions u, v are within angle θ iff ‖u − v‖ ≤ 2 sin(θ/2). Each ray is led by its
    first member (leader clustering, see ``_leader_labels``); rays are numbered by their first
    point in data order. For exactly shared rays and generic data this equals the exact ray count.
    """
    if tol < 0 or not np.isfinite(tol):
        raise ValueError(f"ray tolerance must be a non-negative angle in radians, got {tol}")
    Xc = centred(X, b)
    N = Xc.shape[1]
    rho = np.linalg.norm(Xc, axis=0)
    beyond = np.flatnonzero(rho > lam)
    assignment = np.full(N, -1, dtype=np.int64)
    if beyond.size == 0:
        return RayClustering(np.zeros((Xc.shape[0], 0)), assignment, np.zeros(N), tol)
    directions = (Xc[:, beyond] / rho[beyond]).T
    raw = _leader_labels(directions, 2.0 * np.sin(min(tol, np.pi) / 2.0))
    _, first, labels = np.unique(raw, return_index=True, return_inverse=True)
    labels = np.argsort(np.argsort(first))[labels]  # renumber rays by first occurrence
    n_rays = first.size
    weights = rho[beyond] - lam
    atoms = np.zeros((Xc.shape[0], n_rays))
    np.add.at(atoms.T, labels, directions * weights[:, None])
    atoms /= np.linalg.norm(atoms, axis=0)
    assignment[beyond] = labels
    point_codes = np.zeros(N)
    point_codes[beyond] = np.maximum(np.sum(atoms[:, labels] * Xc[:, beyond], axis=0) - lam, 0.0)
    return RayClustering(atoms, assignment, point_codes, tol)


@dataclass(frozen=True)
class WideLimitSolution:
    """Everything the wide-limit theory says about one data set at one λ."""

    b: NDArray[np.float64]
    objective: float
    q_diag: NDArray[np.float64]
    rays: RayClustering
    attained_objective: float
    certified_gap: float
    gap_at_bias: float
    bias_gap_bound: float
    learned_bias: bool
    seconds: float

    @property
    def n_rays(self) -> int:
        return self.rays.n_rays


def solve_wide_limit(
    X: NDArray, lam: float, *, b: ArrayLike | None = None, ray_tol: float = DEFAULT_RAY_TOL, median_tol: float = 1e-14
) -> WideLimitSolution:
    """Closed-form global optimum of (1) for data X (D, N); ``b=None`` learns the bias (spec §4)."""
    start = time.perf_counter()
    X = np.asarray(X, dtype=np.float64)
    learned = b is None
    b_star = huber_median(X, lam, tol=median_tol).b if learned else np.asarray(b, dtype=np.float64).reshape(-1)
    optimum = wide_optimum_at_bias(X, b_star, lam)
    rays = cluster_rays(X, b_star, lam, ray_tol)
    attained = rays.objective(X, b_star, lam)
    gap = certified_gap(attained, b_star, X, lam, learned_bias=learned)
    return WideLimitSolution(
        b=b_star, objective=optimum.value, q_diag=optimum.q_diag, rays=rays, attained_objective=attained,
        certified_gap=gap.certified_gap, gap_at_bias=gap.gap_at_bias, bias_gap_bound=gap.bias_term,
        learned_bias=learned, seconds=time.perf_counter() - start,
    )
