"""The non-zero codes of a TopK-family batch and the autograd functions that keep its step sparse
(docs/ecosystem.md §3, "The TopK family's sparse step"; benchmarks/RESULTS.md §4).

* :class:`ActiveLatents`: token t's active latents and their values; decodes by gathering the active
  decoder rows, O(B·k·d_in) instead of the dense product's O(B·d_sae·d_in).
* :class:`GatheredDecode`: that decode with the compiled backward (∂L/∂z at the active entries and
  ∂L/∂W_dec = Zᵀg in one pass, :mod:`.sparse_products`).
* :class:`SelectedPreacts`: the selected pre-activations with the sparse encoder backward.
* :func:`compiled`: whether the compiled kernels apply to a tensor (CPU, float32/64).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dictcheck.empirics.kernels.sparse_products import (
    LatentGroups,
    by_latent,
    gather_dots,
    scatter_rows,
    scatter_rows_and_dots,
    tile_tokens,
)

__all__ = ["ActiveLatents", "GatheredDecode", "SelectedPreacts", "compiled"]


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
    in the dense path); on the CPU (float32/64) both are compiled (:class:`GatheredDecode`,
    :mod:`.sparse_products`). Same values as the dense path up to the order
    of summation. ``cache`` holds the entries' token indices and their grouping by latent, built
    once per batch and shared with the encoder's backward (:class:`SelectedPreacts`).
    """

    idx: Tensor
    vals: Tensor
    offsets: Tensor | None
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    def decode(self, W_dec: Tensor) -> Tensor:
        """Σ_j vals_tj · W_dec[idx_tj] per token, (B, d_in) (no bias)."""
        if compiled(W_dec) and torch.is_grad_enabled() and (self.vals.requires_grad or W_dec.requires_grad):
            return GatheredDecode.apply(self.vals, W_dec, self.idx, self.offsets, self.cache)
        return torch.nn.functional.embedding_bag(
            self.idx, W_dec, self.offsets, mode="sum", per_sample_weights=self.vals
        )

    def by_latent(self, d_sae: int, G: Tensor) -> LatentGroups:
        """The entries grouped by latent (:func:`~dictcheck.empirics.kernels.sparse_products.by_latent`) for
        products with the rows of G (B, e): within tiles of tokens when the compiled products apply
        (:func:`~dictcheck.empirics.kernels.sparse_products.tile_tokens`), one tile otherwise; built at the
        first call for that tiling."""
        tile = None
        if compiled(G):
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


class GatheredDecode(torch.autograd.Function):
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


class SelectedPreacts(torch.autograd.Function):
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
            if compiled(xe):
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


def compiled(t: Tensor) -> bool:
    """Whether the compiled kernels (:mod:`~dictcheck.empirics.kernels.topk_select`,
    :mod:`.sparse_products`) apply: CPU, float32/64."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)
