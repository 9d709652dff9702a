"""saprmarks/dictionary_learning folders (``config.json`` + ``ae.pt``), read into dictcheck's layout
(docs/ecosystem.md §1). ``ae.pt`` is read with ``weights_only=True`` (no arbitrary unpickling)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dictcheck.empirics.architectures import REGISTRY, Architecture
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

__all__ = ["load_dictionary_learning", "from_dictionary_learning"]

def _dl_classes() -> dict[str, Architecture]:
    """``trainer.dict_class`` -> the registered architecture that reads it (its ``dl_class`` trait)."""
    return {a.dl_class: a for a in REGISTRY.values() if a.dl_class is not None}


class _CheckedState(Mapping[str, torch.Tensor]):
    """A state dict whose entries are checked when an architecture reads them: a floating-point tensor, 2-D for a
    matrix (``*.weight``, ``W_*``: dictionary_learning's names) and at most 1-D otherwise (SaeFormatError naming
    it otherwise); shapes and values are checked against the architecture's schema after conversion."""

    def __init__(self, sd: Mapping[str, Any], source: str, cls_name: str) -> None:
        self._sd, self._source, self._cls = sd, source, cls_name

    def __getitem__(self, name: str) -> torch.Tensor:
        v = self._sd[name]
        matrix = name.endswith("weight") or name.startswith("W_")
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or (v.ndim != 2 if matrix else v.ndim > 1):
            what = f"a {v.dtype} tensor of shape {list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
            raise SaeFormatError(f"{self._source}: entry {name!r} must be a {'2-D' if matrix else '0-D or 1-D'} "
                                 f"floating-point tensor (dict_class {self._cls}), got {what}")
        return v

    def __iter__(self):
        return iter(self._sd)

    def __len__(self) -> int:
        return len(self._sd)


def load_dictionary_learning(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Read a saprmarks/dictionary_learning folder (``ae.pt`` + ``config.json``): ``trainer.dict_class`` names
    the architecture (its ``dl_class``), whose :meth:`~Architecture.from_dictionary_learning` maps the state
    dict's tensors to the saved names (e.g. encoder.weight [dict, act] -> W_enc = transpose; decoder.weight
    [act, dict] -> W_dec = transpose). ``ae.pt`` is read with ``weights_only=True``.
    """
    directory = Path(directory)
    cfg_path, w_path = directory / "config.json", directory / "ae.pt"
    raw = read_json(cfg_path)
    trainer = raw.get("trainer") if isinstance(raw, dict) else None
    if not isinstance(trainer, dict):
        raise SaeFormatError(f"{cfg_path}: missing field 'trainer'")
    if not isinstance(trainer.get("dict_class"), str) or trainer["dict_class"] not in _dl_classes():
        raise SaeFormatError(f"{cfg_path}: unsupported trainer.dict_class {trainer.get('dict_class')!r}; supported: "
                             f"{sorted(_dl_classes())}")
    try:
        sd = read_torch(w_path, "dictionary_learning weights")
    except ValueError as exc:
        raise SaeFormatError(str(exc)) from None
    if not isinstance(sd, Mapping):
        raise SaeFormatError(f"{w_path}: expected a state dict, got {type(sd).__name__}")
    return from_dictionary_learning(trainer, sd, source=str(w_path))


def from_dictionary_learning(trainer: Mapping[str, Any], sd: Mapping[str, torch.Tensor], *,
                             source: str) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """A dictionary_learning module's state dict ``sd`` in dictcheck's layout; ``trainer`` holds its
    ``dict_class`` (and, from a folder's config.json, ``activation_dim``, ``dict_size``, ``k``, ``seed``)."""
    w_path = source
    cls_name = trainer.get("dict_class")
    classes = _dl_classes()
    if not isinstance(cls_name, str) or cls_name not in classes:
        raise SaeFormatError(f"{source}: unsupported dictionary_learning class {cls_name!r}; supported: "
                             f"{sorted(classes)}")
    arch = classes[cls_name]
    try:
        w, fields, cfg_fields = arch.from_dictionary_learning(_CheckedState(sd, w_path, cls_name))
    except KeyError as exc:
        raise SaeFormatError(f"{w_path}: tensor {exc.args[0]!r} is missing (dict_class {cls_name})") from None
    except ValueError as exc:
        raise SaeFormatError(f"{w_path}: {exc}") from None
    arch_fields: dict[str, Any] = {"source": "dictionary_learning", "dict_class": cls_name, **fields}
    d_in, d_sae = int(w["W_enc"].shape[0]), int(w["W_enc"].shape[-1])
    for key, val in (("activation_dim", d_in), ("dict_size", d_sae)):
        if key in trainer and trainer[key] != val:
            raise SaeFormatError(f"{w_path}: tensor 'W_enc' implies {key}={val}, config.json says {trainer[key]}")
    k = trainer.get("k")
    if arch.k_in_cfg and not isinstance(k, int):
        kt = sd.get("k")
        k = int(kt) if isinstance(kt, torch.Tensor) and kt.numel() == 1 else None
    cfg = new_sae_config(
        arch.name,
        d_in,
        d_sae,
        k=k,
        dtype=dtype_name(w["W_enc"]),
        lam=None,
        arch_fields=arch_fields,
        seed=trainer.get("seed"),
        **cfg_fields,
    )
    weights = cast_weights(w, cfg)
    check_tensors(weights, cfg, schema_of(cfg), str(w_path))
    return weights, cfg
