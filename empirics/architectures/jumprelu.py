"""The JumpReLU SAE ``jumprelu`` (Rajamanoharan et al. 2024, *Jumping Ahead: Improving Reconstruction
Fidelity with JumpReLU Sparse Autoencoders*, arXiv:2407.14435; SAELens ``jumprelu``, dictionary_learning
``JumpReluAutoEncoder``; docs/ecosystem.md §1, §3).

θ_d = exp(log_threshold_d) > 0 (parameter ``log_threshold``; the saved tensor is SAELens' ``threshold`` = θ),
z = a·H(a − θ), loss = mse + λ·mean_t Σ_d H(a_td − θ_d). H has no useful gradient, so two custom autograd
functions supply the paper's straight-through pseudo-gradients with the rectangle kernel K(u) = 1[|u| < ½]
and bandwidth ε (:mod:`dictcheck.empirics.kernels.straight_through`):

- :class:`JumpReLUFn`  (z = a·H(a − θ)): ∂z/∂a = H(a − θ); ∂z/∂θ = −(θ/ε)·K((a − θ)/ε).
- :class:`StepFn`      (H(a − θ)):       ∂H/∂a = 0;       ∂H/∂θ = −(1/ε)·K((a − θ)/ε).

The forward values are exact (no smoothing). The L0 term therefore trains θ only, as in the paper. Init:
θ = ``init_threshold`` for every latent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from dictcheck.empirics.architectures.base import (
    ForeignWeights,
    OptionsContext,
    Schema,
    option,
    register,
    require_real,
)
from dictcheck.empirics.architectures.linear_sae import Encoding, LamOptions, LinearSAE, LinearSAEArchitecture
from dictcheck.empirics.kernels.straight_through import JumpReLUFn, StepFn

__all__ = ["JumpReLUOptions", "JumpReLUSAE", "JumpReLU"]


@dataclass(frozen=True)
class JumpReLUOptions(LamOptions):
    """jumprelu: the L0 coefficient ``lam`` and the straight-through estimator's settings."""

    jumprelu_bandwidth: float = option(1e-3, type=float, help="bandwidth ε of the rectangle kernel of the "
                                       "straight-through threshold gradients (jumprelu, default 1e-3)")
    init_threshold: float = option(1e-3, type=float, help="initial threshold θ of every latent (jumprelu, "
                                   "default 1e-3)")

    def resolved(self, arch: str, d_sae: int) -> JumpReLUOptions:
        return replace(LamOptions.resolved(self, arch, d_sae),
                       jumprelu_bandwidth=require_real("jumprelu_bandwidth", self.jumprelu_bandwidth, positive=True),
                       init_threshold=require_real("init_threshold", self.init_threshold, positive=True))


class JumpReLUSAE(LinearSAE):
    """z = a·H(a − θ), λ·L0 penalty (module docstring)."""

    arch = "jumprelu"

    def __init__(self, d_in: int, d_sae: int, options: JumpReLUOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(d_in, d_sae, options, dtype=dtype)
        self.lam = float(options.lam)
        self.jumprelu_bandwidth = float(options.jumprelu_bandwidth)
        self.log_threshold = torch.nn.Parameter(torch.full((d_sae,), math.log(options.init_threshold), dtype=dtype))

    @property
    def threshold(self) -> Tensor:
        """θ = exp(log_threshold) [d_sae] (differentiable)."""
        return self.log_threshold.exp()

    def encoding(self, x: Tensor) -> Encoding:
        a = self.pre_activation(x)
        return Encoding(JumpReLUFn.apply(a, self.threshold, self.jumprelu_bandwidth), a)

    def sparsity_loss(self, enc: Encoding, n_tokens: int) -> Tensor:
        """λ·mean_t Σ_d H(a_td − θ_d), with the straight-through θ-gradient."""
        return self.lam * StepFn.apply(enc.a, self.threshold, self.jumprelu_bandwidth).sum() / n_tokens

    def extra_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"threshold": (self.d_sae,)}

    def extra_state(self) -> dict[str, Tensor]:
        return {"threshold": self.log_threshold.detach().exp().clone()}

    def load_extra_state(self, weights: Mapping[str, Tensor]) -> None:
        """θ ≥ 0 (SAELens clamps it there; θ_d = 0 is a latent with z_d = ReLU(a_d), log θ_d = −∞)."""
        th = weights["threshold"].to(device=self.log_threshold.device, dtype=self.log_threshold.dtype)
        if not bool((th >= 0).all()):
            raise ValueError("tensor 'threshold' must be >= 0 (z = a·H(a − θ) is ReLU(a)·H(a − θ) only there)")
        self.log_threshold.copy_(th.log())


@register
class JumpReLU(LinearSAEArchitecture):
    """z = a·H(a − θ) with straight-through threshold gradients; λ weighs the L0 term."""

    name = "jumprelu"
    saved_name = "jumprelu"
    reads_foreign = True
    dl_class = "JumpReluAutoEncoder"
    saelens_training_name = "jumprelu"
    saelens_training_fields = frozenset({
        "decoder_init_norm", "jumprelu_init_threshold", "jumprelu_bandwidth", "jumprelu_sparsity_loss_mode",
        "l0_coefficient", "l0_warm_up_steps", "pre_act_loss_coefficient", "jumprelu_tanh_scale",
        "jumprelu_ste_to_input", "target_l0",
    })
    objective = "mse + λ·L0 (straight-through threshold gradients)"
    Options = JumpReLUOptions
    Model = JumpReLUSAE

    def extra_schema(self, d_in: int, d_sae: int) -> Schema:
        return {"threshold": ((d_sae,), True)}

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        return {"lam": ctx.lam, "init_threshold": draw(st.sampled_from([1e-3, 0.1]))}

    def from_dictionary_learning(self, sd: Mapping[str, Tensor]) -> ForeignWeights:
        """JumpReluAutoEncoder: its tensors already carry the SAELens names; its encoder sees x itself
        (``apply_b_dec_to_input = False``). It reports codes times ‖w_d‖ and divides them back before decoding:
        the same x̂ and L0, and its codes are the unit-atom codes."""
        weights = {n: sd[n] for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
        return weights, {}, {"apply_b_dec_to_input": False}
