"""Ground-truth recovery metrics of an SAE on data with known features, as SAELens defines them
(``sae_lens.synthetic.evals.eval_sae_on_synthetic_data``; docs/ecosystem.md §6).

TOKENS ARE ROWS (like :mod:`dictcheck.empirics.metrics.reconstruction`): ``x``, ``x_hat`` (N, D); ``codes`` (N, d_sae);
``gt_acts`` (N, n_gt), the true features' activations; atoms and features are ROWS too: the SAE's decoder
``W_dec`` (d_sae, D) and the true feature vectors ``features`` (n_gt, D). Codes and activations may be dense
arrays, torch tensors or scipy sparse matrices. Everything is computed in float64.

With c_jg = |cos(w_j, f_g)| (rows normalised with their norm clamped at 1e-8, so a zero row has cosine 0):

* ``mcc``: the mean of c over the one-to-one matching of min(d_sae, n_gt) pairs that maximises its sum
  (the Hungarian algorithm, :func:`scipy.optimize.linear_sum_assignment` on 1 − c);
* ``uniqueness``: the number of distinct features g*(j) = argmax_g c_jg (first maximum) over the SAE's latents,
  divided by d_sae (0 for d_sae = 0);
* ``precision``, ``recall``, ``f1_score``, ``accuracy``: latent j as a detector of its feature g*(j) (fires:
  z_tj ≠ 0; the feature fires: a_tg > 0), counts pooled over the tokens, each ratio 0 where its denominator is
  0, then the mean over latents;
* ``true_l0``, ``sae_l0``: mean_t #{g : a_tg ≠ 0} and mean_t #{j : z_tj ≠ 0};
* ``dead_latents``: the NUMBER of latents with z_tj = 0 on every token (SAELens counts; docs/ecosystem.md §2's
  ``dead_frac`` is the fraction);
* ``shrinkage``: mean_t ‖x̂_t‖ / ‖x_t‖ over the tokens with ‖x_t‖ > 1e-6 (0 when there are none);
* ``ve``: 1 − Σ_t ‖x_t − x̂_t‖² / Σ_t ‖x_t − x̄‖², docs/ecosystem.md §2's ``ve`` (SAELens' synthetic
  ``explained_variance``: the same pooled ratio; never emitted under that bare name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from dictcheck.empirics.metrics.reconstruction import ZERO_VARIANCE_REL

__all__ = [
    "GT_METRIC_NAMES",
    "ClassificationCounts",
    "GroundTruthEval",
    "abs_cosines",
    "best_matches",
    "classification_metrics",
    "mcc",
    "uniqueness",
]

#: Keys of :meth:`GroundTruthEval.result`, in SAELens' order.
GT_METRIC_NAMES = ("true_l0", "sae_l0", "dead_latents", "shrinkage", "ve", "mcc", "uniqueness", "precision",
                   "recall", "f1_score", "accuracy")
#: Row norms are clamped here before normalising (SAELens' ``cosine_similarities``).
NORM_CLAMP = 1e-8
#: Tokens with ‖x_t‖ at or below this are left out of ``shrinkage`` (SAELens' ``ShrinkageCalculator``).
SHRINKAGE_MIN_NORM = 1e-6


def _rows(a: Any, name: str) -> NDArray[np.float64]:
    if hasattr(a, "detach"):
        a = a.detach().cpu().double().numpy()
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (one vector per row), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries")
    return arr


def abs_cosines(A: Any, B: Any) -> NDArray[np.float64]:
    """|cos(a_i, b_j)| for the rows of A (n_a, D) and B (n_b, D), each row divided by max(‖row‖, 1e-8)."""
    A, B = _rows(A, "A"), _rows(B, "B")
    if A.shape[1] != B.shape[1]:
        raise ValueError(f"rows of length {A.shape[1]} and {B.shape[1]} cannot be compared")
    An = A / np.maximum(np.linalg.norm(A, axis=1), NORM_CLAMP)[:, None]
    Bn = B / np.maximum(np.linalg.norm(B, axis=1), NORM_CLAMP)[:, None]
    return np.abs(An @ Bn.T)


def mcc(W_dec: Any, features: Any) -> float:
    """Mean |cos| over the best one-to-one matching of SAE atoms (rows of ``W_dec``) and true features
    (module docstring)."""
    c = abs_cosines(W_dec, features)
    if c.size == 0:
        return 0.0
    rows, cols = linear_sum_assignment(1.0 - c)
    return float(c[rows, cols].mean())


def best_matches(W_dec: Any, features: Any) -> NDArray[np.int64]:
    """g*(j) = argmax_g |cos(w_j, f_g)| for every SAE latent j (the first maximum on ties)."""
    return np.argmax(abs_cosines(W_dec, features), axis=1).astype(np.int64)


def uniqueness(W_dec: Any, features: Any) -> float:
    """Distinct best-matching features over the number of SAE latents (module docstring)."""
    W = _rows(W_dec, "W_dec")
    if W.shape[0] == 0:
        return 0.0
    return len(np.unique(best_matches(W, features))) / W.shape[0]


def _fired(a: Any, name: str, strict_positive: bool) -> sp.csr_array:
    """(N, n) boolean sparse matrix of a ≠ 0 (or a > 0)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().double().numpy()
    m = sp.csr_array(a, dtype=np.float64) if sp.issparse(a) else sp.csr_array(np.asarray(a, dtype=np.float64))
    if m.ndim != 2:
        raise ValueError(f"{name} must be 2-D (tokens as rows)")
    m.eliminate_zeros()
    keep = m.data > 0 if strict_positive else m.data != 0
    out = sp.csr_array((keep.astype(np.float64), m.indices, m.indptr), shape=m.shape)
    out.eliminate_zeros()
    return out


@dataclass
class ClassificationCounts:
    """Per-latent true/false positives and negatives of latent j detecting feature g*(j), pooled over tokens."""

    tp: NDArray[np.float64]
    fp: NDArray[np.float64]
    fn: NDArray[np.float64]
    tn: NDArray[np.float64]

    @classmethod
    def zeros(cls, d_sae: int) -> ClassificationCounts:
        return cls(*(np.zeros(d_sae) for _ in range(4)))

    def add(self, codes: Any, gt_acts: Any, matches: NDArray[np.int64]) -> None:
        sae = _fired(codes, "codes", strict_positive=False)
        gt = _fired(gt_acts, "gt_acts", strict_positive=True)
        if sae.shape[0] != gt.shape[0] or sae.shape[1] != matches.size:
            raise ValueError(f"codes {sae.shape} and gt_acts {gt.shape} do not fit {matches.size} latents")
        g = gt[:, matches]
        tp = np.asarray(sae.multiply(g).sum(axis=0)).ravel()
        n_sae, n_gt = np.asarray(sae.sum(axis=0)).ravel(), np.asarray(g.sum(axis=0)).ravel()
        self.tp += tp
        self.fp += n_sae - tp
        self.fn += n_gt - tp
        self.tn += sae.shape[0] - n_sae - n_gt + tp

    def result(self) -> dict[str, float]:
        """Mean over latents of precision, recall, F1 and accuracy (each 0 where undefined)."""
        if self.tp.size == 0:
            return {"precision": 0.0, "recall": 0.0, "f1_score": 0.0, "accuracy": 0.0}

        def ratio(num: NDArray, den: NDArray) -> NDArray:
            return np.divide(num, den, out=np.zeros_like(num), where=den > 0)

        precision = ratio(self.tp, self.tp + self.fp)
        recall = ratio(self.tp, self.tp + self.fn)
        f1 = ratio(2 * precision * recall, precision + recall)
        total = self.tp + self.fp + self.fn + self.tn
        accuracy = (self.tp + self.tn) / np.maximum(total, 1e-8)
        return {"precision": float(precision.mean()), "recall": float(recall.mean()), "f1_score": float(f1.mean()),
                "accuracy": float(accuracy.mean())}


def classification_metrics(codes: Any, gt_acts: Any, W_dec: Any, features: Any) -> dict[str, float]:
    """Precision, recall, F1 and accuracy of the SAE's latents as detectors of their best-matching features
    (module docstring)."""
    matches = best_matches(W_dec, features)
    counts = ClassificationCounts.zeros(matches.size)
    counts.add(codes, gt_acts, matches)
    return counts.result()


class GroundTruthEval:
    """Every metric of the module docstring over an evaluation set seen one batch at a time: construct with
    the SAE's decoder rows and the true features, :meth:`update` with each batch's (x, x̂, codes, true
    activations), then :meth:`result` (keys :data:`GT_METRIC_NAMES`)."""

    def __init__(self, W_dec: Any, features: Any) -> None:
        self.W_dec = _rows(W_dec, "W_dec")
        self.features = _rows(features, "features")
        self.matches = best_matches(self.W_dec, self.features)
        self.counts = ClassificationCounts.zeros(self.W_dec.shape[0])
        self.fired = np.zeros(self.W_dec.shape[0], dtype=bool)
        self.n = 0
        self.nnz_sae = self.nnz_gt = 0
        self.shrink_sum, self.shrink_n = 0.0, 0
        self.x_sum = np.zeros(self.W_dec.shape[1])
        self.x_sq = self.sq_err = 0.0

    def update(self, x: Any, x_hat: Any, codes: Any, gt_acts: Any) -> None:
        xa, xh = _rows(x, "x"), _rows(x_hat, "x_hat")
        if xa.shape != xh.shape or xa.shape[1] != self.W_dec.shape[1]:
            raise ValueError(f"x {xa.shape} and x_hat {xh.shape} must both be (N, {self.W_dec.shape[1]})")
        sae = _fired(codes, "codes", strict_positive=False)
        gt_nonzero = _fired(gt_acts, "gt_acts", strict_positive=False)
        self.counts.add(codes, gt_acts, self.matches)
        self.fired |= np.asarray(sae.sum(axis=0)).ravel() > 0
        self.nnz_sae += sae.nnz
        self.nnz_gt += gt_nonzero.nnz
        nx = np.linalg.norm(xa, axis=1)
        keep = nx > SHRINKAGE_MIN_NORM
        self.shrink_sum += float(np.sum(np.linalg.norm(xh[keep], axis=1) / nx[keep]))
        self.shrink_n += int(keep.sum())
        self.x_sum += xa.sum(axis=0)
        self.x_sq += float(np.sum(xa * xa))
        self.sq_err += float(np.sum((xa - xh) ** 2))
        self.n += xa.shape[0]

    def result(self) -> dict[str, float]:
        """The metrics over every token seen (ValueError before any, or for zero-variance data: ``ve``)."""
        if self.n == 0:
            raise ValueError("no tokens were seen")
        total_variance = self.x_sq - float(self.x_sum @ self.x_sum) / self.n
        if total_variance <= ZERO_VARIANCE_REL * self.x_sq:
            raise ValueError("x has zero variance over the evaluation set: ve is undefined")
        return {
            "true_l0": self.nnz_gt / self.n,
            "sae_l0": self.nnz_sae / self.n,
            "dead_latents": int(np.sum(~self.fired)),
            "shrinkage": self.shrink_sum / self.shrink_n if self.shrink_n else 0.0,
            "ve": 1.0 - self.sq_err / total_variance,
            "mcc": mcc(self.W_dec, self.features),
            "uniqueness": uniqueness(self.W_dec, self.features),
            **self.counts.result(),
        }
