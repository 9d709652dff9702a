"""Block-sparse featurizers: ``bsf-vanilla``, ``bsf-grassmann``, ``bsf-grouplasso`` (docs/bsf.md §2–§4).

Layout: tokens are ROWS, ``x`` is (B, D). The code of a token is n_b blocks of size q, stored flat as
(B, n_b·q) with block g = entries g·q … g·q+q−1; codes are **signed** (no ReLU anywhere). The decoder
block W_g ∈ R^{D×q} is rows g·q … g·q+q−1 of W_dec [n_b·q, D] transposed (spec §0), and
x̂ = Σ_g W_g z_g + b_dec.

Centring (spec §3 "data are centred beforehand"): ``b_dec`` is a fixed buffer, not trained. The model
encodes x̃ = x − b_dec and adds b_dec back to the reconstruction, which is the same as training on
data centred by b_dec. ``b_dec_init=None`` means b_dec = 0.

The three variants (spec §3):

* ``bsf-vanilla``: a = W_encᵀx̃ + b_enc, z = Π_k(a) (the k blocks of largest ‖a_g‖; ties to the
  lowest index), loss = MSE. With q = 1 this is an absolute-value TopK SAE with signed codes.
* ``bsf-grassmann``: parameter B (n_b, D, q); on every forward W_g = Q of the reduced QR of B_g with
  signs fixed so that diag(R) > 0 (a differentiable parametrisation, W_gᵀW_g = I_q). Tied encoder
  z_g = γW_gᵀx̃ with one global γ = exp(log_gamma), z = Π_k(z), x̂ = γΣ_{top-k} W_gW_gᵀx̃ + b_dec.
  Loss = MSE.
* ``bsf-grouplasso``: encoder as Vanilla. ``gate="shrink"`` (the paper's version, default):
  z = sh_θ(a) with one global θ = exp(log_theta) (θ₀ = 1), loss = MSE + c_gl·mean_i Σ_g‖z_ig‖
  (``penalty="code"``, the paper's) or MSE + c_gl·mean_i Σ_g‖W_g z_ig‖ (``penalty="contribution"``, a
  dictcheck option: docs/bsf.md §3.3 Decision).
  ``gate="ste"`` (post-paper option, spec §2 "Block gate with STE"): z_g = a_g·H(‖a_g‖ − θ_g),
  θ_g = softplus(10·theta_raw_g), loss = MSE + c_gl·mean_i #{active blocks}, no shrinkage; the step
  H passes no gradient to ‖a_g‖ and a rectangle kernel of width w gives ∂H/∂θ_g = −(1/w)·1[|‖a_g‖ −
  θ_g| ≤ w/2]. Cold start on the first training batch: θ_g = the (1 − k_target/n_b) quantile of the
  batch's block norms, w = 0.5·std(block norms) + 1e-6, then frozen.

Shared (spec §3, §4): MSE = mean over all B·D entries of (x − x̂)², against the CLEAN x. Denoising
(training mode only): the encoder sees x̃ + snr·std(x̃_batch)·ε, ε ~ N(0, I) from torch's global RNG
(which the training loop seeds), std one scalar over the centred batch. Vanilla and Group-Lasso init:
Gaussian W_dec (from a generator seeded by ``seed``), each block scaled to unit Frobenius norm;
W_enc = W_decᵀ (an independent parameter afterwards); b_enc = 0. :meth:`project_parameters_` rescales
every block back to ‖W_g‖_F = 1 after each step. No gradient projection is needed for any variant
(:meth:`project_gradients_` is the base no-op): the unit-Frobenius constraint is restored by the
post-step projection and the Grassmann frames are orthonormal by construction. There is no AuxK for
BSFs (aux_loss = 0).

Outputs: ``codes`` (B, n_b·q); ``l0`` = mean number of non-zero code scalars; ``extra["block_l0"]`` =
mean number of blocks with ‖z_g‖ > 1e-6 (spec §4). Saved tensors follow
the architecture's weight schema (:meth:`BlockSparse.weight_schema`); :meth:`BlockSparseFeaturizer.arch_fields`
gives n_b, q, k and the options (stored under ``metadata.dictcheck.bsf``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from dictcheck.empirics.architectures.base import (
    ArchOptions,
    Architecture,
    OptionsContext,
    Schema,
    option,
    register,
    require_int,
    require_real,
)
from dictcheck.empirics.architectures.featurizer import Featurizer, FeaturizerOutput
from dictcheck.empirics.kernels.straight_through import StepFn

__all__ = [
    "BLOCK_L0_TOL",
    "BlockSparseFeaturizer",
    "VanillaBSF",
    "GrassmannBSF",
    "GroupLassoBSF",
    "block_topk",
    "block_soft_threshold",
    "GATES",
    "PENALTIES",
    "BsfOptions",
    "BsfTopKOptions",
    "GroupLassoOptions",
    "BlockSparse",
    "Vanilla",
    "Grassmann",
    "GroupLasso",
]

#: A block counts as active when ‖z_g‖ > 1e-6 (spec §3.3, §4).
BLOCK_L0_TOL = 1e-6
#: ‖a_g‖ is clamped below at 1e-8 inside sh_θ (spec §2).
NORM_CLAMP = 1e-8
STE_THETA_SCALE = 10.0  # θ_g = softplus(10·r_g), spec §2
STE_WIDTH_FACTOR, STE_WIDTH_FLOOR = 0.5, 1e-6  # w = 0.5·std(block norms) + 1e-6, spec §2


GATES = ("shrink", "ste")
#: Where the sh_θ gate's ℓ₂,₁ penalty sits: on the codes ‖z_g‖ (the paper's) or on the contributions
#: ‖W_g z_g‖ (a dictcheck option, docs/bsf.md §3.3 Decision "contribution penalty").
PENALTIES = ("code", "contribution")
DEFAULT_DENOISE = 0.1  # docs/bsf.md §4: snr 0.1
DEFAULT_C_GL = 1e-2  # docs/bsf.md §3.3
DEFAULT_K_TARGET = 16  # docs/bsf.md §3.3 (STE gate)


@dataclass(frozen=True)
class BsfOptions(ArchOptions):
    """Every BSF: the block size q (d_sae = n_b·q) and the denoising level."""

    block_size: int | None = option(None, type=int, help="block size q (d_sae = n_b·q)")
    denoise: float = option(DEFAULT_DENOISE, type=float, help="input-noise level snr of the denoising objective "
                            "(default 0.1; training only)")

    def resolved(self, arch: str, d_sae: int) -> BsfOptions:
        if self.block_size is None:
            raise ValueError(f"arch {arch!r} requires the option block_size (q)")
        q = require_int("block_size", self.block_size, 1)
        if d_sae % q:
            raise ValueError(f"block_size = {q} must divide d_sae = {d_sae}")
        return replace(self, block_size=q, denoise=require_real("denoise", self.denoise))


@dataclass(frozen=True)
class BsfTopKOptions(BsfOptions):
    """Vanilla and Grassmannian BSF: also k, the number of active blocks per token (Π_k)."""

    k: int | None = option(None, type=int, help="active latents per token (topk, batchtopk, vasae); active "
                           "blocks per token (bsf-vanilla, bsf-grassmann)")

    def resolved(self, arch: str, d_sae: int) -> BsfTopKOptions:
        base = BsfOptions.resolved(self, arch, d_sae)
        n_b = d_sae // base.block_size
        if self.k is None:
            raise ValueError(f"arch {arch!r} requires k (number of active blocks per token)")
        try:
            k = require_int("k", self.k, 1, n_b)
        except ValueError:
            raise ValueError(f"arch {arch!r}: k must be an int in [1, n_b={n_b}], got {self.k!r}") from None
        return replace(base, k=k)


@dataclass(frozen=True)
class GroupLassoOptions(BsfOptions):
    """Group-Lasso BSF: the ℓ₂,₁ coefficient and the gate (the paper's shrink, or the STE gate)."""

    c_gl: float = option(DEFAULT_C_GL, type=float, help="group-lasso coefficient c (bsf-grouplasso, default 1e-2)")
    gate: str = option("shrink", type=str, choices=GATES, help="bsf-grouplasso gate (default shrink, the paper's)")
    k_target: int | None = option(None, type=int, help="target active blocks of the STE gate's cold start "
                                  "(bsf-grouplasso --gate ste, default 16)")
    penalty: str = option("code", type=str, choices=PENALTIES, help="bsf-grouplasso shrink gate: ℓ₂,₁ on the codes "
                          "‖z_g‖ (default, the paper's) or on the contributions ‖W_g z_g‖ (docs/bsf.md §3.3)")

    def resolved(self, arch: str, d_sae: int) -> GroupLassoOptions:
        base = BsfOptions.resolved(self, arch, d_sae)
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        out = replace(self, block_size=base.block_size, denoise=base.denoise, c_gl=require_real("c_gl", self.c_gl))
        if self.gate == "shrink":
            if self.k_target is not None:
                raise ValueError("option k_target applies only to gate='ste'")
            return out
        if self.penalty != "code":
            raise ValueError("option penalty='contribution' applies only to gate='shrink'")
        n_b = d_sae // base.block_size
        k_target = require_int("k_target", DEFAULT_K_TARGET if self.k_target is None else self.k_target, 1)
        if k_target > n_b:
            raise ValueError(f"k_target = {k_target} exceeds n_b = {n_b}; pass a smaller k_target")
        return replace(out, k_target=k_target)


def block_topk(a: Tensor, k: int) -> Tensor:
    """Π_k over the blocks of a (..., n_b, q): keep the k blocks of largest norm, zero the rest
    (spec §2). Ties go to the lowest block index (a stable descending sort). Gradients flow
    through the kept blocks only."""
    order = torch.sort(a.detach().norm(dim=-1), dim=-1, descending=True, stable=True).indices
    keep = torch.zeros(a.shape[:-1], dtype=a.dtype, device=a.device).scatter(-1, order[..., :k], 1.0)
    return a * keep.unsqueeze(-1)


def block_soft_threshold(a: Tensor, theta: Tensor) -> Tensor:
    """sh_θ(a)_g = max(0, 1 − θ/max(‖a_g‖, 1e-8))·a_g over the blocks of a (..., n_b, q) (spec §2)."""
    norms = a.norm(dim=-1, keepdim=True).clamp_min(NORM_CLAMP)
    return torch.clamp(1.0 - theta / norms, min=0.0) * a


class BlockSparseFeaturizer(Featurizer):
    """A block-sparse featurizer (see the module docstring); one subclass per variant overrides
    :meth:`_blocks` (the block codes), :meth:`decoder_blocks`, :meth:`weight_shapes` and :meth:`initialise_`,
    and where it has one :meth:`sparsity_loss`. Build one with its architecture (``architecture(name).build``)."""

    arch: ClassVar[str]

    def __init__(self, d_in: int, d_sae: int, options: BsfOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.d_in, self.d_sae = int(d_in), int(d_sae)
        self.q = int(options.block_size)
        self.n_b = self.d_sae // self.q
        self.k = getattr(options, "k", None)
        self.denoise = float(options.denoise)
        self.register_buffer("b_dec", torch.zeros(self.d_in, dtype=dtype))

    def initialise_(self, gen: torch.Generator) -> None:
        """The variant's init (module docstring) from the seeded generator ``gen``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ dictionary
    def decoder_blocks(self) -> Tensor:
        """The decoder blocks W_g as (n_b, D, q)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ encoder / decoder
    def _check_x(self, x: Tensor) -> None:
        if x.dim() != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"expected x of shape (B, d_in={self.d_in}) with tokens as rows, got {list(x.shape)}")

    def _blocks(self, xc: Tensor, W: Tensor) -> tuple[Tensor, Tensor | None]:
        """(block codes (B, n_b, q), STE gate values (B, n_b) or None) of centred inputs xc."""
        raise NotImplementedError

    def encode(self, x: Tensor) -> Tensor:
        """Codes z (B, n_b·q) of clean x (never noised; denoising lives in :meth:`forward`)."""
        self._check_x(x)
        return self._blocks(x - self.b_dec, self.decoder_blocks())[0].reshape(x.shape[0], self.d_sae)

    def decode(self, z: Tensor) -> Tensor:
        """x̂ = Σ_g W_g z_g + b_dec for flat codes z (B, n_b·q)."""
        if z.dim() != 2 or z.shape[1] != self.d_sae:
            raise ValueError(f"expected codes of shape (B, d_sae={self.d_sae}), got {list(z.shape)}")
        W = self.decoder_blocks()
        return torch.einsum("bgq,gdq->bd", z.view(-1, self.n_b, self.q), W) + self.b_dec

    def block_contributions(self, x: Tensor) -> Tensor:
        """c_ig = W_g z_ig (B, n_b, D) of clean x (spec §0, §6); Σ_g c_ig + b_dec = x̂_i. Memory B·n_b·D."""
        self._check_x(x)
        W = self.decoder_blocks()
        z = self._blocks(x - self.b_dec, W)[0]
        return torch.einsum("bgq,gdq->bgd", z, W)

    # ------------------------------------------------------------------ forward
    def sparsity_loss(self, z: Tensor, h: Tensor | None, W: Tensor) -> Tensor:
        """The variant's sparsity term (a mean over tokens); 0 for the Π_k variants."""
        return z.new_zeros(())

    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> FeaturizerOutput:
        """Encode (noised in training mode), decode, and the loss of the variant (module docstring)."""
        self._check_x(x)
        xc = x - self.b_dec
        if self.training and self.denoise > 0:
            xc = xc + self.denoise * xc.std() * torch.randn_like(xc)
        W = self.decoder_blocks()
        z, h = self._blocks(xc, W)
        x_hat = torch.einsum("bgq,gdq->bd", z, W) + self.b_dec
        mse = (x - x_hat).pow(2).mean()
        sparsity = self.sparsity_loss(z, h, W)
        codes = z.reshape(x.shape[0], self.d_sae)
        block_l0 = (z.detach().norm(dim=-1) > BLOCK_L0_TOL).sum(-1).to(x.dtype).mean()
        return FeaturizerOutput(x_hat=x_hat, codes=codes, loss=mse + sparsity, mse=mse, sparsity_loss=sparsity,
                                aux_loss=mse.new_zeros(()), l0=(codes != 0).sum(-1).to(x.dtype).mean(),
                                extra={"block_l0": block_l0})

    # ------------------------------------------------------------------ training hooks
    def firing_metrics(self, fire_counts: Tensor, n_tokens: int) -> dict[str, Any]:
        """``dead_blocks``: blocks none of whose q latents fired on the ``n_tokens`` tokens (spec §4)."""
        counts = torch.as_tensor(fire_counts).reshape(-1)
        if counts.numel() != self.d_sae:
            raise ValueError(f"fire_counts has {counts.numel()} entries, expected d_sae = {self.d_sae}")
        return {"dead_blocks": int((counts.view(self.n_b, self.q).sum(1) == 0).sum())}

    # ------------------------------------------------------------------ save / load
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Saved tensor names → shapes (as the architecture's weight schema lists them; b_dec optional on load)."""
        raise NotImplementedError

    def state_weights(self) -> dict[str, Tensor]:
        """Detached copies under the save names (Grassmann's B is saved raw, not orthonormalised)."""
        return {name: getattr(self, name).detach().clone() for name in self.weight_shapes()}

    @torch.no_grad()
    def load_state_weights(self, weights: Mapping[str, Tensor]) -> None:
        """Inverse of :meth:`state_weights`; a missing b_dec means 0. ValueError on a bad name or shape."""
        shapes = self.weight_shapes()
        missing = sorted(set(shapes) - set(weights) - {"b_dec"})
        extra = sorted(set(weights) - set(shapes))
        if missing or extra:
            raise ValueError(f"arch {self.arch!r}: missing tensors {missing}, unexpected tensors {extra}")
        for name, shape in shapes.items():
            t = torch.as_tensor(weights[name]) if name in weights else torch.zeros(shape)
            if tuple(t.shape) != shape:
                raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"tensor {name!r} has non-finite values")
            dest = getattr(self, name)
            dest.copy_(t.to(device=dest.device, dtype=dest.dtype))

    def arch_fields(self) -> dict[str, Any]:
        """n_b, q, k and the resolved options, for ``metadata.dictcheck.bsf``."""
        return {"n_b": self.n_b, "q": self.q, "k": self.k, **self.options()}

    def options(self) -> dict[str, Any]:
        """The architecture options this model was built with (as :class:`BsfOptions` resolves them)."""
        return {"block_size": self.q, "denoise": self.denoise}

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, d_in={self.d_in}, n_b={self.n_b}, q={self.q}, k={self.k}, options={self.options()}"


class _LinearBlocks(BlockSparseFeaturizer):
    """Vanilla and Group-Lasso: a = W_encᵀx̃ + b_enc and a linear decoder W_dec of unit-Frobenius blocks."""

    def __init__(self, d_in: int, d_sae: int, options: BsfOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(d_in, d_sae, options, dtype=dtype)
        D, Z = self.d_in, self.d_sae
        self.W_enc = torch.nn.Parameter(torch.zeros(D, Z, dtype=dtype))
        self.b_enc = torch.nn.Parameter(torch.zeros(Z, dtype=dtype))
        self.W_dec = torch.nn.Parameter(torch.zeros(Z, D, dtype=dtype))

    @torch.no_grad()
    def initialise_(self, gen: torch.Generator) -> None:
        """Gaussian W_dec, unit-Frobenius blocks, W_enc = W_decᵀ, b_enc = 0."""
        self.W_dec.copy_(torch.randn(self.d_sae, self.d_in, generator=gen, dtype=torch.float64).to(self.W_dec.dtype))
        self.project_parameters_()
        self.W_enc.copy_(self.W_dec.T)

    def decoder_blocks(self) -> Tensor:
        return self.W_dec.view(self.n_b, self.q, self.d_in).transpose(1, 2)

    def _preacts(self, xc: Tensor) -> Tensor:
        return (xc @ self.W_enc + self.b_enc).view(-1, self.n_b, self.q)

    @torch.no_grad()
    def project_parameters_(self) -> None:
        """Rescale every decoder block to ‖W_g‖_F = 1 (spec §3.1)."""
        blocks = self.W_dec.view(self.n_b, self.q * self.d_in)
        norms = blocks.norm(dim=1, keepdim=True)
        blocks.div_(torch.where(norms > 0, norms, torch.ones_like(norms)))

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        D, Z = self.d_in, self.d_sae
        return {"W_enc": (D, Z), "b_enc": (Z,), "W_dec": (Z, D), "b_dec": (D,)}


class VanillaBSF(_LinearBlocks):
    """``bsf-vanilla``: z = Π_k(a), loss = MSE."""

    arch = "bsf-vanilla"

    def _blocks(self, xc: Tensor, W: Tensor) -> tuple[Tensor, Tensor | None]:
        return block_topk(self._preacts(xc), self.k), None


class GroupLassoBSF(_LinearBlocks):
    """``bsf-grouplasso``: the sh_θ gate with the ℓ₂,₁ penalty, or the STE gate with a block-count penalty."""

    arch = "bsf-grouplasso"

    def __init__(self, d_in: int, d_sae: int, options: GroupLassoOptions, *,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(d_in, d_sae, options, dtype=dtype)
        self.c_gl, self.gate, self.k_target, self.penalty = options.c_gl, options.gate, options.k_target, options.penalty
        if self.gate == "shrink":
            self.log_theta = torch.nn.Parameter(torch.zeros((), dtype=dtype))  # θ₀ = 1
        else:
            self.theta_raw = torch.nn.Parameter(torch.zeros(self.n_b, dtype=dtype))
            # The rectangle width w; NaN until the cold start on the first training batch (a buffer,
            # so training checkpoints carry it).
            self.register_buffer("gate_width", torch.tensor(math.nan, dtype=torch.float64))

    @property
    def theta(self) -> Tensor:
        """Group-Lasso threshold: global θ = exp(log_theta) (shrink) or θ_g = softplus(10·theta_raw_g) (ste)."""
        if self.gate == "shrink":
            return self.log_theta.exp()
        return torch.nn.functional.softplus(STE_THETA_SCALE * self.theta_raw)

    def _blocks(self, xc: Tensor, W: Tensor) -> tuple[Tensor, Tensor | None]:
        a = self._preacts(xc)
        if self.gate == "shrink":
            return block_soft_threshold(a, self.theta), None
        norms = a.detach().norm(dim=-1)
        if self.training and not self.gate_ready:
            self._cold_start(norms)
        h = StepFn.apply(norms, self.theta, float(self.gate_width) if self.gate_ready else 1.0, True)
        return a * h.unsqueeze(-1), h

    @torch.no_grad()
    def _cold_start(self, norms: Tensor) -> None:
        """θ_g ← the (1 − k_target/n_b) quantile of the batch's block norms; w ← 0.5·std + 1e-6 (spec §2)."""
        flat = norms.reshape(-1).to(torch.float64)
        theta0 = float(torch.quantile(flat, 1.0 - self.k_target / self.n_b).clamp_min(NORM_CLAMP))
        # softplus(10 r) = θ  ⇔  r = log(expm1(θ))/10
        self.theta_raw.fill_(math.log(math.expm1(theta0)) / STE_THETA_SCALE)
        self.gate_width.fill_(STE_WIDTH_FACTOR * float(flat.std()) + STE_WIDTH_FLOOR)

    @property
    def gate_ready(self) -> bool:
        """Whether the STE gate's cold start has set θ and w (before it, eval uses w = 1, θ_g = softplus(0))."""
        return bool(torch.isfinite(self.gate_width))

    def sparsity_loss(self, z: Tensor, h: Tensor | None, W: Tensor) -> Tensor:
        """c_gl·mean_i Σ_g ‖z_ig‖ (or ‖W_g z_ig‖; shrink) or c_gl·mean_i #{active blocks} (ste)."""
        if h is None:
            return self.c_gl * self._penalised_norms(z, W).sum(-1).mean()
        return self.c_gl * h.sum(-1).mean()

    def _penalised_norms(self, z: Tensor, W: Tensor) -> Tensor:
        """(B, n_b) norms the shrink gate's ℓ₂,₁ penalty sums: ‖z_g‖ (penalty "code") or the contribution
        ‖W_g z_g‖ = √(z_gᵀ W_gᵀW_g z_g) (penalty "contribution"; exactly 0 for an inactive block, z_g = 0,
        whose gradient is then 0 instead of 0/0: the square is clamped below at NORM_CLAMP² inside the root)."""
        if self.penalty != "contribution":
            return z.norm(dim=-1)
        sq = torch.einsum("bgq,gqr,bgr->bg", z, torch.einsum("gdq,gdr->gqr", W, W), z)
        return torch.where(sq > 0, sq.clamp_min(NORM_CLAMP**2).sqrt(), torch.zeros_like(sq))

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        gate = {"log_theta": ()} if self.gate == "shrink" else {"theta_raw": (self.n_b,)}
        return {**super().weight_shapes(), **gate}

    def arch_fields(self) -> dict[str, Any]:
        """Also the STE gate width once set."""
        fields = super().arch_fields()
        if self.gate == "ste":
            fields["gate_width"] = float(self.gate_width) if self.gate_ready else None
        return fields

    def load_arch_fields(self, fields: dict[str, Any]) -> None:
        """Restore the STE gate width (the only non-weight state); other keys are ignored."""
        if self.gate == "ste" and fields.get("gate_width") is not None:
            self.gate_width.fill_(float(fields["gate_width"]))

    def options(self) -> dict[str, Any]:
        opts = {**super().options(), "c_gl": self.c_gl, "gate": self.gate, "penalty": self.penalty}
        if self.gate == "ste":
            opts["k_target"] = self.k_target
        return opts


class GrassmannBSF(BlockSparseFeaturizer):
    """``bsf-grassmann``: orthonormal frames W_g = Q of a sign-fixed QR of B_g, tied encoder z_g = γW_gᵀx̃, Π_k."""

    arch = "bsf-grassmann"

    def __init__(self, d_in: int, d_sae: int, options: BsfTopKOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(d_in, d_sae, options, dtype=dtype)
        if self.q > self.d_in:
            raise ValueError(f"bsf-grassmann needs block_size q = {self.q} <= d_in = {self.d_in} (orthonormal frames)")
        self.B = torch.nn.Parameter(torch.zeros(self.n_b, self.d_in, self.q, dtype=dtype))
        self.log_gamma = torch.nn.Parameter(torch.zeros((), dtype=dtype))

    @torch.no_grad()
    def initialise_(self, gen: torch.Generator) -> None:
        """B_g = the sign-fixed Q of a QR of a Gaussian (D, q), log_gamma = 0."""
        G = torch.randn(self.n_b, self.d_in, self.q, generator=gen, dtype=torch.float64)
        self.B.copy_(_sign_fixed_q(G).to(self.B.dtype))

    @property
    def gamma(self) -> Tensor:
        """The global encoder scale γ = exp(log_gamma)."""
        return self.log_gamma.exp()

    def decoder_blocks(self) -> Tensor:
        """Orthonormal blocks: the sign-fixed QR of each B_g."""
        return _sign_fixed_q(self.B)

    def _blocks(self, xc: Tensor, W: Tensor) -> tuple[Tensor, Tensor | None]:
        return block_topk(self.gamma * torch.einsum("bd,gdq->bgq", xc, W), self.k), None

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"B": (self.n_b, self.d_in, self.q), "log_gamma": (), "b_dec": (self.d_in,)}


def _sign_fixed_q(G: Tensor) -> Tensor:
    """Q of the reduced QR of each G_g (…, D, q) with the signs that make diag(R) > 0 (differentiable)."""
    Q, R = torch.linalg.qr(G, mode="reduced")
    return Q * torch.where(torch.diagonal(R, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(Q.dtype).unsqueeze(-2)


# ------------------------------------------------------------------------------------------------------------------
# The registered architectures

class BlockSparse(Architecture):
    """The BSFs: unit-Frobenius or orthonormal blocks, a fixed centring vector, Adam at lr 4e-4."""

    Model: ClassVar[type[BlockSparseFeaturizer]]

    family = "bsf"
    family_title = "block-sparse featurizers (bsf-*; d_sae = n_b·q)"
    fields_key = "bsf"
    #: docs/bsf.md §3: data are centred beforehand; dictcheck centres by a fixed b_dec = the mean of the
    #: first batch (Decision), or not at all.
    b_dec_inits = ("mean", "zero")
    decoder_norm = "unit_frobenius_block"

    def default_lr(self, d_sae: int) -> float:
        return 4e-4  # docs/bsf.md §4: Adam, lr 4e-4 (the authors' code default)

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        n_b, q = _positive_field(fields, "n_b"), _positive_field(fields, "q")
        if n_b * q != d_sae:
            raise ValueError(f"n_b*q = {n_b}*{q} = {n_b * q} != d_sae = {d_sae}")
        return self.block_schema(d_in, d_sae, n_b, q)

    def block_schema(self, d_in: int, d_sae: int, n_b: int, q: int) -> Schema:
        return {"W_enc": ((d_in, d_sae), True), "b_enc": ((d_sae,), True), "W_dec": ((d_sae, d_in), True),
                "b_dec": ((d_in,), False)}

    def decoder_constraint_violation(self, model: Featurizer) -> float:
        """max_g |‖W_g‖_F − 1| over the decoder blocks W_g ∈ R^{D×q}, in float64 (docs/bsf.md §3.1)."""
        with torch.no_grad():
            norms = model.decoder_blocks().detach().to(torch.float64).norm(dim=(1, 2))
        return float((norms - 1.0).abs().max())

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        """Π_k variants: the block size, k ≤ n_b active blocks and the denoising level."""
        return {"block_size": ctx.block_size, "k": draw(st.integers(1, ctx.d_sae // ctx.block_size)),
                "denoise": draw(st.sampled_from([0.0, 0.1]))}

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        if float(getattr(options, "denoise", 0.0)) > 0:
            return ("the denoising noise is drawn per rank and scaled by each rank's own batch std "
                    "(use --denoise 0 for exact equivalence)")
        return None

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        """:attr:`Model` with the variant's init (module docstring), deterministic in ``seed``; b_dec (a fixed
        buffer) starts at 0."""
        model = self.Model(d_in, d_sae, options, dtype=dtype)
        model.initialise_(torch.Generator(device="cpu").manual_seed(int(seed)))
        return model


def _positive_field(fields: Mapping[str, Any], name: str) -> int:
    v = fields.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"requires positive int metadata.dictcheck.bsf.{name}, got {v!r}")
    return v


@register
class Vanilla(BlockSparse):
    """a = W_encᵀx̃ + b_enc, z = Π_k(a) (the k blocks of largest norm)."""

    name = "bsf-vanilla"
    saved_name = "dictcheck/bsf-vanilla"
    Options = BsfTopKOptions
    Model = VanillaBSF


@register
class Grassmann(BlockSparse):
    """Orthonormal frames W_g = Q of a sign-fixed QR of B_g, tied encoder with a global γ."""

    name = "bsf-grassmann"
    saved_name = "dictcheck/bsf-grassmann"
    decoder_norm = "qr_orthonormal"
    Options = BsfTopKOptions
    Model = GrassmannBSF

    def block_schema(self, d_in: int, d_sae: int, n_b: int, q: int) -> Schema:
        return {"B": ((n_b, d_in, q), True), "log_gamma": ((), True), "b_dec": ((d_in,), False)}

    def decoder_constraint_violation(self, model: Featurizer) -> float:
        """max_g ‖W_gᵀW_g − I_q‖_F of the frames W_g (the sign-fixed QR of the raw B_g), in float64
        (docs/bsf.md §3.2: orthonormal frames, W_g a point of the Stiefel manifold)."""
        with torch.no_grad():
            W = model.decoder_blocks().detach().to(torch.float64)
            eye = torch.eye(W.shape[-1], dtype=torch.float64)
            return float((W.transpose(1, 2) @ W - eye).norm(dim=(1, 2)).max())


@register
class GroupLasso(BlockSparse):
    """sh_θ gate with the ℓ₂,₁ penalty on the codes (or, as an option, on the contributions), or the STE gate
    with a block-count penalty."""

    name = "bsf-grouplasso"
    saved_name = "dictcheck/bsf-grouplasso"
    Options = GroupLassoOptions
    Model = GroupLassoBSF

    def block_schema(self, d_in: int, d_sae: int, n_b: int, q: int) -> Schema:
        return {**super().block_schema(d_in, d_sae, n_b, q), "log_theta": ((), False), "theta_raw": ((n_b,), False)}

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        gate = draw(st.sampled_from(list(GATES)))
        opts = {"block_size": ctx.block_size, "gate": gate, "c_gl": draw(st.sampled_from([1e-3, 1e-2])),
                "denoise": draw(st.sampled_from([0.0, 0.1]))}
        return {**opts, "k_target": draw(st.integers(1, ctx.d_sae // ctx.block_size))} if gate == "ste" else opts

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        note = super().ddp_inexactness(options)
        if note is None and getattr(options, "gate", None) == "ste":
            return "the STE gate's cold start (θ, w) is taken from rank 0's first B/P tokens"
        return note
