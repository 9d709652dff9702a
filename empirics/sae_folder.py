"""Rebuild a :class:`empirics.sae_models.SparseAutoencoder` from a SAELens-layout folder."""

from __future__ import annotations

import os

from empirics.sae_io import SaeConfig, dictcheck_arch, load_sae
from empirics.sae_models import ARCHS, LAM_ARCHS, SparseAutoencoder, make_sae


def load_sae_model(directory: str | os.PathLike[str]) -> tuple[SparseAutoencoder, SaeConfig]:
    """Load weights and config with :func:`empirics.sae_io.load_sae` and rebuild the model in eval mode.

    λ only enters the training loss, so a folder without ``metadata.dictcheck.lam`` still gives a
    working encoder (λ = 1 is used for the loss term). Raises SaeFormatError for unreadable folders
    and ValueError for architectures without a model here (bsf-*, bilinear-*).
    """
    weights, cfg = load_sae(directory)
    arch = dictcheck_arch(cfg)
    if arch not in ARCHS:
        raise ValueError(f"{directory}: architecture {arch!r} has no SAE model here (known: {', '.join(ARCHS)})")
    lam = cfg.dictcheck.get("lam")
    model = make_sae(arch, cfg.d_in, cfg.d_sae, k=cfg.k, lam=(lam if lam is not None else 1.0) if arch in LAM_ARCHS else None,
                     dtype=cfg.torch_dtype, apply_b_dec_to_input=cfg.apply_b_dec_to_input)
    model.load_state_weights(weights)
    if cfg.arch_fields:
        model.load_arch_fields(cfg.arch_fields)
    model.eval()
    return model, cfg
