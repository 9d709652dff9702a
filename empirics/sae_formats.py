"""Every SAE folder format dictcheck reads (docs/ecosystem.md §1), and :func:`load_any_sae`, which
detects the format of a folder and returns the model:

* SAELens / dictcheck (``cfg.json`` + ``sae_weights.safetensors``): :mod:`dictcheck.empirics.sae_folder`;
* EleutherAI sparsify (``cfg.json`` + ``sae.safetensors``): :func:`load_sparsify`;
* saprmarks/dictionary_learning (``config.json`` + ``ae.pt``): :func:`load_dictionary_learning`.

The two foreign readers return ``(weights, cfg)`` converted to dictcheck's layout, as
:func:`dictcheck.empirics.sae_folder.load_sae` does."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dictcheck.empirics.featurizer import Featurizer
from dictcheck.empirics.sae_folder import arch_of, load_featurizer, new_sae_config, schema_of
from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.sae_io import (
    DTYPES,
    SaeConfig,
    SaeFormatError,
    check_tensors,
    read_json,
    read_safetensors,
    shape_text,
)

__all__ = ["FORMATS", "detect_format", "load_any_sae", "load_sparsify", "load_dictionary_learning"]

#: Folder format -> the files that identify it.
FORMATS: dict[str, tuple[str, ...]] = {
    "saelens": ("cfg.json", "sae_weights.safetensors"),
    "sparsify": ("cfg.json", "sae.safetensors"),
    "dictionary_learning": ("config.json", "ae.pt"),
}


def detect_format(directory: str | os.PathLike[str]) -> str:
    """``saelens`` (also dictcheck's own), ``sparsify`` or ``dictionary_learning``; SaeFormatError (one line)
    naming the files looked for when the folder is none of them."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SaeFormatError(f"{directory}: not a folder (an SAE folder holds cfg.json + sae_weights.safetensors)")
    for name, files in FORMATS.items():
        if all((directory / f).is_file() for f in files):
            return name
    wanted = "; ".join(f"{k}: {' + '.join(v)}" for k, v in FORMATS.items())
    raise SaeFormatError(f"{directory}: not an SAE folder of a known format ({wanted})")


def load_any_sae(directory: str | os.PathLike[str]) -> tuple[Featurizer, SaeConfig, str]:
    """(model in eval mode, its config in dictcheck's layout, the folder format) for any folder of
    :data:`FORMATS`."""
    fmt = detect_format(directory)
    if fmt == "saelens":
        model, cfg = load_featurizer(directory)
        return model, cfg, fmt
    weights, cfg = load_sparsify(directory) if fmt == "sparsify" else load_dictionary_learning(directory)
    try:
        model = architecture(arch_of(cfg)).from_folder(cfg, weights)
    except ValueError as exc:
        raise SaeFormatError(f"{directory}: {exc}") from None
    model.eval()
    return model, cfg, fmt


def _cast_all(tensors: Mapping[str, torch.Tensor], cfg: SaeConfig) -> dict[str, torch.Tensor]:
    return {n: t.detach().to("cpu", cfg.torch_dtype).contiguous() for n, t in tensors.items()}


def _dtype_name(t: torch.Tensor) -> str:
    for name, dt in DTYPES.items():
        if t.dtype == dt:
            return name
    return "float32"


def load_sparsify(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Read an EleutherAI sparsify hookpoint folder (``cfg.json`` + ``sae.safetensors``).

    encoder.weight [num_latents, d_in] -> W_enc = transpose [d_in, d_sae]; encoder.bias -> b_enc;
    W_dec [num_latents, d_in] and b_dec unchanged. sparsify is a TopK SAE whose encoder does see
    x - b_dec, so the result is ``topk`` with ``apply_b_dec_to_input=True``. Skip connections
    (``W_skip``) are not representable and raise :class:`SaeFormatError`.
    """
    directory = Path(directory)
    cfg_path, w_path = directory / "cfg.json", directory / "sae.safetensors"
    raw = read_json(cfg_path)
    if not isinstance(raw, dict):
        raise SaeFormatError(f"{cfg_path}: top level must be a JSON object")
    t = read_safetensors(w_path)
    for name in ("encoder.weight", "encoder.bias", "W_dec", "b_dec"):
        if name not in t:
            raise SaeFormatError(f"{w_path}: tensor {name!r} is missing")
    extra = sorted(set(t) - {"encoder.weight", "encoder.bias", "W_dec", "b_dec"})
    if extra:
        raise SaeFormatError(f"{w_path}: unsupported tensor(s) {extra} (skip connections are not representable)")
    enc = t["encoder.weight"]
    if enc.ndim != 2:
        raise SaeFormatError(f"{w_path}: tensor 'encoder.weight' has shape {shape_text(enc.shape)}, expected [num_latents, d_in]")
    n_lat, d_in = enc.shape
    if "d_in" in raw and raw["d_in"] != d_in:
        raise SaeFormatError(f"{w_path}: tensor 'encoder.weight' has shape {shape_text(enc.shape)}, expected [num_latents, {raw['d_in']}] (cfg.json d_in)")
    if raw.get("num_latents") and raw["num_latents"] != n_lat:
        raise SaeFormatError(f"{w_path}: tensor 'encoder.weight' has shape {shape_text(enc.shape)}, expected [{raw['num_latents']}, d_in] (cfg.json num_latents)")
    k = raw.get("k")
    if not isinstance(k, int):
        raise SaeFormatError(f"{cfg_path}: missing or non-int field 'k'")
    cfg = new_sae_config(
        "topk",
        int(d_in),
        int(n_lat),
        k=k,
        dtype=_dtype_name(enc),
        decoder_norm_policy="unit" if raw.get("normalize_decoder", True) else "none",
        arch_fields={"source": "sparsify", "sparsify_cfg": raw},
    )
    weights = _cast_all(
        {"W_enc": enc.T, "b_enc": t["encoder.bias"], "W_dec": t["W_dec"], "b_dec": t["b_dec"]}, cfg
    )
    check_tensors(weights, cfg, schema_of(cfg), str(w_path))
    return weights, cfg


_DL_CLASSES = {"AutoEncoder": "relu", "AutoEncoderTopK": "topk", "BatchTopKSAE": "batchtopk", "JumpReluAutoEncoder": "jumprelu"}


def load_dictionary_learning(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Read a saprmarks/dictionary_learning folder (``ae.pt`` + ``config.json``).

    Supported ``trainer.dict_class``: AutoEncoder (-> relu; its decoder bias is named ``bias``),
    AutoEncoderTopK (-> topk), BatchTopKSAE (-> batchtopk; the scalar inference ``threshold`` becomes the
    JumpReLU ``threshold`` tensor SAELens saves, and is kept in ``metadata.dictcheck.batchtopk.threshold``)
    and JumpReluAutoEncoder (-> jumprelu, whose
    tensors already use our names). encoder.weight [dict, act] -> W_enc = transpose;
    decoder.weight [act, dict] -> W_dec = transpose. ``ae.pt`` is read with ``weights_only=True``.
    """
    directory = Path(directory)
    cfg_path, w_path = directory / "config.json", directory / "ae.pt"
    raw = read_json(cfg_path)
    trainer = raw.get("trainer") if isinstance(raw, dict) else None
    if not isinstance(trainer, dict):
        raise SaeFormatError(f"{cfg_path}: missing field 'trainer'")
    cls_name = trainer.get("dict_class")
    if cls_name not in _DL_CLASSES:
        raise SaeFormatError(f"{cfg_path}: unsupported trainer.dict_class {cls_name!r}; supported: {sorted(_DL_CLASSES)}")
    arch = _DL_CLASSES[cls_name]
    if not w_path.is_file():
        raise SaeFormatError(f"{w_path}: file is missing")
    try:
        sd = torch.load(w_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SaeFormatError(f"{w_path}: unreadable torch state dict ({exc})") from None
    if not isinstance(sd, Mapping):
        raise SaeFormatError(f"{w_path}: expected a state dict, got {type(sd).__name__}")

    def get(name: str) -> torch.Tensor:
        if name not in sd:
            raise SaeFormatError(f"{w_path}: tensor {name!r} is missing (dict_class {cls_name})")
        return sd[name]

    arch_fields: dict[str, Any] = {"source": "dictionary_learning", "dict_class": cls_name}
    if arch == "jumprelu":
        w = {n: get(n) for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
    else:
        enc, dec = get("encoder.weight"), get("decoder.weight")
        w = {
            "W_enc": enc.T,
            "b_enc": get("encoder.bias"),
            "W_dec": dec.T,
            "b_dec": get("bias") if arch == "relu" else get("b_dec"),
        }
        if arch == "batchtopk":  # saved as SAELens saves it: the scalar θ repeated as a JumpReLU threshold
            theta = float(sd["threshold"]) if "threshold" in sd else 0.0
            arch_fields["threshold"] = theta if "threshold" in sd else None
            w["threshold"] = torch.full((enc.shape[0],), max(theta, 0.0), dtype=enc.dtype)
    d_in, d_sae = int(w["W_enc"].shape[0]), int(w["W_enc"].shape[-1])
    for key, val in (("activation_dim", d_in), ("dict_size", d_sae)):
        if key in trainer and trainer[key] != val:
            raise SaeFormatError(f"{w_path}: tensor 'W_enc' implies {key}={val}, config.json says {trainer[key]}")
    k = trainer.get("k")
    if architecture(arch).k_in_cfg and not isinstance(k, int):
        kt = sd.get("k")
        k = int(kt) if isinstance(kt, torch.Tensor) and kt.numel() == 1 else None
    cfg = new_sae_config(
        arch,
        d_in,
        d_sae,
        k=k,
        dtype=_dtype_name(w["W_enc"]),
        lam=None,
        arch_fields=arch_fields,
        seed=trainer.get("seed"),
    )
    weights = _cast_all(w, cfg)
    check_tensors(weights, cfg, schema_of(cfg), str(w_path))
    return weights, cfg

