"""Every SAE folder format dictcheck reads (docs/ecosystem.md §1), and :func:`load_any_sae`, which
detects the format of a folder and returns the model:

* SAELens / dictcheck (``cfg.json`` + ``sae_weights.safetensors``): :mod:`dictcheck.empirics.io.sae_folder`;
* EleutherAI sparsify (``cfg.json`` + ``sae.safetensors``): :mod:`dictcheck.empirics.io.sparsify`;
* saprmarks/dictionary_learning (``config.json`` + ``ae.pt``): :mod:`dictcheck.empirics.io.dictionary_learning`.

The two foreign readers return ``(weights, cfg)`` converted to dictcheck's layout, as
:func:`dictcheck.empirics.io.sae_folder.load_sae` does."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import safetensors.torch

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.io.dictionary_learning import load_dictionary_learning
from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.io.sae_folder import arch_of, load_featurizer, schema_of
from dictcheck.empirics.io.saelens import SaeConfig, SaeFormatError, write_sae_files
from dictcheck.empirics.io.sparsify import load_sparsify

__all__ = ["FORMATS", "detect_format", "load_any_sae", "source_name", "save_in_format"]

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


def load_any_sae(source: str | os.PathLike[str] | Any, *, mmap: bool = False) -> tuple[Featurizer, SaeConfig, str]:
    """(model in eval mode, its config in dictcheck's layout, the format) for any folder of :data:`FORMATS`, or
    for an SAE object in memory (:func:`dictcheck.empirics.io.objects.load_object`). ``mmap``: the weights of a
    safetensors file (SAELens, sparsify) stay copy-on-write views of it where the architecture allows
    (:meth:`Architecture.from_folder`), so an SAE wider than memory loads in the pages it reads."""
    if not isinstance(source, (str, os.PathLike)):
        from dictcheck.empirics.io.objects import load_object

        return load_object(source)
    directory = source
    fmt = detect_format(directory)
    if fmt == "saelens":
        model, cfg = load_featurizer(directory, mmap=mmap)
        return model, cfg, fmt
    mapped = mmap and fmt == "sparsify"  # dictionary_learning's torch pickles are read whole
    weights, cfg = load_sparsify(directory, mmap=mapped) if fmt == "sparsify" else load_dictionary_learning(directory)
    try:
        model = architecture(arch_of(cfg)).from_folder(cfg, weights, mapped=mapped)
    except ValueError as exc:
        raise SaeFormatError(f"{directory}: {exc}") from None
    model.eval()
    return model, cfg, fmt


def source_name(source: str | os.PathLike[str] | Any) -> str:
    """How messages name an SAE source: the folder's path, or a short name of an object (never its repr)."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    from dictcheck.empirics.io.objects import object_name

    return object_name(source)


def save_in_format(directory: str | os.PathLike[str], model: Featurizer, cfg: SaeConfig, fmt: str) -> Path:
    """Write ``model`` (e.g. a polished copy of a loaded SAE) to ``directory`` in the format ``fmt`` it was read
    from, keeping the source's config: ``saelens`` (``cfg.json`` with every field of ``cfg``, the weights under
    the architecture's saved names; a config in SAELens' training layout is refused, since its weights would
    need SAELens' training state) or ``sparsify`` (``cfg.json`` = the source's sparsify config +
    ``sae.safetensors`` under sparsify's names). ValueError for another format or layout."""
    arch = architecture(arch_of(cfg))
    weights = model.state_weights()
    if fmt == "saelens":
        if not cfg.dictcheck and cfg.architecture == arch.saelens_training_name != arch.saved_name:
            raise ValueError(f"cannot write SAELens' training layout (architecture {cfg.architecture!r}); save the "
                             f"model as an inference folder ({arch.saved_name!r}) with save_sae")
        return write_sae_files(directory, weights, cfg, schema_of(cfg))
    if fmt == "sparsify":
        raw = cfg.dictcheck.get(arch.fields_key, {}).get("sparsify_cfg")
        if not isinstance(raw, dict):
            raise ValueError("this model was not read from a sparsify folder (no metadata.dictcheck.topk.sparsify_cfg)")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {"encoder.weight": weights["W_enc"].T.contiguous(), "encoder.bias": weights["b_enc"],
                   "W_dec": weights["W_dec"], "b_dec": weights["b_dec"]}
        atomic_write_bytes(out / "sae.safetensors", safetensors.torch.save(tensors))
        atomic_write_bytes(out / "cfg.json", json.dumps(raw).encode())
        return out
    raise ValueError(f"writing the {fmt!r} format is not implemented (saelens, sparsify)")
