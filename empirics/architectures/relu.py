"""The ReLU SAE ``relu`` (SAELens ``standard``, dictionary_learning ``AutoEncoder``): z = ReLU(a), loss =
mse + 2λ·mean_t ‖z_t‖₁. With unit-norm decoder rows this is exactly objective (1) of docs/theory.md §1
evaluated at the encoder's (amortised) codes (docs/ecosystem.md §1, §3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from dictcheck.empirics.architectures.base import ForeignWeights, OptionsContext, register
from dictcheck.empirics.architectures.linear_sae import (
    SAE_B_DEC_INITS,
    Encoding,
    LamOptions,
    LinearSAE,
    LinearSAEArchitecture,
)
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.theory.scaling import LAMBDA_RANGE

__all__ = ["ReluSAE", "Relu", "l1_lam_from_folder"]


class ReluSAE(LinearSAE):
    """z = ReLU(a) (module docstring)."""

    arch = "relu"

    def __init__(self, d_in: int, d_sae: int, options: LamOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(d_in, d_sae, options, dtype=dtype)
        self.lam = float(options.lam)

    def encoding(self, x: Tensor) -> Encoding:
        a = self.pre_activation(x)
        return Encoding(torch.relu(a), a)

    def sparsity_loss(self, enc: Encoding, n_tokens: int) -> Tensor:
        """2λ·mean_t ‖z_t‖₁ (objective (1)'s penalty)."""
        return 2.0 * self.lam * enc.z.abs().sum() / n_tokens


def _folder_lam(value: float, where: str) -> float:
    """A λ read from a folder, within :data:`dictcheck.theory.scaling.LAMBDA_RANGE` like every other λ
    (ValueError naming ``where`` otherwise)."""
    low, high = LAMBDA_RANGE
    if not low <= value <= high:
        raise ValueError(f"the folder's λ = {value:g} ({where}) is outside the accepted range [{low:g}, {high:g}]; "
                         "give --lam")
    return value


def l1_lam_from_folder(cfg: SaeConfig) -> tuple[float | None, str]:
    """The λ of objective (1) a folder of an L1-trained SAE records, and where: ``metadata.dictcheck.lam``,
    else SAELens' ``l1_coefficient`` c (its loss mean_t[‖x − x̂‖² + c·Σ_d z_d‖w_d‖] is objective (1) with unit
    atoms and 2λ = c), else (None, why not); ValueError for a λ outside
    :data:`dictcheck.theory.scaling.LAMBDA_RANGE`."""
    lam = cfg.dictcheck.get("lam")
    if isinstance(lam, (int, float)) and not isinstance(lam, bool) and lam > 0:
        return _folder_lam(float(lam), "metadata.dictcheck.lam"), "metadata.dictcheck.lam"
    details = cfg.metadata.get("training_architecture_details")
    if isinstance(details, dict) and isinstance(details.get("l1_coefficient"), (int, float)):
        if details.get("lp_norm", 1.0) != 1.0:
            return None, f"SAELens trained it with an l{details['lp_norm']} penalty, not objective (1)'s l1"
        c = float(details["l1_coefficient"])
        if c > 0:
            return _folder_lam(c / 2, f"SAELens l1_coefficient c = {c:g}, λ = c/2"), (
                f"SAELens l1_coefficient c = {c:g}: its loss mean_t[‖x − x̂‖² + c·Σ_d z_d‖w_d‖] is "
                "objective (1) with unit atoms and 2λ = c")
    return None, "the folder records no λ (no metadata.dictcheck.lam, no SAELens l1_coefficient)"


@register
class Relu(LinearSAEArchitecture):
    """z = ReLU(a); exactly objective (1) at the encoder's codes (docs/theory.md §1)."""

    name = "relu"
    saved_name = "standard"
    reads_foreign = True
    dl_class = "AutoEncoder"
    saelens_training_name = "standard"
    saelens_training_fields = frozenset({"decoder_init_norm", "l1_coefficient", "lp_norm", "l1_warm_up_steps"})
    objective = "objective (1): mse + 2λ‖z‖₁"
    trains_objective_1 = True
    #: The Huber median is the wide-limit optimum's bias of objective (1) (docs/theory.md §4.2).
    b_dec_inits = (SAE_B_DEC_INITS[0], "huber_median", *SAE_B_DEC_INITS[1:])
    Options = LamOptions
    Model = ReluSAE

    def lam_from_folder(self, cfg: SaeConfig) -> tuple[float | None, str]:
        return l1_lam_from_folder(cfg)

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        return {"lam": ctx.lam}

    def from_dictionary_learning(self, sd: Mapping[str, Tensor]) -> ForeignWeights:
        """AutoEncoder: encoder.weight [dict, act], encoder.bias, decoder.weight [act, dict], and the decoder
        bias named ``bias``."""
        return {"W_enc": sd["encoder.weight"].T, "b_enc": sd["encoder.bias"], "W_dec": sd["decoder.weight"].T,
                "b_dec": sd["bias"]}, {}, {}
