"""``dictcheck polish`` / :func:`dictcheck.polish` (proofs_checks/sae_polish.py, docs/theory.md §7.1): the polished
SAE as a folder that loads and re-checks, polish.json's record, the frozen decoder, resuming, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

import dictcheck
from dictcheck.empirics.io.sae_folder import load_featurizer
from dictcheck.empirics.data.synthetic import SyntheticModel, SyntheticSpec, ZipfFiring
from dictcheck.proofs_checks import sae_polish
from dictcheck.proofs_checks.cli import main
from dictcheck.solvers.polish import exact_code_objective

SWEEPS = 4
FIT = {"fit_steps": 40, "fit_batch_size": 128}


@pytest.fixture(scope="module")
def sae_and_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """A briefly trained TopK SAE (32 latents, k 3) on 1500 synthetic tokens in 12 dimensions."""
    tmp = tmp_path_factory.mktemp("polish")
    synth = SyntheticModel(SyntheticSpec(n_features=24, d=12, firing=ZipfFiring(1.0, 0.3, 0.05), seed=1))
    X = synth.sample(1500, np.random.default_rng(0)).x.astype(np.float32)
    np.save(tmp / "X.npy", X)
    dictcheck.train(X, "topk", 32, {"k": 3}, steps=150, batch_size=128, out=tmp / "sae", progress=False)
    return tmp / "sae", tmp / "X.npy", X


def _polish(sae: Path, data: Path, out: Path, **extra) -> dict:
    return dictcheck.polish(sae, str(data), out, sweeps=extra.pop("sweeps", SWEEPS), **{**FIT, **extra})


def test_the_polished_folder_loads_rechecks_and_records_the_run(tmp_path: Path, sae_and_data) -> None:
    sae, data, X = sae_and_data
    report = _polish(sae, data, tmp_path / "out")
    model, cfg = load_featurizer(tmp_path / "out")
    assert model.arch == "topk" and cfg.k == 3 and (cfg.d_in, cfg.d_sae) == (12, 32)
    state = np.load(tmp_path / "out" / "polish_work" / "dictionary.npz")
    # the folder holds the polished decoder and b_dec: the encoder fit left them where polishing put them
    np.testing.assert_allclose(model.W_dec.detach().double().numpy(), state["W"].T, atol=1e-6)
    np.testing.assert_allclose(model.b_dec.detach().double().numpy(), state["b"], atol=1e-5)
    source, _ = load_featurizer(sae)
    assert not torch.allclose(model.W_enc, source.W_enc)  # the encoder was fitted
    on_disk = json.loads((tmp_path / "out" / "polish.json").read_text())
    assert on_disk["polish"]["sweeps"] == report["polish"]["sweeps"] == len(report["polish"]["per_sweep"]) == SWEEPS
    p = report["polish"]
    # per-sweep objectives: the descent never rises on its tokens, and the last one is the reported end point
    objectives = [r["objective"] for r in p["per_sweep"]]
    assert all(b <= a * (1 + 1e-9) for a, b in zip([p["objective_before"], *objectives], objectives))
    assert p["objective_after"] == objectives[-1]
    assert p["held_out"]["objective_after"] == p["per_sweep"][-1]["objective_held_out"]
    cols, held = sae_polish.polish_split(len(X), 0.2, None)
    Xh = X[held].T.astype(np.float64)
    assert p["held_out"]["objective_after"] == pytest.approx(
        exact_code_objective(state["W"], state["b"], Xh, report["lam"]), rel=1e-9)
    assert report["encoder_fit"]["steps"] == FIT["fit_steps"] and report["encoder_fit"]["trained"] == ["W_enc", "b_enc"]
    assert len(report["encoder_fit"]["log"]) >= 2
    for key in ("sae_before", "sae_after", "exact_codes_before", "exact_codes_after"):
        assert {"fvu", "l0"} <= set(report["held_out"][key])
    assert report["held_out"]["sae_after"]["l0"] <= 3 + 1e-9  # its own k
    assert p["converged"] in (True, False) and "stationary" in p["convergence"] or "not yet" in p["convergence"]
    rechecked = dictcheck.check_sae(tmp_path / "out", str(data), report["lam"])
    assert rechecked["arch"] == "topk" and rechecked["objective"] == pytest.approx(
        exact_code_objective(state["W"], state["b"], X.T.astype(np.float64), report["lam"]), rel=1e-6)


def test_a_stopped_polish_resumes_where_it_stopped(tmp_path: Path, sae_and_data, monkeypatch) -> None:
    sae, data, _ = sae_and_data
    whole = _polish(sae, data, tmp_path / "whole", sweeps=6)
    real_save = sae_polish._save_state
    calls = []

    def crash_after_first_checkpoint(*args, **kwargs):
        real_save(*args, **kwargs)
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(sae_polish, "_save_state", crash_after_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        _polish(sae, data, tmp_path / "stopped", sweeps=6, checkpoint_every=2)
    monkeypatch.setattr(sae_polish, "_save_state", real_save)
    with pytest.raises(ValueError, match="resume"):
        _polish(sae, data, tmp_path / "stopped", sweeps=6)
    resumed = _polish(sae, data, tmp_path / "stopped", sweeps=6, resume=True)
    a, b = whole["polish"], resumed["polish"]
    assert len(b["per_sweep"]) == 6 and b["objective_before"] == a["objective_before"]
    assert b["objective_after"] == pytest.approx(a["objective_after"], rel=1e-9)
    np.testing.assert_allclose(b["atom_cosines"], a["atom_cosines"], atol=1e-8)


def test_foreign_formats_are_refused_by_name_before_any_work(tmp_path: Path, sae_and_data) -> None:
    _, data, _ = sae_and_data
    folder = tmp_path / "sparsify"
    folder.mkdir()
    W = torch.randn(8, 12)
    safetensors.torch.save_file({"encoder.weight": W, "encoder.bias": torch.zeros(8), "W_dec": W.clone(),
                                 "b_dec": torch.zeros(12)}, folder / "sae.safetensors")
    (folder / "cfg.json").write_text(json.dumps({"num_latents": 8, "k": 2, "d_in": 12}))
    with pytest.raises(ValueError, match="sparsify format is not implemented"):
        dictcheck.polish(folder, str(data), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_json_and_bad_options(tmp_path: Path, sae_and_data, capsys) -> None:
    sae, data, _ = sae_and_data
    args = ["polish", str(sae), "--data", str(data), "--out", str(tmp_path / "out"), "--sweeps", "2",
            "--fit-steps", "20", "--fit-batch-size", "64"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["polish"]["max_sweeps"] == 2 and report["format"] == "saelens"
    assert main([*args[:6], "--out", str(tmp_path / "o2"), "--holdout", "1.5"]) == 2
    assert "--holdout" in capsys.readouterr().err
    assert main(args) == 2  # the folder holds the first run's checkpoints
    assert "resume" in capsys.readouterr().err.splitlines()[-1]


def test_saelens_loads_the_polished_folder(tmp_path: Path, sae_and_data) -> None:
    sae_lens = pytest.importorskip("sae_lens")
    sae, data, X = sae_and_data
    _polish(sae, data, tmp_path / "out", sweeps=2)
    ours, _ = load_featurizer(tmp_path / "out")
    theirs = sae_lens.SAE.load_from_disk(str(tmp_path / "out"), device="cpu")
    x = torch.as_tensor(X[:20])
    with torch.no_grad():
        torch.testing.assert_close(theirs.decode(theirs.encode(x)), ours(x).x_hat)
