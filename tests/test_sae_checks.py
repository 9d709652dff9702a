"""The trained-SAE checks (proofs_checks/checks/sae.py): registration, the quick ones end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dictcheck.proofs_checks.registry import CheckContext, load_all_checks

SAE_IDS = ("sae.antipodal_threshold", "sae.antipodal_threshold_jumprelu", "sae.wide_limit", "sae.absorption_vs_width", "sae.amortisation_gap")


@pytest.fixture(scope="module")
def registry():
    return load_all_checks()


@pytest.fixture
def ctx(tmp_path):
    return CheckContext(out_dir=tmp_path, seed=0, quick=True)


def test_registered_with_predictions(registry):
    for cid in SAE_IDS:
        assert cid in registry, cid
        assert isinstance(registry[cid].predicted, str) and registry[cid].predicted
    for cid in SAE_IDS:  # replications train for a while: full suite only; the invariant is quick
        assert registry[cid].quick is (registry[cid].kind == "invariant")
    assert registry["sae.amortisation_gap"].kind == "invariant"


def test_amortisation_gap_passes(registry, ctx):
    out = registry["sae.amortisation_gap"].func(ctx)
    assert out.passed, out.measured
    assert set(out.measured["gaps"]) == {"relu", "topk", "batchtopk", "jumprelu", "abs"}
    assert out.measured["min_gap"] >= -1e-9
    assert out.tolerance == -1e-9 and out.tolerance_reason
    for row in out.details["rows"]:
        assert row["objective_exact"] <= row["objective_encoder"] + 1e-9
    json.dumps(out.measured)


def test_wide_limit_records_its_measurements(registry, ctx):
    """The prediction may fail and is then a finding; the theorem parts must hold whatever the training reached:
    bound ≤ polished ≤ exact-code objective ≤ encoder objective, and the data sets are what they claim."""
    out = registry["sae.wide_limit"].func(ctx)
    assert set(out.measured) == {"circle", "general", "interior"}
    for name, row in out.details["rows"].items():
        assert row["huber_bound"] <= row["objective_polished"] + 1e-9, name
        assert row["objective_polished"] <= row["objective_exact"] + 1e-9, name
        assert row["objective_exact"] <= row["objective_encoder"] + 1e-9, name
    assert out.measured["circle"]["hull_vertices"] == out.measured["general"]["hull_vertices"] == 12
    assert out.measured["interior"]["hull_vertices"] < 12
    assert out.verdict in ("replicated", "not replicated", "inconclusive") and len(out.controls) == 3
    assert out.passed or out.finding


def test_antipodal_reduced_relu(ctx):
    """A reduced run of the slow check's table: relu only, one p on either side of 1/2."""
    from dictcheck.proofs_checks.checks.sae import antipodal_table

    rows = antipodal_table(ctx, p_grid=(0.3, 0.7), archs=("relu",), steps=600)
    by_p = {r["p"]: r for r in rows}
    assert not by_p[0.3]["pair"] and by_p[0.7]["pair"]
    assert min(c["jaccard"] for c in by_p[0.7]["antiparallel"]) == pytest.approx(0.0, abs=1e-12)
    assert np.isfinite(by_p[0.7]["b_dot_u"]) and by_p[0.7]["b_dot_u"] > 0.5
    assert by_p[0.7]["rel_excess"] >= -1e-9  # the Huber bound is a lower bound


def test_pair_needs_disjoint_supports() -> None:
    """Cosine −1 alone is not a pair: a duplicated line (same points, signed codes) has Jaccard 1."""
    from dictcheck.proofs_checks.checks.sae import pair_summary

    W = np.array([[1.0, -1.0], [0.0, 0.0]])
    r = np.r_[np.linspace(-2, -1, 10), np.linspace(1, 2, 10)]
    split = pair_summary(W, np.stack([np.maximum(r, 0), np.maximum(-r, 0)]))
    duplicated = pair_summary(W, np.stack([r / 2, -r / 2]))
    assert split["pair"] and split["antiparallel"][0]["jaccard"] == 0.0
    assert not duplicated["pair"] and duplicated["antiparallel"][0]["jaccard"] == 1.0


def test_absorption_measures_on_ground_truth_and_a_tilt() -> None:
    from dictcheck.empirics.data.toys import make_toy
    from dictcheck.proofs_checks.checks.sae import absorption_measures
    from dictcheck.solvers.lasso_codes import exact_codes

    toy = make_toy("parent_child", seed=0)
    labels, W = toy.ground_truth["labels"], np.eye(3)
    gt = absorption_measures(W, exact_codes(W, toy.X, np.zeros(3), toy.lam).Z, labels)
    assert not gt["absorbed"] and gt["parent_off_excess"] == 0.0 and gt["child_parent_cosines"] == [0.0, 0.0]
    tilted = W.copy()
    tilted[:, 1] = np.array([0.6, 0.8, 0.0])
    m = absorption_measures(tilted, exact_codes(tilted, toy.X, np.zeros(3), toy.lam).Z, labels)
    assert m["absorbed"] and m["child_parent_cosines"][0] == pytest.approx(0.6)
