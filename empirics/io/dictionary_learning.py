"""saprmarks/dictionary_learning folders (``config.json`` + ``ae.pt``), read into dictcheck's layout
(docs/ecosystem.md §1). ``ae.pt`` is read with ``weights_only=True`` (no arbitrary unpickling)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.io.safe_files import read_torch
from dictcheck.empirics.io.sae_folder import new_sae_config, schema_of
from dictcheck.empirics.io.saelens import (
    SaeConfig,
    SaeFormatError,
    cast_weights,
    check_tensors,
    dtype_name,
    read_json,
)
from dictcheck.theory.scaling import MAX_ENTRY

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
    if not isinstance(cls_name, str) or cls_name not in _DL_CLASSES:
        raise SaeFormatError(f"{cfg_path}: unsupported trainer.dict_class {cls_name!r}; supported: {sorted(_DL_CLASSES)}")
    arch = _DL_CLASSES[cls_name]
    try:
        sd = read_torch(w_path, "dictionary_learning weights")
    except ValueError as exc:
        raise SaeFormatError(str(exc)) from None
    if not isinstance(sd, Mapping):
        raise SaeFormatError(f"{w_path}: expected a state dict, got {type(sd).__name__}")

    def get(name: str, ndim: int) -> torch.Tensor:
        """Tensor ``name`` of the state dict, a floating-point tensor of ``ndim`` dimensions (SaeFormatError
        otherwise): every entry is checked before it is used."""
        if name not in sd:
            raise SaeFormatError(f"{w_path}: tensor {name!r} is missing (dict_class {cls_name})")
        v = sd[name]
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.ndim != ndim:
            what = f"a {v.dtype} tensor of shape {list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
            raise SaeFormatError(f"{w_path}: entry {name!r} must be a {ndim}-D floating-point tensor, got {what}")
        return v

    arch_fields: dict[str, Any] = {"source": "dictionary_learning", "dict_class": cls_name}
    if arch == "jumprelu":
        w = {n: get(n, 2 if n.startswith("W_") else 1) for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
    else:
        enc, dec = get("encoder.weight", 2), get("decoder.weight", 2)
        w = {
            "W_enc": enc.T,
            "b_enc": get("encoder.bias", 1),
            "W_dec": dec.T,
            "b_dec": get("bias", 1) if arch == "relu" else get("b_dec", 1),
        }
        if arch == "batchtopk":  # saved as SAELens saves it: the scalar θ repeated as a JumpReLU threshold
            theta = float(get("threshold", 0)) if "threshold" in sd else 0.0
            if not abs(theta) <= MAX_ENTRY:
                raise SaeFormatError(f"{w_path}: entry 'threshold' is {theta!r}, not a finite number of magnitude at "
                                     f"most {MAX_ENTRY:g}")
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
