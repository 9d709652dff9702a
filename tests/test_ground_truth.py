"""Ground-truth metrics (dictcheck.empirics.metrics.ground_truth, docs/ecosystem.md §6): brute-force and loop re-derivations,
batching and sparse inputs, and reference values SAELens 6.54.12 computed on a fixed case (its own equality with
``eval_sae_on_synthetic_data`` on trained-like SAEs is tests/test_ground_truth_saelens.py, in the benchmark venv)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.metrics.ground_truth import (
    GroundTruthEval,
    abs_cosines,
    best_matches,
    classification_metrics,
    mcc,
    uniqueness,
)


def _case() -> tuple[np.ndarray, ...]:
    """The fixed case the SAELens reference values below were computed on."""
    rng = np.random.default_rng(20261201)
    W = rng.standard_normal((12, 6))
    F = rng.standard_normal((10, 6))
    W[:5] = F[:5] + 0.3 * rng.standard_normal((5, 6))
    codes = np.maximum(rng.standard_normal((40, 12)) - 0.8, 0.0)
    gt = np.maximum(rng.standard_normal((40, 10)) - 0.5, 0.0)
    x = rng.standard_normal((40, 6)) + 0.5
    xh = x + 0.4 * rng.standard_normal((40, 6))
    return W, F, codes, gt, x, xh


#: sae_lens 6.54.12 on _case() in float64 (mean_correlation_coefficient, feature_uniqueness,
#: compute_classification_metrics (its counts are float32), ShrinkageCalculator, ExplainedVarianceCalculator,
#: DeadLatentsCalculator, L0Calculator); reproduce in .venv-bench.
SAELENS_REFERENCE = {"mcc": 0.819023106039905, "uniqueness": 0.5833333333333334, "precision": 0.3338744640350342,
                     "recall": 0.17710113525390625, "f1_score": 0.22318869829177856, "accuracy": 0.5854166746139526,
                     "shrinkage": 1.043615348368462, "ve": 0.834145384899718, "dead_latents": 0, "sae_l0": 2.375,
                     "true_l0": 3.45}


def test_equals_saelens_reference_values() -> None:
    W, F, codes, gt, x, xh = _case()
    ev = GroundTruthEval(W, F)
    ev.update(x, xh, codes, gt)
    got = ev.result()
    for key, want in SAELENS_REFERENCE.items():
        assert got[key] == pytest.approx(want, rel=1e-6, abs=1e-12), key


def _brute_mcc(c: np.ndarray) -> float:
    n_a, n_b = c.shape
    if n_a <= n_b:
        best = max(sum(c[i, p[i]] for i in range(n_a)) for p in itertools.permutations(range(n_b), n_a))
    else:
        best = max(sum(c[p[j], j] for j in range(n_b)) for p in itertools.permutations(range(n_a), n_b))
    return best / min(n_a, n_b)


@settings(max_examples=40, deadline=None)
@given(n_a=st.integers(1, 5), n_b=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_mcc_is_the_best_one_to_one_matching(n_a: int, n_b: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((n_a, 4)), rng.standard_normal((n_b, 4))
    assert mcc(A, B) == pytest.approx(_brute_mcc(abs_cosines(A, B)), abs=1e-12)


def test_mcc_is_one_at_the_features_up_to_sign_scale_and_order() -> None:
    F = np.random.default_rng(0).standard_normal((7, 5))
    perm = [3, 0, 6, 1, 5, 2, 4]
    W = F[perm] * np.array([2.0, -1.0, 0.5, -3.0, 1.0, 4.0, -0.1])[:, None]
    assert mcc(W, F) == pytest.approx(1.0)
    assert uniqueness(W, F) == 1.0
    assert mcc(np.zeros((3, 5)), F) == 0.0  # a zero row has cosine 0 (norm clamped, SAELens' convention)


def test_uniqueness_and_classification_by_loops() -> None:
    W, F, codes, gt, _, _ = _case()
    c = abs_cosines(W, F)
    best = [int(np.argmax(c[j])) for j in range(W.shape[0])]
    assert list(best_matches(W, F)) == best
    assert uniqueness(W, F) == len(set(best)) / W.shape[0]
    prec, rec, f1s, accs = [], [], [], []
    for j, g in enumerate(best):
        fires, truth = codes[:, j] != 0, gt[:, g] > 0
        tp, fp = np.sum(fires & truth), np.sum(fires & ~truth)
        fn, tn = np.sum(~fires & truth), np.sum(~fires & ~truth)
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        prec.append(p)
        rec.append(r)
        f1s.append(2 * p * r / (p + r) if p + r else 0.0)
        accs.append((tp + tn) / len(fires))
    got = classification_metrics(codes, gt, W, F)
    assert got == pytest.approx({"precision": np.mean(prec), "recall": np.mean(rec), "f1_score": np.mean(f1s),
                                 "accuracy": np.mean(accs)}, abs=1e-12)


def test_batches_and_sparse_inputs_give_the_same_result() -> None:
    W, F, codes, gt, x, xh = _case()
    whole = GroundTruthEval(W, F)
    whole.update(x, xh, codes, gt)
    parts = GroundTruthEval(W, F)
    for lo in (0, 7, 23):
        hi = {0: 7, 7: 23, 23: 40}[lo]
        parts.update(x[lo:hi], xh[lo:hi], sp.csr_array(codes[lo:hi]), sp.csr_array(gt[lo:hi]))
    assert parts.result() == pytest.approx(whole.result(), rel=1e-12)


def test_zero_variance_and_empty_are_refused() -> None:
    W, F, codes, gt, x, _ = _case()
    ev = GroundTruthEval(W, F)
    with pytest.raises(ValueError, match="no tokens"):
        ev.result()
    flat = np.ones_like(x)
    ev.update(flat, flat, codes, gt)
    with pytest.raises(ValueError, match="zero variance"):
        ev.result()
