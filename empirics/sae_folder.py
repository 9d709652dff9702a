"""Rebuild a trained :class:`empirics.featurizer.Featurizer` from a SAELens-layout folder."""

from __future__ import annotations

import os

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.featurizer import Featurizer
from dictcheck.empirics.sae_io import SaeConfig, SaeFormatError, dictcheck_arch, load_sae
from dictcheck.empirics.sae_models import LAM_ARCHS, SparseAutoencoder, make_sae

__all__ = ["load_featurizer", "load_sae_model"]


def load_featurizer(directory: str | os.PathLike[str]) -> tuple[Featurizer, SaeConfig]:
    """Load weights and config with :func:`empirics.sae_io.load_sae` and rebuild the model in eval mode.

    Linear SAEs need only the SAELens fields: λ only enters the training loss, so a folder without
    ``metadata.dictcheck.lam`` still gives a working encoder (λ = 1 is used for the loss term).
    BSFs and bilinear autoencoders are rebuilt from ``metadata.dictcheck.training`` (``k`` and the
    resolved ``options`` that :func:`empirics.training.train` records). Raises SaeFormatError for
    unreadable folders or missing build information.
    """
    weights, cfg = load_sae(directory)
    arch = architecture(dictcheck_arch(cfg))
    if arch.family == "sae":
        lam = cfg.dictcheck.get("lam")
        model: Featurizer = make_sae(arch.name, cfg.d_in, cfg.d_sae, k=cfg.k,
                                     lam=(lam if lam is not None else 1.0) if arch.name in LAM_ARCHS else None,
                                     dtype=cfg.torch_dtype, apply_b_dec_to_input=cfg.apply_b_dec_to_input)
    else:
        training = cfg.dictcheck.get("training")
        if not isinstance(training, dict) or not isinstance(training.get("options"), dict):
            raise SaeFormatError(f"{directory}: cfg.json lacks metadata.dictcheck.training.options, which a "
                                 f"{arch.name} model is rebuilt from (folders written by `dictcheck train` have it)")
        try:
            options = arch.resolve_options(cfg.d_sae, training.get("k"), None, training["options"])
            model = arch.build(arch.name, cfg.d_in, cfg.d_sae, k=training.get("k"), dtype=cfg.torch_dtype, **options)
        except ValueError as exc:
            raise SaeFormatError(f"{directory}: cannot rebuild {arch.name}: {exc}") from None
    try:
        model.load_state_weights(weights)
    except ValueError as exc:
        raise SaeFormatError(f"{directory}: {exc}") from None
    if cfg.arch_fields:
        model.load_arch_fields(cfg.arch_fields)
    model.eval()
    return model, cfg


def load_sae_model(directory: str | os.PathLike[str]) -> tuple[SparseAutoencoder, SaeConfig]:
    """:func:`load_featurizer` restricted to the linear SAEs (ValueError for bsf-*, bilinear-*)."""
    model, cfg = load_featurizer(directory)
    if not isinstance(model, SparseAutoencoder):
        raise ValueError(f"{directory}: architecture {cfg.arch!r} has no linear SAE model (it is a "
                         f"{architecture(cfg.arch).family} featurizer)")
    return model, cfg
