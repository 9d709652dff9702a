"""`dictcheck check-sae`: an SAE folder in the SAELens layout checked against the theory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dictcheck.empirics.sae_folder import new_sae_config, save_sae
from dictcheck.empirics.sae_models import make_sae
from dictcheck.empirics.toy_data import make_toy
from dictcheck.proofs_checks.cli import main
from dictcheck.solvers.reference_learner import fit_reference


def _save(tmp: Path, arch: str, W_dec: np.ndarray, b_dec: np.ndarray, lam: float, k: int | None = None) -> Path:
    d_sae, d_in = W_dec.shape
    sae = make_sae(arch, d_in, d_sae, k=k, lam=lam if arch != "topk" else None, dtype=torch.float64)
    weights = sae.state_weights()
    weights["W_dec"] = torch.as_tensor(W_dec)
    weights["W_enc"] = torch.as_tensor(W_dec.T.copy())
    weights["b_dec"] = torch.as_tensor(b_dec)
    cfg = new_sae_config(arch, d_in, d_sae, k=k, lam=lam, dtype="float64")
    out = tmp / arch
    save_sae(out, weights, cfg)
    return out


@pytest.fixture(scope="module")
def toy_and_fit():
    toy = make_toy("independent_features", seed=0)
    fit = fit_reference(toy.X, toy.lam, W0=toy.ground_truth["W_true"], learn_bias=True)
    return toy, fit


def test_relu_sae_with_a_stationary_decoder(tmp_path: Path, toy_and_fit, capsys: pytest.CaptureFixture[str]) -> None:
    toy, fit = toy_and_fit
    folder = _save(tmp_path, "relu", fit.W.T.copy(), fit.b, toy.lam)
    np.save(tmp_path / "X.npy", toy.X.T)
    assert main(["check-sae", str(folder), "--data", str(tmp_path / "X.npy"), "--lam", str(toy.lam), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stationary"] is True  # the decoder is a stationary point of (1) with exact codes
    assert out["amortisation_gap"] >= -1e-9  # exact codes never do worse than the encoder's
    assert out["antipodal_pairs"] == [] and len(out["encoder_firing_fraction"]) == 3
    assert {"fvu", "ve", "l0", "dead_frac"} <= set(out["metrics"]) and "explained_variance" not in out["metrics"]
    assert main(["check-sae", str(folder), "--data", str(tmp_path / "X.npy"), "--lam", str(toy.lam)]) == 0
    assert "amortisation gap" in capsys.readouterr().out


def test_antipodal_pair_and_signed_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    W_dec = np.array([[1.0, 0.0, 0.0], [-1.0, 0.01, 0.0], [0.0, 0.0, 1.0]])
    W_dec /= np.linalg.norm(W_dec, axis=1, keepdims=True)
    X = rng.normal(size=(50, 3))
    np.save(tmp_path / "X.npy", X)
    folder = _save(tmp_path, "abs", W_dec, np.zeros(3), 0.1)
    assert main(["check-sae", str(folder), "--data", str(tmp_path / "X.npy"), "--lam", "0.1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["antipodal_pairs"] == [[0, 1]]
    assert out["signed_codes"] is True and out["amortisation_gap"] is None


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, toy_and_fit) -> None:
    toy, fit = toy_and_fit
    folder = _save(tmp_path, "relu", fit.W.T.copy(), fit.b, toy.lam)
    np.save(tmp_path / "wrongD.npy", np.ones((5, 4)))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cfg.json").write_text("{not json")
    cases = [
        [str(tmp_path / "missing"), "--data", str(tmp_path / "wrongD.npy"), "--lam", "0.1"],
        [str(tmp_path / "broken"), "--data", str(tmp_path / "wrongD.npy"), "--lam", "0.1"],
        [str(folder), "--data", str(tmp_path / "wrongD.npy"), "--lam", "0.1"],
        [str(folder), "--data", str(tmp_path / "wrongD.npy"), "--lam", "-1"],
    ]
    for argv in cases:
        proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "check-sae", *argv], capture_output=True, text=True)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
