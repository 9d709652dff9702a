"""``dictcheck inspect-bilinear`` (proofs_checks/cli/inspect_bilinear.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dictcheck.empirics.architectures import build_model
from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae
from dictcheck.proofs_checks.cli import main
from dictcheck.theory.quadric_geometry import FactoredForms, readout


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """cli.main (inspect-bilinear is registered in cli.COMMANDS)."""
    return main(argv)


def _save(tmp_path: Path, arch: str, **options) -> tuple[Path, FactoredForms]:
    model = build_model(arch, 5, 4, options, seed=1, dtype=torch.float64)
    cfg = new_sae_config(arch, 5, 4, arch_fields=model.arch_fields(), dtype="float64")
    out = save_sae(tmp_path / arch, model.state_weights(), cfg)
    return out, FactoredForms.from_dictionary(model.dictionary())


@pytest.mark.parametrize("arch,options", [("bilinear-quadratic", {}), ("bilinear-atomic", {}),
                                          ("bilinear-compound", {"n_atoms": 6, "k_c": 2})])
def test_json_table_matches_the_readout(tmp_path: Path, arch: str, options: dict,
                                        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    folder, forms = _save(tmp_path, arch, **options)
    assert _run(["inspect-bilinear", str(folder), "--json", "--top", "3"], monkeypatch) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arch"] == arch and out["d_sae"] == 4 and out["n_shown"] == 3
    expected = sorted(readout(forms), key=lambda g: -g.importance)[:3]
    assert [s["latent"] for s in out["latents"]] == [g.index for g in expected]
    for s, g in zip(out["latents"], expected):
        assert s["label"] == g.label and s["rank"] == g.rank
        assert s["importance"] == pytest.approx(g.importance, rel=1e-12)
        assert s["effective_rank"] == pytest.approx(g.effective_rank, rel=1e-12)
        assert (s["support"] is not None) == (arch == "bilinear-compound")
    if arch == "bilinear-compound":
        assert all(s["support"] == 2 for s in out["latents"])


def test_table_and_latent_detail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    folder, forms = _save(tmp_path, "bilinear-quadratic")
    assert _run(["inspect-bilinear", str(folder)], monkeypatch) == 0
    text = capsys.readouterr().out
    assert "hyperboloid" in text and "eff.rank" in text and "(4 of 4 latents" in text
    assert _run(["inspect-bilinear", str(folder), "--latent", "2", "--json"], monkeypatch) == 0
    detail = json.loads(capsys.readouterr().out)["latent"]
    g = readout(forms, latents=[2])[0]
    assert detail["latent"] == 2 and detail["label"] == g.label == "hyperboloid"
    np.testing.assert_allclose(detail["top_eigenvalues"], g.eigenvalues[:10], rtol=1e-12)
    np.testing.assert_allclose(np.array(detail["eigenvectors"]).T, g.eigenvectors, rtol=1e-12)
    assert _run(["inspect-bilinear", str(folder), "--latent", "2"], monkeypatch) == 0
    assert "e1 largest coordinates" in capsys.readouterr().out


def test_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    folder, _ = _save(tmp_path, "bilinear-atomic")
    data = tmp_path / "X.npy"
    np.save(data, np.random.default_rng(0).normal(size=(50, 5)))
    png = tmp_path / "latent.png"
    assert _run(["inspect-bilinear", str(folder), "--figure", str(png), "--data", str(data)], monkeypatch) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure: {png}" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (["--latent", "7"], "--latent must lie in [0, 4)"),
    (["--top", "0"], "--top must be >= 1"),
    (["--figure", "x.png"], "--figure needs --data"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, extra: list[str], message: str,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    folder, _ = _save(tmp_path, "bilinear-atomic")
    assert _run(["inspect-bilinear", str(folder), *extra], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("dictcheck: error:")


def test_missing_folder_wrong_arch_and_wrong_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    assert _run(["inspect-bilinear", str(tmp_path / "nope")], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "file is missing" in err
    cfg = new_sae_config("topk", 3, 2, k=1)
    linear = {"W_enc": torch.zeros(3, 2), "b_enc": torch.zeros(2), "W_dec": torch.zeros(2, 3), "b_dec": torch.zeros(3)}
    folder = save_sae(tmp_path / "topk", linear, cfg)
    assert _run(["inspect-bilinear", str(folder)], monkeypatch) == 2
    assert "is not a bilinear autoencoder" in capsys.readouterr().err
    bilinear, _ = _save(tmp_path, "bilinear-atomic")
    data = tmp_path / "X3.npy"
    np.save(data, np.ones((4, 3)))
    assert _run(["inspect-bilinear", str(bilinear), "--figure", str(tmp_path / "f.png"), "--data", str(data)],
                monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has D = 3, the model has d_in = 5" in err
