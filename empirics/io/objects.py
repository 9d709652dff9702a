"""SAEs in memory, read as their library saves them (docs/ecosystem.md §1): :func:`load_object` takes a SAELens
``SAE``/``TrainingSAE``, a sparsify ``SparseCoder``, a dictionary_learning module or a dictcheck featurizer and
returns the model dictcheck checks, exactly what the same object's saved folder would load as. The libraries are
recognised by the module their class comes from; none of them is imported.
"""

from __future__ import annotations

from typing import Any

import torch

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.architectures.linear_sae import LinearSAE
from dictcheck.empirics.io.dictionary_learning import from_dictionary_learning
from dictcheck.empirics.io.sae_folder import arch_of, new_sae_config, saelens_weights, validate_config
from dictcheck.empirics.io.saelens import SaeConfig, SaeFormatError, dtype_name
from dictcheck.empirics.io.sparsify import from_sparsify

__all__ = ["ACCEPTED", "load_object", "object_name"]

#: What :func:`load_object` accepts, for its TypeError.
ACCEPTED = ("an SAE folder (path)", "a SAELens SAE or TrainingSAE", "a sparsify SparseCoder",
            "a dictionary_learning dictionary (AutoEncoder, AutoEncoderTopK, BatchTopKSAE, JumpReluAutoEncoder, "
            "GatedAutoEncoder, ...)", "a dictcheck featurizer")


def _library(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def object_name(obj: Any) -> str:
    """A short name of an SAE object for messages (``<sae_lens TopKSAE d_sae=16384>``), never its repr."""
    d_sae = getattr(getattr(obj, "cfg", None), "d_sae", None) or getattr(obj, "d_sae", None) or getattr(
        obj, "dict_size", None)
    return f"<{_library(obj)} {type(obj).__name__}" + (f" d_sae={d_sae}" if d_sae else "") + ">"


def _state(obj: Any) -> dict[str, torch.Tensor]:
    return {n: t.detach().to("cpu") for n, t in obj.state_dict().items()}


def _own(model: Featurizer) -> SaeConfig:
    """The config of a dictcheck featurizer, as its saved folder holds it."""
    a = architecture(model.arch)
    options = model.arch_options
    top, _ = a.saved_options(options) if options is not None else ({}, {})
    dtype = dtype_name(next(iter(model.state_weights().values())))
    extra: dict[str, Any] = {}
    if isinstance(model, LinearSAE):
        extra = {"apply_b_dec_to_input": model.apply_b_dec_to_input,
                 "normalize_activations": model.input_normalisation.mode}
    return new_sae_config(model.arch, model.d_in, model.d_sae, k=top.get("k"), lam=top.get("lam"), dtype=dtype,
                          arch_fields=model.arch_fields(), **extra)


def load_object(obj: Any) -> tuple[Featurizer, SaeConfig, str]:
    """(model in eval mode, its config in dictcheck's layout, the format) of an SAE object in memory (module
    docstring); TypeError naming what is accepted for anything else, SaeFormatError for an object of a known
    library that dictcheck cannot compute exactly."""
    name = object_name(obj)
    if isinstance(obj, Featurizer):
        obj.eval()
        return obj, _own(obj), "dictcheck"
    library = _library(obj)
    if library == "sae_lens" and hasattr(getattr(obj, "cfg", None), "to_dict"):
        cfg = SaeConfig.from_dict(obj.cfg.to_dict(), source=name)
        validate_config(cfg, source=name)
        weights, fmt = saelens_weights(_state(obj), cfg, source=name), "saelens"
    elif library == "sparsify" and hasattr(obj, "cfg") and hasattr(obj, "d_in"):
        raw = {**(obj.cfg.to_dict() if hasattr(obj.cfg, "to_dict") else vars(obj.cfg)), "d_in": obj.d_in}
        weights, cfg = from_sparsify(raw, _state(obj), cfg_source=name, w_source=name)
        fmt = "sparsify"
    elif library == "dictionary_learning" and hasattr(obj, "state_dict"):
        trainer = {"dict_class": type(obj).__name__, "k": getattr(obj, "k", None)}
        if isinstance(trainer["k"], torch.Tensor):
            trainer["k"] = int(trainer["k"])
        weights, cfg = from_dictionary_learning(trainer, _state(obj), source=name)
        fmt = "dictionary_learning"
    else:
        raise TypeError(f"cannot check {name}: expected {', '.join(ACCEPTED[:-1])} or {ACCEPTED[-1]}")
    try:
        model = architecture(arch_of(cfg, source=name)).from_folder(cfg, weights)
    except ValueError as exc:
        raise SaeFormatError(f"{name}: {exc}") from None
    model.eval()
    return model, cfg, fmt
