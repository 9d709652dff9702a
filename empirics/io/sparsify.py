"""EleutherAI sparsify hookpoint folders (``cfg.json`` + ``sae.safetensors``), read into dictcheck's
layout (docs/ecosystem.md §1)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dictcheck.empirics.io.sae_folder import new_sae_config, schema_of
from dictcheck.empirics.io.saelens import (
    SaeConfig,
    SaeFormatError,
    cast_weights,
    check_tensors,
    dtype_name,
    read_json,
    read_safetensors,
    shape_text,
)

__all__ = ["load_sparsify", "from_sparsify"]


def load_sparsify(directory: str | os.PathLike[str], *, mmap: bool = False
                  ) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Read an EleutherAI sparsify hookpoint folder (``cfg.json`` + ``sae.safetensors``): :func:`from_sparsify`
    of its config and tensors (``mmap``: views of the file)."""
    directory = Path(directory)
    cfg_path, w_path = directory / "cfg.json", directory / "sae.safetensors"
    raw = read_json(cfg_path)
    if not isinstance(raw, dict):
        raise SaeFormatError(f"{cfg_path}: top level must be a JSON object")
    return from_sparsify(raw, read_safetensors(w_path, mmap=mmap), cfg_source=str(cfg_path), w_source=str(w_path))


def from_sparsify(raw: dict[str, Any], t: Mapping[str, torch.Tensor], *, cfg_source: str,
                  w_source: str) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """A sparsify ``SparseCoder``'s config (``raw``, with ``d_in``) and state dict ``t`` in dictcheck's layout.

    encoder.weight [num_latents, d_in] -> W_enc = transpose [d_in, d_sae]; encoder.bias -> b_enc;
    W_dec [num_latents, d_in] and b_dec unchanged. sparsify is a TopK SAE whose encoder does see
    x - b_dec, so the result is ``topk`` with ``apply_b_dec_to_input=True``. Skip connections
    (``W_skip``) are not representable and raise :class:`SaeFormatError`.
    """
    w_path = w_source
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
        raise SaeFormatError(f"{cfg_source}: missing or non-int field 'k'")
    cfg = new_sae_config(
        "topk",
        int(d_in),
        int(n_lat),
        k=k,
        dtype=dtype_name(enc),
        decoder_norm_policy="unit" if raw.get("normalize_decoder", True) else "none",
        arch_fields={"source": "sparsify", "sparsify_cfg": raw},
    )
    weights = cast_weights(
        {"W_enc": enc.T, "b_enc": t["encoder.bias"], "W_dec": t["W_dec"], "b_dec": t["b_dec"]}, cfg
    )
    check_tensors(weights, cfg, schema_of(cfg), str(w_path))
    return weights, cfg
