"""Brute-force optimum of objective (1) on data made of mutually orthogonal groups of rays
(docs/theory.md §4.6), used as the prediction of the width sweep.

Data: groups g = 1..G of points, each group inside its own 2-plane P_g (planes mutually orthogonal), b = 0.
An atom inside P_g never fires on another group's points (correlation 0 ≤ λ), so with atoms kept inside the
planes the problem separates: the optimum at width d_z is

    min over k_1 + … + k_G ≤ d_z of Σ_g f_g(k_g),

f_g(k) the optimum (sum form) of group g alone with k atoms. Here f_g(0) = Σ_i ρ_i², f_g(1) = Σ_i ρ_i² −
max_u gain(u) (gain lemma, S6, with r_i = x_i; the maximum over the circle of P_g by a grid and fixed-point
refinement), and f_g(k) = Σ_i h_λ(ρ_i) for k ≥ #rays of the group (§4.4). Groups here have at most two rays,
so f_g(k) for k ≥ 2 is the Huber bound.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dictcheck.solvers.new_atom_search import refine_atom
from dictcheck.theory.diagnostics import gain
from dictcheck.theory.huber import huber

#: Grid of the atom's angle in its plane before refinement.
ANGLE_GRID = 3600


def one_atom_optimum(X: NDArray, plane: NDArray, lam: float) -> tuple[float, NDArray[np.float64]]:
    """(f(1), u): the best single unit atom u inside span(plane) (D, 2 orthonormal) for the points X (D, n),
    b = 0, and the optimal sum objective Σ‖x_i‖² − gain(u)."""
    angles = np.linspace(-np.pi, np.pi, ANGLE_GRID, endpoint=False)
    U = plane @ np.vstack([np.cos(angles), np.sin(angles)])
    best = U[:, int(np.argmax(np.sum(np.maximum(U.T @ X - lam, 0.0) ** 2, axis=1)))]
    u, _ = refine_atom(best, X, lam)
    return float(np.sum(X * X) - gain(u, X, lam)), u


@dataclass(frozen=True)
class GroupPrediction:
    """f[g] = (f_g(0), f_g(1), f_g(2)) per group (sum form) and, per width d_z, the best allocation (k_1, …, k_G)
    with its mean objective and the margin (mean) to the second-best allocation with a different pattern."""

    f: list[tuple[float, float, float]]
    allocation: dict[int, tuple[int, ...]]
    objective: dict[int, float]
    margin: dict[int, float]


def predict_groups(groups: list[NDArray], planes: list[NDArray], lam: float, widths: list[int]) -> GroupPrediction:
    """Brute force over allocations of at most two atoms per group (module docstring). Raises ValueError if a
    group and its plane disagree."""
    if len(groups) != len(planes):
        raise ValueError(f"{len(groups)} groups but {len(planes)} planes")
    N = sum(g.shape[1] for g in groups)
    f = []
    for X, P in zip(groups, planes):
        rho = np.linalg.norm(X, axis=0)
        f.append((float(np.sum(rho**2)), one_atom_optimum(X, P, lam)[0], float(np.sum(huber(rho, lam)))))
    allocation, objective, margin = {}, {}, {}
    for d_z in widths:
        options = sorted((sum(f[g][k] for g, k in enumerate(ks)) / N, ks)
                         for ks in itertools.product(range(3), repeat=len(groups)) if sum(ks) <= d_z)
        best_value, best = options[0]
        allocation[d_z], objective[d_z] = best, best_value
        # saturated groups (k = 2) tie with any larger k; the next pattern is the next distinct value
        others = [v for v, ks in options if v > best_value + 1e-12]
        margin[d_z] = others[0] - best_value if others else float("inf")
    return GroupPrediction(f=f, allocation=allocation, objective=objective, margin=margin)
