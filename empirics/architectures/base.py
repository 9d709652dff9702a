"""What one trainable architecture declares, in one place, and the registry that holds them.

An architecture is a subclass of :class:`Architecture` registered with :func:`register`. It declares

* ``name`` (what ``dictcheck train --arch`` takes), ``family`` (``sae``, ``bsf``, ``bilinear``,
  ``vasae``; groups the CLI options) and ``fields_key`` (``metadata.dictcheck.<fields_key>`` holds
  its non-weight fields, docs/ecosystem.md §1);
* ``saved_name``: the SAELens ``architecture`` string of cfg.json; ``k_in_cfg``: whether ``k`` is a
  SAELens top-level cfg field; ``apply_b_dec_to_input``: the saved default;
* ``decoder_norm``: the decoder-norm policy (docs/ecosystem.md §3), and
  :meth:`decoder_constraint_violation`, how far a model's decoder is from it (None for ``"none"``);
  ``b_dec_inits``: the centring rules the training loop may use (the first is the default;
  ``"none"``: no centring vector);
* ``encoder_weights``: the parameters an encoder fitted to a frozen decoder trains
  (:mod:`dictcheck.empirics.training.encoder_fit`; empty: it cannot be fitted), and ``trains_objective_1``:
  whether its loss is objective (1) at its ``lam`` (docs/theory.md §1), so that a λ of (1) is its own sparsity
  coefficient;
* :meth:`default_lr`, a typed options dataclass ``Options`` (a subclass of :class:`ArchOptions`;
  defaults, CLI help and CLI type as field metadata, made with :func:`option`), its weight schema
  (:meth:`weight_schema`), its exactness under DDP (:meth:`ddp_inexactness`) and how to build it
  (:meth:`init_model`).

Options named ``k``, ``lam`` and ``aux_coef`` are saved where SAELens and earlier dictcheck folders
keep them (``k`` top-level and in ``metadata.dictcheck.training.k``, ``lam`` in
``metadata.dictcheck.lam``, ``aux_coef`` in ``metadata.dictcheck.training.aux_coef``); every other
option is saved in ``metadata.dictcheck.training.options`` (:meth:`Architecture.saved_options`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from dictcheck.theory.scaling import MAX_ENTRY

if TYPE_CHECKING:  # this module stays torch-free: the registry and the CLI's parsers read it
    import torch

    from dictcheck.empirics.architectures.featurizer import Featurizer
    from dictcheck.empirics.io.saelens import SaeConfig

__all__ = [
    "ArchOptions",
    "Architecture",
    "Schema",
    "option",
    "register",
    "unregister",
    "ForeignWeights",
    "OptionsContext",
    "REGISTERED",
    "require_int",
    "require_real",
]

#: Tensor name -> (shape, required).
Schema = dict[str, tuple[tuple[int, ...], bool]]
#: What an architecture reads from a foreign library's module: (weights under the saved names, its
#: ``metadata.dictcheck.<fields_key>`` fields, SAELens cfg fields that differ from its defaults).
ForeignWeights = tuple[dict[str, "torch.Tensor"], dict[str, Any], dict[str, Any]]
#: Options saved outside ``training.options`` (see the module docstring).
TOP_LEVEL_OPTIONS = ("k", "lam", "aux_coef")


#: Batch-sized buffers at input and code width alive during a training step (default of
#: :meth:`Architecture.step_bytes`).
STEP_COPIES = 8


def option(default: Any = None, *, help: str, type: type | None = None, choices: tuple[str, ...] | None = None,
           cli: bool = True) -> Any:
    """A field of an options dataclass: its default, and the CLI help, value type and choices.
    ``cli=False`` keeps it off the command line (e.g. a list-valued option)."""
    return dataclasses.field(default=default, metadata={"help": help, "type": type, "choices": choices, "cli": cli})


def require_int(name: str, value: Any, low: int, high: int | None = None, *, what: str | None = None) -> int:
    """``value`` as an int in [low, high]; ValueError naming ``name`` otherwise (bools are refused)."""
    ok = isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        span = f"an int >= {low}" if high is None else f"an int in [{low}, {what or high}]"
        raise ValueError(f"{name} must be {span}, got {value!r}")
    return int(value)


def require_real(name: str, value: Any, *, positive: bool = False, high: float = MAX_ENTRY) -> float:
    """``value`` as a float in [0, high] ((0, high] when ``positive``); ValueError naming ``name`` otherwise. The
    default bound :data:`dictcheck.theory.scaling.MAX_ENTRY` keeps every product of an option with data or
    weights (themselves at most that large) inside float64."""
    ok = isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0) or value > high:
        raise ValueError(f"{name} must be a finite number in {'(' if positive else '['}0, {high:g}], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ArchOptions:
    """Base of every architecture's options: a frozen dataclass of JSON values.

    Subclasses add fields made with :func:`option` and override :meth:`resolved` to validate them
    and fill defaults that depend on the width (ValueError with a one-line message).
    """

    def resolved(self, arch: str, d_sae: int) -> ArchOptions:
        """These options validated for ``arch`` at width ``d_sae``, derived defaults filled in."""
        return self

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


class Architecture:
    """One trainable architecture (see the module docstring). Subclasses set the class attributes and
    implement :meth:`init_model` and :meth:`weight_schema`."""

    name: ClassVar[str]
    family: ClassVar[str]
    family_title: ClassVar[str]
    fields_key: ClassVar[str]
    saved_name: ClassVar[str]
    decoder_norm: ClassVar[str]
    b_dec_inits: ClassVar[tuple[str, ...]]
    Options: ClassVar[type[ArchOptions]] = ArchOptions
    k_in_cfg: ClassVar[bool] = False
    apply_b_dec_to_input: ClassVar[bool] = True
    #: A folder saved as ``saved_name`` without ``metadata.dictcheck.arch`` (SAELens' own) is this arch.
    reads_foreign: ClassVar[bool] = False
    #: Top-level cfg.json fields beyond SaeConfig's that this architecture implements (e.g. SAELens'
    #: ``rescale_acts_by_decoder_norm`` for TopK); any other is refused when a folder is read.
    cfg_fields: ClassVar[frozenset[str]] = frozenset()
    #: The objective its training minimises, in words (reports quote it).
    objective: ClassVar[str] = ""
    #: Its training loss is objective (1) at its option ``lam`` (docs/theory.md §1): a folder's λ is objective
    #: (1)'s, and ``check-sae`` needs one (given or recorded).
    trains_objective_1: ClassVar[bool] = False
    #: Parameters an encoder fit with the decoder frozen trains (empty: none).
    encoder_weights: ClassVar[tuple[str, ...]] = ()
    #: Whether its codes may be negative (docs/theory.md §4.5).
    signed_codes: ClassVar[bool] = False
    #: The saprmarks/dictionary_learning class (``trainer.dict_class``) read as this architecture, if any.
    dl_class: ClassVar[str | None] = None
    #: SAELens' training architecture (``TrainingSAEConfig.architecture()``: the ``architecture`` of a folder
    #: written by ``save_model``, ``metadata.training_architecture`` of either save method), if SAELens trains it.
    saelens_training_name: ClassVar[str | None] = None
    #: The top-level fields of SAELens' training config class that only affect training (the fields of
    #: ``TrainingSAEConfig`` subclasses not in the inference config, docs/ecosystem.md §1): accepted in a
    #: folder and reported, never used.
    saelens_training_fields: ClassVar[frozenset[str]] = frozenset()

    # ------------------------------------------------------------------ options
    def default_lr(self, d_sae: int) -> float:
        raise NotImplementedError

    def options(self, values: Mapping[str, Any] | ArchOptions | None, d_sae: int) -> ArchOptions:
        """Parse (a mapping or an ``Options`` instance) and validate the options at width ``d_sae``."""
        if isinstance(values, ArchOptions):
            if not isinstance(values, self.Options):
                raise ValueError(f"arch {self.name!r} takes {self.Options.__name__}, got {type(values).__name__}")
            opts = values
        else:
            values = dict(values or {})
            allowed = self.Options.field_names()
            unknown = sorted(set(values) - set(allowed))
            if unknown:
                if not allowed:
                    raise ValueError(f"arch {self.name!r} takes no options, got {unknown}")
                raise ValueError(f"arch {self.name!r} does not take option(s) {unknown}; allowed: {list(allowed)}")
            opts = self.Options(**values)
        return opts.resolved(self.name, d_sae)

    def saved_options(self, options: ArchOptions) -> tuple[dict[str, Any], dict[str, Any]]:
        """(top-level values ``k``/``lam``/``aux_coef`` present in ``options``, the other options)."""
        d = options.to_dict()
        return ({n: d.pop(n) for n in TOP_LEVEL_OPTIONS if n in d}, d)

    def options_from_saved(self, top: Mapping[str, Any], others: Mapping[str, Any], d_sae: int) -> ArchOptions:
        """Inverse of :meth:`saved_options` (a top-level value that is None takes the default)."""
        names = self.Options.field_names()
        merged = {n: v for n, v in top.items() if n in names and v is not None}
        return self.options({**dict(others), **merged}, d_sae)

    # ------------------------------------------------------------------ schema and build
    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        """Saved tensor name -> (shape, required); ``fields`` is ``metadata.dictcheck.<fields_key>``."""
        raise NotImplementedError

    def step_bytes(self, d_in: int, d_sae: int, options: ArchOptions, batch_size: int, elem: int) -> int:
        """An estimate of the activation memory of one training step (forward and backward) on a batch
        of ``batch_size`` rows, ``elem`` bytes per number: :data:`STEP_COPIES` copies of the batch at
        input and at code width (pre-activations, codes, reconstruction, their gradients)."""
        return STEP_COPIES * batch_size * (d_in + d_sae) * elem

    def decoder_constraint_violation(self, model: Featurizer) -> float | None:
        """How far ``model``'s decoder is from the constraint ``decoder_norm`` declares, in float64 (0.0 when it
        holds exactly; the training loop restores it after every step), or None when the architecture declares
        no decoder constraint (``decoder_norm = "none"``). Subclasses with a constraint override this."""
        if self.decoder_norm != "none":
            raise NotImplementedError(f"arch {self.name!r} declares decoder_norm {self.decoder_norm!r} but does not "
                                      "measure it")
        return None

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        """Why P ranks with global batch B do NOT train exactly what one process with batch B trains,
        or None when they do (up to floating-point summation order; docs of empirics.training.distributed)."""
        return None

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        """A freshly initialised model, deterministic in ``seed`` (its own generator; no global RNG)."""
        raise NotImplementedError

    def build(self, d_in: int, d_sae: int, options: Mapping[str, Any] | ArchOptions | None = None, *,
              seed: int = 0, dtype: torch.dtype | None = None) -> Featurizer:
        """Validate the options and build a fresh model (``dtype`` None: float32); ``model.arch_options`` holds
        the resolved options."""
        import torch

        dtype = torch.float32 if dtype is None else dtype
        require_int("d_in", d_in, 1)
        require_int("d_sae", d_sae, 1)
        opts = self.options(options, d_sae)
        model = self.init_model(int(d_in), int(d_sae), opts, seed=int(seed), dtype=dtype)
        model.arch_options = opts
        return model

    # ------------------------------------------------------------------ folders
    def folder_options(self, cfg: SaeConfig) -> ArchOptions:
        """The options a saved folder was trained with: ``metadata.dictcheck.training`` (``k``,
        ``aux_coef``, ``options``) and ``metadata.dictcheck.lam`` (ValueError when missing or invalid)."""
        training = cfg.dictcheck.get("training")
        if not isinstance(training, dict) or not isinstance(training.get("options"), dict):
            raise ValueError(f"cfg.json lacks metadata.dictcheck.training.options, which a {self.name} model is "
                             "rebuilt from (folders written by `dictcheck train` have it)")
        top = {"k": training.get("k"), "lam": cfg.dictcheck.get("lam"), "aux_coef": training.get("aux_coef")}
        try:
            return self.options_from_saved(top, training["options"], cfg.d_sae)
        except ValueError as exc:
            raise ValueError(f"cannot rebuild {self.name}: {exc}") from None

    def from_folder(self, cfg: SaeConfig, weights: Mapping[str, torch.Tensor], *, mapped: bool = False
                    ) -> Featurizer:
        """The model a checked folder holds: built with :meth:`folder_options`, weights and non-weight
        fields (``metadata.dictcheck.<fields_key>``) loaded. ValueError for weights the model refuses.
        ``mapped``: the weights are views of the file (memory-mapped); see :meth:`model_with_weights`."""
        model = self.model_with_weights(cfg, dict(weights), mapped=mapped)
        fields = cfg.dictcheck.get(self.fields_key)
        if isinstance(fields, dict) and fields:
            model.load_arch_fields(fields)
        self.apply_cfg_fields(model, cfg)
        return model

    def model_with_weights(self, cfg: SaeConfig, weights: dict[str, torch.Tensor], *, mapped: bool) -> Featurizer:
        """A model built with :meth:`folder_options` holding ``weights`` (copied into its own parameters: a
        ``mapped`` file is read whole)."""
        model = self.build(cfg.d_in, cfg.d_sae, self.folder_options(cfg), dtype=cfg.torch_dtype)
        model.load_state_weights(weights)
        return model

    def apply_cfg_fields(self, model: Featurizer, cfg: SaeConfig) -> None:
        """Make the loaded model compute what the folder's SAELens fields say (after its weights are
        loaded). Default: only ``normalize_activations = none`` is implemented (ValueError otherwise)."""
        if cfg.normalize_activations != "none":
            raise ValueError(f"field 'normalize_activations' = {cfg.normalize_activations!r} is not implemented for "
                             f"architecture {self.name!r}")

    def lam_from_folder(self, cfg: SaeConfig) -> tuple[float | None, str]:
        """The λ of objective (1) a folder records and where it comes from, or (None, why not): none unless the
        architecture is trained on objective (1) (:attr:`trains_objective_1`)."""
        return None, f"a {self.name} SAE is not trained on objective (1)"

    def from_dictionary_learning(self, sd: Mapping[str, torch.Tensor]) -> ForeignWeights:
        """(weights under the saved names, ``metadata.dictcheck.<fields_key>`` fields, SAELens cfg fields that
        differ from the architecture's defaults) from the state dict of a :attr:`dl_class` module (KeyError
        naming a missing tensor)."""
        raise NotImplementedError(f"arch {self.name!r} reads no dictionary_learning folder")

    def from_saelens_training(self, weights: dict[str, torch.Tensor], cfg: SaeConfig) -> dict[str, torch.Tensor]:
        """The weights of a folder SAELens' ``save_model`` wrote (``architecture`` = :attr:`saelens_training_name`)
        under the saved names of :meth:`weight_schema`, computed as ``save_inference_model`` would save them;
        by default the same tensors."""
        return weights

    def prefix_widths(self, cfg: SaeConfig) -> tuple[int, ...] | None:
        """The widths of the nested prefixes a folder of this (training) architecture holds, each a dictionary
        of its own (e.g. Matryoshka SAEs), or None."""
        return None

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        """Options drawn by hypothesis for the trained-model property tests (tests/trained_properties.py):
        ``draw`` and the strategies module ``st`` come from the test, ``ctx`` the problem's sizes."""
        raise NotImplementedError(f"arch {self.name!r} has no options strategy: add draw_options")

    def __repr__(self) -> str:
        return f"<architecture {self.name!r} ({self.family})>"


@dataclass(frozen=True)
class OptionsContext:
    """What :meth:`Architecture.draw_options` may use: the input width and the width, a block size that
    divides it, a drawn number of active latents ``k`` (≤ min(d_sae, 4)), the problem's λ, and
    ``embedding()``, which writes a token-embedding file of width d_in for anchored models and returns its
    path."""

    d_in: int
    d_sae: int
    block_size: int
    k: int
    lam: float
    embedding: Any


#: The architectures registered so far (:mod:`dictcheck.empirics.architectures.registry` imports their modules on
#: demand and is what callers read).
REGISTERED: dict[str, Architecture] = {}


def register(cls: type[Architecture]) -> type[Architecture]:
    """Class decorator: register one instance of ``cls`` under ``cls.name`` (ValueError if taken)."""
    if cls.name in REGISTERED:
        raise ValueError(f"architecture {cls.name!r} is registered twice")
    if cls.reads_foreign and any(a.reads_foreign and a.saved_name == cls.saved_name for a in REGISTERED.values()):
        raise ValueError(f"architecture {cls.name!r}: foreign folders saved as {cls.saved_name!r} already read as "
                         "another architecture")
    REGISTERED[cls.name] = cls()
    return cls


def unregister(name: str) -> None:
    """Remove an architecture from the registry (tests register toy architectures temporarily)."""
    REGISTERED.pop(name, None)
