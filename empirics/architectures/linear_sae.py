"""Linear sparse autoencoders: ``relu``, ``topk``, ``batchtopk``, ``jumprelu``, ``abs``.

Specs: docs/ecosystem.md §1 (SAELens weight names) and §3 (decoder norms, init, AuxK);
docs/theory.md §1 (objective (1)), §4.5 (signed codes) and §7 (relation to trained SAEs).

Layout: tokens are ROWS. ``x`` is (B, d_in), codes are (B, d_sae). Parameters use the SAELens names
and shapes: W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]. The rows of W_dec
are the atoms; the theory's dictionary is W = W_decᵀ (D × d_z).

Pre-activation: a = (x − b_dec·[apply_b_dec_to_input]) @ W_enc + b_enc. Decoder: x̂ = z @ W_dec + b_dec.
The TopK family computes the same x̂ (and the same gradients) from its ≤ k active latents per token
(:class:`ActiveLatents`, ``sparse_decode`` = True by default): O(B·k·d_in) instead of O(B·d_sae·d_in).

Per-arch codes and losses (every loss is a mean over the B tokens; ``mse`` = (1/B) Σ_t ‖x_t − x̂_t‖²,
the ecosystem ``mse``):

* ``relu``: z = ReLU(a); loss = mse + 2λ·mean_t ‖z_t‖₁. With unit-norm decoder rows this is exactly
  objective (1) of docs/theory.md §1 evaluated at the encoder's (amortised) codes.
* ``topk``: z = ReLU of the top-k entries of a per token, all others 0 (≤ k non-zeros per token).
  loss = mse (+ AuxK).
* ``batchtopk``: training mode keeps the top k·B entries of ReLU(a) over the whole batch.
  **Decision (inference threshold):** a scalar θ is tracked in training mode as an exponential
  running mean of the minimum kept (positive) activation, θ ← (1 − m)·θ + m·min_kept with
  m = ``batchtopk_momentum`` = 0.01 (SAELens' ``topk_threshold`` rule; dictionary_learning uses the
  same idea with β = 0.999), initialised by the first training batch. In eval mode
  z = ReLU(a)·1[ReLU(a) > θ] (the dictionary_learning inference rule). Before any training batch
  has been seen (θ < 0) eval mode falls back to the batch rule. θ is not a SAELens weight; it is
  exposed by :meth:`SparseAutoencoder.arch_fields` as ``{"threshold": θ}``, to be stored under
  ``metadata.dictcheck.batchtopk.threshold`` (the key sae_io uses for dictionary_learning).
  loss = mse (+ AuxK).
* ``jumprelu`` (Rajamanoharan et al. 2024, *Jumping Ahead: Improving Reconstruction Fidelity with
  JumpReLU Sparse Autoencoders*, arXiv:2407.14435): θ_d = exp(log_threshold_d) > 0 (parameter
  ``log_threshold``; ``state_weights()`` exposes SAELens' ``threshold`` = θ), z = a·H(a − θ),
  loss = mse + λ·mean_t Σ_d H(a_td − θ_d). H has no useful gradient, so two custom autograd
  functions supply the paper's straight-through pseudo-gradients with the rectangle kernel
  K(u) = 1[|u| < ½] and bandwidth ε:

  - :class:`JumpReLUFn`  (z = a·H(a − θ)): ∂z/∂a = H(a − θ); ∂z/∂θ = −(θ/ε)·K((a − θ)/ε).
  - :class:`StepFn`      (H(a − θ)):       ∂H/∂a = 0;       ∂H/∂θ = −(1/ε)·K((a − θ)/ε).

  Both live in :mod:`dictcheck.empirics.kernels.straight_through` (shared with the BSF's STE gate).

  The forward values are exact (no smoothing). The L0 term therefore trains θ only, as in the paper.
* ``abs`` (signed codes). **dictcheck Decision** (docs/theory.md §4.5, "signed codes with the |z|
  penalty"; §7 "absolute-value activations give signed codes"): with u = (x − b_dec·[apply]) @ W_enc
  (b_enc NOT added), z = sign(u)·ReLU(|u| + b_enc), i.e. the symmetric soft threshold with learnable
  per-latent threshold −b_enc, the signed analogue of ``relu`` (the bias acts as a threshold on both
  sides). loss = mse + 2λ·mean_t ‖z_t‖₁ (objective (1) with Z signed and ‖·‖₁ = Σ|z|). With b_dec = 0
  the encoder is odd: encode(−x) = −encode(x). b_enc is initialised to 0 (z = u at init).

Init (docs/ecosystem.md §3): W_dec ~ Gaussian rows from a ``torch.Generator`` seeded by ``seed``, normalised to
unit norm; W_enc = W_decᵀ (tied init); b_enc = 0; b_dec = ``b_dec_init`` or 0; jumprelu θ =
``init_threshold``.

Decoder norms (docs/ecosystem.md §3 Decision; all five archs): unit-norm rows. The training loop calls
:meth:`SparseAutoencoder.remove_parallel_grad_` before ``optimizer.step()`` and
:meth:`SparseAutoencoder.normalise_decoder_` after it.

AuxK (TopK family only, ``aux_coef`` > 0, ``forward(x, dead_mask)``), exactly docs/ecosystem.md §3:
k_aux = d_in // 2; per token the top min(k_aux, n_dead) of the dead latents' ReLU'd pre-activations
are decoded WITHOUT b_dec, ê = z_aux @ W_dec; target e = (x − x̂).detach();
aux = aux_coef · min(n_dead/k_aux, 1) · Σ_t‖e_t − ê_t‖² / Σ_t‖e_t − ē‖². It is exactly 0 when
nothing is dead, when ``dead_mask`` is None, and (Decision) when Σ_t‖e_t − ē‖² = 0 (no residual
variance to explain, e.g. B = 1). For non-TopK archs ``aux_coef`` is stored but ignored
(aux_loss = 0), so a training loop may pass one value for every arch.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from dictcheck.empirics.architectures.activation_normalisation import ActivationNormalisation
from dictcheck.empirics.architectures.featurizer import Featurizer, FeaturizerOutput
from dictcheck.empirics.kernels.straight_through import JumpReLUFn, StepFn
from dictcheck.empirics.kernels.sparse_products import (
    LatentGroups,
    by_latent,
    gather_dots,
    scatter_rows,
    scatter_rows_and_dots,
    tile_tokens,
)
from dictcheck.empirics.kernels.topk_select import ALIKE_ROWS, encoder_topk, row_topk

ARCHS = ("relu", "topk", "batchtopk", "jumprelu", "abs")
TOPK_FAMILY = ("topk", "batchtopk")
LAM_ARCHS = ("relu", "jumprelu", "abs")
SAELENS_WEIGHT_NAMES = ("W_enc", "b_enc", "W_dec", "b_dec")

__all__ = [
    "ARCHS",
    "SparseAutoencoder",
    "make_sae",
]


@dataclass(frozen=True)
class ActiveLatents:
    """The non-zero codes of a TopK-family batch: token t's active latents ``idx`` with values
    ``vals`` (both (B, k) when every token has k of them; flat and grouped by token, token t
    starting at ``offsets[t]``, when their number varies).

    Sparse decode (the ``sparsify`` library's embedding-bag decoder): x̂_t − b_dec =
    Σ_{j active in t} z_tj · W_dec[j] = (z_t @ W_dec), computed by ``embedding_bag`` in
    O(B·k·d_in) instead of the dense product's O(B·d_sae·d_in). Its backward pass is the same
    gather: ∂L/∂z_tj = ⟨∂L/∂x̂_t, W_dec[j]⟩ for the active j only, and ∂L/∂W_dec[j] =
    Σ_t z_tj ∂L/∂x̂_t over the tokens where j is active (rows of inactive latents get 0, as
    in the dense path); on the CPU (float32/64) both are compiled (:class:`_GatheredDecode`,
    :mod:`~dictcheck.empirics.kernels.sparse_products`). Same values as the dense path up to the order
    of summation. ``cache`` holds the entries' token indices and their grouping by latent, built
    once per batch and shared with the encoder's backward (:class:`_SelectedPreacts`).
    """

    idx: Tensor
    vals: Tensor
    offsets: Tensor | None
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    def decode(self, W_dec: Tensor) -> Tensor:
        """Σ_j vals_tj · W_dec[idx_tj] per token, (B, d_in) (no bias)."""
        if _compiled(W_dec) and torch.is_grad_enabled() and (self.vals.requires_grad or W_dec.requires_grad):
            return _GatheredDecode.apply(self.vals, W_dec, self.idx, self.offsets, self.cache)
        return torch.nn.functional.embedding_bag(
            self.idx, W_dec, self.offsets, mode="sum", per_sample_weights=self.vals
        )

    def by_latent(self, d_sae: int, G: Tensor) -> LatentGroups:
        """The entries grouped by latent (:func:`~dictcheck.empirics.kernels.sparse_products.by_latent`) for
        products with the rows of G (B, e): within tiles of tokens when the compiled products apply
        (:func:`~dictcheck.empirics.kernels.sparse_products.tile_tokens`), one tile otherwise; built at the
        first call for that tiling."""
        tile = None
        if _compiled(G):
            tile = tile_tokens(G.shape[1] * G.element_size(), self.n_tokens, self.idx.numel(), d_sae)
        key = ("by_latent", tile)
        if key not in self.cache:
            self.cache[key] = by_latent(self.idx.reshape(-1), self.rows(), d_sae, tile)
        return self.cache[key]

    @property
    def n_tokens(self) -> int:
        """B, the number of tokens."""
        return self.vals.shape[0] if self.offsets is None else self.offsets.shape[0]

    def dense(self, width: int) -> Tensor:
        """The codes as a dense (B, ``width``) tensor (differentiable in vals)."""
        out = self.vals.new_zeros(self.n_tokens, width)
        if self.offsets is None:
            return out.scatter_(-1, self.idx, self.vals)
        return out.index_put_((self.rows(), self.idx), self.vals)

    def rows(self) -> Tensor:
        """Token index of every entry, (B·k,) or like the flat ``idx`` (built at the first call)."""
        if "rows" not in self.cache:
            arange = torch.arange(self.n_tokens, device=self.idx.device)
            if self.offsets is None:
                self.cache["rows"] = arange.repeat_interleave(self.idx.shape[1])
            else:
                counts = torch.diff(self.offsets, append=self.offsets.new_tensor([self.idx.numel()]))
                self.cache["rows"] = arange.repeat_interleave(counts)
        return self.cache["rows"]


class _GatheredDecode(torch.autograd.Function):
    """:meth:`ActiveLatents.decode` with the compiled backward: ∂L/∂z_p = ⟨W_dec[j_p], g_{t_p}⟩ and
    ∂L/∂W_dec = Zᵀg, g = ∂L/∂x̂, in one pass over the entries grouped by latent when both are needed
    (:func:`~dictcheck.empirics.kernels.sparse_products.scatter_rows_and_dots`; alone:
    :func:`~dictcheck.empirics.kernels.sparse_products.gather_dots`,
    :func:`~dictcheck.empirics.kernels.sparse_products.scatter_rows`); the forward is ``embedding_bag``'s.
    Arguments: vals, W_dec, then idx, offsets, cache of the ActiveLatents."""

    @staticmethod
    def forward(ctx, vals, W_dec, idx, offsets, cache):  # noqa: D102
        ctx.save_for_backward(vals, W_dec, idx, offsets)
        ctx.cache = cache
        return torch.nn.functional.embedding_bag(idx, W_dec, offsets, mode="sum", per_sample_weights=vals)

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        vals, W_dec, idx, offsets = ctx.saved_tensors
        act = ActiveLatents(idx, vals, offsets, ctx.cache)
        grad_vals = grad_W = None
        if ctx.needs_input_grad[1]:
            groups = act.by_latent(W_dec.shape[0], g)
            val_sorted = vals.reshape(-1)[groups.order]
            if ctx.needs_input_grad[0]:  # both in one pass over the rows of g
                grad_W, dots = scatter_rows_and_dots(groups, val_sorted, W_dec, g)
                grad_vals = dots.view_as(vals)
            else:
                grad_W = scatter_rows(groups, val_sorted, g)
        elif ctx.needs_input_grad[0]:
            grad_vals = gather_dots(act.rows(), idx.reshape(-1), W_dec, g).view_as(vals)
        return grad_vals, grad_W, None, None, None


def _batch_topk(
    vals: Tensor, cols: Tensor, n_keep: int, d: int, full_rows: Callable[[Tensor], Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """(rows, cols, values of a) of the n_keep largest entries of ReLU(a) (B, d) over the whole
    batch, sorted by (row, col), without a top-n_keep over all B·d entries (1.2 s at
    B = d = 4096 on the benchmark CPU) and without reading a again except in a few rows.

    ``vals``, ``cols`` (B, m), m = min(d, 2k): each row's m largest entries of a, descending (the
    candidates); ``full_rows(r)`` returns the rows a[r]. θ̂ = the n_keep-th largest ReLU'd
    candidate is a lower bound of the true threshold θ (more candidates can only raise it), so
    the global top n_keep lies in the entries ≥ θ̂. A row whose m-th largest value is < θ̂ (or
    ≤ 0: zeros carry no code) has shown all of them; for the other rows ("heavy", read in full
    with ``full_rows``) every entry ≥ θ̂ is added. The top n_keep of that superset is the global
    one. Equal values at θ may be chosen differently from a flat ``torch.topk`` (the kept values
    are the same).
    """
    B, m = vals.shape
    r_vals = torch.relu(vals)
    theta = torch.topk(r_vals.reshape(-1), n_keep, sorted=False).values.min()  # unsorted: 5× faster
    rows = torch.arange(B, device=vals.device).unsqueeze(1).expand(B, m)
    heavy = (r_vals[:, -1] >= theta) & (r_vals[:, -1] > 0) if m < d else torch.zeros_like(r_vals[:, -1], dtype=torch.bool)
    if bool(heavy.any()):
        light = ~heavy
        hr = heavy.nonzero().squeeze(1)
        a_h = full_rows(hr)
        hi, hc = (torch.relu(a_h) >= theta).nonzero(as_tuple=True)
        c_rows = torch.cat([rows[light].reshape(-1), hr[hi]])
        c_cols = torch.cat([cols[light].reshape(-1), hc])
        c_vals = torch.cat([vals[light].reshape(-1), a_h[hi, hc]])
    else:
        c_rows, c_cols, c_vals = rows.reshape(-1), cols.reshape(-1), vals.reshape(-1)
    pick = torch.topk(torch.relu(c_vals), n_keep, sorted=False).indices
    flat, order = torch.sort(c_rows[pick] * d + c_cols[pick])
    return torch.div(flat, d, rounding_mode="floor"), flat % d, c_vals[pick][order]


class _SelectedPreacts(torch.autograd.Function):
    """The selected pre-activations a_tj = x̃_t · W_enc[:, j] + b_enc[j] with a sparse backward.

    forward(x, b_dec, x̃, W_enc, b_enc, idx, offsets, values, cache) returns ``values``, the entries of
    the dense pre-activation GEMM at the selected (t, j) (same numbers as the dense path), where
    x̃ = x − b_dec (b_dec None: x̃ = x) is passed precomputed and detached. backward, with
    g_tj = ∂L/∂a_tj at the selected entries (∂L/∂a is 0 elsewhere: the TopK loss sees a only
    there): ∂L/∂W_enc[:, j] = Σ_t g_tj x̃_t, ∂L/∂b_enc[j] = Σ_t g_tj, ∂L/∂x_t = Σ_j g_tj W_enc[:, j],
    and ∂L/∂b_dec = −Σ_t ∂L/∂x_t = −W_enc ∂L/∂b_enc (one matrix-vector product: the per-token sums
    are needed only when x itself requires a gradient), in O(B·k·d_in) instead of autograd's two
    dense (B·d_sae·d_in) products through a. Layout of idx/offsets as in :class:`ActiveLatents`,
    whose ``cache`` (the grouping by latent) this backward shares. ∂L/∂W_enc is summed by latent,
    (Σ_t g_tj x̃_t)_j: compiled on the CPU (float32/64,
    :func:`~dictcheck.empirics.kernels.sparse_products.scatter_rows`, which writes it in W_enc's (d_in, d_sae)
    layout directly), a sparse CSR product otherwise.
    """

    @staticmethod
    def forward(ctx, x, b_dec, xe, W_enc, b_enc, idx, offsets, values, cache):  # noqa: D102
        ctx.save_for_backward(xe, W_enc, idx, offsets)
        ctx.cache = cache
        return values

    @staticmethod
    def backward(ctx, g):  # noqa: D102
        xe, W_enc, idx, offsets = ctx.saved_tensors
        sel = ActiveLatents(idx, g, offsets, ctx.cache)
        grad_x = grad_bd = grad_W = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = sel.decode(W_enc.T.contiguous())
        flat_idx, flat_g = idx.reshape(-1), g.reshape(-1)
        if ctx.needs_input_grad[3]:
            d_sae = W_enc.shape[1]
            groups = sel.by_latent(d_sae, xe)
            if _compiled(xe):
                grad_W = scatter_rows(groups, flat_g[groups.order], xe, transposed=True)
            else:  # one tile: crow is Zᵀ's CSR row pointer
                with warnings.catch_warnings():  # "sparse CSR support is in beta"
                    warnings.simplefilter("ignore", UserWarning)
                    g_t = torch.sparse_csr_tensor(groups.crow, groups.tok, flat_g[groups.order],
                                                  size=(d_sae, xe.shape[0]))
                grad_W = torch.sparse.mm(g_t, xe).T
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[4]:
            grad_b = torch.zeros_like(W_enc[0]).index_add_(0, flat_idx, flat_g)
            if ctx.needs_input_grad[1]:
                grad_bd = -(W_enc @ grad_b)
            if not ctx.needs_input_grad[4]:
                grad_b = None
        return grad_x, grad_bd, None, grad_W, grad_b, None, None, None, None


class SparseAutoencoder(Featurizer):
    """Linear SAE with SAELens parameter names; see the module docstring for each arch.

    Build with :func:`make_sae` (validates arguments and initialises the weights).
    """

    def __init__(
        self,
        arch: str,
        d_in: int,
        d_sae: int,
        *,
        k: int | None = None,
        lam: float | None = None,
        aux_coef: float = 0.0,
        jumprelu_bandwidth: float = 1e-3,
        init_threshold: float = 1e-3,
        apply_b_dec_to_input: bool = True,
        batchtopk_momentum: float = 0.01,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        _validate(arch, d_in, d_sae, k, lam, aux_coef, jumprelu_bandwidth, init_threshold, batchtopk_momentum)
        self.arch = arch
        self.d_in = int(d_in)
        self.d_sae = int(d_sae)
        self.k = int(k) if arch in TOPK_FAMILY else None
        self.lam = float(lam) if arch in LAM_ARCHS else None
        self.aux_coef = float(aux_coef)
        self.jumprelu_bandwidth = float(jumprelu_bandwidth)
        self.apply_b_dec_to_input = bool(apply_b_dec_to_input)
        self.batchtopk_momentum = float(batchtopk_momentum)
        # TopK family: decode by gathering the active decoder rows (see ActiveLatents); False
        # selects the dense product z @ W_dec (same numbers up to rounding, kept as the reference).
        self.sparse_decode = True
        #: SAELens' run-time input normalisation and TopK decoder-norm rescaling of a loaded folder (neither
        #: for models dictcheck trains).
        self.input_normalisation = ActivationNormalisation()
        self.rescale_acts_by_decoder_norm = False
        self.W_enc = torch.nn.Parameter(torch.zeros(d_in, d_sae, dtype=dtype))
        self.b_enc = torch.nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.W_dec = torch.nn.Parameter(torch.zeros(d_sae, d_in, dtype=dtype))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_in, dtype=dtype))
        if arch == "jumprelu":
            self.log_threshold = torch.nn.Parameter(torch.full((d_sae,), math.log(init_threshold), dtype=dtype))
        if arch == "batchtopk":
            # Scalar inference threshold θ; −1 means "not estimated yet".
            self.register_buffer("batchtopk_threshold", torch.tensor(-1.0, dtype=dtype))

    # ------------------------------------------------------------------ encoder / decoder
    @property
    def threshold(self) -> Tensor:
        """JumpReLU θ = exp(log_threshold) [d_sae] (differentiable)."""
        if self.arch != "jumprelu":
            raise AttributeError(f"arch {self.arch!r} has no per-latent threshold")
        return self.log_threshold.exp()

    def _encoder_input(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_in:
            raise ValueError(f"input has last dimension {x.shape[-1]}, expected d_in = {self.d_in}")
        return x - self.b_dec if self.apply_b_dec_to_input else x

    def pre_activation(self, x: Tensor) -> Tensor:
        """a = (x − b_dec·[apply_b_dec_to_input]) @ W_enc + b_enc (for 'abs' this includes b_enc too)."""
        return self._encoder_affine(self._encoder_input(x))

    def _encoder_affine(self, xe: Tensor) -> Tensor:
        return xe @ self.W_enc + self.b_enc

    def _gathers(self) -> bool:
        """Whether this model decodes from its active latents (:class:`ActiveLatents`) and gives
        the encoder the sparse backward (:class:`_SelectedPreacts`): the TopK family with
        ``sparse_decode`` and without SAELens' decoder-norm rescaling."""
        return self.arch in TOPK_FAMILY and self.sparse_decode and not self.rescale_acts_by_decoder_norm

    def _threshold_rule(self) -> bool:
        """batchtopk in eval mode with a known θ (the per-entry rule of the module docstring)."""
        return self.arch == "batchtopk" and not self.training and float(self.batchtopk_threshold) >= 0

    def _encode(self, x: Tensor) -> tuple[Tensor | None, Tensor | None, ActiveLatents | None]:
        """(codes, pre-activation a used for AuxK / L0, active latents of the TopK family or
        None). x is (B, d_in).

        A gathering model (:meth:`_gathers`) returns no dense codes (``ActiveLatents.dense``
        builds them on request) and, on the CPU when nothing else reads a (no AuxK, not the
        batchtopk eval rule), no a either: its rows' top entries come from the encoder product
        block by block (:func:`~dictcheck.empirics.kernels.topk_select.encoder_topk`)."""
        if self.arch == "abs":
            u = self._encoder_input(x) @ self.W_enc
            z = torch.sign(u) * torch.relu(u.abs() + self.b_enc)
            return z, u + self.b_enc, None
        if self.arch in TOPK_FAMILY:
            xe = self._encoder_input(x)
            a = None
            if not (self._gathers() and _compiled(xe) and self.aux_coef == 0 and not self._threshold_rule()):
                a = self._encoder_affine(xe)
                if self.rescale_acts_by_decoder_norm:  # SAELens (topk): select on a_d·‖w_d‖, in the model dtype
                    a = a * self.W_dec.norm(dim=-1)
            act = self._active_latents(a, x, xe)
            return (None if self._gathers() else act.dense(self.d_sae)), a, act
        a = self.pre_activation(x)
        if self.arch == "relu":
            return torch.relu(a), a, None
        if self.arch == "jumprelu":
            return JumpReLUFn.apply(a, self.threshold, self.jumprelu_bandwidth), a, None
        raise AssertionError(self.arch)  # pragma: no cover

    def _row_top(self, a: Tensor | None, xe: Tensor, m: int) -> tuple[Tensor, Tensor]:
        """Each token's m largest pre-activations and their latents, descending (no gradient):
        compiled (:mod:`~dictcheck.empirics.kernels.topk_select`) for a gathering model on the CPU,
        from the encoder product when a is None; ``torch.topk`` otherwise (the dense reference)."""
        if a is None:
            return encoder_topk(xe, self.W_enc, self.b_enc, m)
        if self._gathers() and _compiled(a):
            return row_topk(a, m)
        return torch.topk(a.detach(), m, dim=-1)

    def _active_latents(self, a: Tensor | None, x: Tensor, xe: Tensor) -> ActiveLatents:
        """The non-zero codes of the TopK family (module docstring) as (latent, value) lists.

        topk: per token the k largest a, values ReLU(a) (at most k non-zeros). batchtopk in
        training mode (or before θ is known): the k·B largest ReLU(a) over the whole batch,
        grouped by token; in eval mode: ReLU(a)·1[ReLU(a) > θ]. The selection uses a's
        values only (a None: read from the encoder product, see :meth:`_encode`; x is the
        encoder's input, xe = x̃ its centred version); a gathering model's selected
        pre-activations carry the sparse encoder gradient of
        :class:`_SelectedPreacts`, otherwise autograd through the dense a.
        """
        B = xe.shape[0]
        with torch.no_grad():
            rows = offsets = None
            if self.arch == "topk":
                vals, idx = self._row_top(a, xe, min(self.k, self.d_sae))
            elif self._threshold_rule():
                rows, idx = (a > self.batchtopk_threshold).nonzero(as_tuple=True)  # ReLU(a) > θ ≥ 0
                vals = a[rows, idx]
            else:
                cand, cols = self._row_top(a, xe, min(self.d_sae, 2 * self.k))
                full_rows = a.__getitem__ if a is not None else partial(self._encoder_rows, xe)
                rows, idx, vals = _batch_topk(cand, cols, min(self.k * B, B * self.d_sae), self.d_sae, full_rows)
            if rows is not None:
                offsets = torch.zeros(B, dtype=torch.long, device=xe.device)
                offsets[1:] = torch.cumsum(torch.bincount(rows, minlength=B), 0)[:-1]
        if self._gathers():
            cache: dict = {}
            b_dec = self.b_dec if self.apply_b_dec_to_input else None
            pre = _SelectedPreacts.apply(x, b_dec, xe.detach(), self.W_enc, self.b_enc, idx, offsets, vals, cache)
            return ActiveLatents(idx, torch.relu(pre), offsets, cache)
        pre = a.gather(-1, idx) if rows is None else a[rows, idx]
        return ActiveLatents(idx, torch.relu(pre), offsets)

    @torch.no_grad()
    def _encoder_rows(self, xe: Tensor, rows: Tensor) -> Tensor:
        """The pre-activation rows a[rows] (no gradient) as :func:`~dictcheck.empirics.kernels.topk_select.encoder_topk`
        rounds them: from a product of at least ``ALIKE_ROWS`` rows (the requested ones, padded with
        others), or of the whole batch when it is smaller, so a heavy row of _batch_topk holds
        the very values its candidates came from. A product of these rows alone may round an ulp
        apart, and an entry equal to θ̂ could then fall below it and be lost from the selection."""
        n = xe.shape[0]
        if n <= ALIKE_ROWS:
            return self._encoder_affine(xe)[rows]
        pad = torch.arange(max(0, ALIKE_ROWS - rows.numel()), device=rows.device)
        return self._encoder_affine(xe[torch.cat([rows, pad])])[: rows.numel()]

    def encode(self, x: Tensor) -> Tensor:
        """Codes z of raw tokens x, shape (B, d_sae): the input normalisation (SAELens'
        ``normalize_activations``; none for models dictcheck trains) first. batchtopk in training mode
        selects over the whole batch."""
        z, _, act = self._encode(self.input_normalisation.apply(_as_2d(x, self.d_in))[0])
        return act.dense(self.d_sae) if z is None else z

    def unit_codes(self, z: Tensor) -> Tensor:
        """The codes of the unit atoms ŵ_d = w_d/‖w_d‖ that give the same reconstruction: z_d·‖w_d‖, or z
        itself with ``rescale_acts_by_decoder_norm`` (objective (1) is stated for unit atoms, docs/theory.md
        §1, §2.1)."""
        return z if self.rescale_acts_by_decoder_norm else z * self.W_dec.norm(dim=1)

    def decode(self, z: Tensor) -> Tensor:
        """x̂ = z @ W_dec + b_dec (z·(1/‖w_d‖) first with ``rescale_acts_by_decoder_norm``, as SAELens), in the
        SAE's input space (before any inverse normalisation)."""
        if z.shape[-1] != self.d_sae:
            raise ValueError(f"codes have last dimension {z.shape[-1]}, expected d_sae = {self.d_sae}")
        if self.rescale_acts_by_decoder_norm:
            z = z * (1 / self.W_dec.norm(dim=-1))
        return z @ self.W_dec + self.b_dec

    # ------------------------------------------------------------------ forward
    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> FeaturizerOutput:
        x = _as_2d(x, self.d_in)
        B = x.shape[0]
        x_in, state = self.input_normalisation.apply(x)
        z, a, act = self._encode(x_in)
        x_hat_in = act.decode(self.W_dec) + self.b_dec if self._gathers() else self.decode(z)
        x_hat = self.input_normalisation.invert(x_hat_in, state)
        resid = x - x_hat
        mse = resid.pow(2).sum() / B
        zero = mse.new_zeros(())
        if self.arch in ("relu", "abs"):
            sparsity = 2.0 * self.lam * z.abs().sum() / B
        elif self.arch == "jumprelu":
            sparsity = self.lam * StepFn.apply(a, self.threshold, self.jumprelu_bandwidth).sum() / B
        else:
            sparsity = zero
        aux = zero
        if self.arch in TOPK_FAMILY:
            if self.arch == "batchtopk" and self.training:
                self._update_batchtopk_threshold(act.vals)  # the batch's non-zero codes (and zeros)
            if self.aux_coef > 0 and dead_mask is not None:
                aux = self.auxk_loss(x_in, x_hat_in, a, dead_mask)
        live = None
        if self._gathers():
            nonzero = act.vals.detach() != 0
            live = act.idx[nonzero]
            l0 = nonzero.sum().to(x.dtype) / B  # = mean over tokens of ‖z_t‖₀
        else:
            l0 = (z != 0).sum(dim=-1).to(x.dtype).mean()
        return FeaturizerOutput(
            x_hat=x_hat, codes=partial(act.dense, self.d_sae) if z is None else z, loss=mse + sparsity + aux,
            mse=mse, sparsity_loss=sparsity, aux_loss=aux, l0=l0, live_latents=live,
        )

    @torch.no_grad()
    def _update_batchtopk_threshold(self, codes: Tensor) -> None:
        """θ update (module docstring) from the minimum positive entry of ``codes``."""
        pos = codes[codes > 0]
        if pos.numel() == 0:
            return
        m = pos.min().to(self.batchtopk_threshold.dtype)
        th = self.batchtopk_threshold
        if float(th) < 0:
            th.copy_(m)
        else:
            th.mul_(1.0 - self.batchtopk_momentum).add_(self.batchtopk_momentum * m)

    def auxk_loss(self, x: Tensor, x_hat: Tensor, a: Tensor, dead_mask: Tensor) -> Tensor:
        """AuxK loss (docs/ecosystem.md §3), see the module docstring. Exactly 0 when nothing is dead."""
        dead_mask = dead_mask.to(device=a.device, dtype=torch.bool).reshape(-1)
        if dead_mask.numel() != self.d_sae:
            raise ValueError(f"dead_mask has {dead_mask.numel()} entries, expected d_sae = {self.d_sae}")
        zero = a.new_zeros(())
        n_dead = int(dead_mask.sum())
        if n_dead == 0 or self.aux_coef <= 0:
            return zero
        k_aux = max(self.d_in // 2, 1)
        k_eff = min(k_aux, n_dead)
        e = (x - x_hat).detach()
        masked = torch.where(dead_mask, a, torch.full_like(a, -math.inf))
        vals, idx = torch.topk(masked, k_eff, dim=-1)
        aux = ActiveLatents(idx, torch.relu(vals), None)
        e_hat = aux.decode(self.W_dec) if self.sparse_decode else aux.dense(self.d_sae) @ self.W_dec  # no b_dec
        num = (e - e_hat).pow(2).sum()
        den = (e - e.mean(dim=0, keepdim=True)).pow(2).sum()
        scale = self.aux_coef * min(n_dead / k_aux, 1.0)
        if float(den) <= 0:
            return zero
        return scale * num / den

    def wants_dead_mask(self) -> bool:
        """AuxK needs the dead latents: the TopK family with ``aux_coef`` > 0."""
        return self.arch in TOPK_FAMILY and self.aux_coef > 0

    # ------------------------------------------------------------------ decoder-norm constraint
    def project_gradients_(self) -> None:
        """Training-loop hook: :meth:`remove_parallel_grad_` (every arch here has unit-norm atoms)."""
        self.remove_parallel_grad_()

    def project_parameters_(self) -> None:
        """Training-loop hook: :meth:`normalise_decoder_`."""
        self.normalise_decoder_()

    @torch.no_grad()
    def normalise_decoder_(self) -> None:
        """Rescale every decoder row (atom) to unit ℓ2 norm (zero rows are left at zero)."""
        norms = self.W_dec.norm(dim=1, keepdim=True)
        self.W_dec.div_(torch.where(norms > 0, norms, torch.ones_like(norms)))

    @torch.no_grad()
    def remove_parallel_grad_(self) -> None:
        """g_d ← g_d − (g_d·w_d / ‖w_d‖²) w_d for every decoder row (call before optimizer.step)."""
        g = self.W_dec.grad
        if g is None:
            return
        w = self.W_dec
        sq = w.pow(2).sum(dim=1, keepdim=True)
        coef = (g * w).sum(dim=1, keepdim=True) / torch.where(sq > 0, sq, torch.ones_like(sq))
        g.sub_(coef * w)

    # ------------------------------------------------------------------ save / load
    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """SAELens tensor names -> shapes for this arch."""
        shapes = {
            "W_enc": (self.d_in, self.d_sae),
            "b_enc": (self.d_sae,),
            "W_dec": (self.d_sae, self.d_in),
            "b_dec": (self.d_in,),
        }
        if self.arch in ("jumprelu", "batchtopk"):
            shapes["threshold"] = (self.d_sae,)
        return shapes

    def state_weights(self) -> dict[str, Tensor]:
        """SAELens-named detached copies: W_enc, b_enc, W_dec, b_dec (+ ``threshold`` for jumprelu, and for
        batchtopk its inference θ repeated d_sae times: SAELens saves a BatchTopK SAE as a JumpReLU with that
        threshold, which computes z = ReLU(a)·1[a > θ], the same as the eval-mode rule here; an unestimated
        θ < 0 is saved as 0)."""
        out = {n: getattr(self, n).detach().clone() for n in SAELENS_WEIGHT_NAMES}
        if self.arch == "jumprelu":
            out["threshold"] = self.log_threshold.detach().exp().clone()
        if self.arch == "batchtopk":
            out["threshold"] = self.batchtopk_threshold.detach().clamp_min(0.0).expand(self.d_sae).clone()
        return out

    @torch.no_grad()
    def load_state_weights(self, weights: dict[str, Tensor]) -> None:
        """Inverse of :meth:`state_weights`; names and shapes must match exactly (ValueError otherwise)."""
        shapes = self.weight_shapes()
        missing = sorted(set(shapes) - set(weights))
        extra = sorted(set(weights) - set(shapes))
        if missing or extra:
            raise ValueError(f"arch {self.arch!r}: missing tensors {missing}, unexpected tensors {extra}")
        for name, shape in shapes.items():
            t = torch.as_tensor(weights[name])
            if tuple(t.shape) != shape:
                raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        for name in SAELENS_WEIGHT_NAMES:
            p = getattr(self, name)
            p.copy_(torch.as_tensor(weights[name]).to(device=p.device, dtype=p.dtype))
        if self.arch == "jumprelu":
            th = torch.as_tensor(weights["threshold"]).to(device=self.log_threshold.device, dtype=self.log_threshold.dtype)
            if not bool((th > 0).all()):
                raise ValueError("tensor 'threshold' must be strictly positive (parameterised as log_threshold)")
            self.log_threshold.copy_(th.log())
        if self.arch == "batchtopk":
            th = torch.as_tensor(weights["threshold"])
            if not bool((th == th.reshape(-1)[0]).all()) or float(th.reshape(-1)[0]) < 0:
                raise ValueError("tensor 'threshold' of a batchtopk SAE must repeat one value >= 0 (its inference θ)")
            self.batchtopk_threshold.fill_(float(th.reshape(-1)[0]))

    def arch_fields(self) -> dict[str, float | int | None]:
        """Architecture fields for ``metadata.dictcheck.<arch>`` (batchtopk: the inference θ, or None)."""
        if self.arch == "batchtopk":
            th = float(self.batchtopk_threshold)
            return {"threshold": th if th >= 0 else None}
        return {}

    @torch.no_grad()
    def load_arch_fields(self, fields: dict) -> None:
        """Inverse of :meth:`arch_fields` (unknown keys are ignored). A batchtopk θ recorded as None (never
        estimated; the saved threshold tensor then holds 0) restores the batch rule."""
        if self.arch == "batchtopk" and "threshold" in fields:
            th = fields["threshold"]
            self.batchtopk_threshold.fill_(-1.0 if th is None else float(th))

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, d_in={self.d_in}, d_sae={self.d_sae}, k={self.k}, lam={self.lam}, aux_coef={self.aux_coef}"


def _compiled(t: Tensor) -> bool:
    """Whether the compiled kernels (:mod:`~dictcheck.empirics.kernels.topk_select`,
    :mod:`~dictcheck.empirics.kernels.sparse_products`) apply: CPU, float32/64."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)


def _as_2d(x: Tensor, d_in: int) -> Tensor:
    if x.dim() != 2 or x.shape[1] != d_in:
        raise ValueError(f"expected x of shape (B, d_in={d_in}) with tokens as rows, got {list(x.shape)}")
    return x


def _validate(
    arch: str,
    d_in: int,
    d_sae: int,
    k: int | None,
    lam: float | None,
    aux_coef: float,
    bandwidth: float,
    init_threshold: float,
    momentum: float,
) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown SAE architecture {arch!r}; expected one of {ARCHS}")
    for name, v in (("d_in", d_in), ("d_sae", d_sae)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if arch in TOPK_FAMILY:
        if k is None:
            raise ValueError(f"arch {arch!r} requires k (number of active latents per token)")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= d_sae:
            raise ValueError(f"arch {arch!r}: k must be an int in [1, d_sae={d_sae}], got {k!r}")
    if arch in LAM_ARCHS:
        if lam is None:
            raise ValueError(f"arch {arch!r} requires lam (the λ of theory objective (1) / the L0 coefficient)")
        if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
            raise ValueError(f"arch {arch!r}: lam must be a finite number >= 0, got {lam!r}")
    if not (math.isfinite(aux_coef) and aux_coef >= 0):
        raise ValueError(f"aux_coef must be finite and >= 0, got {aux_coef!r}")
    if arch == "jumprelu":
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(f"jumprelu_bandwidth must be > 0, got {bandwidth!r}")
        if not (math.isfinite(init_threshold) and init_threshold > 0):
            raise ValueError(f"init_threshold must be > 0, got {init_threshold!r}")
    if not 0 < momentum <= 1:
        raise ValueError(f"batchtopk_momentum must be in (0, 1], got {momentum!r}")


def make_sae(
    arch: str,
    d_in: int,
    d_sae: int,
    *,
    k: int | None = None,
    lam: float | None = None,
    aux_coef: float = 0.0,
    jumprelu_bandwidth: float = 1e-3,
    init_threshold: float = 1e-3,
    b_dec_init: Tensor | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    apply_b_dec_to_input: bool = True,
    batchtopk_momentum: float = 0.01,
) -> SparseAutoencoder:
    """Build and initialise an SAE (docs/ecosystem.md §3 init): unit-norm random W_dec rows from a generator
    seeded by ``seed``, W_enc = W_decᵀ, b_enc = 0, b_dec = ``b_dec_init`` or 0.

    Raises ValueError for an unknown arch, a missing/invalid ``k`` (topk, batchtopk) or ``lam``
    (relu, jumprelu, abs), or a ``b_dec_init`` of the wrong shape.
    """
    sae = SparseAutoencoder(
        arch,
        d_in,
        d_sae,
        k=k,
        lam=lam,
        aux_coef=aux_coef,
        jumprelu_bandwidth=jumprelu_bandwidth,
        init_threshold=init_threshold,
        apply_b_dec_to_input=apply_b_dec_to_input,
        batchtopk_momentum=batchtopk_momentum,
        dtype=dtype,
    )
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    w = torch.randn(d_sae, d_in, generator=gen, dtype=torch.float64)
    w = w / w.norm(dim=1, keepdim=True)
    with torch.no_grad():
        sae.W_dec.copy_(w.to(dtype))
        sae.normalise_decoder_()
        sae.W_enc.copy_(sae.W_dec.detach().T)
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    sae.set_centring_(b_dec_init)
    return sae
