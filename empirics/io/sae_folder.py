"""SAE folders for the registered architectures: configs, save, load, and the rebuilt model.

:mod:`dictcheck.empirics.io.saelens` knows the SAELens files and fields; this module adds what depends on
the architecture (:mod:`dictcheck.empirics.architectures`): the saved ``architecture`` string, the
weight schema, the decoder-norm policy, where ``k`` goes, and how a model is rebuilt
(docs/ecosystem.md §1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.architectures import REGISTRY, Architecture, Schema, architecture
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.io.saelens import (
    CFG_FILE,
    WEIGHTS_FILE,
    SaeConfig,
    SaeFormatError,
    check_tensors,
    dictcheck_version,
    read_config,
    read_safetensors,
    write_sae_files,
)

__all__ = [
    "arch_of",
    "training_architecture_of",
    "training_only_fields",
    "folder_names",
    "saelens_weights",
    "arch_fields_of",
    "schema_of",
    "validate_config",
    "new_sae_config",
    "save_sae",
    "load_sae",
    "load_featurizer",
    "load_sae_model",
]


def _saelens_training(name: Any) -> Architecture | None:
    """The registered architecture SAELens trains as ``name`` (its ``saelens_training_name``), or None."""
    return next((a for a in REGISTRY.values() if a.saelens_training_name == name), None)


def _architecture_of(cfg: SaeConfig, source: str) -> Architecture:
    dc = cfg.dictcheck
    name = dc.get("arch")
    if name is None:
        for arch in REGISTRY.values():
            if arch.reads_foreign and arch.saved_name == cfg.architecture:
                return arch
        trained = _saelens_training(cfg.architecture)  # a folder of SAELens' save_model
        if trained is not None:
            return trained
        if isinstance(cfg.architecture, str) and cfg.architecture.startswith("dictcheck/"):
            name = cfg.architecture.split("/", 1)[1]
        else:
            known = sorted({a.saved_name for a in REGISTRY.values()} | {a.saelens_training_name for a in
                                                                        REGISTRY.values() if a.saelens_training_name})
            raise SaeFormatError(f"{source}: unknown architecture {cfg.architecture!r}; known: {known}")
    if not isinstance(name, str) or name not in REGISTRY:
        raise SaeFormatError(f"{source}: unknown dictcheck architecture {name!r} in metadata.dictcheck.arch")
    arch = REGISTRY[name]
    if arch.saved_name != cfg.architecture:
        raise SaeFormatError(f"{source}: metadata.dictcheck.arch {name!r} must be saved as architecture "
                             f"{arch.saved_name!r}, got {cfg.architecture!r}")
    return arch


def arch_of(cfg: SaeConfig, *, source: str = CFG_FILE) -> str:
    """The dictcheck architecture of ``cfg``: ``metadata.dictcheck.arch``, else the registered architecture
    that reads foreign folders saved as ``cfg.architecture`` (SaeFormatError when none)."""
    return _architecture_of(cfg, source).name


def training_architecture_of(cfg: SaeConfig, *, source: str = CFG_FILE) -> Architecture:
    """The architecture the folder's SAE was trained as: SAELens' ``metadata.training_architecture`` when a
    registered architecture trains as it (e.g. ``batchtopk`` beside a saved ``jumprelu``), else the folder's
    own architecture (:func:`arch_of`). Its traits say which objective was minimised and where λ comes from."""
    trained = _saelens_training(cfg.metadata.get("training_architecture")) if not cfg.dictcheck else None
    return trained if trained is not None else _architecture_of(cfg, source)


def training_only_fields(cfg: SaeConfig, *, source: str = CFG_FILE) -> dict[str, Any]:
    """The top-level fields of ``cfg`` that SAELens' training config declares training-only for the folder's
    architecture (accepted, reported, not used; docs/ecosystem.md §1)."""
    arch = _architecture_of(cfg, source)
    return {n: v for n, v in cfg.extra_fields.items() if n in arch.saelens_training_fields}


def folder_names(cfg: SaeConfig, model_arch: str) -> dict[str, Any]:
    """How a report names the SAE: ``arch`` as the folder names it (SAELens' ``architecture``, e.g. ``standard``
    or ``jumprelu``; dictcheck's name for its own folders and the foreign formats it converts),
    ``training_architecture`` (SAELens' ``metadata.training_architecture``, e.g. ``batchtopk``, or None),
    ``dictcheck_arch`` (the architecture whose semantics dictcheck computes) and the accepted
    ``training_only_fields``."""
    return {"arch": model_arch if cfg.dictcheck else cfg.architecture,
            "training_architecture": None if cfg.dictcheck else cfg.metadata.get("training_architecture"),
            "dictcheck_arch": model_arch, "training_only_fields": training_only_fields(cfg)}


def arch_fields_of(cfg: SaeConfig) -> dict[str, Any]:
    """Architecture-specific fields, ``metadata.dictcheck[<fields key>]`` ({} when absent)."""
    sub = cfg.dictcheck.get(_architecture_of(cfg, CFG_FILE).fields_key)
    return sub if isinstance(sub, dict) else {}


def schema_of(cfg: SaeConfig, *, source: str = CFG_FILE) -> Schema:
    """Tensor name -> (shape, required) for ``cfg`` (the architecture's :meth:`Architecture.weight_schema`)."""
    arch = _architecture_of(cfg, source)
    sub = cfg.dictcheck.get(arch.fields_key)
    try:
        return arch.weight_schema(cfg.d_in, cfg.d_sae, sub if isinstance(sub, dict) else {})
    except ValueError as exc:
        raise SaeFormatError(f"{source}: architecture {arch.name!r} {exc}") from None


#: Top-level cfg.json fields of SAELens versions before 6 that say where an SAE came from, not what it
#: computes (accepted and kept as they are).
PROVENANCE_FIELDS = frozenset({
    "hook_layer", "dataset_path", "dataset_trust_remote_code", "sae_lens_training_version", "neuronpedia_id",
    "model_from_pretrained_kwargs", "seqpos_slice", "model_class_name", "exclude_special_tokens",
})
#: Fields of older SAELens versions that change what the SAE computes, with the only value dictcheck
#: implements (any other value is refused).
_FIXED_FIELDS: dict[str, Any] = {"activation_fn_str": "relu", "activation_fn_kwargs": {}, "finetuning_scaling_factor": False}


def validate_config(cfg: SaeConfig, *, source: str = CFG_FILE) -> None:
    """The architecture's rules on top of the field checks: a known architecture, ``k`` where SAELens
    keeps it, the fields its weight schema needs, and no top-level field that could change what the SAE
    computes unless dictcheck implements it. Fields SAELens' training config declares training-only are
    accepted (:func:`training_only_fields`). Every offending field is named in one SaeFormatError (one line;
    nothing is ignored silently)."""
    arch = _architecture_of(cfg, source)
    if arch.k_in_cfg and cfg.k is None:
        raise SaeFormatError(f"{source}: architecture {cfg.architecture!r} requires field 'k'")
    offending = [f"{name!r} = {value!r}" for name, value in cfg.extra_fields.items()
                 if name not in PROVENANCE_FIELDS and name not in arch.cfg_fields
                 and name not in arch.saelens_training_fields
                 and not (name in _FIXED_FIELDS and value == _FIXED_FIELDS[name] and arch.family == "sae")]
    if offending:
        raise SaeFormatError(f"{source}: field(s) {', '.join(offending)} not implemented by dictcheck for "
                             f"architecture {cfg.architecture!r}; refusing rather than ignoring them (they may change "
                             "what the SAE computes)")
    schema_of(cfg, source=source)


def new_sae_config(
    arch: str,
    d_in: int,
    d_sae: int,
    *,
    k: int | None = None,
    lam: float | None = None,
    act_scale: float = 1.0,
    seed: int | None = None,
    n_tokens: int | None = None,
    data_hash: str | None = None,
    decoder_norm_policy: str | None = None,
    hook: Mapping[str, Any] | None = None,
    arch_fields: Mapping[str, Any] | None = None,
    model_name: str | None = None,
    hook_name: str | None = None,
    hook_head_index: int | None = None,
    context_size: int | None = None,
    prepend_bos: bool = True,
    dtype: str = "float32",
    device: str = "cpu",
    apply_b_dec_to_input: bool | None = None,
    normalize_activations: str = "none",
    reshape_activations: str = "none",
    version: str | None = None,
) -> SaeConfig:
    """Config for dictcheck arch ``arch`` with the defaults of its registered class filled in:
    ``apply_b_dec_to_input`` and ``decoder_norm_policy`` (docs/ecosystem.md §1, §3);
    ``arch_fields`` go to ``metadata.dictcheck[<fields key>]``; ``k`` is kept top-level only where
    SAELens keeps it. SaeFormatError (one line) for an unknown arch or an invalid config."""
    try:
        a = architecture(arch)
    except ValueError:
        raise SaeFormatError(f"unknown dictcheck architecture {arch!r}; known: {sorted(REGISTRY)}") from None
    dc: dict[str, Any] = {
        "arch": arch,
        "lam": lam,
        "act_scale": act_scale,
        "seed": seed,
        "n_tokens": n_tokens,
        "data_hash": data_hash,
        "version": dictcheck_version() if version is None else version,
        "decoder_norm_policy": decoder_norm_policy or a.decoder_norm,
        "hook": dict(hook) if hook is not None else None,
        a.fields_key: dict(arch_fields or {}),
    }
    metadata = {
        "model_name": model_name,
        "hook_name": hook_name,
        "hook_head_index": hook_head_index,
        "context_size": context_size,
        "prepend_bos": prepend_bos,
        "dictcheck": dc,
    }
    cfg = SaeConfig(
        d_in=d_in,
        d_sae=d_sae,
        architecture=a.saved_name,
        dtype=dtype,
        device=device,
        apply_b_dec_to_input=a.apply_b_dec_to_input if apply_b_dec_to_input is None else apply_b_dec_to_input,
        normalize_activations=normalize_activations,
        reshape_activations=reshape_activations,
        k=k if a.k_in_cfg else None,
        metadata=metadata,
    )
    cfg.validate()
    validate_config(cfg)
    return cfg


def save_sae(
    directory: str | os.PathLike[str],
    weights: Mapping[str, torch.Tensor | np.ndarray],
    cfg: SaeConfig,
    *,
    sparsity: torch.Tensor | np.ndarray | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> Path:
    """Save an SAE folder (:func:`dictcheck.empirics.io.saelens.write_sae_files` with the architecture's
    schema): cfg.json, sae_weights.safetensors, optional sparsity.safetensors and metrics.json."""
    cfg.validate()
    validate_config(cfg)
    return write_sae_files(directory, weights, cfg, schema_of(cfg), sparsity=sparsity, metrics=metrics)


def load_sae(directory: str | os.PathLike[str], *, mmap: bool = False) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Load an SAE folder written by :func:`save_sae` (or by SAELens for the standard archs): ``(weights,
    cfg)`` with CPU tensors, every name, shape, dtype and value checked (SaeFormatError, one line). ``mmap``:
    the tensors are copy-on-write views of the file (:func:`~dictcheck.empirics.io.saelens.mapped_safetensors`)."""
    cfg = read_config(directory)
    source = str(Path(directory) / CFG_FILE)
    validate_config(cfg, source=source)
    return saelens_weights(read_safetensors(Path(directory) / WEIGHTS_FILE, mmap=mmap), cfg,
                           source=str(Path(directory) / WEIGHTS_FILE)), cfg


def saelens_weights(tensors: Mapping[str, torch.Tensor], cfg: SaeConfig, *, source: str) -> dict[str, torch.Tensor]:
    """The tensors of a folder (or of an SAE object's state dict) with config ``cfg``, under the saved names of
    its architecture's schema and checked against it (name, shape, dtype, finite): a folder of SAELens'
    ``save_model`` holds the training state, converted as ``save_inference_model`` would save it
    (:meth:`Architecture.from_saelens_training`)."""
    arch = _architecture_of(cfg, source)
    weights = dict(tensors)
    if not cfg.dictcheck and cfg.architecture == arch.saelens_training_name != arch.saved_name:
        weights = arch.from_saelens_training(weights, cfg)
    check_tensors(weights, cfg, schema_of(cfg, source=source), source)
    return weights


def load_featurizer(directory: str | os.PathLike[str], *, mmap: bool = False) -> tuple[Featurizer, SaeConfig]:
    """Load weights and config with :func:`load_sae` and rebuild the model in eval mode
    (:meth:`Architecture.from_folder`; ``mmap``: its weights stay views of the file where the architecture
    allows). SaeFormatError for unreadable folders or missing build information."""
    weights, cfg = load_sae(directory, mmap=mmap)
    arch = architecture(arch_of(cfg))
    try:
        model = arch.from_folder(cfg, weights, mapped=mmap)
    except ValueError as exc:
        raise SaeFormatError(f"{directory}: {exc}") from None
    model.eval()
    return model, cfg


def load_sae_model(directory: str | os.PathLike[str]) -> tuple[Featurizer, SaeConfig]:
    """:func:`load_featurizer` restricted to the linear SAEs (ValueError for bsf-*, bilinear-*, vasae)."""
    model, cfg = load_featurizer(directory)
    family = architecture(model.arch).family
    if family != "sae":
        raise ValueError(f"{directory}: architecture {model.arch!r} has no linear SAE model (it is a "
                         f"{family} featurizer)")
    return model, cfg
