"""saprmarks/dictionary_learning folders (``config.json`` + ``ae.pt``), read into dictcheck's layout
(docs/ecosystem.md §1). ``ae.pt`` is read with ``weights_only=True`` (no arbitrary unpickling)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.io.sae_folder import new_sae_config, schema_of
from dictcheck.empirics.io.saelens import (
    SaeConfig,
    SaeFormatError,
    cast_weights,
    check_tensors,
    dtype_name,
    read_json,
)

__all__ = ["load_dictionary_learning"]

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
        dtype=dtype_name(w["W_enc"]),
        lam=None,
        arch_fields=arch_fields,
        seed=trainer.get("seed"),
    )
    weights = cast_weights(w, cfg)
    check_tensors(weights, cfg, schema_of(cfg), str(w_path))
    return weights, cfg
