"""`dictcheck check-dict`: JSON contract, verdicts and error paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dictcheck.empirics.data.toys import make_toy
from dictcheck.proofs_checks.cli import main
from dictcheck.solvers.reference_learner import fit_reference

KEYS = {"kkt_violation", "stationarity_violation", "hull_violation", "bias_identity_violation", "firing_fraction",
        "antipode_gain", "nested_pairs", "stationary"}


@pytest.fixture(scope="module")
def stationary(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, float]:
    toy = make_toy("independent_features", seed=0)
    fit = fit_reference(toy.X, toy.lam, W0=toy.ground_truth["W_true"], learn_bias=True)
    root = tmp_path_factory.mktemp("dict")
    np.save(root / "W.npy", fit.W * np.array([2.0, 0.5, 3.0]))  # rescaled: check-dict must renormalise
    np.save(root / "X.npy", toy.X.T)
    np.save(root / "b.npy", fit.b)
    return root / "W.npy", root / "X.npy", root / "b.npy", toy.lam


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_stationary_dictionary_with_its_bias(stationary, capsys) -> None:
    W, X, b, lam = stationary
    out = _run(capsys, ["check-dict", "--dict", str(W), "--data", str(X), "--lam", str(lam), "--bias", str(b), "--json"])
    assert KEYS <= set(out)
    assert out["stationary"] is True
    assert out["kkt_violation"] <= 1e-8 and out["stationarity_violation"] <= 1e-7 and out["hull_violation"] <= 1e-7
    assert out["atoms_renormalised"] is True
    assert len(out["firing_fraction"]) == 3 and len(out["antipode_gain"]) == 3 and out["nested_pairs"] == []


def test_learn_bias_recovers_the_stationary_bias(stationary, capsys) -> None:
    W, X, b, lam = stationary
    out = _run(capsys, ["check-dict", "--dict", str(W), "--data", str(X), "--lam", str(lam), "--learn-bias", "--json"])
    np.testing.assert_allclose(out["bias"], np.load(b), atol=1e-6)
    assert out["stationary"] is True and out["bias_identity_violation"] <= 1e-6


def test_ground_truth_hierarchy_is_not_stationary(tmp_path: Path, capsys) -> None:
    toy = make_toy("parent_child", seed=0)
    np.save(tmp_path / "W.npy", toy.ground_truth["W_true"])
    np.save(tmp_path / "X.npy", toy.X.T)
    out = _run(capsys, ["check-dict", "--dict", str(tmp_path / "W.npy"), "--data", str(tmp_path / "X.npy"),
                        "--lam", str(toy.lam), "--json"])
    assert out["stationary"] is False and out["stationarity_violation"] > 0.1
    assert [1, 0] in out["nested_pairs"] and [2, 0] in out["nested_pairs"]
    assert main(["check-dict", "--dict", str(tmp_path / "W.npy"), "--data", str(tmp_path / "X.npy"), "--lam", "0.1"]) == 0
    text = capsys.readouterr().out
    assert "NOT stationary" in text and "nested supports" in text


@pytest.mark.parametrize(
    "W, X, extra, message",
    [
        (np.ones((3, 2)), np.ones((5, 4)), [], "rows"),
        (np.ones((3, 0)), np.ones((5, 3)), [], "zero atoms"),
        (np.zeros((3, 2)), np.ones((5, 3)), [], "zero"),
        (np.full((3, 2), np.nan), np.ones((5, 3)), [], "NaN"),
        (np.ones((3, 2)), np.ones((5, 3)), ["--lam", "0"], "--lam"),
        (np.ones((3, 2)), np.ones((5, 3)), ["--bias", "{bias_inf}"], "NaN or inf"),
        (np.ones((3, 2)), np.ones((5, 3)), ["--bias", "{bias_short}"], "entries"),
        (np.ones((3, 2)), np.ones((5, 3)), ["--bias", "{bias_short}", "--learn-bias"], "not allowed"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, W, X, extra, message) -> None:
    np.save(tmp_path / "W.npy", W)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "bias_inf.npy", np.array([0.0, np.inf, 0.0]))
    np.save(tmp_path / "bias_short.npy", np.zeros(2))
    extra = [e.format(bias_inf=tmp_path / "bias_inf.npy", bias_short=tmp_path / "bias_short.npy") for e in extra]
    lam = [] if "--lam" in extra else ["--lam", "0.1"]
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "check-dict", "--dict", str(tmp_path / "W.npy"),
                           "--data", str(tmp_path / "X.npy"), *lam, *extra], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
