"""Linear SAEs: ``relu``, ``topk``, ``batchtopk``, ``jumprelu``, ``abs`` (models in
:mod:`dictcheck.empirics.architectures.linear_sae`; docs/ecosystem.md §1, §3; docs/theory.md §1, §4.5)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from dictcheck.empirics.architectures.activation_normalisation import ActivationNormalisation
from dictcheck.empirics.architectures.base import (
    ArchOptions,
    Architecture,
    Schema,
    option,
    register,
    require_int,
    require_real,
)
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.empirics.architectures.linear_sae import make_sae

__all__ = ["sae_default_lr", "LinearSAEOptions", "LinearSAE", "Relu", "TopK", "BatchTopK", "JumpReLU", "Abs"]

#: Centring rules (docs/ecosystem.md §3 init): geometric median of the first batch by default; "keep" leaves
#: the model's b_dec (a warm start).
SAE_B_DEC_INITS = ("geometric_median", "huber_median", "mean", "zero", "keep")


def sae_default_lr(d_sae: int) -> float:
    """dictionary_learning's TopK rule lr = 2e-4/√(d_sae/2^14) (docs/ecosystem.md §3)."""
    return 2e-4 / math.sqrt(d_sae / 2**14)


def linear_schema(d_in: int, d_sae: int) -> Schema:
    """W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in] (SAELens names)."""
    return {"W_enc": ((d_in, d_sae), True), "b_enc": ((d_sae,), True), "W_dec": ((d_sae, d_in), True),
            "b_dec": ((d_in,), True)}


@dataclass(frozen=True)
class LinearSAEOptions(ArchOptions):
    """Options every linear SAE takes: ``freeze_b_dec`` keeps b_dec at its ``b_dec_init`` value through training
    (with ``b_dec_init = "zero"``: b = 0, the fixed-bias setting of toys such as docs/theory.md §5.2, where a
    learned b_dec would take over an always-on feature). Python API only; saved with the other options."""

    freeze_b_dec: bool = option(False, help="keep b_dec at its b_dec_init value during training")


@dataclass(frozen=True)
class LamOptions(LinearSAEOptions):
    """relu and abs: λ of objective (1) (penalty 2λ‖z‖₁, mean over tokens)."""

    lam: float | None = option(None, type=float, help="λ of objective (1): penalty 2λ‖z‖₁, mean over tokens "
                               "(relu, abs); the L0 coefficient (jumprelu)")

    def resolved(self, arch: str, d_sae: int) -> LamOptions:
        if self.lam is None:
            raise ValueError(f"arch {arch!r} needs lam (its sparsity coefficient)")
        return replace(self, lam=require_real("lam", self.lam))


@dataclass(frozen=True)
class JumpReLUOptions(LamOptions):
    """jumprelu: the L0 coefficient ``lam`` and the straight-through estimator's settings."""

    jumprelu_bandwidth: float = option(1e-3, type=float, help="bandwidth ε of the rectangle kernel of the "
                                       "straight-through threshold gradients (jumprelu, default 1e-3)")
    init_threshold: float = option(1e-3, type=float, help="initial threshold θ of every latent (jumprelu, "
                                   "default 1e-3)")

    def resolved(self, arch: str, d_sae: int) -> JumpReLUOptions:
        base = LamOptions.resolved(self, arch, d_sae)
        return replace(self, lam=base.lam,
                       jumprelu_bandwidth=require_real("jumprelu_bandwidth", self.jumprelu_bandwidth, positive=True),
                       init_threshold=require_real("init_threshold", self.init_threshold, positive=True))


@dataclass(frozen=True)
class TopKOptions(LinearSAEOptions):
    """topk: k active latents per token and the AuxK coefficient."""

    k: int | None = option(None, type=int, help="active latents per token (topk, batchtopk, vasae); active "
                           "blocks per token (bsf-vanilla, bsf-grassmann)")
    aux_coef: float = option(0.0, type=float, help="AuxK coefficient (topk, batchtopk; 0: off)")

    def resolved(self, arch: str, d_sae: int) -> TopKOptions:
        if self.k is None:
            raise ValueError(f"arch {arch!r} needs k, an int in [1, d_sae={d_sae}], got None")
        try:
            k = require_int("k", self.k, 1, d_sae)
        except ValueError:
            raise ValueError(f"arch {arch!r} needs k, an int in [1, d_sae={d_sae}], got {self.k!r}") from None
        return replace(self, k=k, aux_coef=require_real("aux_coef", self.aux_coef))


@dataclass(frozen=True)
class BatchTopKOptions(TopKOptions):
    """batchtopk: also the momentum of its inference threshold (docs of sae_models)."""

    batchtopk_momentum: float = option(0.01, type=float, help="momentum of batchtopk's running inference "
                                       "threshold (default 0.01)")

    def resolved(self, arch: str, d_sae: int) -> BatchTopKOptions:
        base = TopKOptions.resolved(self, arch, d_sae)
        m = require_real("batchtopk_momentum", self.batchtopk_momentum, positive=True)
        if m > 1:
            raise ValueError(f"batchtopk_momentum must be in (0, 1], got {m!r}")
        return replace(self, k=base.k, aux_coef=base.aux_coef, batchtopk_momentum=m)


class LinearSAE(Architecture):
    """The linear SAEs: unit-norm decoder rows, SAELens weight names, the dictionary_learning lr."""

    family = "sae"
    family_title = "linear SAEs (relu, topk, batchtopk, jumprelu, abs)"
    decoder_norm = "unit"
    b_dec_inits = SAE_B_DEC_INITS
    encoder_weights = ("W_enc", "b_enc")

    @property
    def fields_key(self) -> str:  # type: ignore[override]
        return self.name

    def default_lr(self, d_sae: int) -> float:
        return sae_default_lr(d_sae)

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return linear_schema(d_in, d_sae)

    def decoder_constraint_violation(self, model: Featurizer) -> float:
        """max_d |‖w_d‖ − 1| over the decoder rows (atoms) W_dec[d], in float64 (docs/ecosystem.md §3 unit norm)."""
        with torch.no_grad():
            norms = model.W_dec.detach().to(torch.float64).norm(dim=1)
        return float((norms - 1.0).abs().max())

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        """The model of :func:`make_sae`; b_dec stops taking gradients when ``freeze_b_dec`` (Adam then leaves it
        where the training loop's centring rule put it)."""
        kwargs = options.to_dict()
        freeze = kwargs.pop("freeze_b_dec")
        if not isinstance(freeze, bool):
            raise ValueError(f"freeze_b_dec must be true or false, got {freeze!r}")
        model = make_sae(self.name, d_in, d_sae, seed=seed, dtype=dtype, **kwargs)
        model.b_dec.requires_grad_(not freeze)
        return model

    def folder_options(self, cfg: SaeConfig) -> ArchOptions:
        """A linear SAE needs only the SAELens fields (``k``); λ only enters the training loss, so a folder
        without ``metadata.dictcheck.lam`` still gives a working encoder (λ = 1 stands in). Options of
        ``metadata.dictcheck.training`` are used when present."""
        training = cfg.dictcheck.get("training")
        training = training if isinstance(training, dict) else {}
        lam = cfg.dictcheck.get("lam")
        top = {"k": cfg.k, "lam": 1.0 if lam is None else lam, "aux_coef": training.get("aux_coef")}
        others = training.get("options") if isinstance(training.get("options"), dict) else {}
        try:
            return self.options_from_saved(top, others, cfg.d_sae)
        except ValueError as exc:
            raise ValueError(f"cannot rebuild {self.name}: {exc}") from None

    def apply_cfg_fields(self, model: Featurizer, cfg: SaeConfig) -> None:
        """SAELens semantics of a folder: ``apply_b_dec_to_input`` (x − b_dec enters the encoder, or x) and
        ``normalize_activations`` (:class:`dictcheck.empirics.architectures.activation_normalisation.ActivationNormalisation`).
        ``reshape_activations = hook_z`` only flattens heads (the data are given flattened, (N, d_in)) and
        ``hook_head_index`` only says which activations the SAE reads: neither changes the math."""
        model.apply_b_dec_to_input = bool(cfg.apply_b_dec_to_input)
        model.input_normalisation = ActivationNormalisation(cfg.normalize_activations)


@register
class Relu(LinearSAE):
    """z = ReLU(a); exactly objective (1) at the encoder's codes (docs/theory.md §1)."""

    name = "relu"
    saved_name = "standard"
    reads_foreign = True
    Options = LamOptions
    trains_objective_1 = True


@register
class TopK(LinearSAE):
    """The k largest pre-activations per token, ReLU'd; optional AuxK (docs/ecosystem.md §3)."""

    name = "topk"
    saved_name = "topk"
    reads_foreign = True
    k_in_cfg = True
    cfg_fields = frozenset({"rescale_acts_by_decoder_norm"})
    Options = TopKOptions

    def apply_cfg_fields(self, model: Featurizer, cfg: SaeConfig) -> None:
        """Also SAELens' ``rescale_acts_by_decoder_norm``: TopK selects on a_d·‖w_d‖ and decodes with
        z_d·(1/‖w_d‖), computed as SAELens computes it (so bfloat16 folders round the same way)."""
        super().apply_cfg_fields(model, cfg)
        rescale = cfg.extra_fields.get("rescale_acts_by_decoder_norm", False)
        if not isinstance(rescale, bool):
            raise ValueError(f"field 'rescale_acts_by_decoder_norm' must be true or false, got {rescale!r}")
        model.rescale_acts_by_decoder_norm = rescale

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        if getattr(options, "aux_coef", 0.0) > 0:
            return "AuxK is normalised by each rank's own residual variance and the ranks' AuxK losses are averaged"
        return None


@register
class BatchTopK(TopK):
    """The k·B largest activations of the batch in training, a running threshold at inference."""

    name = "batchtopk"
    #: SAELens saves a BatchTopK SAE for inference as a JumpReLU with its θ as threshold (docs/ecosystem.md §1).
    saved_name = "jumprelu"
    reads_foreign = False
    cfg_fields = frozenset()
    Options = BatchTopKOptions

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return {**linear_schema(d_in, d_sae), "threshold": ((d_sae,), True)}

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        return ("batchtopk keeps the top k·B/P activations of each rank's B/P tokens (not the top k·B of the "
                "global batch), and its inference threshold follows rank 0's batches")


@register
class JumpReLU(LinearSAE):
    """z = a·H(a − θ) with straight-through threshold gradients; λ weighs the L0 term."""

    name = "jumprelu"
    saved_name = "jumprelu"
    reads_foreign = True
    Options = JumpReLUOptions

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return {**linear_schema(d_in, d_sae), "threshold": ((d_sae,), True)}


@register
class Abs(LinearSAE):
    """Signed codes with the |z| penalty (Decision: the symmetric soft threshold; dictcheck-only)."""

    name = "abs"
    saved_name = "dictcheck/abs"
    Options = LamOptions
    trains_objective_1 = True
