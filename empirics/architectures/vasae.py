"""VASAE: TopK SAE whose decoder columns are anchored to the vocabulary (docs/vasae.md §1–§4, §9).

Layout: tokens are ROWS. ``x`` is (B, d_in), codes are (B, d_sae). Parameters use the SAELens
names: W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]. The rows of W_dec are
the decoder columns w_d of the spec (W = W_decᵀ, D × d_z).

Model (§1), exactly the authors' code:

* a = x @ W_enc + b_enc (**no** b_dec subtraction, no input normalisation);
* z = TopK_k(ReLU(a)): the ≤ k largest positive entries per token, all others 0;
* x̂ = z @ W_dec + b_dec, the decoder free (no unit-norm constraint, no gradient projection);
* reconstruction term ``mse`` = (1/(B·D)) Σ_t ‖x_t − x̂_t‖² (per-element MSE).

Anchor loss (§2, §3), with Ê the row-normalised frozen embedding W_E (V × D) and ŵ_d = w_d/‖w_d‖
(norms clamped at 1e-8 so a zero column gives no NaN):

* ``nearest``: s_d = max_v ŵ_d·ê_v; L_anchor = −(1/d_z) Σ_d s_d over ALL d_z columns (dead ones too).
  dictcheck's gathered form: under no-grad the argmax t_d is found chunk-wise (``anchor_chunk``
  columns per [chunk × V] cosine block), then L_anchor = −(1/d_z) Σ_d ŵ_d·ê_{t_d} from the gathered
  rows. Value and gradient equal the full max wherever the argmax is unique; the backward pass
  costs O(d_z·D) instead of O(d_z·V·D).
* ``logsumexp`` / ``softmax`` (optional modes, [code]): s_d = log Σ_{i≤10} exp(c_di), resp.
  Σ_i softmax(c_d)_i c_di, over the top-10 cosines c_d (temperature 1, [open] → Decision), the
  top-10 indices found under no-grad and the cosines gathered, as above.

The training loss is mse + λ_anchor · L_anchor, where the anchor term is reported as ``aux_loss``.
It is computed only in training mode, only when λ_anchor > 0, and only on optimiser steps t with
t mod ``anchor_every`` = 0 (the training loop calls :meth:`VocabAnchoredSAE.set_step`). λ_anchor = 0
is the paper's plain SAE (§4). The gathered tokens t_d are refreshed (the full chunked max, the
expensive part) only on steps with t mod ``anchor_refresh`` = M_refresh = 0 (a multiple of
``anchor_every``; default: every anchor step) and held in the buffer ``anchor_ids`` in between, so
the anchor can act on every step at O(d_z·D) while the argmax costs O(d_z·V·D) once per M_refresh
steps (§3).

Hard-tied baseline (§4, ``tie="hard"``): W_dec = W_E (d_sae = V, d_in = D required; a one-line
ValueError otherwise), frozen, b_dec = 0 frozen; only the encoder trains. The labelled extension
``vocab_ids`` (a list of d_sae distinct token ids, e.g. the most frequent tokens of the corpus)
ties to those rows of W_E instead, for d_z < V (spec's ``vocab_subset="top_frequency"``).

W_E is frozen and never saved (§2, §9): ``anchor_source`` names it ("smollm2", "tinycoder", a local
model directory, or a path to a ``.npy`` (V, D) file) and :meth:`VocabAnchoredSAE.arch_fields`
stores the source and the SHA-256 of its float32 bytes under ``metadata.dictcheck.vasae``.

Init (option ``init``, from a generator seeded by ``seed``; b_dec = 0, the training loop sets the
centring vector):

* ``"torch"`` (default; Decision): torch's ``nn.Linear`` default, W_enc, b_enc ~ U(±1/√D) and
  W_dec ~ U(±1/√d_z);
* ``"authors"``: the authors' code (issue 16), every weight N(0, 0.02²) — W_enc and W_dec — and
  b_enc = 0. Each column then has ‖w_d‖ ≈ 0.02·√D (0.48 at D = 576), and a dead column's only
  gradient, the anchor's, is λ_anchor·sin θ_d/(d_z‖w_d‖) (docs/vasae.md §8).
"""

from __future__ import annotations

import functools
import hashlib
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
    OptionsContext,
    Schema,
    option,
    register,
    require_int,
    require_real,
)
from dictcheck.empirics.architectures.featurizer import Featurizer, FeaturizerOutput
from dictcheck.empirics.architectures.linear_sae import linear_schema
from dictcheck.empirics.io.safe_files import read_npy

__all__ = [
    "ANCHOR_MODES",
    "ANCHOR_TOPK",
    "CHUNK_BYTES",
    "TIES",
    "VocabAnchoredSAE",
    "INITS",
    "anchor_loss",
    "anchor_width",
    "default_chunk",
    "embedding_sha256",
    "load_embedding",
    "nearest_tokens",
    "top_tokens",
    "VasaeOptions",
    "Vasae",
    "make_vasae",
]

ANCHOR_MODES = ("nearest", "logsumexp", "softmax")
#: Number of top cosines the soft modes use (the authors' code).
ANCHOR_TOPK = 10
TIES = ("none", "hard")
#: Initialisations (Decision, module docstring): torch's nn.Linear default, or the authors' N(0, 0.02).
INITS = ("torch", "authors")
#: Standard deviation of every weight under init = "authors" (the authors' code; issue 16).
AUTHORS_INIT_STD = 0.02
#: Decision (§3): the default chunk keeps one [chunk × V] cosine block ≤ 256 MB (decimal, as the
#: spec's "2048 × 49152 ≈ 0.40 GB").
CHUNK_BYTES = 256 * 10**6
_NORM_EPS = 1e-8
_SAVE_NAMES = ("W_enc", "b_enc", "W_dec", "b_dec")


# ------------------------------------------------------------------------------------------ math
def _unit_rows(M: Tensor) -> Tensor:
    """Rows divided by max(‖row‖, 1e-8)."""
    return M / M.norm(dim=-1, keepdim=True).clamp_min(_NORM_EPS)


def default_chunk(n_vocab: int, itemsize: int) -> int:
    """Columns per [chunk × n_vocab] cosine block so that one block takes ≤ :data:`CHUNK_BYTES`."""
    return max(1, CHUNK_BYTES // (n_vocab * itemsize))


@torch.no_grad()
def top_tokens(W: Tensor, E: Tensor, n: int = 1, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """Top-``n`` cosines and token ids per row of ``W`` (d_z, D) against the rows of ``E`` (V, D).

    Computed chunk-wise (``chunk`` rows of W per block; default :func:`default_chunk` for blocks in
    W's dtype, to which E is cast), both sides L2-normalised. Returns (cos (d_z, n) descending,
    ids (d_z, n) int64).
    """
    if W.dim() != 2 or E.dim() != 2 or W.shape[1] != E.shape[1]:
        raise ValueError(f"need W (d_z, D) and E (V, D) with the same D, got {list(W.shape)} and {list(E.shape)}")
    if not 1 <= n <= E.shape[0]:
        raise ValueError(f"n must be in [1, V={E.shape[0]}], got {n}")
    chunk = default_chunk(E.shape[0], W.element_size()) if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    E_hat = _unit_rows(E.to(W.dtype))
    W_hat = _unit_rows(W.detach())
    vals, ids = [], []
    for start in range(0, W.shape[0], chunk):
        v, i = torch.topk(W_hat[start:start + chunk] @ E_hat.T, n, dim=1)
        vals.append(v)
        ids.append(i)
    return torch.cat(vals), torch.cat(ids)


def nearest_tokens(W: Tensor, E: Tensor, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """(s, t): alignment score s_d = max_v cos(w_d, e_v) and intrinsic token t_d (§0), chunk-wise."""
    s, t = top_tokens(W, E, 1, chunk)
    return s[:, 0], t[:, 0]


def anchor_width(mode: str, n_vocab: int) -> int:
    """Token ids per column the anchor gathers: 1 in nearest mode, min(10, V) in the soft modes."""
    if mode not in ANCHOR_MODES:
        raise ValueError(f"anchor_mode must be one of {ANCHOR_MODES}, got {mode!r}")
    return 1 if mode == "nearest" else min(ANCHOR_TOPK, n_vocab)


def anchor_loss(W: Tensor, E: Tensor, mode: str = "nearest", chunk: int | None = None,
                ids: Tensor | None = None) -> Tensor:
    """L_anchor = −(1/d_z) Σ_d s_d in the gathered form (module docstring), differentiable in W.

    W is (d_z, D) (the rows of W_dec), E the frozen embedding (V, D). ``ids`` ((d_z, n) token ids,
    n = :func:`anchor_width`) are the tokens to gather; None finds them now (the exact max). Stale ids
    (an earlier refresh) give the cosines to those tokens, which may no longer be the largest.
    """
    n = anchor_width(mode, E.shape[0])
    if ids is None:
        _, ids = top_tokens(W, E, n, chunk)
    elif tuple(ids.shape) != (W.shape[0], n):
        raise ValueError(f"ids must have shape (d_z={W.shape[0]}, {n}), got {list(ids.shape)}")
    cos = torch.einsum("dD,dnD->dn", _unit_rows(W), _unit_rows(E[ids].to(W.dtype)))
    if mode == "nearest":
        s = cos[:, 0]
    elif mode == "logsumexp":
        s = torch.logsumexp(cos, dim=1)
    else:
        s = (torch.softmax(cos, dim=1) * cos).sum(dim=1)
    return -s.mean()


# ------------------------------------------------------------------------------------ embedding
def embedding_sha256(E: np.ndarray) -> str:
    """SHA-256 hex of the C-contiguous float32 bytes of W_E (the hash §9 stores)."""
    return hashlib.sha256(np.ascontiguousarray(E, dtype=np.float32).tobytes()).hexdigest()


@functools.lru_cache(maxsize=4)
def _cached_embedding(source: str) -> np.ndarray:
    if source.endswith(".npy"):
        E = read_npy(source, "anchor_source")
    else:
        from dictcheck.empirics.data.lm_models import load_lm

        E = load_lm(source).embedding()
        E = E.detach().cpu().numpy() if isinstance(E, Tensor) else np.asarray(E)
    if E.ndim != 2 or E.shape[0] < 1 or E.shape[1] < 1:
        raise ValueError(f"anchor_source {source!r}: embedding must be a (V, D) matrix, got shape {list(E.shape)}")
    if not np.isfinite(E).all():
        raise ValueError(f"anchor_source {source!r}: embedding has non-finite entries")
    if float(np.abs(E).max()) > float(np.finfo(np.float32).max):
        raise ValueError(f"anchor_source {source!r}: embedding entries exceed the float32 range")
    E = np.array(E, dtype=np.float32)
    E.setflags(write=False)
    return E


def load_embedding(source: str) -> np.ndarray:
    """W_E (V, D) float32 from ``anchor_source`` (model name / HF dir via ``empirics.data.lm_models.load_lm``,
    or a ``.npy`` file); cached per source. ValueError for an unreadable or malformed source."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"anchor_source must be a model name, a model directory or a .npy path, got {source!r}")
    return _cached_embedding(source)


# ---------------------------------------------------------------------------------------- model
class VocabAnchoredSAE(Featurizer):
    """VASAE (arch ``vasae``); see the module docstring. Build with :func:`make_vasae`."""

    arch = "vasae"

    def __init__(self, d_in: int, d_sae: int, *, k: int, embedding: np.ndarray | None, anchor_coef: float,
                 anchor_every: int, anchor_refresh: int, anchor_mode: str, anchor_chunk: int | None,
                 anchor_source: str | None, tie: str, vocab_ids: list[int] | None, init: str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.d_in, self.d_sae, self.k = int(d_in), int(d_sae), int(k)
        self.anchor_coef = float(anchor_coef)
        self.anchor_every = int(anchor_every)
        self.anchor_refresh = int(anchor_refresh)
        self.anchor_mode = anchor_mode
        self.init = init
        self.anchor_chunk = anchor_chunk
        self.anchor_source = anchor_source
        self.tie = tie
        self.vocab_ids = None if vocab_ids is None else [int(v) for v in vocab_ids]
        self._embedding_np = embedding
        self._embedding: Tensor | None = None
        self._expected_sha256: str | None = None
        self._step = 0
        self.W_enc = torch.nn.Parameter(torch.zeros(d_in, d_sae, dtype=dtype))
        self.b_enc = torch.nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        frozen = tie == "hard"
        self.W_dec = torch.nn.Parameter(torch.zeros(d_sae, d_in, dtype=dtype), requires_grad=not frozen)
        self.b_dec = torch.nn.Parameter(torch.zeros(d_in, dtype=dtype), requires_grad=not frozen)
        #: The gathered tokens t_d of the last refresh (−1: none yet); a buffer, so a resumed run
        #: continues with the same stale tokens as an uninterrupted one.
        width = anchor_width(anchor_mode, ANCHOR_TOPK if embedding is None else embedding.shape[0])
        self.register_buffer("anchor_ids", torch.full((d_sae, width), -1, dtype=torch.int64))
        #: (step, top-1 cosines s_d) of the last refresh, for monitoring; None before the first.
        self.last_refresh: tuple[int, Tensor] | None = None

    # -------------------------------------------------------------- embedding
    def embedding(self) -> Tensor:
        """The frozen W_E (V, D) on the model's device and dtype (loaded from ``anchor_source`` on first use)."""
        if self._embedding_np is None:
            if self.anchor_source is None:
                raise ValueError("this vasae model has no embedding: set anchor_source")
            E_np = load_embedding(self.anchor_source)
            if self._expected_sha256 not in (None, embedding_sha256(E_np)):
                raise ValueError(f"anchor_source {self.anchor_source!r} no longer holds the embedding this model was "
                                 "trained with (SHA-256 differs from metadata.dictcheck.vasae.embedding_sha256)")
            self._embedding_np = E_np
        E = self._embedding
        if E is None or E.device != self.W_dec.device or E.dtype != self.W_dec.dtype:
            E = torch.tensor(self._embedding_np, dtype=self.W_dec.dtype, device=self.W_dec.device)
            self._embedding = E
        return E

    # -------------------------------------------------------------- forward
    def encode(self, x: Tensor) -> Tensor:
        """z = TopK_k(ReLU(x @ W_enc + b_enc)), shape (B, d_sae)."""
        if x.dim() != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"expected x of shape (B, d_in={self.d_in}) with tokens as rows, got {list(x.shape)}")
        r = torch.relu(x @ self.W_enc + self.b_enc)
        vals, idx = torch.topk(r, self.k, dim=-1)
        return torch.zeros_like(r).scatter(-1, idx, vals)

    def decode(self, z: Tensor) -> Tensor:
        """x̂ = z @ W_dec + b_dec."""
        return z @ self.W_dec + self.b_dec

    def set_step(self, step: int) -> None:
        """Record the optimiser step t; the anchor term is used on steps with t mod anchor_every = 0."""
        self._step = int(step)

    def anchor_active(self) -> bool:
        """True when this forward pass adds the anchor term (training mode, λ_anchor > 0, t mod M = 0)."""
        return self.training and self.anchor_coef > 0 and self._step % self.anchor_every == 0

    def _anchor(self) -> Tensor:
        """L_anchor with the gathered tokens, refreshed (the exact max) on steps t with t mod
        ``anchor_refresh`` = 0 and whenever none are held (first anchor step, or a model whose buffer was
        never set)."""
        E = self.embedding()
        n = anchor_width(self.anchor_mode, E.shape[0])
        if self._step % self.anchor_refresh == 0 or self.anchor_ids.shape[1] != n or bool((self.anchor_ids < 0).any()):
            s, ids = top_tokens(self.W_dec, E, n, self.anchor_chunk)
            self.anchor_ids = ids
            self.last_refresh = (self._step, s[:, 0].clone())
        return anchor_loss(self.W_dec, E, self.anchor_mode, ids=self.anchor_ids)

    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> FeaturizerOutput:
        """Codes, x̂ and loss = mse_per_element + λ_anchor·L_anchor (``dead_mask`` is unused: no AuxK)."""
        z = self.encode(x)
        x_hat = self.decode(z)
        mse = (x - x_hat).pow(2).mean()
        zero = mse.new_zeros(())
        anchor = self.anchor_coef * self._anchor() if self.anchor_active() else zero
        l0 = (z != 0).sum(dim=-1).to(x.dtype).mean()
        return FeaturizerOutput(x_hat=x_hat, codes=z, loss=mse + anchor, mse=mse, sparsity_loss=zero,
                                aux_loss=anchor, l0=l0)

    # -------------------------------------------------------------- save / load
    def state_weights(self) -> dict[str, Tensor]:
        """SAELens-named detached copies W_enc, b_enc, W_dec, b_dec (hard-tied: W_dec = W_E, b_dec = 0)."""
        return {n: getattr(self, n).detach().clone() for n in _SAVE_NAMES}

    @torch.no_grad()
    def load_state_weights(self, weights: dict[str, Tensor]) -> None:
        """Inverse of :meth:`state_weights`; ValueError for a missing, extra or misshapen tensor."""
        if set(weights) != set(_SAVE_NAMES):
            raise ValueError(f"vasae needs tensors {list(_SAVE_NAMES)}, got {sorted(weights)}")
        for name in _SAVE_NAMES:
            p = getattr(self, name)
            t = torch.as_tensor(weights[name])
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(p.shape)}")
            p.copy_(t.to(p.device, p.dtype))

    def arch_fields(self) -> dict[str, Any]:
        """``metadata.dictcheck.vasae`` (§9): anchor settings, decoder mode, vocab policy, W_E source + hash.

        ``anchor_topk`` is always 10 as in §9 and the authors' config; only the soft modes use it."""
        E = self._embedding_np
        return {
            "anchor_coeff": self.anchor_coef,
            "anchor_mode": self.anchor_mode,
            "anchor_topk": ANCHOR_TOPK,
            "anchor_every": self.anchor_every,
            "anchor_chunk": self.anchor_chunk,
            "refresh_interval": self.anchor_refresh,
            "init": self.init,
            "decoder_mode": "hard_tied" if self.tie == "hard" else "learnable",
            "nonneg": True,
            "vocab_policy": "all" if self.vocab_ids is None else "subset",
            "embedding_source": self.anchor_source,
            "embedding_shape": None if E is None else list(E.shape),
            "embedding_sha256": None if E is None else embedding_sha256(E),
        }

    def load_arch_fields(self, fields: dict[str, Any]) -> None:
        """Remember the saved ``embedding_sha256``: a later lazy load of W_E must match it (ValueError)."""
        self._expected_sha256 = fields.get("embedding_sha256")

    def extra_repr(self) -> str:
        return (f"d_in={self.d_in}, d_sae={self.d_sae}, k={self.k}, anchor_coef={self.anchor_coef}, "
                f"anchor_every={self.anchor_every}, anchor_refresh={self.anchor_refresh}, anchor_mode={self.anchor_mode!r}, tie={self.tie!r}")


# ---------------------------------------- the registered architectures

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
    """Build and initialise a VASAE (the module docstring). ``embedding`` (a
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

    def draw_options(self, draw: Any, st: Any, ctx: OptionsContext) -> dict[str, Any]:
        anchored = draw(st.booleans())
        return {"k": ctx.k, "anchor_coef": 0.1 if anchored else 0.0, "anchor_every": draw(st.integers(1, 3)),
                "anchor_source": ctx.embedding() if anchored else None}

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        return make_vasae(d_in, d_sae, seed=seed, dtype=dtype, **options.to_dict())
