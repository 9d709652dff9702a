"""Hypothesis: the §3 identities hold at random stationary points produced by the reference learner."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.solvers.hull_distance import hull_candidate_distances
from dictcheck.solvers.reference_learner import fit_reference
from dictcheck.theory.diagnostics import dictionary_diagnostics
from dictcheck.theory.huber import huber_objective

TOL = 1e-7


def _random_fit(seed: int, learn_bias: bool):
    rng = np.random.default_rng(seed)
    D, d_z, N = int(rng.integers(2, 5)), int(rng.integers(2, 5)), int(rng.integers(15, 40))
    atoms = rng.normal(size=(D, d_z))
    codes = rng.uniform(0.5, 2.0, size=(d_z, N)) * (rng.random((d_z, N)) < 0.4)
    X = atoms @ codes + 0.05 * rng.normal(size=(D, N)) + (rng.normal(size=(D, 1)) if learn_bias else 0.0)
    lam = float(rng.uniform(0.05, 0.3))
    W0 = rng.normal(size=(D, d_z))
    fit = fit_reference(X, lam, W0=W0, b0=np.zeros(D), learn_bias=learn_bias)
    return X, lam, fit


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_identities_hold_at_learner_stationary_points(seed: int, learn_bias: bool) -> None:
    X, lam, fit = _random_fit(seed, learn_bias)
    d = dictionary_diagnostics(fit.W, fit.Z, fit.b, X, lam, learned_bias=learn_bias)
    assert d.kkt_violation <= TOL
    if d.live_atoms:
        assert d.stationarity_violation <= TOL
        assert d.hull_violation <= TOL
        assert d.hull_prime_min_summand >= -TOL
    if learn_bias:
        assert d.bias_residual_mean_norm <= TOL
        if np.isfinite(d.bias_identity_violation):
            assert d.bias_identity_violation <= 1e-6
        # 50% rule, first half: an atom firing on > 1/2 of the points has a positive antipode gain
        for k in np.flatnonzero(d.firing_fraction > 0.5):
            assert d.antipode_gain[k] > 0
    # nesting corollary S4: nested supports only between coinciding atoms
    for k, j in d.nested_pairs:
        assert fit.W[:, k] @ fit.W[:, j] >= 1 - 1e-5
    hull = hull_candidate_distances(fit.W, fit.Z, fit.b, X, lam)
    live = np.isfinite(hull.distances["H-act-res"])
    assert np.all(hull.distances["H-act-res"][live] <= 1e-6)
    # every dictionary of every width lies above the wide-limit value at its bias
    assert fit.objective >= huber_objective(fit.b, X, lam) - 1e-12
