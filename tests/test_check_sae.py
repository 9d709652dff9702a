"""`dictcheck check-sae`: an SAE folder (SAELens, sparsify, dictionary_learning) checked against the theory:
λ from the folder, auto or given; polishing to the nearest stationary point; streaming; bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import safetensors.torch
import torch

from dictcheck.empirics.data.activation_store import FORMAT, MANIFEST
from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae
from dictcheck.empirics.architectures.linear_sae import make_sae
from dictcheck.empirics.data.toys import make_toy
from dictcheck.proofs_checks.cli import main
from dictcheck.solvers.lam_search import lam_for_l0
from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.solvers.polish import polish_dictionary
from dictcheck.solvers.reference_learner import fit_reference
from dictcheck.theory.diagnostics import dictionary_diagnostics
from dictcheck.theory.objective import sae_objective


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


# ----------------------------------------------------------------------------------- λ, polish, formats
def _run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["check-sae", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_lambda_from_the_folder_auto_and_given(tmp_path: Path, toy_and_fit, capsys) -> None:
    toy, fit = toy_and_fit
    np.save(tmp_path / "X.npy", toy.X.T)
    data = ["--data", str(tmp_path / "X.npy")]
    relu = _save(tmp_path, "relu", fit.W.T.copy(), fit.b, toy.lam)
    out = _run_json([str(relu), *data], capsys)
    assert out["lam"] == toy.lam and out["lam_source"] == "folder" and out["stationary"] is True
    # a SAELens standard folder: λ = l1_coefficient / 2 (SAELens' loss is mean_t ‖x − x̂‖² + c Σ z_d ‖w_d‖)
    cfg = json.loads((relu / "cfg.json").read_text())
    del cfg["metadata"]["dictcheck"]
    cfg["metadata"]["training_architecture_details"] = {"l1_coefficient": 2 * toy.lam, "lp_norm": 1.0}
    (relu / "cfg.json").write_text(json.dumps(cfg))
    out = _run_json([str(relu), *data], capsys)
    assert out["lam"] == pytest.approx(toy.lam, rel=1e-15) and out["lam_source"] == "folder"
    assert "l1_coefficient" in out["lam_details"]["note"]
    out = _run_json([str(relu), *data, "--lam", "0.3"], capsys)
    assert out["lam"] == 0.3 and out["lam_source"] == "given"
    cfg["metadata"]["training_architecture_details"] = {"l1_coefficient": 0.2, "lp_norm": 2.0}
    (relu / "cfg.json").write_text(json.dumps(cfg))
    assert main(["check-sae", str(relu), *data]) == 2  # an l2 penalty is not objective (1): λ is not guessed
    assert "give --lam" in capsys.readouterr().err
    # TopK: no λ comes with it; auto finds the λ whose exact codes are as sparse as the SAE's
    topk = _save(tmp_path, "topk", fit.W.T.copy(), fit.b, toy.lam, k=2)
    out = _run_json([str(topk), *data], capsys)
    assert out["lam_source"] == "auto" and out["lam_details"]["target_l0"] == pytest.approx(out["l0_sae"])
    assert abs(out["l0_exact"] - out["l0_sae"]) <= 0.05 * out["l0_sae"]


def test_lam_for_l0_finds_a_known_sparsity() -> None:
    rng = np.random.default_rng(4)
    W = rng.normal(size=(6, 14))
    W /= np.linalg.norm(W, axis=0)
    X = rng.normal(size=(6, 120)) * 2
    b = rng.normal(size=6) * 0.1
    for lam0 in (0.05, 1.1):
        target = exact_codes(W, X, b, lam0).mean_support
        found = lam_for_l0(W, X, b, target)
        assert found.l0 == pytest.approx(target, abs=1 / 120)  # L0 is piecewise constant in λ: hit it or adjacent
        assert exact_codes(W, X, b, found.lam).mean_support == pytest.approx(found.l0)
    with pytest.raises(ValueError, match="target L0"):
        lam_for_l0(W, X, b, 15.0)


def test_polish_keeps_a_stationary_point_and_returns_a_perturbed_one(toy_and_fit) -> None:
    toy, fit = toy_and_fit
    W = fit.W[:, fit.live]
    same = polish_dictionary(W, fit.b, toy.X, toy.lam)
    assert same.converged and same.iterations <= 2
    assert abs(same.objective_after - fit.objective) <= 1e-12 * fit.objective
    assert np.min(np.sum(W * same.W, axis=0)) >= 1 - 1e-12
    rng = np.random.default_rng(1)
    moved = polish_dictionary(W + 0.05 * rng.normal(size=W.shape), fit.b + 0.05, toy.X, toy.lam)
    assert moved.converged and moved.objective_before > fit.objective * (1 + 1e-3)
    assert moved.objective_after == pytest.approx(fit.objective, rel=1e-10)
    assert np.min(np.sum(W * moved.W, axis=0)) >= 1 - 1e-9
    d = dictionary_diagnostics(moved.W, moved.codes.to_dense(), moved.b, toy.X, toy.lam, learned_bias=True)
    assert d.stationary


def test_polish_report_and_json_contract(tmp_path: Path, toy_and_fit, capsys) -> None:
    toy, fit = toy_and_fit
    np.save(tmp_path / "X.npy", toy.X.T)
    rng = np.random.default_rng(2)
    W_dec = fit.W.T + 0.05 * rng.normal(size=fit.W.T.shape)
    folder = _save(tmp_path, "relu", W_dec, fit.b, toy.lam)
    out = _run_json([str(folder), "--data", str(tmp_path / "X.npy"), "--polish"], capsys)
    for key in ("lam", "lam_source", "l0_sae", "l0_exact", "verdict", "timings_s", "amortisation_gap"):
        assert key in out, key
    p = out["polish"]
    assert {"objective_before", "objective_after", "atom_cosines", "stationary"} <= set(p)
    assert p["stationary"] is True and p["objective_after"] < p["objective_before"]
    assert len(p["atom_cosines"]) == 3 and min(p["atom_cosines"]) > 0.99
    held, N = p["held_out"], toy.X.shape[1]
    assert held["n_tokens"] == round(0.2 * N) and p["n_tokens"] == N - held["n_tokens"]
    assert held["objective_after"] < held["objective_before"]  # the perturbation is undone on unseen tokens too
    Xh = toy.X[:, np.unique(np.linspace(0, N - 1, held["n_tokens"]).round().astype(np.int64))]
    W_unit = (W_dec / np.linalg.norm(W_dec, axis=1, keepdims=True)).T
    ex = exact_codes(W_unit, Xh, fit.b, toy.lam, tol=1e-12)
    assert held["objective_before"] == pytest.approx(sae_objective(W_unit, ex.Z, fit.b, Xh, toy.lam), rel=1e-9)
    assert out["stationary"] is False and out["verdict"].startswith("This relu SAE")
    assert main(["check-sae", str(folder), "--data", str(tmp_path / "X.npy"), "--polish"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("This relu SAE") and "How to read the violations" in text and "polish (" in text
    assert "held-out tokens" in text
    none_held = _run_json([str(folder), "--data", str(tmp_path / "X.npy"), "--polish", "--polish-holdout", "0"], capsys)
    assert none_held["polish"]["held_out"] is None and none_held["polish"]["n_tokens"] == N


def test_batches_do_not_change_the_report(tmp_path: Path, toy_and_fit, capsys) -> None:
    toy, fit = toy_and_fit
    np.save(tmp_path / "X.npy", toy.X.T)
    folder = _save(tmp_path, "relu", fit.W.T.copy() + 0.01, fit.b, toy.lam)
    one = _run_json([str(folder), "--data", str(tmp_path / "X.npy")], capsys)
    many = _run_json([str(folder), "--data", str(tmp_path / "X.npy"), "--batch-size", "7"], capsys)
    for key in ("objective", "kkt_violation", "stationarity_violation", "hull_violation", "amortisation_gap",
                "best_new_atom_gain", "wide_gap"):
        assert many[key] == pytest.approx(one[key], rel=1e-9, abs=1e-12), key
    assert many["nested_pairs"] == one["nested_pairs"] and many["metrics"] == pytest.approx(one["metrics"])


def test_other_formats_and_an_activation_store(tmp_path: Path, toy_and_fit, capsys) -> None:
    toy, fit = toy_and_fit
    X = toy.X.T.astype(np.float32)
    np.save(tmp_path / "X.npy", X)
    W_dec = torch.as_tensor(fit.W.T.copy(), dtype=torch.float32)
    sparsify = tmp_path / "sparsify"
    sparsify.mkdir()
    safetensors.torch.save_file({"encoder.weight": W_dec.clone(), "encoder.bias": torch.zeros(3), "W_dec": W_dec,
                                 "b_dec": torch.as_tensor(fit.b, dtype=torch.float32)}, sparsify / "sae.safetensors")
    (sparsify / "cfg.json").write_text(json.dumps({"num_latents": 3, "k": 2, "d_in": 3}))
    out = _run_json([str(sparsify), "--data", str(tmp_path / "X.npy"), "--lam", str(toy.lam)], capsys)
    assert out["format"] == "sparsify" and out["arch"] == "topk"
    dl = tmp_path / "dl"
    dl.mkdir()
    torch.save({"encoder.weight": W_dec.clone(), "encoder.bias": torch.zeros(3), "decoder.weight": W_dec.T.clone(),
                "bias": torch.as_tensor(fit.b, dtype=torch.float32)}, dl / "ae.pt")
    (dl / "config.json").write_text(json.dumps({"trainer": {"dict_class": "AutoEncoder"}}))
    out = _run_json([str(dl), "--data", str(tmp_path / "X.npy"), "--lam", str(toy.lam)], capsys)
    assert out["format"] == "dictionary_learning" and out["arch"] == "relu"
    store = tmp_path / "store"
    store.mkdir()
    shards = []
    for i, lo in enumerate(range(0, len(X), 64)):
        np.save(store / f"shard_{i:05d}.npy", X[lo:lo + 64])
        shards.append({"file": f"shard_{i:05d}.npy", "rows": int(len(X[lo:lo + 64])),
                       "sha256": hashlib.sha256((store / f"shard_{i:05d}.npy").read_bytes()).hexdigest()})
    (store / MANIFEST).write_text(json.dumps({"format": FORMAT, "d": 3, "shards": shards}))
    from_store = _run_json([str(dl), "--data", str(store), "--lam", str(toy.lam)], capsys)
    assert from_store["objective"] == pytest.approx(out["objective"], rel=1e-12) and from_store["n_tokens"] == len(X)


@pytest.mark.parametrize("problem", ["nan_weights", "zscore", "empty_data", "wrong_d"])
def test_more_bad_inputs_exit_2_with_one_line(tmp_path: Path, toy_and_fit, problem: str) -> None:
    toy, fit = toy_and_fit
    folder = _save(tmp_path, "relu", fit.W.T.copy(), fit.b, toy.lam)
    data = tmp_path / "X.npy"
    np.save(data, toy.X.T)
    if problem == "nan_weights":
        w = safetensors.torch.load_file(folder / "sae_weights.safetensors")
        w["W_dec"][0, 0] = float("nan")
        safetensors.torch.save_file(w, folder / "sae_weights.safetensors")
    elif problem == "zscore":
        cfg = json.loads((folder / "cfg.json").read_text())
        cfg["normalize_activations"] = "zscore"
        (folder / "cfg.json").write_text(json.dumps(cfg))
    elif problem == "empty_data":
        np.save(data, np.zeros((0, 3)))
    else:
        np.save(data, np.ones((4, 5)))
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "check-sae", str(folder), "--data",
                           str(data)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


_BLOCKED_REFERENCE: dict[str, dict] = {}


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 70), st.integers(1, 90), st.booleans(), st.sampled_from(["topk", "relu"]))
def test_report_is_the_same_for_any_blocks(tmp_path_factory, batch, latent_block, fast, arch) -> None:
    """The whole check-sae report (every number to 1e-10 relative, λ auto's bisection included) does not depend
    on the token batch, the block of atoms of the screened products, or the screen's precision."""
    from dictcheck.proofs_checks.sae_report import SaeCheckSettings, sae_report

    if arch not in _BLOCKED_REFERENCE:
        tmp = tmp_path_factory.mktemp(arch)
        rng = np.random.default_rng(7)
        W = rng.normal(size=(48, 10))
        W /= np.linalg.norm(W, axis=1, keepdims=True)
        X = np.maximum(rng.normal(size=(160, 48)) - 1.0, 0.0) @ W + 0.05 * rng.normal(size=(160, 10))
        folder = _save(tmp, arch, W, 0.01 * rng.normal(size=10), 0.1, k=4 if arch == "topk" else None)
        lam = "auto" if arch == "topk" else None
        _BLOCKED_REFERENCE[arch] = {"args": (str(folder), X, lam),
                                    "report": sae_report(str(folder), X, SaeCheckSettings(lam=lam))}
    folder, X, lam = _BLOCKED_REFERENCE[arch]["args"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dictcheck.solvers.atom_rows.bf16_is_fast", lambda device: fast)
        got = sae_report(folder, X, SaeCheckSettings(lam=lam, batch_size=batch, latent_block=latent_block))
    ref = _BLOCKED_REFERENCE[arch]["report"]

    def same(a, b, path=""):
        if isinstance(a, dict):
            for key in a:
                if key != "timings_s":
                    same(a[key], b[key], f"{path}.{key}")
        elif isinstance(a, list):
            assert len(a) == len(b), path
            for i, (u, v) in enumerate(zip(a, b)):
                same(u, v, f"{path}[{i}]")
        elif isinstance(a, float) and isinstance(b, float):
            assert a == b or abs(a - b) <= 1e-10 * max(abs(a), abs(b)), (path, a, b)
        else:
            assert a == b, (path, a, b)

    same(ref, got)
