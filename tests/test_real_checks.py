"""real.* checks: registration and the antipode measure (the checks themselves need SmolLM2 activations and
run in the full suite only)."""

from __future__ import annotations

import numpy as np

from dictcheck.proofs_checks.registry import load_all_checks


def test_registered_kinds() -> None:
    registry = load_all_checks()
    assert registry["real.antipodal_dense"].kind == "replication"
    assert registry["real.stationarity"].kind == "descriptive"
    assert not registry["real.antipodal_dense"].quick and not registry["real.stationarity"].quick


def test_antipode_needs_disjoint_supports() -> None:
    from dictcheck.proofs_checks.checks.real import antipode_flags

    W = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])  # latents 0 and 1 antiparallel, 2 orthogonal
    r = np.r_[np.linspace(-2, -1, 10), np.linspace(1, 2, 10)]
    split = np.stack([np.maximum(r, 0), np.maximum(-r, 0), np.ones(20)], axis=1)
    shared = np.stack([np.abs(r), np.abs(r), np.ones(20)], axis=1)
    has, pairs = antipode_flags(W, split)
    assert has.tolist() == [True, True, False] and pairs == [{"latents": [0, 1], "jaccard": 0.0}]
    has, pairs = antipode_flags(W, shared)
    assert not has.any() and pairs[0]["jaccard"] == 1.0
