"""The absolute-value SAE ``abs`` (signed codes; dictcheck only).

**dictcheck Decision** (docs/theory.md §4.5, "signed codes with the |z| penalty"; §7 "absolute-value
activations give signed codes"): with u = (x − b_dec·[apply]) @ W_enc (b_enc NOT added),
z = sign(u)·ReLU(|u| + b_enc), the symmetric soft threshold with learnable per-latent threshold −b_enc, the
signed analogue of ``relu`` (the bias acts as a threshold on both sides). loss = mse + 2λ·mean_t ‖z_t‖₁
(objective (1) with Z signed and ‖·‖₁ = Σ|z|). With b_dec = 0 the encoder is odd: encode(−x) = −encode(x).
b_enc is initialised to 0 (z = u at init).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dictcheck.empirics.architectures.base import OptionsContext, register
from dictcheck.empirics.architectures.linear_sae import Encoding, LamOptions, LinearSAEArchitecture
from dictcheck.empirics.architectures.relu import ReluSAE, l1_lam_from_folder
from dictcheck.empirics.io.saelens import SaeConfig

__all__ = ["AbsSAE", "Abs"]


class AbsSAE(ReluSAE):
    """z = sign(u)·ReLU(|u| + b_enc) (module docstring); the sparsity term is relu's 2λ·mean_t ‖z_t‖₁."""

    arch = "abs"

    def encoding(self, x: Tensor) -> Encoding:
        u = self._encoder_input(x) @ self.W_enc
        return Encoding(torch.sign(u) * torch.relu(u.abs() + self.b_enc), u + self.b_enc)


@register
class Abs(LinearSAEArchitecture):
    """Signed codes with the |z| penalty (Decision: the symmetric soft threshold; dictcheck-only)."""

    name = "abs"
    saved_name = "dictcheck/abs"
    objective = "objective (1) with signed codes: mse + 2λ‖z‖₁"
    trains_objective_1 = True
    signed_codes = True
    Options = LamOptions
    Model = AbsSAE

    def lam_from_folder(self, cfg: SaeConfig) -> tuple[float | None, str]:
        return l1_lam_from_folder(cfg)

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        return {"lam": ctx.lam}
