"""SAELens folders as its training leaves them, both save methods (docs/ecosystem.md §1): each loads, computes
what SAELens computes (codes and reconstruction of ``reference.npz``, written by SAELens itself with
tests/fixtures/saelens/make_fixtures.py), is named as the folder names it, reports the training-only fields and
refuses every unimplemented field at once. A numpy re-implementation of SAELens' inference (below) is held
equal to the same references, so the fixtures and the formulas check each other."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

import dictcheck
from dictcheck.empirics.io.formats import load_any_sae
from dictcheck.empirics.io.sae_folder import folder_names, training_only_fields
from dictcheck.empirics.io.saelens import SaeFormatError, read_config

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "saelens"
#: (folder, the architecture dictcheck computes it as).
FOLDERS = [
    ("standard-save_model", "relu"), ("standard-save_inference_model", "relu"),
    ("topk-save_model", "topk"), ("topk-save_inference_model", "topk"),
    ("batchtopk-save_model", "batchtopk"), ("batchtopk-save_inference_model", "jumprelu"),
    ("jumprelu-save_model", "jumprelu"), ("jumprelu-save_inference_model", "jumprelu"),
    ("matryoshka_batchtopk-save_inference_model", "jumprelu"),
]


def _reference(folder: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / folder / "reference.npz") as ref:
        return {k: ref[k] for k in ref.files}


def _atol(values: np.ndarray) -> float:
    """float32 rounding: a folded (SAELens' inference save) and an unfolded (training state, decoder norms applied
    at run time) evaluation of the same products differ by a few ulps of the largest value."""
    return 1e-6 * max(1.0, float(np.abs(values).max()))


def saelens_numpy(folder: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SAELens 6 inference, re-implemented in float64 numpy from the folder's own files: (codes, x̂)."""
    cfg = json.loads((folder / "cfg.json").read_text())
    w = {k: v.astype(np.float64) for k, v in safetensors.numpy.load_file(folder / "sae_weights.safetensors").items()}
    x_in = x - w["b_dec"] if cfg["apply_b_dec_to_input"] else x
    norms = np.linalg.norm(w["W_dec"], axis=1)
    rescale = bool(cfg.get("rescale_acts_by_decoder_norm", False))
    a = x_in @ w["W_enc"] + w.get("b_enc", 0.0)
    if rescale:
        a = a * norms
    arch = cfg["architecture"]
    if arch == "standard":
        z = np.maximum(a, 0)
    elif arch == "topk":  # the k largest per token, ReLU'd
        z = np.zeros_like(a)
        top = np.argsort(-a, axis=1)[:, :cfg["k"]]
        np.put_along_axis(z, top, np.maximum(np.take_along_axis(a, top, axis=1), 0), axis=1)
    elif arch == "jumprelu":
        z = np.maximum(a, 0) * (a > w["threshold"])
    else:  # batchtopk, matryoshka_batchtopk training state: saved for inference as JumpReLU at θ = topk_threshold
        z = np.maximum(a, 0) * (a > float(w["topk_threshold"]))
    x_hat = (z / norms if rescale else z) @ w["W_dec"] + w["b_dec"]
    return z, x_hat


@pytest.mark.parametrize("folder, arch", FOLDERS)
def test_the_folder_computes_what_saelens_computes(folder: str, arch: str) -> None:
    ref = _reference(folder)
    model, cfg, fmt = load_any_sae(FIXTURES / folder)
    assert fmt == "saelens" and model.arch == arch
    with torch.no_grad():
        out = model(torch.from_numpy(ref["x"]))
    np.testing.assert_allclose(out.codes.numpy(), ref["z"], rtol=0, atol=_atol(ref["z"]))
    np.testing.assert_allclose(out.x_hat.numpy(), ref["x_hat"], rtol=0, atol=_atol(ref["x_hat"]))
    z, x_hat = saelens_numpy(FIXTURES / folder, ref["x"].astype(np.float64))
    np.testing.assert_allclose(z, ref["z"], rtol=0, atol=_atol(ref["z"]))
    np.testing.assert_allclose(x_hat, ref["x_hat"], rtol=0, atol=_atol(ref["x_hat"]))


@pytest.mark.parametrize("folder, arch", FOLDERS)
def test_the_report_names_the_architecture_as_the_folder_does(folder: str, arch: str) -> None:
    cfg = read_config(FIXTURES / folder)
    names = folder_names(cfg, arch)
    assert names["arch"] == cfg.architecture and names["dictcheck_arch"] == arch
    assert names["training_architecture"] == folder.split("-")[0]
    fields = training_only_fields(cfg)
    if folder.endswith("save_model"):  # the training config's own fields, accepted and reported
        assert fields and set(fields) <= set(cfg.extra_fields) and "decoder_init_norm" in fields
    else:
        assert fields == {}


def test_a_refusal_lists_every_offending_field(tmp_path: Path) -> None:
    folder = tmp_path / "sae"
    shutil.copytree(FIXTURES / "standard-save_model", folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg.update(activation_fn="tanh", finetuning_scaling_factor=True)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SaeFormatError, match=r"'activation_fn' = 'tanh', 'finetuning_scaling_factor' = True"):
        load_any_sae(folder)


def test_check_sae_measures_saelens_fvu_and_l0_and_reads_its_lambda() -> None:
    """fvu and L0 as docs/ecosystem.md §2 defines them, from SAELens' own outputs; λ of a standard SAE from its
    l1_coefficient c = 0.2 (2λ = c)."""
    ref = _reference("standard-save_model")
    report = dictcheck.check_sae(FIXTURES / "standard-save_model", ref["x"].astype(np.float64))
    x = ref["x"].astype(np.float64)
    fvu = np.sum((x - ref["x_hat"]) ** 2) / np.sum((x - x.mean(0)) ** 2)
    assert report["metrics"]["fvu"] == pytest.approx(fvu, rel=1e-5)
    assert report["l0_sae"] == pytest.approx(np.count_nonzero(ref["z"]) / len(x))
    assert report["lam"] == pytest.approx(0.1) and report["lam_source"] == "folder"
    assert report["arch"] == "standard" and report["training_architecture"] == "standard"


def test_sae_objects_in_memory_and_anything_else_is_a_type_error() -> None:
    """A featurizer in memory is checked as its saved folder would be; an object of no accepted kind is a
    TypeError naming what is accepted (never its repr used as a path)."""
    model, _, _ = load_any_sae(FIXTURES / "topk-save_inference_model")
    x = _reference("topk-save_inference_model")["x"].astype(np.float64)
    from_object = dictcheck.check_sae(model, x, lam=0.05)
    from_folder = dictcheck.check_sae(FIXTURES / "topk-save_inference_model", x, lam=0.05)
    assert from_object["format"] == "dictcheck" and from_object["dictcheck_arch"] == "topk"
    for key in ("l0_sae", "l0_exact", "objective"):
        assert from_object[key] == pytest.approx(from_folder[key], rel=1e-12), key
    loaded, cfg = dictcheck.load_sae(model)
    assert loaded is model and cfg.d_sae == 16
    for bad in (object(), torch.nn.Linear(2, 2), {"W_enc": 1}):
        with pytest.raises(TypeError, match="expected an SAE folder \\(path\\), a SAELens SAE or TrainingSAE"):
            dictcheck.check_sae(bad, x)


@pytest.mark.parametrize("folder", ["topk-save_inference_model", "standard-save_model"])
def test_save_in_format_writes_the_folder_as_it_was_read(folder: str, tmp_path: Path) -> None:
    from dictcheck.empirics.io.formats import save_in_format

    model, cfg, fmt = load_any_sae(FIXTURES / folder)
    save_in_format(tmp_path / "out", model, cfg, fmt)
    again, cfg_again, _ = load_any_sae(tmp_path / "out")
    assert cfg_again.to_dict() == cfg.to_dict()
    x = torch.from_numpy(_reference(folder)["x"])
    with torch.no_grad():
        assert torch.equal(again(x).x_hat, model(x).x_hat)


def test_save_in_format_refuses_saelens_training_layouts_it_cannot_write(tmp_path: Path) -> None:
    from dictcheck.empirics.io.formats import save_in_format

    model, cfg, fmt = load_any_sae(FIXTURES / "batchtopk-save_model")
    with pytest.raises(ValueError, match="training layout"):
        save_in_format(tmp_path / "out", model, cfg, fmt)
