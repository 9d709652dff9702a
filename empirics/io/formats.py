"""Every SAE folder format dictcheck reads (docs/ecosystem.md §1), and :func:`load_any_sae`, which
detects the format of a folder and returns the model:

* SAELens / dictcheck (``cfg.json`` + ``sae_weights.safetensors``): :mod:`dictcheck.empirics.io.sae_folder`;
* EleutherAI sparsify (``cfg.json`` + ``sae.safetensors``): :mod:`dictcheck.empirics.io.sparsify`;
* saprmarks/dictionary_learning (``config.json`` + ``ae.pt``): :mod:`dictcheck.empirics.io.dictionary_learning`.

The two foreign readers return ``(weights, cfg)`` converted to dictcheck's layout, as
:func:`dictcheck.empirics.io.sae_folder.load_sae` does."""

from __future__ import annotations

import os
from pathlib import Path

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.io.dictionary_learning import load_dictionary_learning
from dictcheck.empirics.io.sae_folder import arch_of, load_featurizer
from dictcheck.empirics.io.saelens import SaeConfig, SaeFormatError
from dictcheck.empirics.io.sparsify import load_sparsify

__all__ = ["FORMATS", "detect_format", "load_any_sae"]

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
