"""Tests for empirics.io.saelens: the SAELens-compatible save format (docs/ecosystem.md §1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from dictcheck.empirics.io import saelens
from dictcheck.empirics.architectures import REGISTRY, architecture
from dictcheck.empirics.io.dictionary_learning import load_dictionary_learning
from dictcheck.empirics.io.sparsify import load_sparsify
from dictcheck.empirics.io.sae_folder import arch_fields_of, arch_of, load_sae, new_sae_config, save_sae
from dictcheck.empirics.io.sae_folder import schema_of as expected_shapes
from dictcheck.empirics.io.saelens import (
    CFG_FILE,
    METRICS_FILE,
    SPARSITY_FILE,
    WEIGHTS_FILE,
    SaeConfig,
    SaeFormatError,
    load_metrics,
    load_sparsity,
)


def saved_architecture(arch: str) -> str:
    """The saved SAELens ``architecture`` string of a registered arch (SaeFormatError for others)."""
    try:
        return architecture(arch).saved_name
    except ValueError as exc:
        raise SaeFormatError(str(exc)) from None

D, Z = 6, 12

ARCH_FIELDS = {
    "bsf-vanilla": {"n_b": 4, "q": 3},
    "bsf-grassmann": {"n_b": 4, "q": 3},
    "bsf-grouplasso": {"n_b": 4, "q": 3, "gate": "paper"},
    "bilinear-compound": {"n_atoms": 5, "prior": "compound", "decoder": "symmetric", "hoyer_coeff": 0.1},
    "bilinear-quadratic": {"prior": "quadratic", "decoder": "symmetric"},
    "vasae": {"anchor_coeff": 0.1, "anchor_mode": "nearest", "anchor_topk": 10, "decoder_mode": "learnable"},
}
ALL_ARCHS = sorted(REGISTRY)


def make_cfg(arch: str, dtype: str = "float32", **kw) -> SaeConfig:
    k = 3 if arch in ("topk", "batchtopk", "vasae") else None
    return new_sae_config(
        arch,
        D,
        Z,
        k=k,
        lam=0.25,
        act_scale=1.5,
        seed=7,
        n_tokens=1000,
        data_hash="sha256:abc",
        hook={"module": "model.layers.5", "output": "output", "hidden_states_index": 6},
        arch_fields=ARCH_FIELDS.get(arch, {}),
        model_name="tiny",
        hook_name="blocks.5.hook_resid_post",
        context_size=128,
        dtype=dtype,
        **kw,
    )


def make_weights(cfg: SaeConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, _required) in expected_shapes(cfg).items():
        out[name] = torch.randn(shape, generator=g, dtype=torch.float64).to(cfg.torch_dtype)
    return out


def assert_one_line(exc: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


@pytest.fixture
def saved(tmp_path: Path):
    cfg = make_cfg("jumprelu")
    w = make_weights(cfg)
    save_sae(tmp_path, w, cfg)
    return tmp_path, w, cfg


# ------------------------------------------------------------------ architecture strings
def test_architecture_strings_follow_spec_table():
    assert saved_architecture("relu") == "standard"
    assert saved_architecture("topk") == "topk"
    assert saved_architecture("batchtopk") == "jumprelu"  # as SAELens saves it, with its θ as threshold
    assert saved_architecture("jumprelu") == "jumprelu"
    assert saved_architecture("vasae") == "topk"
    assert saved_architecture("abs") == "dictcheck/abs"
    assert saved_architecture("bsf-grassmann") == "dictcheck/bsf-grassmann"
    assert saved_architecture("bilinear-atomic") == "dictcheck/bilinear-atomic"
    with pytest.raises(SaeFormatError):
        saved_architecture("gated")


def test_defaults():
    cfg = make_cfg("relu")
    assert cfg.apply_b_dec_to_input is True and cfg.normalize_activations == "none"
    assert cfg.dtype == "float32" and cfg.device == "cpu" and cfg.reshape_activations == "none"
    assert make_cfg("vasae").apply_b_dec_to_input is False
    assert cfg.metadata["hook_head_index"] is None
    assert cfg.dictcheck["decoder_norm_policy"] == "unit"
    assert make_cfg("bilinear-atomic").dictcheck["decoder_norm_policy"] == "none"


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_round_trip_every_arch(tmp_path: Path, arch: str):
    cfg = make_cfg(arch)
    w = make_weights(cfg)
    save_sae(tmp_path, w, cfg)
    w2, cfg2 = load_sae(tmp_path)
    assert cfg2 == cfg
    assert arch_of(cfg2) == arch
    assert set(w2) == set(w)
    for name in w:
        assert w2[name].dtype == w[name].dtype
        assert torch.equal(w2[name], w[name]), name  # bit-identical
    raw = json.loads((tmp_path / CFG_FILE).read_text())
    assert raw["architecture"] == saved_architecture(arch)
    assert set(raw["metadata"]) >= {"model_name", "hook_name", "hook_head_index", "context_size", "prepend_bos"}
    # no dictcheck-specific field at top level
    assert set(raw) <= {
        "d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input", "normalize_activations",
        "reshape_activations", "architecture", "metadata", "k",
    }


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_round_trip_dtypes(tmp_path: Path, dtype: str):
    cfg = make_cfg("topk", dtype=dtype)
    w = make_weights(cfg)
    save_sae(tmp_path, w, cfg)
    w2, cfg2 = load_sae(tmp_path)
    assert cfg2 == cfg
    assert all(torch.equal(w2[n], w[n]) and w2[n].dtype == cfg.torch_dtype for n in w)


def test_numpy_input_and_tied_views(tmp_path: Path):
    cfg = make_cfg("relu", dtype="float64")
    rng = np.random.default_rng(0)
    W_dec = torch.from_numpy(rng.standard_normal((Z, D)))
    w = {"W_enc": W_dec.T, "b_enc": np.zeros(Z), "W_dec": W_dec, "b_dec": rng.standard_normal(D)}
    save_sae(tmp_path, w, cfg)
    w2, _ = load_sae(tmp_path)
    assert torch.equal(w2["W_enc"], W_dec.T) and torch.equal(w2["W_dec"], W_dec)
    assert np.array_equal(w2["b_dec"].numpy(), w["b_dec"])


def test_metadata_dictcheck_preserved(tmp_path: Path):
    cfg = make_cfg("vasae")
    save_sae(tmp_path, make_weights(cfg), cfg)
    _, cfg2 = load_sae(tmp_path)
    dc = cfg2.metadata["dictcheck"]
    assert dc["arch"] == "vasae" and dc["lam"] == 0.25 and dc["act_scale"] == 1.5
    assert dc["seed"] == 7 and dc["n_tokens"] == 1000 and dc["data_hash"] == "sha256:abc"
    assert dc["version"] and dc["decoder_norm_policy"] == "none"
    assert dc["hook"] == {"module": "model.layers.5", "output": "output", "hidden_states_index": 6}
    assert dc["vasae"] == ARCH_FIELDS["vasae"]
    assert arch_fields_of(cfg2) == ARCH_FIELDS["vasae"]
    assert cfg2.architecture == "topk" and cfg2.k == 3 and cfg2.apply_b_dec_to_input is False


def test_optional_files_round_trip(tmp_path: Path):
    cfg = make_cfg("relu")
    sp = torch.full((Z,), -2.0)
    sp[0] = -float("inf")  # never fired
    save_sae(tmp_path, make_weights(cfg), cfg, sparsity=sp, metrics={"fvu": 0.1, "l0": 3.0})
    assert torch.equal(load_sparsity(tmp_path), sp)
    assert load_metrics(tmp_path) == {"fvu": 0.1, "l0": 3.0}
    other = tmp_path / "other"
    save_sae(other, make_weights(cfg), cfg)
    assert load_sparsity(other) is None and load_metrics(other) is None


def test_unknown_top_level_fields_are_refused_provenance_kept_and_not_required(tmp_path: Path):
    cfg = make_cfg("topk")
    save_sae(tmp_path, make_weights(cfg), cfg)
    raw = json.loads((tmp_path / CFG_FILE).read_text())
    raw["hook_layer"] = 5  # provenance of older SAELens files: kept, changes nothing
    (tmp_path / CFG_FILE).write_text(json.dumps(raw))
    _, cfg2 = load_sae(tmp_path)
    assert cfg2.extra_fields == {"hook_layer": 5} and cfg2.to_dict()["hook_layer"] == 5
    raw["some_future_field"] = {"x": 1}  # could change what the SAE computes: refused, never ignored
    (tmp_path / CFG_FILE).write_text(json.dumps(raw))
    with pytest.raises(SaeFormatError) as exc:
        load_sae(tmp_path)
    assert_one_line(exc, "'some_future_field'", "refusing")
    for field, value in (("activation_fn_str", "topk"), ("finetuning_scaling_factor", True)):
        raw = {"d_in": D, "d_sae": Z, "architecture": "standard", field: value}
        (tmp_path / CFG_FILE).write_text(json.dumps(raw))
        safetensors.torch.save_file(make_weights(make_cfg("relu")), tmp_path / WEIGHTS_FILE)
        with pytest.raises(SaeFormatError, match=field):
            load_sae(tmp_path)
    # a minimal SAELens cfg (only required fields, no metadata.dictcheck) loads too
    minimal = {"d_in": D, "d_sae": Z, "architecture": "standard"}
    (tmp_path / CFG_FILE).write_text(json.dumps(minimal))
    w = make_weights(make_cfg("relu"))
    safetensors.torch.save_file(w, tmp_path / WEIGHTS_FILE)
    _, cfg3 = load_sae(tmp_path)
    assert arch_of(cfg3) == "relu" and cfg3.apply_b_dec_to_input is True and cfg3.dtype == "float32"


def test_legacy_top_level_metadata_migrated(tmp_path: Path):
    raw = {"d_in": D, "d_sae": Z, "architecture": "standard", "model_name": "gpt2", "hook_name": "h", "context_size": 64}
    (tmp_path / CFG_FILE).write_text(json.dumps(raw))
    safetensors.torch.save_file(make_weights(make_cfg("relu")), tmp_path / WEIGHTS_FILE)
    _, cfg = load_sae(tmp_path)
    assert cfg.metadata["model_name"] == "gpt2" and cfg.metadata["context_size"] == 64


# ------------------------------------------------------------------ error paths
def _rewrite_cfg(d: Path, fn) -> None:
    raw = json.loads((d / CFG_FILE).read_text())
    fn(raw)
    (d / CFG_FILE).write_text(json.dumps(raw))


def test_error_missing_cfg(saved):
    d, _, _ = saved
    (d / CFG_FILE).unlink()
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, CFG_FILE, "missing")


def test_error_missing_weights(saved):
    d, _, _ = saved
    (d / WEIGHTS_FILE).unlink()
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, WEIGHTS_FILE, "missing")


def test_error_unreadable_json(saved):
    d, _, _ = saved
    (d / CFG_FILE).write_text('{"d_in": 6, ')
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, CFG_FILE, "JSON")


@pytest.mark.parametrize("field", ["d_in", "d_sae", "architecture"])
def test_error_missing_field(saved, field):
    d, _, _ = saved
    _rewrite_cfg(d, lambda r: r.pop(field))
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, CFG_FILE, field)


def test_error_missing_k_for_topk(tmp_path: Path):
    cfg = make_cfg("topk")
    save_sae(tmp_path, make_weights(cfg), cfg)
    _rewrite_cfg(tmp_path, lambda r: r.pop("k"))
    with pytest.raises(SaeFormatError) as e:
        load_sae(tmp_path)
    assert_one_line(e, CFG_FILE, "'k'")


@pytest.mark.parametrize("arch", ["gated", "dictcheck/nonsense"])
def test_error_unknown_architecture(saved, arch):
    d, _, _ = saved
    _rewrite_cfg(d, lambda r: r.update(architecture=arch))
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, CFG_FILE, arch)


def test_error_arch_inconsistent_with_metadata(saved):
    d, _, _ = saved
    _rewrite_cfg(d, lambda r: r.update(architecture="standard"))
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, CFG_FILE, "jumprelu", "standard")


@pytest.mark.parametrize("bad", [{"dtype": "int8"}, {"d_in": -1}, {"d_sae": True}, {"normalize_activations": "zscore"}])
def test_error_bad_field_values(saved, bad):
    d, _, _ = saved
    _rewrite_cfg(d, lambda r: r.update(bad))
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, CFG_FILE, next(iter(bad)))


def test_error_shape_mismatch_names_file_tensor_shapes(saved):
    d, w, _ = saved
    w = dict(w)
    w["W_dec"] = torch.zeros(Z, D + 1)
    safetensors.torch.save_file(w, d / WEIGHTS_FILE)
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, WEIGHTS_FILE, "'W_dec'", f"[{Z}, {D + 1}]", f"[{Z}, {D}]")


def test_error_cfg_says_other_d_in(saved):
    d, _, _ = saved
    _rewrite_cfg(d, lambda r: r.update(d_in=D + 2))
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, WEIGHTS_FILE, "'W_enc'", f"[{D}, {Z}]", f"[{D + 2}, {Z}]")


def test_error_missing_tensor(saved):
    d, w, _ = saved
    w = {n: t for n, t in w.items() if n != "threshold"}
    safetensors.torch.save_file(w, d / WEIGHTS_FILE)
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, WEIGHTS_FILE, "'threshold'", f"[{Z}]")


def test_error_unexpected_tensor(saved):
    d, w, _ = saved
    safetensors.torch.save_file({**w, "W_skip": torch.zeros(D, D)}, d / WEIGHTS_FILE)
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, WEIGHTS_FILE, "W_skip")


def test_error_dtype_mismatch(saved):
    d, w, _ = saved
    safetensors.torch.save_file({n: t.double() for n, t in w.items()}, d / WEIGHTS_FILE)
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, WEIGHTS_FILE, "float64", "float32")


def test_error_truncated_safetensors(saved):
    d, _, _ = saved
    data = (d / WEIGHTS_FILE).read_bytes()
    for cut in (4, len(data) // 2, len(data) - 1):
        (d / WEIGHTS_FILE).write_bytes(data[:cut])
        with pytest.raises(SaeFormatError) as e:
            load_sae(d)
        assert_one_line(e, WEIGHTS_FILE)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_error_nonfinite_weights_on_load(saved, value):
    d, w, _ = saved
    w = dict(w)
    w["b_enc"] = w["b_enc"].clone()
    w["b_enc"][3] = value
    safetensors.torch.save_file(w, d / WEIGHTS_FILE)
    with pytest.raises(SaeFormatError) as e:
        load_sae(d)
    assert_one_line(e, WEIGHTS_FILE, "'b_enc'", f"[{Z}]", "non-finite")


def test_save_validates_before_writing(tmp_path: Path):
    cfg = make_cfg("relu")
    w = make_weights(cfg)
    w["W_enc"] = w["W_enc"].clone()
    w["W_enc"][0, 0] = float("nan")
    with pytest.raises(SaeFormatError) as e:
        save_sae(tmp_path / "out", w, cfg)
    assert_one_line(e, "'W_enc'", "non-finite")
    w = make_weights(cfg)
    w["b_dec"] = torch.zeros(D + 1)
    with pytest.raises(SaeFormatError) as e:
        save_sae(tmp_path / "out", w, cfg)
    assert_one_line(e, "'b_dec'", f"[{D + 1}]", f"[{D}]")
    w = make_weights(cfg)
    w["W_dec"] = torch.zeros(Z, D, dtype=torch.int64)
    with pytest.raises(SaeFormatError):
        save_sae(tmp_path / "out", w, cfg)
    assert not (tmp_path / "out").exists()


def test_bsf_and_compound_require_arch_fields():
    with pytest.raises(SaeFormatError) as e:
        new_sae_config("bsf-vanilla", D, Z, arch_fields={"n_b": 4})
    assert_one_line(e, "bsf.q")
    with pytest.raises(SaeFormatError) as e:
        new_sae_config("bsf-vanilla", D, Z, arch_fields={"n_b": 5, "q": 3})
    assert_one_line(e, "d_sae")
    with pytest.raises(SaeFormatError) as e:
        new_sae_config("bilinear-compound", D, Z)
    assert_one_line(e, "n_atoms")


def test_error_bad_sparsity(tmp_path: Path):
    cfg = make_cfg("relu")
    with pytest.raises(SaeFormatError) as e:
        save_sae(tmp_path, make_weights(cfg), cfg, sparsity=torch.zeros(Z + 1))
    assert_one_line(e, "sparsity", f"[{Z + 1}]", f"[{Z}]")
    with pytest.raises(SaeFormatError):
        save_sae(tmp_path, make_weights(cfg), cfg, sparsity=torch.full((Z,), float("nan")))


# ------------------------------------------------------------------ atomic writes
def _no_temp_files(d: Path) -> bool:
    return not [p for p in d.iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_crash_during_write_leaves_no_partial_file(tmp_path: Path, monkeypatch):
    cfg = make_cfg("relu")
    w = make_weights(cfg)
    calls = {"n": 0}
    real_fsync = os.fsync

    def crashing_fsync(fd):  # data already (partially) written to the temp file, then "crash"
        calls["n"] += 1
        raise OSError("simulated crash during write")

    monkeypatch.setattr(saelens.os, "fsync", crashing_fsync)
    with pytest.raises(OSError, match="simulated crash"):
        save_sae(tmp_path, w, cfg)
    monkeypatch.setattr(saelens.os, "fsync", real_fsync)
    assert calls["n"] >= 1
    assert not (tmp_path / WEIGHTS_FILE).exists()
    assert not (tmp_path / CFG_FILE).exists()
    assert _no_temp_files(tmp_path)


def test_atomic_write_crash_keeps_previous_version_intact(saved, monkeypatch):
    d, w_old, cfg = saved
    old_bytes = (d / WEIGHTS_FILE).read_bytes()
    real_write = saelens._atomic_write_bytes
    seen = []

    def half_then_crash(path, data):
        seen.append(path.name)
        if path.name == CFG_FILE:  # weights already staged; crash before anything is replaced
            raise KeyboardInterrupt
        return real_write(path, data)

    monkeypatch.setattr(saelens, "_atomic_write_bytes", half_then_crash)
    with pytest.raises(KeyboardInterrupt):
        save_sae(d, make_weights(cfg, seed=1), cfg, metrics={"a": 1})
    assert seen[0] == WEIGHTS_FILE
    assert (d / WEIGHTS_FILE).read_bytes() == old_bytes
    assert not (d / METRICS_FILE).exists()
    assert _no_temp_files(d)
    w2, _ = load_sae(d)
    assert all(torch.equal(w2[n], w_old[n]) for n in w_old)


def test_atomic_write_crash_inside_serialiser(tmp_path: Path, monkeypatch):
    cfg = make_cfg("relu")

    def boom(tensors, metadata=None):
        raise RuntimeError("serialiser died")

    monkeypatch.setattr(saelens.safetensors.torch, "save", boom)
    with pytest.raises(RuntimeError):
        save_sae(tmp_path, make_weights(cfg), cfg)
    assert not (tmp_path / WEIGHTS_FILE).exists()
    assert _no_temp_files(tmp_path)


# ------------------------------------------------------------------ foreign readers
def test_load_sparsify(tmp_path: Path):
    g = torch.Generator().manual_seed(0)
    enc = torch.randn(Z, D, generator=g)
    t = {"encoder.weight": enc, "encoder.bias": torch.randn(Z, generator=g),
         "W_dec": torch.randn(Z, D, generator=g), "b_dec": torch.randn(D, generator=g)}
    safetensors.torch.save_file(t, tmp_path / "sae.safetensors")
    (tmp_path / "cfg.json").write_text(json.dumps({"expansion_factor": 2, "normalize_decoder": True,
                                                   "num_latents": Z, "k": 4, "d_in": D}))
    w, cfg = load_sparsify(tmp_path)
    assert arch_of(cfg) == "topk" and cfg.k == 4 and cfg.d_in == D and cfg.d_sae == Z
    assert torch.equal(w["W_enc"], enc.T) and torch.equal(w["W_dec"], t["W_dec"])
    save_sae(tmp_path / "ours", w, cfg)
    w2, cfg2 = load_sae(tmp_path / "ours")
    assert cfg2 == cfg and all(torch.equal(w2[n], w[n]) for n in w)
    (tmp_path / "cfg.json").write_text(json.dumps({"num_latents": Z, "k": 4, "d_in": D + 1}))
    with pytest.raises(SaeFormatError) as e:
        load_sparsify(tmp_path)
    assert_one_line(e, "sae.safetensors", "encoder.weight", f"[{Z}, {D}]")


@pytest.mark.parametrize("cls_name", ["AutoEncoder", "AutoEncoderTopK", "JumpReluAutoEncoder"])
def test_load_dictionary_learning(tmp_path: Path, cls_name: str):
    g = torch.Generator().manual_seed(0)
    if cls_name == "JumpReluAutoEncoder":
        sd = {"W_enc": torch.randn(D, Z, generator=g), "b_enc": torch.randn(Z, generator=g),
              "W_dec": torch.randn(Z, D, generator=g), "b_dec": torch.randn(D, generator=g),
              "threshold": torch.rand(Z, generator=g)}
    else:
        sd = {"encoder.weight": torch.randn(Z, D, generator=g), "encoder.bias": torch.randn(Z, generator=g),
              "decoder.weight": torch.randn(D, Z, generator=g),
              ("bias" if cls_name == "AutoEncoder" else "b_dec"): torch.randn(D, generator=g)}
        if cls_name == "AutoEncoderTopK":
            sd["k"] = torch.tensor(3)
    torch.save(sd, tmp_path / "ae.pt")
    (tmp_path / "config.json").write_text(json.dumps(
        {"trainer": {"dict_class": cls_name, "activation_dim": D, "dict_size": Z, "seed": 1}}))
    w, cfg = load_dictionary_learning(tmp_path)
    if cls_name == "JumpReluAutoEncoder":
        assert arch_of(cfg) == "jumprelu" and torch.equal(w["threshold"], sd["threshold"])
    else:
        assert torch.equal(w["W_enc"], sd["encoder.weight"].T)
        assert torch.equal(w["W_dec"], sd["decoder.weight"].T)
    if cls_name == "AutoEncoderTopK":
        assert arch_of(cfg) == "topk" and cfg.k == 3
    save_sae(tmp_path / "ours", w, cfg)
    w2, cfg2 = load_sae(tmp_path / "ours")
    assert cfg2 == cfg


# ------------------------------------------------------------------ SAELens round trip
def _reference_encode_decode(w, cfg: SaeConfig, x: torch.Tensor):
    x_in = x - w["b_dec"] if cfg.apply_b_dec_to_input else x
    pre = x_in @ w["W_enc"] + w["b_enc"]
    if arch_of(cfg) == "relu":
        z = torch.relu(pre)
    elif arch_of(cfg) == "topk":
        vals, idx = torch.relu(pre).topk(cfg.k, dim=-1)
        z = torch.zeros_like(pre).scatter(-1, idx, vals)
    elif arch_of(cfg) in ("jumprelu", "batchtopk"):  # batchtopk is saved as SAELens saves it: a JumpReLU
        z = torch.relu(pre) * (pre > w["threshold"])
    else:  # pragma: no cover
        raise AssertionError(arch_of(cfg))
    return z, z @ w["W_dec"] + w["b_dec"]


@pytest.mark.parametrize("arch", ["relu", "topk", "jumprelu", "batchtopk"])
def test_saelens_round_trip(tmp_path: Path, arch: str):
    sae_lens = pytest.importorskip("sae_lens")
    cfg = make_cfg(arch)
    w = make_weights(cfg)
    if arch == "jumprelu":
        w["threshold"] = w["threshold"].abs()
    if arch == "batchtopk":
        w["threshold"] = torch.full_like(w["threshold"], 0.25)
    save_sae(tmp_path, w, cfg)
    sae = sae_lens.SAE.load_from_disk(str(tmp_path), device="cpu")
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(3))
    z_ref, xhat_ref = _reference_encode_decode(w, cfg, x)
    with torch.no_grad():
        z = sae.encode(x)
        xhat = sae.decode(z)
    torch.testing.assert_close(z, z_ref)
    torch.testing.assert_close(xhat, xhat_ref)
    # and SAELens' own save is readable by us
    out = tmp_path / "resaved"
    sae.save_model(str(out))
    w3, cfg3 = load_sae(out)
    for n in w:
        torch.testing.assert_close(w3[n], w[n])
    assert cfg3.d_in == D and cfg3.d_sae == Z


def test_mapped_safetensors_equal_the_library_and_refuse_broken_files(tmp_path) -> None:
    """mapped_safetensors: the tensors safetensors itself reads (every dtype check-sae meets, empty ones too),
    as copy-on-write views (a write never reaches the file); a file cut short or a header that does not fit
    is refused in one line."""
    import safetensors.torch as st

    from dictcheck.empirics.io.saelens import mapped_safetensors, read_safetensors

    tensors = {"f32": torch.randn(5, 3), "bf16": torch.randn(7).bfloat16(), "f16": torch.randn(4).half(),
               "f64": torch.randn(2, 2).double(), "empty": torch.zeros(0, 3)}
    path = tmp_path / "w.safetensors"
    st.save_file(tensors, path)
    mapped = mapped_safetensors(path)
    for name, t in tensors.items():
        assert mapped[name].dtype == t.dtype and torch.equal(mapped[name], t), name
    mapped["f32"][0, 0] += 1.0
    assert torch.equal(read_safetensors(path)["f32"], tensors["f32"])
    assert torch.equal(read_safetensors(path, mmap=True)["f32"], tensors["f32"])
    data = path.read_bytes()
    for broken in (data[:4], data[:-8], (10**9).to_bytes(8, "little") + data[8:]):
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(broken)
        with pytest.raises(SaeFormatError) as err:
            read_safetensors(bad, mmap=True)
        assert "\n" not in str(err.value)


LINEAR_ARCHS = sorted(a for a in REGISTRY if architecture(a).family == "sae")
SAELENS_FIXTURES = Path(__file__).parent / "fixtures" / "saelens"


def _overwrite_tensor(path: Path, name: str, values: torch.Tensor) -> None:
    """Write ``values`` over tensor ``name`` of a safetensors file in place (its header unchanged)."""
    with open(path, "r+b") as fh:
        n = int.from_bytes(fh.read(8), "little")
        lo, _hi = json.loads(fh.read(n))[name]["data_offsets"]
        fh.seek(8 + n + lo)
        fh.write(values.contiguous().view(torch.uint8).numpy().tobytes())


def _assert_same_model(mapped, copied, x: torch.Tensor) -> None:
    state_m, state_c = mapped.state_dict(), copied.state_dict()
    assert state_m.keys() == state_c.keys()
    for key, value in state_c.items():
        assert state_m[key].dtype == value.dtype and torch.equal(state_m[key], value), key
    assert mapped.training == copied.training
    with torch.no_grad():
        assert torch.equal(mapped.encode(x.to(copied.W_dec.dtype)), copied.encode(x.to(copied.W_dec.dtype)))


@pytest.mark.parametrize("arch", LINEAR_ARCHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mapped_loading_is_the_same_model_without_a_copy(tmp_path: Path, arch: str, dtype: str):
    """load_any_sae(mmap=True): every parameter and buffer equal to the copying load's (no uninitialised
    storage left, extra state such as thresholds loaded), the same codes, and W_enc / W_dec views of the
    file itself (a write to the file shows in the model)."""
    from dictcheck.empirics.io.formats import load_any_sae

    cfg = make_cfg(arch, dtype)
    w = make_weights(cfg)
    if "threshold" in w:
        w["threshold"] = (w["threshold"].abs() if arch == "jumprelu"
                          else torch.full_like(w["threshold"], 0.5))
    save_sae(tmp_path, w, cfg)
    mapped, cfg_m, _ = load_any_sae(tmp_path, mmap=True)
    copied, cfg_c, _ = load_any_sae(tmp_path)
    assert cfg_m == cfg_c
    _assert_same_model(mapped, copied, torch.randn(9, D, generator=torch.Generator().manual_seed(1)))
    new_dec = torch.full_like(w["W_dec"], 0.25)
    _overwrite_tensor(tmp_path / "sae_weights.safetensors", "W_dec", new_dec)
    assert torch.equal(mapped.W_dec.detach(), new_dec) and not torch.equal(copied.W_dec.detach(), new_dec)


@pytest.mark.parametrize("folder", sorted(p.name for p in SAELENS_FIXTURES.iterdir() if p.is_dir()))
def test_mapped_loading_of_folders_saelens_wrote(folder: str):
    """Both save methods of SAELens (save_model folders are converted, so only their converted tensors are
    new): the mapped load is the copying load's model."""
    from dictcheck.empirics.io.formats import load_any_sae

    mapped, _, _ = load_any_sae(SAELENS_FIXTURES / folder, mmap=True)
    copied, _, _ = load_any_sae(SAELENS_FIXTURES / folder)
    _assert_same_model(mapped, copied, torch.randn(9, copied.d_in, generator=torch.Generator().manual_seed(2)))


def test_mapped_loading_of_a_sparsify_folder(tmp_path: Path):
    """sparsify's encoder.weight is W_encᵀ: mapped, W_enc is the transposed view of the file's tensor."""
    from dictcheck.empirics.io.formats import load_any_sae

    g = torch.Generator().manual_seed(0)
    t = {"encoder.weight": torch.randn(Z, D, generator=g), "encoder.bias": torch.randn(Z, generator=g),
         "W_dec": torch.randn(Z, D, generator=g), "b_dec": torch.randn(D, generator=g)}
    safetensors.torch.save_file(t, tmp_path / "sae.safetensors")
    (tmp_path / "cfg.json").write_text(json.dumps({"num_latents": Z, "k": 4, "d_in": D}))
    mapped, _, fmt = load_any_sae(tmp_path, mmap=True)
    copied, _, _ = load_any_sae(tmp_path)
    assert fmt == "sparsify"
    _assert_same_model(mapped, copied, torch.randn(9, D, generator=g))
    _overwrite_tensor(tmp_path / "sae.safetensors", "encoder.weight", torch.zeros(Z, D))
    assert not bool(mapped.W_enc.detach().any())
