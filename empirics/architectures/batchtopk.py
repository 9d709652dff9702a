"""The BatchTopK SAE ``batchtopk`` (SAELens ``batchtopk``, saved for inference as ``jumprelu``;
dictionary_learning ``BatchTopKSAE``; docs/ecosystem.md §1, §3).

Training mode keeps the top k·B entries of ReLU(a) over the whole batch. **Decision (inference
threshold):** a scalar θ is tracked in training mode as an exponential running mean of the minimum kept
(positive) activation, θ ← (1 − m)·θ + m·min_kept with m = ``batchtopk_momentum`` = 0.01 (SAELens'
``topk_threshold`` rule; dictionary_learning uses the same idea with β = 0.999), initialised by the first
training batch. In eval mode z = ReLU(a)·1[ReLU(a) > θ] (the dictionary_learning inference rule). Before any
training batch has been seen (θ < 0) eval mode falls back to the batch rule. θ is saved as SAELens saves a
BatchTopK SAE for inference, a JumpReLU ``threshold`` tensor repeating θ (which computes the same
z = ReLU(a)·1[a > θ]), and in ``metadata.dictcheck.batchtopk.threshold`` (None while unestimated; the key
the dictionary_learning reader uses). loss = mse (+ AuxK).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from dictcheck.empirics.architectures.base import (
    ArchOptions,
    ForeignWeights,
    OptionsContext,
    Schema,
    option,
    register,
    require_real,
)
from dictcheck.empirics.architectures.linear_sae import Encoding
from dictcheck.empirics.architectures.topk import TopK, TopKOptions, TopKSAE
from dictcheck.empirics.kernels.topk_select import ALIKE_ROWS

__all__ = ["BatchTopKOptions", "BatchTopKSAE", "BatchTopK"]


@dataclass(frozen=True)
class BatchTopKOptions(TopKOptions):
    """batchtopk: also the momentum of its inference threshold (module docstring)."""

    batchtopk_momentum: float = option(0.01, type=float, help="momentum of batchtopk's running inference "
                                       "threshold (default 0.01)")

    def resolved(self, arch: str, d_sae: int) -> BatchTopKOptions:
        base = TopKOptions.resolved(self, arch, d_sae)
        m = require_real("batchtopk_momentum", self.batchtopk_momentum, positive=True)
        if m > 1:
            raise ValueError(f"batchtopk_momentum must be in (0, 1], got {m!r}")
        return replace(base, batchtopk_momentum=m)


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


class BatchTopKSAE(TopKSAE):
    """The k·B largest activations of the batch in training, the threshold θ at inference (module docstring)."""

    arch = "batchtopk"

    def __init__(self, d_in: int, d_sae: int, options: BatchTopKOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(d_in, d_sae, options, dtype=dtype)
        self.batchtopk_momentum = float(options.batchtopk_momentum)
        # Scalar inference threshold θ; −1 means "not estimated yet".
        self.register_buffer("batchtopk_threshold", torch.tensor(-1.0, dtype=dtype))

    def _threshold_rule(self) -> bool:
        """Eval mode with a known θ (the per-entry rule of the module docstring)."""
        return not self.training and float(self.batchtopk_threshold) >= 0

    def _reads_preacts(self) -> bool:
        return super()._reads_preacts() or self._threshold_rule()

    def select(self, a: Tensor | None, xe: Tensor) -> tuple[Tensor | None, Tensor, Tensor]:
        """In training mode (or before θ is known): the k·B largest ReLU(a) over the whole batch, grouped by
        token; in eval mode: the entries with ReLU(a) > θ."""
        if self._threshold_rule():
            rows, idx = (a > self.batchtopk_threshold).nonzero(as_tuple=True)  # ReLU(a) > θ ≥ 0
            return rows, idx, a[rows, idx]
        cand, cols = self._row_top(a, xe, min(self.d_sae, 2 * self.k))
        full_rows = a.__getitem__ if a is not None else partial(self._encoder_rows, xe)
        B = xe.shape[0]
        return _batch_topk(cand, cols, min(self.k * B, B * self.d_sae), self.d_sae, full_rows)

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

    def observe_(self, enc: Encoding) -> None:
        """The θ update (module docstring) from the batch's non-zero codes (and zeros)."""
        self._update_batchtopk_threshold(enc.active.vals)

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

    def extra_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"threshold": (self.d_sae,)}

    def extra_state(self) -> dict[str, Tensor]:
        """θ repeated d_sae times, as SAELens saves a BatchTopK SAE (an unestimated θ < 0 is saved as 0)."""
        return {"threshold": self.batchtopk_threshold.detach().clamp_min(0.0).expand(self.d_sae).clone()}

    def load_extra_state(self, weights: Mapping[str, Tensor]) -> None:
        th = weights["threshold"]
        if not bool((th == th.reshape(-1)[0]).all()) or float(th.reshape(-1)[0]) < 0:
            raise ValueError("tensor 'threshold' of a batchtopk SAE must repeat one value >= 0 (its inference θ)")
        self.batchtopk_threshold.fill_(float(th.reshape(-1)[0]))

    def arch_fields(self) -> dict[str, float | int | None]:
        """``metadata.dictcheck.batchtopk``: the inference θ, or None."""
        th = float(self.batchtopk_threshold)
        return {"threshold": th if th >= 0 else None}

    @torch.no_grad()
    def load_arch_fields(self, fields: dict) -> None:
        """Inverse of :meth:`arch_fields` (unknown keys are ignored). A θ recorded as None (never estimated; the
        saved threshold tensor then holds 0) restores the batch rule."""
        if "threshold" in fields:
            th = fields["threshold"]
            self.batchtopk_threshold.fill_(-1.0 if th is None else float(th))


@register
class BatchTopK(TopK):
    """The k·B largest activations of the batch in training, a running threshold at inference."""

    name = "batchtopk"
    #: SAELens saves a BatchTopK SAE for inference as a JumpReLU with its θ as threshold (docs/ecosystem.md §1).
    saved_name = "jumprelu"
    reads_foreign = False
    dl_class = "BatchTopKSAE"
    saelens_training_name = "batchtopk"
    #: k only chooses the batch's entries in training: the saved model applies θ.
    saelens_training_fields = frozenset({"decoder_init_norm", "use_sparse_activations", "aux_loss_coefficient",
                                         "topk_threshold_lr"})
    objective = "mse with k·B active latents per batch (+ AuxK)"
    Options = BatchTopKOptions
    Model = BatchTopKSAE

    def extra_schema(self, d_in: int, d_sae: int) -> Schema:
        return {"threshold": ((d_sae,), True)}

    def from_saelens_training(self, weights: dict[str, Tensor], cfg: Any) -> dict[str, Tensor]:
        """SAELens' training state holds the scalar ``topk_threshold`` (float64); ``save_inference_model``
        saves it as the JumpReLU ``threshold`` tensor, θ repeated (in the SAE's dtype)."""
        weights = dict(weights)
        if "topk_threshold" in weights:
            theta = weights.pop("topk_threshold")
            weights["threshold"] = torch.full((cfg.d_sae,), float(theta.reshape(-1)[0]) if theta.numel() else 0.0,
                                              dtype=weights["W_enc"].dtype)
        return weights

    def ddp_inexactness(self, options: ArchOptions) -> str | None:
        return ("batchtopk keeps the top k·B/P activations of each rank's B/P tokens (not the top k·B of the "
                "global batch), and its inference threshold follows rank 0's batches")

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        return {**super().draw_options(draw, st, ctx), "batchtopk_momentum": draw(st.sampled_from([0.01, 0.5]))}

    def from_dictionary_learning(self, sd: Mapping[str, Tensor]) -> ForeignWeights:
        """BatchTopKSAE: TopK's names, and its scalar inference ``threshold`` saved as SAELens saves it (θ
        repeated as a JumpReLU threshold) and kept in ``metadata.dictcheck.batchtopk.threshold``."""
        weights, _, cfg = super().from_dictionary_learning(sd)
        theta = None
        if "threshold" in sd:
            if sd["threshold"].numel() != 1:
                raise ValueError(f"entry 'threshold' must be one number, got shape {list(sd['threshold'].shape)}")
            theta = float(sd["threshold"].reshape(-1)[0])
        weights["threshold"] = torch.full((weights["W_enc"].shape[1],), max(theta or 0.0, 0.0),
                                          dtype=weights["W_enc"].dtype)
        return weights, {"threshold": theta}, cfg
