"""Language-model metrics of an SAE spliced into a model (docs/vasae.md §5, docs/ecosystem.md §2).

LAYOUT: activations are ROWS (tokens), as in :mod:`empirics.metrics.reconstruction`.

**Splice metrics** (:func:`splice_metrics`). For each batch (input_ids, attention_mask) of real token
windows the model runs three times with a forward hook on decoder layer l
(:func:`empirics.data.lm_models.replace_residual`):

* clean: the layer output x is left as is (and recorded on the real positions);
* sae: the output is replaced by x̂ = featurizer(x) on the real positions (padding untouched;
  with ``skip_first``, position 0 too, matching activation stores that drop the BOS position);
* zero: the **whole** output of block l is replaced by zeros (zero ablation).

Next-token cross-entropy (nats) is taken at positions t whose own token and next token are both
real (attention mask 1), the target being token t+1. With token-weighted means over the whole set:

* ``ce_clean``, ``ce_sae``, ``ce_zero``; ``delta_ce`` = ce_sae − ce_clean;
* ``ce_recovered`` = (ce_zero − ce_sae)/(ce_zero − ce_clean) (ratio of means, SAELens/SAEBench);
  ``ce_recovered_batch_mean`` = the mean over batches of the per-batch ratio (the VASAE authors');
* ``kl`` = mean_t KL(p_clean ‖ p_sae), ``kl_zero`` = mean_t KL(p_clean ‖ p_zero) and
  ``kl_score`` = (kl_zero − kl)/kl_zero, over the same positions;
* ``mse``, ``mse_per_element``, ``fvu``, ``ve`` (:mod:`empirics.metrics.reconstruction`), ``l0``, ``dead_frac``,
  ``n_eval_tokens`` pooled over every real position of layer l (firing counted streaming, no
  (N, d_sae) matrix), and ``alive`` (a numpy bool (d_sae,) mask, not JSON). ``n_ce_tokens`` counts
  the CE positions.

Decision for undefined ratios: ``ce_recovered`` is None when ce_zero = ce_clean, ``kl_score`` None
when kl_zero = 0, and a batch with ce_zero = ce_clean is left out of ``ce_recovered_batch_mean``.

**Alignment** (:func:`alignment_metrics`, docs/vasae.md §5): s_d = max_v cos(w_d, e_v) with both
sides L2-normalised, over the decoder columns w_d (rows of W_dec) and the embedding rows e_v.

* buckets strong s ≥ 0.8, medium 0.5 ≤ s < 0.8, weak 0.3 ≤ s < 0.5, none s < 0.3 (counts);
* ``alignment_rate_all`` = #{s_d ≥ 0.8}/d_z (dead features in the denominator, the paper's number);
* ``alignment_rate_alive`` = #{alive, s_d ≥ 0.8}/#{alive}, with ``n_alive``, ``n_alive_aligned``
  (None when nothing is alive); a feature is alive when z > 0 on at least one evaluation token;
* ``coverage`` = #{unique t_d : s_d ≥ 0.8}/n_vocab and ``coverage_alive`` (alive features only);
* ``s_mean``, ``s_min``, ``s_max``, ``s_median`` and ``s_histogram`` (20 equal bins on [−1, 1]).

**Names** (:func:`feature_names`): the top-5 tokens and cosines per feature, as ids and as strings
decoded one token at a time without cleaning up spaces.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.data.lm_models import LoadedLM, replace_residual
from dictcheck.empirics.metrics.reconstruction import fvu, mse, mse_per_element
from dictcheck.empirics.architectures.vasae import nearest_tokens, top_tokens

__all__ = [
    "ALIGNED",
    "BUCKETS",
    "alignment_metrics",
    "feature_names",
    "ce_and_kl",
    "next_token_logp",
    "splice_metrics",
]

#: s_d ≥ ALIGNED counts as aligned ("strong"), docs/vasae.md §5.
ALIGNED = 0.8
#: Bucket name → [low, high) of s_d.
BUCKETS: dict[str, tuple[float, float]] = {
    "strong": (0.8, math.inf),
    "medium": (0.5, 0.8),
    "weak": (0.3, 0.5),
    "none": (-math.inf, 0.3),
}
_HIST_BINS = 20


# ------------------------------------------------------------------------------------- CE and KL
def next_token_logp(logits: Tensor, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(log p (n, V) float64, targets (n,)) at the positions t with mask[t] = mask[t+1] = 1.

    ``logits`` (B, T, V); the target of position t is input_ids[t+1].
    """
    valid = (attention_mask[:, :-1] > 0) & (attention_mask[:, 1:] > 0)
    return torch.log_softmax(logits[:, :-1][valid].to(torch.float64), dim=-1), input_ids[:, 1:][valid]


def ce_and_kl(logp: Tensor, targets: Tensor, ref_logp: Tensor) -> tuple[float, float]:
    """(Σ_t CE_t, Σ_t KL(p_ref,t ‖ p_t)) in nats for log-probabilities (n, V) at n positions."""
    ce = -logp.gather(1, targets[:, None]).sum()
    kl = (ref_logp.exp() * (ref_logp - logp)).sum()
    return float(ce), float(kl)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den != 0 else None


@torch.no_grad()
def splice_metrics(lm: LoadedLM, featurizer: Featurizer, layer: int,
                   batches: Iterable[tuple[Tensor, Tensor]], *, skip_first: bool = False) -> dict[str, Any]:
    """CE/KL/reconstruction metrics of ``featurizer`` spliced in at the output of block ``layer``.

    ``batches`` yields (input_ids, attention_mask), both (B, T). ``skip_first``: leave position 0
    (a BOS token, which activation stores drop) unspliced and out of the reconstruction metrics;
    it still counts for CE. See the module docstring for every key. ValueError when the featurizer does not reconstruct in input space, its d_in differs from
    the model's width, or there are no CE positions.
    """
    if getattr(featurizer, "d_in", None) != lm.d_model:
        raise ValueError(f"the SAE has d_in={getattr(featurizer, 'd_in', None)} but the model's residual width is {lm.d_model}")
    if not 0 <= layer < lm.n_layers:
        raise ValueError(f"layer must be in [0, {lm.n_layers - 1}], got {layer}")
    was_training = featurizer.training
    featurizer.eval()
    p = next(featurizer.parameters())
    xs, x_hats = [], []
    fire_counts = torch.zeros(featurizer.d_sae, dtype=torch.int64)
    sums = {"ce_clean": 0.0, "ce_sae": 0.0, "ce_zero": 0.0, "kl": 0.0, "kl_zero": 0.0}
    n_ce, batch_ratios = 0, []

    def splice(out: Tensor, mask: Tensor) -> Tensor:
        x = out[mask]
        res = featurizer(x.to(p.device, p.dtype))
        if res.x_hat is None:
            raise ValueError(f"arch {featurizer.arch!r} has no input-space reconstruction to splice in")
        xs.append(x.detach().to(torch.float64).cpu())
        x_hats.append(res.x_hat.detach().to(torch.float64).cpu())
        fire_counts.add_((res.codes.detach() != 0).sum(dim=0).cpu())
        new = out.clone()
        new[mask] = res.x_hat.to(out.dtype).to(out.device)
        return new

    try:
        for input_ids, attention_mask in batches:
            mask = attention_mask > 0
            if skip_first:
                mask[:, 0] = False
            kw = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
            ref, targets = next_token_logp(lm.model(**kw).logits, input_ids, attention_mask)
            ce_c, _ = ce_and_kl(ref, targets, ref)
            with replace_residual(lm, layer, lambda out: splice(out, mask)):
                ce_s, kl_s = ce_and_kl(next_token_logp(lm.model(**kw).logits, input_ids, attention_mask)[0], targets, ref)
            with replace_residual(lm, layer, torch.zeros_like):
                ce_z, kl_z = ce_and_kl(next_token_logp(lm.model(**kw).logits, input_ids, attention_mask)[0], targets, ref)
            n = int(targets.numel())
            for key, v in zip(sums, (ce_c, ce_s, ce_z, kl_s, kl_z)):
                sums[key] += v
            n_ce += n
            if n and ce_z != ce_c:
                batch_ratios.append((ce_z - ce_s) / (ce_z - ce_c))
    finally:
        featurizer.train(was_training)
    if n_ce == 0:
        raise ValueError("no next-token positions to evaluate (every window is shorter than 2 real tokens)")
    m = {key: v / n_ce for key, v in sums.items()}
    out: dict[str, Any] = {
        **m,
        "ce_recovered": _ratio(m["ce_zero"] - m["ce_sae"], m["ce_zero"] - m["ce_clean"]),
        "ce_recovered_batch_mean": float(np.mean(batch_ratios)) if batch_ratios else None,
        "delta_ce": m["ce_sae"] - m["ce_clean"],
        "kl_score": _ratio(m["kl_zero"] - m["kl"], m["kl_zero"]),
        "n_ce_tokens": n_ce,
    }
    x, x_hat = torch.cat(xs).numpy(), torch.cat(x_hats).numpy()
    alive = (fire_counts > 0).numpy()
    out.update(mse=mse(x, x_hat), mse_per_element=mse_per_element(x, x_hat), fvu=fvu(x, x_hat),
               l0=float(fire_counts.sum()) / x.shape[0], dead_frac=float(1.0 - alive.mean()),
               n_eval_tokens=int(x.shape[0]), alive=alive)
    out["ve"] = 1.0 - out["fvu"]
    return out


# -------------------------------------------------------------------------------------- alignment
def alignment_metrics(W_dec: Tensor | np.ndarray, embedding: Tensor | np.ndarray,
                      alive: np.ndarray | Tensor | None = None, chunk: int | None = None) -> dict[str, Any]:
    """Alignment of the decoder columns (rows of ``W_dec``, (d_z, D)) with the vocabulary (V, D).

    ``alive``: boolean (d_z,) mask of features that fired on the evaluation tokens, or None (then the
    alive keys are None). Returns the keys of the module docstring plus ``s`` and ``t`` (numpy arrays).
    """
    W = torch.as_tensor(W_dec).to(torch.float64)
    E = torch.as_tensor(embedding).to(torch.float64)
    s_t, t_t = nearest_tokens(W, E, chunk)
    s, t = s_t.numpy(), t_t.numpy()
    d_z, V = s.shape[0], E.shape[0]
    aligned = s >= ALIGNED
    out: dict[str, Any] = {
        "n_features": d_z,
        "n_vocab": V,
        "buckets": {name: int(((s >= lo) & (s < hi)).sum()) for name, (lo, hi) in BUCKETS.items()},
        "alignment_rate_all": float(aligned.mean()),
        "n_aligned": int(aligned.sum()),
        "coverage": len(np.unique(t[aligned])) / V,
        "s_mean": float(s.mean()),
        "s_median": float(np.median(s)),
        "s_min": float(s.min()),
        "s_max": float(s.max()),
        "s_histogram": {"edges": np.linspace(-1, 1, _HIST_BINS + 1).tolist(),
                        "counts": np.histogram(np.clip(s, -1, 1), bins=_HIST_BINS, range=(-1, 1))[0].tolist()},
        "alignment_rate_alive": None,
        "n_alive": None,
        "n_alive_aligned": None,
        "coverage_alive": None,
        "s": s,
        "t": t,
    }
    if alive is not None:
        live = np.asarray(alive, dtype=bool).reshape(-1)
        if live.shape != (d_z,):
            raise ValueError(f"alive has {live.size} entries, expected d_z = {d_z}")
        both = live & aligned
        out.update(n_alive=int(live.sum()), n_alive_aligned=int(both.sum()),
                   alignment_rate_alive=_ratio(float(both.sum()), float(live.sum())),
                   coverage_alive=len(np.unique(t[both])) / V)
    return out


def feature_names(W_dec: Tensor | np.ndarray, embedding: Tensor | np.ndarray, lm: LoadedLM,
                  features: Iterable[int], top: int = 5) -> list[dict[str, Any]]:
    """Top-``top`` tokens per listed feature: ``{"feature", "token_ids", "tokens", "cos"}``."""
    W = torch.as_tensor(W_dec).to(torch.float64)
    idx = [int(f) for f in features]
    if any(not 0 <= f < W.shape[0] for f in idx):
        raise ValueError(f"feature indices must be in [0, {W.shape[0] - 1}]")
    if not idx:
        return []
    cos, ids = top_tokens(W[idx], torch.as_tensor(embedding).to(torch.float64), top)
    return [{"feature": f, "token_ids": ids[i].tolist(), "tokens": lm.token_strings(ids[i].tolist()),
             "cos": [round(float(c), 6) for c in cos[i]]} for i, f in enumerate(idx)]
