"""The vocabulary-anchored TopK SAE ``vasae`` (model in :mod:`dictcheck.empirics.vasae_models`;
docs/vasae.md §1–§4, §9)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dictcheck.empirics.architectures.base import (
    ArchOptions,
    Architecture,
    Schema,
    option,
    register,
    require_int,
    require_real,
)
from dictcheck.empirics.architectures.sae import linear_schema
from dictcheck.empirics.featurizer import Featurizer
from dictcheck.empirics.vasae_models import (
    ANCHOR_MODES,
    AUTHORS_INIT_STD,
    INITS,
    TIES,
    VocabAnchoredSAE,
    load_embedding,
)

__all__ = ["VasaeOptions", "Vasae", "make_vasae"]


@dataclass(frozen=True)
class VasaeOptions(ArchOptions):
    """k (TopK size) and the anchor settings (JSON values)."""

    k: int | None = option(None, type=int, help="active latents per token (topk, batchtopk, vasae); active "
                           "blocks per token (bsf-vanilla, bsf-grassmann)")
    anchor_coef: float = option(0.0, type=float, help="λ_anchor of the anchor loss (default 0: a plain TopK SAE)")
    anchor_every: int = option(1, type=int, help="add the anchor term every M steps (default 1)")
    anchor_refresh: int | None = option(None, type=int, help="refresh the nearest tokens every M steps, a multiple "
                                        "of anchor_every (default: every anchor step)")
    anchor_mode: str = option("nearest", type=str, choices=ANCHOR_MODES, help="anchor mode (default nearest)")
    anchor_chunk: int | None = option(None, type=int, help="vocabulary rows per cosine block (default: auto, "
                                      "≤ 256 MB)")
    anchor_source: str | None = option(None, type=str, help="token embeddings W_E: smollm2, tinycoder, a model "
                                       "dir or a (V, D) .npy")
    tie: str = option("none", type=str, choices=TIES, help="hard: decoder tied to W_E (the baseline)")
    vocab_ids: list[int] | None = option(None, cli=False, help="d_sae distinct token ids a hard-tied decoder uses")
    init: str = option("torch", type=str, choices=INITS, help="torch: nn.Linear's default; authors: every weight "
                       "N(0, 0.02), zero biases")

    def resolved(self, arch: str, d_sae: int, *, embedding_given: bool = False) -> VasaeOptions:
        """Validate (ValueError, one line). ``anchor_source`` is required when λ_anchor > 0 or
        tie = "hard", unless ``embedding_given`` (the caller passes W_E itself)."""
        if self.k is None or isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) \
                or not 1 <= self.k <= d_sae:
            raise ValueError(f"arch 'vasae' needs k, an int in [1, d_sae={d_sae}], got {self.k!r}")
        coef = require_real("anchor_coef", self.anchor_coef)
        every = require_int("anchor_every", self.anchor_every, 1)
        refresh = every if self.anchor_refresh is None else require_int("anchor_refresh", self.anchor_refresh, 1)
        if refresh % every:
            raise ValueError(f"anchor_refresh must be a multiple of anchor_every={every}, got {refresh}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if self.anchor_mode not in ANCHOR_MODES:
            raise ValueError(f"anchor_mode must be one of {ANCHOR_MODES}, got {self.anchor_mode!r}")
        if self.anchor_chunk is not None:
            try:
                require_int("anchor_chunk", self.anchor_chunk, 1)
            except ValueError:
                raise ValueError(f"anchor_chunk must be an int >= 1 or null (auto), got {self.anchor_chunk!r}") from None
        if self.tie not in TIES:
            raise ValueError(f"tie must be one of {TIES}, got {self.tie!r}")
        src = self.anchor_source
        if src is not None and (not isinstance(src, str) or not src):
            raise ValueError(f"anchor_source must be a non-empty string or null, got {src!r}")
        if src is None and not embedding_given and (coef > 0 or self.tie == "hard"):
            raise ValueError("vasae with anchor_coef > 0 or tie='hard' needs anchor_source (a model name or a .npy path)")
        if self.tie == "hard" and coef > 0:
            raise ValueError("tie='hard' fixes the decoder to W_E, so anchor_coef must be 0")
        ids = self.vocab_ids
        if ids is not None:
            if self.tie != "hard":
                raise ValueError("vocab_ids selects the rows of W_E a hard-tied decoder uses; it needs tie='hard'")
            if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in ids):
                raise ValueError("vocab_ids must be a list of non-negative token ids")
            if len(ids) != d_sae or len(set(ids)) != len(ids):
                raise ValueError(f"vocab_ids must hold d_sae={d_sae} distinct token ids, got {len(ids)} "
                                 f"({len(set(ids))} distinct)")
            ids = [int(v) for v in ids]
        return replace(self, k=int(self.k), anchor_coef=coef, anchor_every=every, anchor_refresh=refresh, vocab_ids=ids)


def make_vasae(d_in: int, d_sae: int, *, k: int, embedding: np.ndarray | Tensor | None = None,
               anchor_coef: float = 0.0, anchor_every: int = 1, anchor_refresh: int | None = None,
               anchor_mode: str = "nearest", anchor_chunk: int | None = None, anchor_source: str | None = None,
               tie: str = "none", vocab_ids: list[int] | None = None, init: str = "torch",
               b_dec_init: Tensor | None = None, seed: int = 0, dtype: torch.dtype = torch.float32) -> VocabAnchoredSAE:
    """Build and initialise a VASAE (docs of :mod:`dictcheck.empirics.vasae_models`). ``embedding`` (a
    float (V, D) array, kept in its dtype) overrides loading it from ``anchor_source``. ValueError for bad
    options, or a hard tie whose W_E (rows) is not (d_sae, d_in). b_dec = ``b_dec_init`` or 0 (always 0
    with a hard tie)."""
    for name, v in (("d_in", d_in), ("d_sae", d_sae)):
        require_int(name, v, 1)
    opts = VasaeOptions(k=k, anchor_coef=anchor_coef, anchor_every=anchor_every, anchor_refresh=anchor_refresh,
                        anchor_mode=anchor_mode, anchor_chunk=anchor_chunk, anchor_source=anchor_source, tie=tie,
                        vocab_ids=vocab_ids, init=init).resolved("vasae", d_sae, embedding_given=embedding is not None)
    E: np.ndarray | None = None
    if embedding is not None:
        E = np.array(embedding.detach().cpu().numpy() if isinstance(embedding, Tensor) else embedding)
        if E.ndim != 2 or E.dtype.kind != "f" or not np.isfinite(E).all():
            raise ValueError(f"embedding must be a finite (V, D) matrix, got shape {list(E.shape)}")
    elif tie == "hard":
        E = load_embedding(opts.anchor_source)
    if E is not None and E.shape[1] != d_in:
        raise ValueError(f"embedding width D={E.shape[1]} differs from the SAE's d_in={d_in}")
    model = VocabAnchoredSAE(d_in, d_sae, embedding=E, dtype=dtype, **opts.to_dict())
    model.arch_options = opts
    gen = torch.Generator(device="cpu").manual_seed(int(seed))

    def uniform(shape: tuple[int, ...], bound: float) -> Tensor:
        return ((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound).to(dtype)

    def normal(shape: tuple[int, ...]) -> Tensor:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * AUTHORS_INIT_STD).to(dtype)

    with torch.no_grad():
        if init == "authors":
            model.W_enc.copy_(normal((d_in, d_sae)))
            model.b_enc.zero_()
            model.W_dec.copy_(normal((d_sae, d_in)))
        else:
            model.W_enc.copy_(uniform((d_in, d_sae), 1 / math.sqrt(d_in)))
            model.b_enc.copy_(uniform((d_sae,), 1 / math.sqrt(d_in)))
            model.W_dec.copy_(uniform((d_sae, d_in), 1 / math.sqrt(d_sae)))
        if tie == "hard":
            assert E is not None
            ids = opts.vocab_ids
            if ids is None and E.shape[0] != d_sae:
                raise ValueError(f"tie='hard' needs d_sae = n_vocab: W_E is {E.shape[0]}x{E.shape[1]} but the SAE is "
                                 f"d_sae={d_sae}, d_in={d_in} (or pass vocab_ids, d_sae token ids)")
            if ids is not None and max(ids) >= E.shape[0]:
                raise ValueError(f"vocab_ids holds token id {max(ids)} >= n_vocab={E.shape[0]}")
            model.W_dec.copy_(torch.as_tensor(E if ids is None else E[ids]).to(dtype))
            model.b_dec.zero_()
        else:
            model.set_centring_(b_dec_init)
    return model


@register
class Vasae(Architecture):
    """TopK SAE with a free decoder anchored to the token embeddings; no b_dec subtraction."""

    name = "vasae"
    family = "vasae"
    family_title = "vocabulary-anchored SAE (vasae; --k is its TopK size)"
    fields_key = "vasae"
    saved_name = "topk"
    k_in_cfg = True
    apply_b_dec_to_input = False
    decoder_norm = "none"
    #: docs/vasae.md §1, §6: no b_dec subtraction and no median init (b_dec starts at 0).
    b_dec_inits = ("zero",)
    Options = VasaeOptions

    def default_lr(self, d_sae: int) -> float:
        return 1e-3  # docs/vasae.md §6: the authors' lr

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return linear_schema(d_in, d_sae)

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        return make_vasae(d_in, d_sae, seed=seed, dtype=dtype, **options.to_dict())
