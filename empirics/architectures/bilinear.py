"""Bilinear autoencoders: ``bilinear-quadratic``, ``bilinear-atomic``, ``bilinear-compound`` (docs/bilinear.md).

Latent j is a quadratic form of the normalised token, z_j = xᵀW_j x, and the decoder reconstructs
the lift T = xxᵀ as T̂ = Σ_j z_j W_j (spec §1). Priors (spec §2; parameters as saved, see
the weight schemas below):

* ``bilinear-quadratic``: U, V (d_sae × D), z_j = (u_j·x)(v_j·x). Option ``decoder``:
  ``"symmetric"`` (default) decodes with W_j = sym(u_j v_jᵀ); ``"asymmetric"`` with u_j v_jᵀ, only to
  reproduce the workshop code. Reason (spec §4): T is symmetric, so
  ‖T − T̂‖² = ‖T − sym T̂‖² + ‖asym T̂‖² and the asymmetric decoder adds a penalty on an
  antisymmetric part that has nothing to do with reconstructing T; the encoder sees only
  sym(W_j), so with the symmetric decoder the trained object is the analysed one; and atomic and
  compound forms are symmetric anyway, so all priors share one loss.
* ``bilinear-atomic``: U (d_sae × D), W_j = u_j u_jᵀ, z_j = (u_j·x)² ≥ 0.
* ``bilinear-compound``: atoms U (n_atoms × D), composition C (d_sae × n_atoms), z = C_eff y with
  y = (Ux)^∘2, W_k = Σ_j C_eff,kj u_j u_jᵀ. **Sparsity of C** (spec §2 Decision): C_eff keeps the
  ``k_c`` largest |C_kj| of each row and zeroes the rest, recomputed in every forward pass; the
  gradient passes straight through to ALL entries of C (C_eff = C − stopgrad(C ⊙ (1 − mask))), so a
  dropped entry can re-enter. ``c_l1`` > 0 adds c_l1·Σ|C_kj| (the raw parameter) to the loss.
  The saved ``C`` is C_eff, what the forward pass uses. ``k_c = n_atoms`` is a dense C (no mask).
  Option ``atoms``: ``"rank1"`` (default, u_j u_jᵀ) or ``"glu"``: GLU atoms u_j v_jᵀ with a second
  factor V (n_atoms × D), y = (Ux)⊙(Vx), W_k = Σ_j C_kj sym(u_j v_jᵀ) (``decoder`` as for the
  quadratic prior; the authors' "mixed" model is GLU atoms, dense C, asymmetric decoder). The atomic
  prior with GLU atoms is ``bilinear-quadratic``. Option ``hoyer_on``: ``"latents"`` (default, the
  composites z, spec §5 Decision) or ``"atoms"`` (the atom activations y, as the authors' mixed model).

Forward pass (spec §0, §3, §5): rows with ‖x‖ = 0 are dropped (they get zero codes and do not count
in N), the others are normalised, x ← x/‖x‖. The loss is the kernel-trick form of
:mod:`theory.bilinear_lifted` (one shared definition of the kernel blocks),

    mse = (1/N)[⟨K, ZᵀZ⟩ − 2‖Z‖² + N]  = nmse_lifted (‖T‖ = 1),

with nothing of size D×D or D² per token formed. ``tile`` > 0 splits the latent axis (the atom
axis for the compound prior, whose quadratic term is evaluated as ⟨(UUᵀ)^∘2, HᵀH⟩, H = Z C_eff)
into blocks, sums unordered block pairs with weight 1 on the diagonal and 2 off it (spec §3,
§9 pitfall 1), and recomputes each block pair in the backward pass (``torch.utils.checkpoint``), so
the d_z × d_z kernel is never held in memory; the value equals the untiled one.

Sparsity (spec §5): per-latent Hoyer density over the batch's N real tokens,
η_j = (‖a_j‖₁/‖a_j‖₂ − 1)/(√N − 1) with a_j = |z_·j| (composites for the compound prior). Dead
latents (a_j = 0) are excluded from η̄ and from the gradient and counted (``hoyer_dead``). Decision:
a batch with fewer than 2 real tokens has no spread to measure, so its Hoyer term is 0.
sparsity_loss = α_H·s(t)·η̄ (+ c_l1·‖C‖₁), with warm-up s(t) = min(1, t/256) from
:meth:`BilinearAutoencoder.set_step`; s = 1 in eval mode or before any step was set. Decision: t is
the 0-based optimiser step the training loop passes, so the first update has no Hoyer term
(s(0) = 0) and s = 1 from the 257th update (t = 256) on.
loss = mse + sparsity_loss; aux_loss = 0 (``aux_coef`` is accepted and ignored, as for non-TopK SAEs).

Init (Decision, seeded by ``seed``; spec §8 names orthogonal init): U and V are semi-orthogonal
(QR of a Gaussian matrix, orthonormal columns when there are more rows than columns) with each row
then scaled to unit norm; C is semi-orthogonal likewise, each row scaled so that its top-k_c part
has unit norm. Unit rows alone give an initial loss above 1 when d_sae ≫ D for the PSD priors
(≈ 2.2 for atomic at d_sae = 8D: the positive forms pile up), so U (and V) are then multiplied
by c^{1/4}, c = Σ_i‖z_i‖²/Σ_i z_iᵀKz_i evaluated on 256 seeded isotropic unit tokens: the
least-squares overall scale of T̂ (T̂ scales as c), which puts the initial loss on isotropic
data at 1 − (Σ‖z‖²)²/(N·Σ zᵀKz) < 1 (the all-zero reconstruction scores exactly 1).
No parameter is constrained during training (decoder_norm_policy "none").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

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
from dictcheck.theory.bilinear_lifted import BilinearDictionary, DECODERS, block_pairs, kernel_block, quadratic_term

__all__ = [
    "ATOMS",
    "HOYER_ON",
    "HOYER_WARMUP_STEPS",
    "BilinearAutoencoder",
    "hoyer_mean",
    "MuonConfig",
    "train_muon",
    "BilinearOptions",
    "QuadraticOptions",
    "CompoundOptions",
    "Bilinear",
    "Quadratic",
    "Atomic",
    "Compound",
]

HOYER_WARMUP_STEPS = 256  # spec §5, s(t) = min(1, t/256)
TOKEN_NORMALISATION = "x/||x||, zero rows dropped"
CALIBRATION_TOKENS = 256  # init scale calibration (Decision, module docstring)
CALIBRATION_TILE = 4096  # bounds the memory of that one-off kernel evaluation
ATOMS = ("rank1", "glu")  # compound atoms u uᵀ or GLU pairs u vᵀ (module docstring)
HOYER_ON = ("latents", "atoms")  # what the compound prior's Hoyer term measures



def _unit_row_orthogonal(rows: int, cols: int, gen: torch.Generator) -> Tensor:
    """Semi-orthogonal (rows × cols) float64 matrix (QR of a Gaussian), each row scaled to unit norm."""
    q, r = torch.linalg.qr(torch.randn(max(rows, cols), min(rows, cols), generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))  # a unique (Haar) Q
    q = q if rows >= cols else q.T
    return q / q.norm(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)


def _topk_mask(C: Tensor, k: int) -> Tensor:
    """0/1 mask of the k largest |C_kj| of each row."""
    idx = C.detach().abs().topk(k, dim=1).indices
    return torch.zeros_like(C).scatter_(1, idx, 1.0)


def hoyer_mean(A: Tensor) -> tuple[Tensor, int]:
    """(η̄ over live latents, number of dead latents) of activations A (N, d_z), N ≥ 2 (spec §5).

    η_j = (‖a_j‖₁/‖a_j‖₂ − 1)/(√N − 1) on |A|; latents with a_j = 0 get no value, no gradient and
    are counted. η̄ = 0 when every latent is dead. Torch twin of theory.bilinear_lifted.hoyer_density.
    """
    N = A.shape[0]
    if N < 2:
        raise ValueError(f"Hoyer density needs at least 2 tokens, got {N}")
    a = A.abs()
    sq = (a * a).sum(0)
    dead = sq == 0
    l2 = torch.sqrt(torch.where(dead, torch.ones_like(sq), sq))
    eta = (a.sum(0) / l2 - 1.0) / (math.sqrt(N) - 1.0)
    live = (~dead).to(A.dtype)
    n_live = int(live.sum())
    return (eta * live).sum() / max(n_live, 1), int(dead.sum())


def _pair_term(prior: str, decoder: str, U: Tensor, V: Tensor | None, M: Tensor, rows: slice, cols: slice) -> Tensor:
    return (kernel_block(prior, decoder, U, V, rows, cols) * (M[:, rows].T @ M[:, cols])).sum()


class BilinearAutoencoder(Featurizer):
    """One bilinear autoencoder (module docstring); built by :class:`Bilinear`."""

    def __init__(
        self,
        arch: str,
        d_in: int,
        d_sae: int,
        *,
        hoyer_coef: float,
        tile: int,
        decoder: str = "symmetric",
        n_atoms: int | None = None,
        k_c: int | None = None,
        c_l1: float = 0.0,
        atoms: str = "rank1",
        hoyer_on: str = "latents",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.arch, self.d_in, self.d_sae = arch, int(d_in), int(d_sae)
        self.prior = arch.removeprefix("bilinear-")
        self.hoyer_coef, self.tile, self.decoder = float(hoyer_coef), int(tile), decoder
        self.n_atoms, self.k_c, self.c_l1 = n_atoms, k_c, float(c_l1)
        if atoms not in ATOMS or hoyer_on not in HOYER_ON:
            raise ValueError(f"atoms must be one of {ATOMS} and hoyer_on one of {HOYER_ON}, got {atoms!r}, {hoyer_on!r}")
        if self.prior != "compound" and (atoms, hoyer_on) != ("rank1", "latents"):
            raise ValueError("atoms and hoyer_on are options of the compound prior (the atomic prior with GLU atoms "
                             "is bilinear-quadratic)")
        self.atoms, self.hoyer_on = atoms, hoyer_on
        self._step: int | None = None
        gen = torch.Generator().manual_seed(int(seed))
        n_u = n_atoms if self.prior == "compound" else self.d_sae
        self.U = torch.nn.Parameter(_unit_row_orthogonal(n_u, self.d_in, gen).to(dtype))
        self.V = (
            torch.nn.Parameter(_unit_row_orthogonal(n_u, self.d_in, gen).to(dtype))
            if self.prior == "quadratic" or atoms == "glu" else None
        )
        if self.prior == "compound":
            C = _unit_row_orthogonal(self.d_sae, n_atoms, gen)
            C = C / (C * _topk_mask(C, k_c)).norm(dim=1, keepdim=True)
            self.C = torch.nn.Parameter(C.to(dtype))
        else:
            self.C = None
        self._calibrate_scale_(gen)

    @torch.no_grad()
    def _calibrate_scale_(self, gen: torch.Generator) -> None:
        """Scale U (and V) by c^{1/4}, c = Σ‖z‖²/Σ zᵀKz on CALIBRATION_TOKENS seeded isotropic unit tokens.

        T̂ scales as c, so this is the least-squares overall scale of the reconstruction on isotropic
        data and the initial loss there is 1 − (Σ‖z‖²)²/(N Σ zᵀKz) < 1 (Decision). Skipped for a model
        built on the meta device (shapes only, e.g. to estimate memory before allocating).
        """
        if self.U.is_meta:
            return
        x = torch.randn(CALIBRATION_TOKENS, self.d_in, generator=gen, dtype=torch.float64).to(self.U.dtype)
        xn = x / x.norm(dim=1, keepdim=True)
        C_eff = self.effective_C() if self.prior == "compound" else None
        z = self.latents(xn, C_eff)
        M = z @ C_eff if C_eff is not None else z
        q = quadratic_term(self.prior, self.decoder, self.U, self.V, M, CALIBRATION_TILE)
        a = float((z * z).sum() / q) ** 0.25
        for p in (self.U, self.V):
            if p is not None:
                p.mul_(a)

    # ------------------------------------------------------------------ hooks
    def set_step(self, step: int) -> None:
        self._step = int(step)

    def hoyer_scale(self) -> float:
        """s(t) = min(1, t/256) in training mode once a step was set; 1 otherwise (spec §5)."""
        if not self.training or self._step is None:
            return 1.0
        return min(1.0, self._step / HOYER_WARMUP_STEPS)

    # ------------------------------------------------------------------ model
    def effective_C(self) -> Tensor:
        """C_eff: per-row top-k_c of |C| (values), gradient straight through to every entry of C."""
        C = self.C
        if self.k_c == self.n_atoms:  # dense C
            return C
        return C - (C * (1.0 - _topk_mask(C, self.k_c))).detach()

    def normalise(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(x/‖x‖ of the nonzero rows, bool mask of those rows); ValueError on a bad batch."""
        if x.ndim != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"x must have shape (B, {self.d_in}), got {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError("x contains non-finite entries")
        x = x.to(self.U.dtype)
        norms = x.norm(dim=1)
        keep = norms > 0
        return x[keep] / norms[keep, None], keep

    def atom_activations(self, xn: Tensor) -> Tensor:
        """Y (N, n): (u_j·x)(v_j·x) with V, else (u_j·x)²; the latents unless the prior is compound."""
        P = xn @ self.U.T
        return P * (xn @ self.V.T) if self.V is not None else P * P

    def latents(self, xn: Tensor, C_eff: Tensor | None = None) -> Tensor:
        """Z (N, d_sae) of normalised rows ``xn`` (C_eff: the compound composition, default effective_C())."""
        y = self.atom_activations(xn)
        if self.prior != "compound":
            return y
        return y @ (self.effective_C() if C_eff is None else C_eff).T

    def _quadratic_term(self, M: Tensor) -> Tensor:
        if self.tile == 0:
            return quadratic_term(self.prior, self.decoder, self.U, self.V, M)
        return sum(
            w * checkpoint(_pair_term, self.prior, self.decoder, self.U, self.V, M, I, J, use_reentrant=False)
            for I, J, w in block_pairs(M.shape[1], self.tile)
        )

    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> FeaturizerOutput:
        xn, keep = self.normalise(x)
        N = xn.shape[0]
        if N == 0:
            raise ValueError("the batch has no nonzero row (zero rows are dropped before normalising)")
        C_eff = self.effective_C() if self.prior == "compound" else None
        y = self.atom_activations(xn)
        z = y @ C_eff.T if C_eff is not None else y
        M = z @ C_eff if C_eff is not None else z
        mse = (self._quadratic_term(M) - 2.0 * (z * z).sum() + N) / N
        if N >= 2:
            eta, n_dead = hoyer_mean(y if self.hoyer_on == "atoms" else z)
        else:
            eta, n_dead = z.new_zeros(()), 0
        sparsity = self.hoyer_coef * self.hoyer_scale() * eta
        if self.prior == "compound" and self.c_l1 > 0:
            sparsity = sparsity + self.c_l1 * self.C.abs().sum()
        if bool(keep.all()):
            codes = z
        else:
            codes = z.new_zeros(x.shape[0], self.d_sae)
            codes[keep] = z
        zero = mse.new_zeros(())
        return FeaturizerOutput(
            x_hat=None,
            codes=codes,
            loss=mse + sparsity,
            mse=mse,
            sparsity_loss=sparsity,
            aux_loss=zero,
            l0=(z != 0).sum(dim=1).to(mse.dtype).mean().detach(),
            extra={
                "nmse_lifted": mse.detach(),
                "hoyer_density": eta.detach(),
                "hoyer_dead": mse.new_tensor(float(n_dead)),
            },
            extra_tokens=N,
        )

    # ------------------------------------------------------------------ analysis
    def dictionary(self) -> BilinearDictionary:
        """The weights as a float64 :class:`theory.bilinear_lifted.BilinearDictionary` (C = C_eff)."""
        w = {name: t.to(torch.float64).numpy() for name, t in self.state_weights().items()}
        return BilinearDictionary(self.prior, w["U"], w.get("V"), w.get("C"), self.decoder)

    def forms(self) -> np.ndarray:
        """Symmetrised forms sym(W_j), float64 numpy (d_sae, D, D), for analysis (spec §6 step 1)."""
        W = self.dictionary().forms()
        return 0.5 * (W + W.transpose(0, 2, 1))

    # ------------------------------------------------------------------ save / load
    def state_weights(self) -> dict[str, Tensor]:
        out = {"U": self.U.detach().clone()}
        if self.V is not None:
            out["V"] = self.V.detach().clone()
        if self.C is not None:
            with torch.no_grad():
                out["C"] = self.effective_C().detach().clone()
        return out

    def load_state_weights(self, weights: dict[str, Tensor]) -> None:
        own = {name: p for name, p in (("U", self.U), ("V", self.V), ("C", self.C)) if p is not None}
        if set(weights) != set(own):
            raise ValueError(f"{self.arch} weights must be exactly {sorted(own)}, got {sorted(weights)}")
        for name, p in own.items():
            t = weights[name]
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(p.shape)}")
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(weights[name].to(p.dtype))

    def arch_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"hoyer_coef": self.hoyer_coef}
        if self.V is not None:
            fields["decoder"] = self.decoder
        if self.prior == "compound":
            fields.update(n_atoms=self.n_atoms, k_c=self.k_c, c_l1=self.c_l1, atoms=self.atoms, hoyer_on=self.hoyer_on)
        fields.update(tile=self.tile, hoyer_warmup_steps=HOYER_WARMUP_STEPS, token_normalisation=TOKEN_NORMALISATION)
        return fields

    def load_arch_fields(self, fields: dict[str, Any]) -> None:
        """Restore the options that do not fix shapes (hoyer_coef, tile, decoder, k_c, c_l1) from the saved
        fields; n_atoms must match the built model. ValueError for a field of the wrong kind."""
        if self.prior == "compound" and fields.get("n_atoms", self.n_atoms) != self.n_atoms:
            raise ValueError(f"n_atoms {fields['n_atoms']} does not match the model's {self.n_atoms}")
        real = (int, float)
        checks = {"hoyer_coef": lambda v: isinstance(v, real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                  "c_l1": lambda v: isinstance(v, real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                  "tile": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                  "decoder": lambda v: v in DECODERS,
                  "k_c": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= (self.n_atoms or 0)}
        if self.prior == "compound" and fields.get("atoms", self.atoms) != self.atoms:
            raise ValueError(f"atoms {fields['atoms']!r} does not match the model's {self.atoms!r}")
        checks["hoyer_on"] = lambda v: v in HOYER_ON
        applies = {"decoder": self.V is not None, "k_c": self.prior == "compound", "c_l1": self.prior == "compound",
                   "hoyer_on": self.prior == "compound"}
        for name, ok in checks.items():
            if name in fields and applies.get(name, True):
                if not ok(fields[name]):
                    raise ValueError(f"saved field {name} = {fields[name]!r} is invalid for {self.arch}")
                setattr(self, name, fields[name])

    def extra_repr(self) -> str:
        return f"arch={self.arch}, d_in={self.d_in}, d_sae={self.d_sae}, " + ", ".join(
            f"{k}={v}" for k, v in self.arch_fields().items() if k != "token_normalisation"
        )


# ---------------------------------------------------------------------------------------------------------
# The authors' optimiser (docs/bilinear.md §8): Muon on every parameter, momentum 0.95, no Nesterov, no
# weight decay, lr constant for the first (1 − cooldown) of the steps then linear to 0 [code: tdooms/bae
# mixed model, lr 0.01, cooldown 0.5]. The project's loop (empirics.training.loop.train) trains with Adam only,
# so this small loop is the one place Muon is used (Decision): same batch rule (with replacement, a seeded
# CPU generator), the Hoyer warm-up through set_step, no clipping (the authors clip nothing).


@dataclass(frozen=True)
class MuonConfig:
    """Muon training of a bilinear autoencoder: steps, batch size, peak lr, momentum, cooldown fraction, seed."""

    steps: int = 1024
    batch_size: int = 512
    lr: float = 0.01
    momentum: float = 0.95
    cooldown: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 2 or not self.lr > 0 or not 0.0 < self.cooldown <= 1.0:
            raise ValueError(f"MuonConfig needs steps >= 1, batch_size >= 2, lr > 0, cooldown in (0, 1]: {self}")

    def lr_factor(self, step: int) -> float:
        """min(1, (1 − step/steps)/cooldown): 1 until step = (1 − cooldown)·steps, then linear to 0."""
        return min(1.0, (1.0 - step / self.steps) / self.cooldown)


def train_muon(model: BilinearAutoencoder, rows: np.ndarray, cfg: MuonConfig) -> list[float]:
    """Train ``model`` in place on ``rows`` (N, D) with ``torch.optim.Muon`` (section comment above); returns
    the batch loss at every tenth of the run. Deterministic under ``cfg.seed`` (CPU)."""
    X = torch.from_numpy(np.ascontiguousarray(rows)).to(model.U.dtype)
    if X.ndim != 2 or X.shape[1] != model.d_in or X.shape[0] < 2:
        raise ValueError(f"rows must have shape (N >= 2, {model.d_in}), got {tuple(X.shape)}")
    opt = torch.optim.Muon(list(model.parameters()), lr=cfg.lr, weight_decay=0.0, momentum=cfg.momentum,
                           nesterov=False)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    every = max(1, cfg.steps // 10)
    log: list[float] = []
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * cfg.lr_factor(step)
        model.set_step(step)
        out = model(X[torch.randint(X.shape[0], (cfg.batch_size,), generator=gen)])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        if (step + 1) % every == 0:
            log.append(float(out.loss.detach()))
    model.eval()
    return log


# ---------------------------------------- the registered architectures

DEFAULT_HOYER_COEF = 0.1
DEFAULT_K_C = 8


@dataclass(frozen=True)
class BilinearOptions(ArchOptions):
    """Every prior: the Hoyer coefficient α_H and the latent tile of the kernel term."""

    hoyer_coef: float = option(DEFAULT_HOYER_COEF, type=float, help="Hoyer density coefficient α_H (default 0.1)")
    tile: int = option(0, type=int, help="latent tile size of the kernel term (default 0: untiled)")

    def resolved(self, arch: str, d_sae: int) -> BilinearOptions:
        return replace(self, hoyer_coef=require_real("hoyer_coef", self.hoyer_coef),
                       tile=require_int("tile", self.tile, 0))


@dataclass(frozen=True)
class QuadraticOptions(BilinearOptions):
    """The quadratic (GLU) prior: also the decoder form."""

    decoder: str = option("symmetric", type=str, choices=DECODERS, help="GLU decoder (bilinear-quadratic; "
                          "asymmetric only to reproduce the workshop code)")

    def resolved(self, arch: str, d_sae: int) -> QuadraticOptions:
        base = BilinearOptions.resolved(self, arch, d_sae)
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {list(DECODERS)}, got {self.decoder!r}")
        return replace(self, hoyer_coef=base.hoyer_coef, tile=base.tile)


@dataclass(frozen=True)
class CompoundOptions(QuadraticOptions):
    """The compound prior W_k = Σ_j C_kj a_j: atoms a_j (u_j u_jᵀ, or GLU u_j v_jᵀ), non-zeros per row of C
    (n_atoms: dense), an L1 on C, what the Hoyer term measures; ``decoder`` applies to GLU atoms only."""

    n_atoms: int | None = option(None, type=int, help="atoms of the compound prior (default 2·d_sae)")
    k_c: int | None = option(None, type=int, help="non-zeros per row of C, compound prior (default min(8, n_atoms); "
                             "n_atoms = dense C)")
    c_l1: float = option(0.0, type=float, help="L1 coefficient on C, compound prior (default 0)")
    atoms: str = option("rank1", type=str, choices=ATOMS, help="compound atoms: rank1 u uᵀ (default) or glu u vᵀ")
    hoyer_on: str = option("latents", type=str, choices=HOYER_ON, help="compound Hoyer term on the composites "
                           "(latents, default) or on the atom activations (atoms)")

    def resolved(self, arch: str, d_sae: int) -> CompoundOptions:
        base = QuadraticOptions.resolved(self, arch, d_sae)
        n_atoms = require_int("n_atoms", 2 * d_sae if self.n_atoms is None else self.n_atoms, 1)
        k_c = require_int("k_c", min(DEFAULT_K_C, n_atoms) if self.k_c is None else self.k_c, 1)
        if k_c > n_atoms:
            raise ValueError(f"k_c must be <= n_atoms = {n_atoms}, got {k_c}")
        if self.atoms not in ATOMS or self.hoyer_on not in HOYER_ON:
            raise ValueError(f"atoms must be one of {list(ATOMS)} and hoyer_on one of {list(HOYER_ON)}, got "
                             f"{self.atoms!r}, {self.hoyer_on!r}")
        if self.atoms == "rank1" and self.decoder != "symmetric":
            raise ValueError("decoder asymmetric needs GLU atoms (atoms glu); rank-1 atoms are symmetric")
        return replace(self, hoyer_coef=base.hoyer_coef, tile=base.tile, n_atoms=n_atoms, k_c=k_c,
                       c_l1=require_real("c_l1", self.c_l1))


class Bilinear(Architecture):
    """Latents xᵀW_jx of normalised tokens, reconstructed in the lift; no centring vector."""

    family = "bilinear"
    family_title = "bilinear autoencoders (bilinear-*)"
    fields_key = "bilinear"
    #: docs/bilinear.md §0: tokens are normalised, there is no centring vector.
    b_dec_inits = ("none",)
    decoder_norm = "none"

    def default_lr(self, d_sae: int) -> float:
        # docs/bilinear.md §8: the workshop trains with Muon at lr 0.03; dictcheck uses the loop's Adam,
        # whose default here is 1e-3 (Decision).
        return 1e-3

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return {"U": ((d_sae, d_in), True)}

    def step_bytes(self, d_in: int, d_sae: int, options: ArchOptions, batch_size: int, elem: int) -> int:
        """The default, plus (untiled) the m × m kernel blocks and their autograd copies, m = d_sae
        (n_atoms for the compound prior)."""
        m = getattr(options, "n_atoms", None) or d_sae
        kernel = 0 if getattr(options, "tile", 0) else 3 * m * m * elem
        return super().step_bytes(d_in, d_sae, options, batch_size, elem) + kernel

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        return ("the Hoyer density is computed per latent over each rank's B/P tokens, and the lifted loss is "
                "normalised by each rank's own count of nonzero tokens")

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        return {"hoyer_coef": draw(st.sampled_from([0.0, 0.1])), "tile": draw(st.sampled_from([0, 2]))}

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        return BilinearAutoencoder(self.name, d_in, d_sae, seed=seed, dtype=dtype, **options.to_dict())


@register
class Quadratic(Bilinear):
    """GLU forms W_j = sym(u_j v_jᵀ) (symmetric decoder by default)."""

    name = "bilinear-quadratic"
    saved_name = "dictcheck/bilinear-quadratic"
    Options = QuadraticOptions

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return {"U": ((d_sae, d_in), True), "V": ((d_sae, d_in), True)}

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        return {**super().draw_options(draw, st, ctx), "decoder": draw(st.sampled_from(["symmetric", "asymmetric"]))}


@register
class Atomic(Bilinear):
    """Rank-one forms W_j = u_j u_jᵀ."""

    name = "bilinear-atomic"
    saved_name = "dictcheck/bilinear-atomic"
    Options = BilinearOptions


@register
class Compound(Bilinear):
    """Sparse combinations of shared rank-one atoms."""

    name = "bilinear-compound"
    saved_name = "dictcheck/bilinear-compound"
    Options = CompoundOptions

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        opts = super().draw_options(draw, st, ctx)
        n_atoms = draw(st.integers(1, 2 * ctx.d_sae))
        return {**opts, "n_atoms": n_atoms, "k_c": draw(st.integers(1, min(n_atoms, 4))),
                "c_l1": draw(st.sampled_from([0.0, 1e-3]))}

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        n_a = fields.get("n_atoms")
        if not isinstance(n_a, int) or isinstance(n_a, bool) or n_a <= 0:
            raise ValueError(f"requires positive int metadata.dictcheck.bilinear.n_atoms, got {n_a!r}")
        glu = {"V": ((n_a, d_in), True)} if fields.get("atoms", "rank1") == "glu" else {}
        return {"U": ((n_a, d_in), True), **glu, "C": ((d_sae, n_a), True)}
