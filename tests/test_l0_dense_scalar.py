"""The L0 dense scalar (docs/theory.md §5.5): the exact 1-D solver against exhaustive search over
assignments and a grid over b, and the population closed form against numerical integration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers.l0_scalar import l0_fit, l0_fit_exhaustive, l0_optimum
from dictcheck.theory.dense_scalar import L0_ATOM_SETS, l0_point_costs, l0_uniform_optimum, l0_uniform_threshold

seeds = st.integers(0, 2**32 - 1)


def _sample(seed: int, n_max: int) -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, n_max + 1))
    s = np.where(rng.random(n) < 0.5, 0.0, rng.uniform(-1.0, 3.0, n))
    return s, float(rng.uniform(0.01, 2.0))


@settings(max_examples=80, deadline=None)
@given(seeds)
def test_solver_equals_exhaustive_search_over_assignments(seed: int) -> None:
    s, c = _sample(seed, 7)
    for atoms in L0_ATOM_SETS:
        fit = l0_fit(s, c, atoms)
        assert fit.objective == pytest.approx(l0_fit_exhaustive(s, c, atoms), rel=1e-10, abs=1e-12)
        assert fit.objective == pytest.approx(float(np.mean(l0_point_costs(s, fit.b, c, atoms))), abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seeds)
def test_solver_is_the_minimum_over_a_fine_grid_of_b(seed: int) -> None:
    s, c = _sample(seed, 40)
    grid = np.linspace(s.min() - 2.0, s.max() + 2.0, 20001)
    step = grid[1] - grid[0]
    for atoms in L0_ATOM_SETS:
        fit = l0_fit(s, c, atoms)
        on_grid = l0_point_costs(s[None, :], grid[:, None], c, atoms).mean(axis=1).min()
        slope = 2.0 * (np.abs(s).max() + 3.0)  # |d cost/db| ≤ 2 max|s − b| on the grid
        assert fit.objective <= on_grid + 1e-12
        assert on_grid <= fit.objective + slope * step


def _population_at(p: float, c: float, lo: float, hi: float, atoms: str, grid: np.ndarray) -> np.ndarray:
    """The population cost at each bias of ``grid`` by quadrature (midpoint rule, 4000 nodes)."""
    nodes = (lo + (hi - lo) * (np.arange(4000) + 0.5) / 4000)[None, :]
    zero = l0_point_costs(np.zeros((1, 1)), grid[:, None], c, atoms)[:, 0]
    return (1 - p) * zero + p * l0_point_costs(nodes, grid[:, None], c, atoms).mean(axis=1)


def _population(p: float, c: float, lo: float, hi: float, atoms: str) -> float:
    """min over b of the population cost on a b grid, refined once."""
    grid = np.linspace(-0.5, hi + 0.5, 1501)
    j = int(np.argmin(_population_at(p, c, lo, hi, atoms, grid)))
    fine = np.linspace(grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)], 1501)
    return float(_population_at(p, c, lo, hi, atoms, fine).min())


@settings(max_examples=12, deadline=None)
@given(st.floats(0.01, 0.2), st.floats(0.0, 1.0), st.floats(0.5, 3.0), st.floats(0.05, 0.95))
def test_population_closed_form_against_quadrature(c: float, lo_extra: float, width_extra: float, p: float) -> None:
    lo = 2.0 * np.sqrt(c) + lo_extra
    hi = lo + np.sqrt(12.0 * c) + width_extra
    opt = l0_uniform_optimum(p, c, lo, hi)
    tol = 1e-5
    assert _population(p, c, lo, hi, "+u") == pytest.approx(opt.one_latent, abs=tol)
    assert _population(p, c, lo, hi, "+u,-u") == pytest.approx(opt.objective, abs=tol)
    # One flipped atom at b = hi − √c does as well as any pair: the second latent never strictly pays.
    at_top = _population_at(p, c, lo, hi, "-u", np.array([hi - np.sqrt(c)]))[0]
    assert at_top == pytest.approx(opt.pair, abs=tol)
    # Above p* that is the −u optimum; below it −u may do better elsewhere (b near the mean, zeros paying b²)
    # but never better than +u, which is optimal there.
    minus_only = _population(p, c, lo, hi, "-u")
    if p > opt.p_star:
        assert minus_only == pytest.approx(opt.pair, abs=tol)
    else:
        assert opt.one_latent - tol <= minus_only <= opt.pair + tol
    assert _population(p, c, lo, hi, "none") >= opt.objective - tol
    assert opt.n_latents == (2 if p > opt.p_star else 1)


def test_threshold_values_and_regime() -> None:
    assert l0_uniform_threshold(0.1, 1.0, 3.0) == pytest.approx(1.0 / (1.0 + (2.0 / 3.0) * np.sqrt(0.1)))
    with pytest.raises(ValueError, match="2\\*sqrt"):
        l0_uniform_threshold(0.3, 1.0, 3.0)
    with pytest.raises(ValueError, match="12c"):
        l0_uniform_threshold(0.1, 1.0, 1.5)
    with pytest.raises(ValueError, match="atoms"):
        l0_point_costs(np.zeros(2), 0.0, 0.1, "u")
    with pytest.raises(ValueError, match="finite"):
        l0_fit(np.array([np.nan]), 0.1, "+u")
    with pytest.raises(ValueError, match="at most 16"):
        l0_fit_exhaustive(np.zeros(17), 0.1, "+u")


def test_best_set_prefers_fewer_atoms_on_ties() -> None:
    s = np.r_[np.zeros(50), np.full(50, 2.0)]
    assert l0_optimum(s, 0.1).best.atoms == "+u"  # +u, −u and ±u tie at c/2; +u is listed first
    assert l0_optimum(np.zeros(5), 0.1).n_latents == 0
