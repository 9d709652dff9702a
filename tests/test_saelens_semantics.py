"""SAELens folders are read with SAELens' semantics or refused (docs/ecosystem.md §1):
``normalize_activations``, ``rescale_acts_by_decoder_norm``, ``apply_b_dec_to_input``, dtypes.

CI compares with numpy re-implementations of SAELens 6's formulas; the same folders are compared with
SAELens itself where ``sae_lens`` is installed (the benchmark venv: see the README)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from dictcheck.empirics.io.sae_folder import load_featurizer
from dictcheck.empirics.io.saelens import SaeFormatError

D, Z, K = 6, 10, 3
NORMS = ("none", "constant_norm_rescale", "layer_norm", "expected_average_only_in")


def _weights(arch: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {"W_enc": rng.normal(size=(D, Z)), "b_enc": rng.normal(size=Z) * 0.3,
         "W_dec": rng.normal(size=(Z, D)) * rng.uniform(0.3, 2.0, size=(Z, 1)), "b_dec": rng.normal(size=D) * 0.2}
    if arch == "jumprelu":
        w["threshold"] = rng.uniform(0.05, 0.5, size=Z)
    return w


def _write_folder(path: Path, arch: str, w: dict[str, np.ndarray], dtype: str = "float64", **fields) -> Path:
    """A SAELens-style folder (no metadata.dictcheck), as SAELens 6 writes it."""
    path.mkdir(parents=True)
    cfg = {"d_in": D, "d_sae": Z, "dtype": dtype, "device": "cpu", "architecture": arch,
           "metadata": {"sae_lens_version": "6.54.12"}, **fields}
    if arch == "topk":
        cfg["k"] = K
    (path / "cfg.json").write_text(json.dumps(cfg))
    torch_dtype = getattr(torch, dtype)
    safetensors.torch.save_file({n: torch.from_numpy(np.ascontiguousarray(v)).to(torch_dtype) for n, v in w.items()},
                                path / "sae_weights.safetensors")
    return path


def _saelens_numpy(arch: str, w: dict[str, np.ndarray], x: np.ndarray, *, norm: str, rescale: bool,
                   apply_b_dec: bool) -> tuple[np.ndarray, np.ndarray]:
    """SAELens 6 encode and forward output, re-implemented from its source (sae.py, topk_sae.py, ...)."""
    if norm == "constant_norm_rescale":
        coeff = np.sqrt(D) / np.linalg.norm(x, axis=1, keepdims=True)
        x_in = x * coeff
    elif norm == "layer_norm":
        mu = x.mean(axis=1, keepdims=True)
        std = (x - mu).std(axis=1, ddof=1, keepdims=True)
        x_in = (x - mu) / (std + 1e-5)
    else:
        x_in = x
    pre = (x_in - w["b_dec"] * apply_b_dec) @ w["W_enc"] + w["b_enc"]
    norms = np.linalg.norm(w["W_dec"], axis=1)
    if arch == "standard":
        z = np.maximum(pre, 0)
    elif arch == "jumprelu":
        z = np.maximum(pre, 0) * (pre > w["threshold"])
    else:
        if rescale:
            pre = pre * norms
        idx = np.argsort(-pre, axis=1, kind="stable")[:, :K]
        z = np.zeros_like(pre)
        np.put_along_axis(z, idx, np.maximum(np.take_along_axis(pre, idx, 1), 0), 1)
    x_hat = (z / norms if rescale else z) @ w["W_dec"] + w["b_dec"]
    if norm == "constant_norm_rescale":
        x_hat = x_hat / coeff
    elif norm == "layer_norm":
        x_hat = x_hat * std + mu
    return z, x_hat


CASES = [(arch, norm, rescale, apply_b_dec)
         for arch, norm, rescale, apply_b_dec in itertools.product(("standard", "topk", "jumprelu"), NORMS,
                                                                    (False, True), (True, False))
         if arch == "topk" or not rescale]


@pytest.mark.parametrize("arch, norm, rescale, apply_b_dec", CASES)
def test_folders_encode_and_decode_as_saelens_computes(tmp_path, arch, norm, rescale, apply_b_dec) -> None:
    w = _weights(arch, seed=len(tmp_path.name))
    extra = {"rescale_acts_by_decoder_norm": True} if rescale else {}
    folder = _write_folder(tmp_path / "sae", arch, w, normalize_activations=norm, apply_b_dec_to_input=apply_b_dec,
                           **extra)
    model, cfg = load_featurizer(folder)
    x = np.random.default_rng(7).normal(size=(40, D)) * 3 + 1
    z_ref, x_hat_ref = _saelens_numpy(arch, w, x, norm=norm, rescale=rescale, apply_b_dec=apply_b_dec)
    with torch.no_grad():
        z = model.encode(torch.from_numpy(x)).numpy()
        x_hat = model(torch.from_numpy(x)).x_hat.numpy()
    np.testing.assert_allclose(z, z_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(x_hat, x_hat_ref, rtol=1e-10, atol=1e-12)
    # unit-atom codes give the same input-space reconstruction with unit atoms (objective (1))
    with torch.no_grad():
        zt = model.encode(torch.from_numpy(x))
        unit = model.unit_codes(zt)
        atoms = model.W_dec / model.W_dec.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ atoms, model.decode(zt) - model.b_dec)


@pytest.mark.parametrize("field, value", [("rescale_acts_by_decoder_norm", "yes"), ("normalize_activations", "zscore"),
                                          ("some_new_option", 1)])
def test_unimplemented_or_invalid_fields_are_refused_by_name(tmp_path, field, value) -> None:
    folder = _write_folder(tmp_path / "sae", "topk", _weights("topk", 0), **{field: value})
    with pytest.raises((SaeFormatError, ValueError), match=field):
        load_featurizer(folder)


def test_rescale_is_refused_where_saelens_has_no_such_field(tmp_path) -> None:
    folder = _write_folder(tmp_path / "sae", "standard", _weights("standard", 0), rescale_acts_by_decoder_norm=True)
    with pytest.raises(SaeFormatError, match="rescale_acts_by_decoder_norm"):
        load_featurizer(folder)


# --------------------------------------------------------------------------- against SAELens itself
@pytest.mark.parametrize("arch, norm, rescale, apply_b_dec", CASES + [("topk", "layer_norm", True, True)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_against_saelens(tmp_path, arch, norm, rescale, apply_b_dec, dtype) -> None:
    sae_lens = pytest.importorskip("sae_lens")
    w = _weights(arch, seed=3)
    extra = {"rescale_acts_by_decoder_norm": True} if rescale else {}
    folder = _write_folder(tmp_path / "sae", arch, w, dtype=dtype, normalize_activations=norm,
                           apply_b_dec_to_input=apply_b_dec, **extra)
    sae = sae_lens.SAE.load_from_disk(str(folder), device="cpu")
    model, _ = load_featurizer(folder)
    x = torch.from_numpy(np.random.default_rng(8).normal(size=(32, D)) * 3 + 1).float()
    with torch.no_grad():
        z_ref = sae.encode(x)
        x_hat_ref = sae(x)
        z, x_hat = model.encode(x.to(model.W_dec.dtype)), model(x.to(model.W_dec.dtype)).x_hat
    tol = {"float32": dict(rtol=1e-5, atol=1e-5), "bfloat16": dict(rtol=2e-2, atol=2e-2)}[dtype]
    torch.testing.assert_close(z.float(), z_ref.float(), **tol)
    torch.testing.assert_close(x_hat.float(), x_hat_ref.float(), **tol)
