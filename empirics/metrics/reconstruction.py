"""Reconstruction and sparsity metrics for SAEs, named exactly as docs/ecosystem.md §2.

LAYOUT WARNING — TOKENS ARE ROWS IN THIS MODULE
================================================
Unlike ``theory/`` and ``solvers/`` (points as *columns*, X of shape (D, N)), every metric function
here takes activations with **one token per ROW**:

* ``x``, ``x_hat`` : (N, D) — N evaluation tokens (padding already removed), D = d_in;
* ``codes``        : (N, d_sae) — one row of latent activations per token.

This is the natural layout of activations and SAE outputs (SAELens, sparsify, dictionary_learning).
The single exception is :func:`amortisation_gap` (and :func:`unit_atom_objective`), a theory
diagnostic (docs/theory.md §6) that keeps the theory layout: X (D, N), W (D, d_z), Z (d_z, N).
Shapes are checked, so a transposed argument raises instead of silently giving a wrong number
(unless N = D, which no check can catch).

Inputs may be numpy arrays, torch tensors (any device / dtype; detached and copied to the CPU) or
anything ``numpy.asarray`` accepts. Everything is computed in float64. Sums are pooled over the
whole evaluation set, never averaged per batch (docs/ecosystem.md §2). Non-finite inputs, N = 0 and
mismatched shapes raise ``ValueError``.

Undefined cases (Decisions, documented here and in each docstring; no silent NaN anywhere):

* ``fvu``, ``ve``, ``fve_dl``, ``ve_legacy_per_token``: zero-variance data (Σ_t ‖x_t − x̄‖² = 0, up to
  rounding: ≤ (64 ε)² Σ_t ‖x_t‖²) raise ``ValueError``.
* ``ve_legacy_per_token``: a token lying exactly on x̄ (‖x_t − x̄‖ = 0) has no per-token ratio and is
  skipped; the mean is over the remaining tokens.
* ``cossim``, ``l2_ratio``: tokens with ‖x_t‖ = 0 are skipped (the mean is over tokens with
  x_t ≠ 0; if there are none, ``ValueError``). In ``cossim`` a token with x_t ≠ 0 but x̂_t = 0
  counts as cos = 0 (the value torch's eps-clamped cosine similarity gives).
* ``rel_recon_bias``: E‖x̂‖² = 0 (all-zero reconstruction) raises ``ValueError``; E[x̂ᵀx] = 0 with
  x̂ ≠ 0 returns +inf (the infimum over γ > 0 is approached as γ → ∞); E[x̂ᵀx] < 0 returns the
  (negative) stationary γ = A/B, which is the argmin over real γ ≠ 0.
* ``l0``, ``dead_frac``: a latent counts as active on a token when |z_td| > ``tol`` (default 0, i.e.
  z_td ≠ 0 exactly, as in the spec).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dictcheck.theory.objective import sae_objective, to_unit_atoms

__all__ = [
    "METRIC_NAMES",
    "DeadLatents",
    "amortisation_gap",
    "cossim",
    "dead_frac",
    "dead_latents",
    "fve_dl",
    "fvu",
    "l0",
    "l2_ratio",
    "mse",
    "mse_per_element",
    "reconstruction_metrics",
    "StreamingMetrics",
    "rel_recon_bias",
    "unit_atom_objective",
    "ve",
    "ve_legacy_per_token",
]

#: Keys of :func:`reconstruction_metrics` that need only (x, x_hat), in docs/ecosystem.md §2 order.
RECON_METRIC_NAMES: tuple[str, ...] = (
    "mse",
    "mse_per_element",
    "fvu",
    "ve",
    "ve_legacy_per_token",
    "fve_dl",
    "cossim",
    "l2_ratio",
    "rel_recon_bias",
)
#: Keys added when codes are given.
CODE_METRIC_NAMES: tuple[str, ...] = ("l0", "dead_frac", "n_eval_tokens")
METRIC_NAMES: tuple[str, ...] = RECON_METRIC_NAMES + CODE_METRIC_NAMES

#: Relative threshold below which the total variance counts as zero (rounding of x̄ only).
ZERO_VARIANCE_REL = (64.0 * np.finfo(np.float64).eps) ** 2


# --------------------------------------------------------------------------------------------------
# input handling


def _as_f64(a: Any, name: str) -> NDArray[np.float64]:
    """numpy / torch / array-like → float64 numpy array (torch: detached, moved to the CPU)."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch.Tensor, without importing torch
        a = a.detach().cpu()
        if getattr(a, "is_sparse", False):
            a = a.to_dense()
        a = a.double().numpy()
    arr = np.asarray(a, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return arr


def _tokens(a: Any, name: str) -> NDArray[np.float64]:
    """A (N, ·) token-rows array with N ≥ 1."""
    arr = _as_f64(a, name)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D with tokens as rows, (N, dim); got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} has N = 0 tokens; metrics need at least one token")
    return arr


def _pair(x: Any, x_hat: Any) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    xa = _tokens(x, "x")
    xh = _tokens(x_hat, "x_hat")
    if xa.shape != xh.shape:
        raise ValueError(
            f"x and x_hat must have the same shape (N, D); got {xa.shape} and {xh.shape}"
        )
    return xa, xh


def _total_variance_sum(x: NDArray[np.float64]) -> float:
    """Σ_t ‖x_t − x̄‖², raising ValueError when it is zero (up to rounding)."""
    xc = x - x.mean(axis=0)
    s = float(np.sum(xc * xc))
    if s <= ZERO_VARIANCE_REL * float(np.sum(x * x)):
        raise ValueError(
            "x has zero variance over the evaluation set (Σ_t ‖x_t − x̄‖² = 0): fvu / ve / fve_dl / "
            "ve_legacy_per_token are undefined"
        )
    return s


def _sq_err_sum(x: NDArray[np.float64], x_hat: NDArray[np.float64]) -> float:
    r = x - x_hat
    return float(np.sum(r * r))


# --------------------------------------------------------------------------------------------------
# reconstruction metrics, x and x_hat of shape (N, D)


def mse(x: Any, x_hat: Any) -> float:
    """``mse`` = (1/N) Σ_t ‖r_t‖², r_t = x_t − x̂_t (docs/ecosystem.md §2; SAELens "mse").

    x, x_hat: (N, D), tokens as rows.
    """
    xa, xh = _pair(x, x_hat)
    return _sq_err_sum(xa, xh) / xa.shape[0]


def mse_per_element(x: Any, x_hat: Any) -> float:
    """``mse_per_element`` = (1/(N·D)) Σ_t ‖r_t‖² (docs/ecosystem.md §2; VASAE/BSF training loss).

    x, x_hat: (N, D), tokens as rows. D = 0 raises ValueError.
    """
    xa, xh = _pair(x, x_hat)
    if xa.shape[1] == 0:
        raise ValueError("D = 0: mse_per_element is undefined")
    return _sq_err_sum(xa, xh) / (xa.shape[0] * xa.shape[1])


def fvu(x: Any, x_hat: Any) -> float:
    """``fvu`` = Σ_t ‖r_t‖² / Σ_t ‖x_t − x̄‖² (docs/ecosystem.md §2; sparsify FVU).

    x̄ is the per-dimension mean over the evaluation set; both sums are pooled over all N tokens.
    Zero-variance x raises ValueError. x, x_hat: (N, D), tokens as rows.
    """
    xa, xh = _pair(x, x_hat)
    return _sq_err_sum(xa, xh) / _total_variance_sum(xa)


def ve(x: Any, x_hat: Any) -> float:
    """``ve`` = 1 − fvu: dictcheck's explained variance (docs/ecosystem.md §2).

    Equals VASAE "VE", BSF "R²", SAELens training-log explained_variance and sparsify 1 − FVU.
    Never reported under a bare ``explained_variance`` key. x, x_hat: (N, D), tokens as rows.
    """
    return 1.0 - fvu(x, x_hat)


def ve_legacy_per_token(x: Any, x_hat: Any) -> float:
    """``ve_legacy_per_token`` = mean_t [1 − ‖r_t‖² / ‖x_t − x̄‖²] (docs/ecosystem.md §2).

    The SAELens/SAEBench legacy eval (SAEBench paper numbers). x̄ is the per-dimension mean over
    the whole evaluation set. Tokens with ‖x_t − x̄‖ = 0 are skipped (Decision: their ratio is
    undefined); zero-variance x raises ValueError. x, x_hat: (N, D), tokens as rows.
    """
    xa, xh = _pair(x, x_hat)
    _total_variance_sum(xa)
    xc = xa - xa.mean(axis=0)
    den = np.sum(xc * xc, axis=1)
    r = xa - xh
    num = np.sum(r * r, axis=1)
    keep = den > 0
    return float(np.mean(1.0 - num[keep] / den[keep]))


def fve_dl(x: Any, x_hat: Any) -> float:
    """``fve_dl`` = 1 − Σ_d Var_t(r_td) / Σ_d Var_t(x_td) (docs/ecosystem.md §2).

    dictionary_learning's ``frac_variance_explained``. The residual's own mean is subtracted, so
    ``fve_dl`` ≥ ``ve`` (equality iff the mean residual is 0); a constant offset error scores 1.
    Population variances (the ratio does not depend on the ddof). Zero-variance x raises
    ValueError. x, x_hat: (N, D), tokens as rows.
    """
    xa, xh = _pair(x, x_hat)
    den = _total_variance_sum(xa)
    r = xa - xh
    rc = r - r.mean(axis=0)
    return 1.0 - float(np.sum(rc * rc)) / den


def _nonzero_rows(xa: NDArray[np.float64], metric: str) -> tuple[NDArray, NDArray]:
    nx = np.linalg.norm(xa, axis=1)
    keep = nx > 0
    if not np.any(keep):
        raise ValueError(f"every x_t is zero: {metric} is undefined")
    return keep, nx


def cossim(x: Any, x_hat: Any) -> float:
    """``cossim`` = mean_t cos(x_t, x̂_t) = mean_t x_tᵀx̂_t / (‖x_t‖ ‖x̂_t‖) (docs/ecosystem.md §2).

    Decision: tokens with x_t = 0 are skipped (mean over the others; ValueError if none remain);
    a token with x̂_t = 0 ≠ x_t counts as cos = 0. x, x_hat: (N, D), tokens as rows.
    """
    xa, xh = _pair(x, x_hat)
    keep, nx = _nonzero_rows(xa, "cossim")
    nh = np.linalg.norm(xh, axis=1)
    dots = np.sum(xa * xh, axis=1)
    den = nx * nh
    cos = np.where(den > 0, dots / np.where(den > 0, den, 1.0), 0.0)
    return float(np.mean(np.clip(cos[keep], -1.0, 1.0)))


def l2_ratio(x: Any, x_hat: Any) -> float:
    """``l2_ratio`` = mean_t ‖x̂_t‖ / ‖x_t‖ (docs/ecosystem.md §2).

    Decision: tokens with x_t = 0 are skipped (mean over the others; ValueError if none remain).
    x, x_hat: (N, D), tokens as rows.
    """
    xa, xh = _pair(x, x_hat)
    keep, nx = _nonzero_rows(xa, "l2_ratio")
    nh = np.linalg.norm(xh, axis=1)
    return float(np.mean(nh[keep] / nx[keep]))


def rel_recon_bias(x: Any, x_hat: Any) -> float:
    """``rel_recon_bias`` γ = E‖x̂‖² / E[x̂ᵀx] (docs/ecosystem.md §2; arXiv:2404.16014).

    The argmin over γ of E‖x̂/γ − x‖² (with u = 1/γ the loss is A u² − 2B u + C, A = E‖x̂‖²,
    B = E[x̂ᵀx], minimised at u = B/A). γ > 1: reconstructions too long (shrinkage shows as γ < 1).
    Decision: A = 0 raises ValueError; B = 0 < A returns +inf; B < 0 returns the negative A/B.
    x, x_hat: (N, D), tokens as rows.
    """
    xa, xh = _pair(x, x_hat)
    a = float(np.sum(xh * xh))
    b = float(np.sum(xh * xa))
    if a == 0.0:
        raise ValueError("x_hat is identically zero: rel_recon_bias (E‖x̂‖²/E[x̂ᵀx]) is undefined")
    if b == 0.0:
        return float("inf")
    return a / b


# --------------------------------------------------------------------------------------------------
# code (latent) metrics, codes of shape (N, d_sae)


def _codes(codes: Any) -> NDArray[np.float64]:
    z = _tokens(codes, "codes")
    return z


def l0(codes: Any, *, tol: float = 0.0) -> float:
    """``l0`` = mean_t #{d : z_td ≠ 0} (docs/ecosystem.md §2).

    codes: (N, d_sae), tokens as rows. A latent is active when |z_td| > tol (default 0: z_td ≠ 0;
    for non-negative codes this is z_td > 0).
    """
    z = _codes(codes)
    return float(np.mean(np.sum(np.abs(z) > tol, axis=1)))


@dataclass(frozen=True)
class DeadLatents:
    """Dead-latent count over an evaluation set (docs/ecosystem.md §2, ``dead_frac``).

    dead_frac: fraction of latents with z_td = 0 (|z_td| ≤ tol) for every evaluation token.
    n_dead, d_sae: counts. n_eval_tokens: N, the number of tokens the verdict is based on (the
    spec requires recording it: "dead" depends on how many tokens were seen). dead_mask: (d_sae,)
    bool. tol: the activity threshold used.
    """

    dead_frac: float
    n_dead: int
    d_sae: int
    n_eval_tokens: int
    dead_mask: NDArray[np.bool_]
    tol: float


def dead_latents(codes: Any, *, tol: float = 0.0) -> DeadLatents:
    """Dead latents of codes (N, d_sae) with ``n_eval_tokens`` recorded; see :class:`DeadLatents`."""
    z = _codes(codes)
    if z.shape[1] == 0:
        raise ValueError("d_sae = 0: dead_frac is undefined")
    mask = ~np.any(np.abs(z) > tol, axis=0)
    n_dead = int(mask.sum())
    return DeadLatents(
        dead_frac=n_dead / z.shape[1],
        n_dead=n_dead,
        d_sae=int(z.shape[1]),
        n_eval_tokens=int(z.shape[0]),
        dead_mask=mask,
        tol=float(tol),
    )


def dead_frac(codes: Any, *, tol: float = 0.0) -> float:
    """``dead_frac`` = fraction of latents with z_td = 0 for every evaluation token (docs/ecosystem.md §2).

    SAEBench 1 − frac_alive. codes: (N, d_sae), tokens as rows. Always record ``n_eval_tokens``
    (= N) with it: use :func:`dead_latents`, or :func:`reconstruction_metrics`, which does.
    """
    return dead_latents(codes, tol=tol).dead_frac


# --------------------------------------------------------------------------------------------------
# everything at once


def reconstruction_metrics(
    x: Any, x_hat: Any, codes: Any = None, *, tol: float = 0.0
) -> dict[str, float]:
    """All §2 reconstruction metrics, keyed exactly by their docs/ecosystem.md §2 names.

    x, x_hat: (N, D); codes: optional (N, d_sae), all tokens as rows. Returns the keys
    ``RECON_METRIC_NAMES`` (mse, mse_per_element, fvu, ve, ve_legacy_per_token, fve_dl, cossim,
    l2_ratio, rel_recon_bias) and, when codes are given, also ``l0``, ``dead_frac`` and
    ``n_eval_tokens`` (an int). There is never a bare ``explained_variance`` key. The undefined
    cases of the module docstring raise ValueError, except rel_recon_bias = +inf when E[x̂ᵀx] = 0.
    """
    xa, xh = _pair(x, x_hat)
    out: dict[str, float] = {
        "mse": mse(xa, xh),
        "mse_per_element": mse_per_element(xa, xh),
        "fvu": fvu(xa, xh),
    }
    out["ve"] = 1.0 - out["fvu"]
    out["ve_legacy_per_token"] = ve_legacy_per_token(xa, xh)
    out["fve_dl"] = fve_dl(xa, xh)
    out["cossim"] = cossim(xa, xh)
    out["l2_ratio"] = l2_ratio(xa, xh)
    out["rel_recon_bias"] = rel_recon_bias(xa, xh)
    if codes is not None:
        z = _codes(codes)
        if z.shape[0] != xa.shape[0]:
            raise ValueError(f"codes has {z.shape[0]} rows but x has N = {xa.shape[0]} tokens")
        out["l0"] = l0(z, tol=tol)
        dl = dead_latents(z, tol=tol)
        out["dead_frac"] = dl.dead_frac
        out["n_eval_tokens"] = dl.n_eval_tokens
    return out


class StreamingMetrics:
    """:func:`reconstruction_metrics` over an evaluation set seen one batch at a time (tokens as rows), with
    the same definitions, Decisions and errors. ``x_mean`` is x̄, the per-dimension mean over the whole set
    (``ve_legacy_per_token`` needs it per token, so it is computed in a cheap pass beforehand); the
    residual's mean for ``fve_dl`` is merged across batches (Chan et al.'s pairwise update)."""

    def __init__(self, x_mean: Any, d_sae: int | None = None, *, tol: float = 0.0) -> None:
        self.x_mean = _as_f64(x_mean, "x_mean").reshape(-1)
        self.tol = float(tol)
        self.n = 0
        self.sums = dict.fromkeys(("sq_err", "tv", "x_sq", "xh_sq", "xh_x", "legacy", "cos", "ratio", "nnz"), 0.0)
        self.counts = dict.fromkeys(("legacy", "nonzero"), 0)
        self.r_mean = np.zeros_like(self.x_mean)
        self.r_m2 = 0.0
        self.fired = None if d_sae is None else np.zeros(int(d_sae), dtype=bool)

    def update(self, x: Any, x_hat: Any, codes: Any = None) -> None:
        xa, xh = _pair(x, x_hat)
        r = xa - xh
        num = np.sum(r * r, axis=1)
        xc = xa - self.x_mean
        den = np.sum(xc * xc, axis=1)
        nx, nh = np.linalg.norm(xa, axis=1), np.linalg.norm(xh, axis=1)
        dots = np.sum(xa * xh, axis=1)
        keep = nx > 0
        cos = np.where(nx * nh > 0, dots / np.where(nx * nh > 0, nx * nh, 1.0), 0.0)
        s = self.sums
        s["sq_err"] += float(num.sum())
        s["tv"] += float(den.sum())
        s["x_sq"] += float(np.sum(xa * xa))
        s["xh_sq"] += float(np.sum(xh * xh))
        s["xh_x"] += float(dots.sum())
        s["legacy"] += float(np.sum(1.0 - num[den > 0] / den[den > 0]))
        s["cos"] += float(np.sum(np.clip(cos[keep], -1.0, 1.0)))
        s["ratio"] += float(np.sum(nh[keep] / nx[keep]))
        self.counts["legacy"] += int(np.sum(den > 0))
        self.counts["nonzero"] += int(keep.sum())
        n_b = xa.shape[0]
        mean_b = r.mean(axis=0)
        delta = mean_b - self.r_mean
        total = self.n + n_b
        self.r_m2 += float(np.sum((r - mean_b) ** 2)) + float(delta @ delta) * self.n * n_b / total
        self.r_mean = self.r_mean + delta * (n_b / total)
        self.n = total
        if codes is not None:
            active = np.abs(_codes(codes)) > self.tol
            if active.shape[0] != n_b:
                raise ValueError(f"codes has {active.shape[0]} rows but x has N = {n_b} tokens")
            s["nnz"] += float(active.sum())
            self.fired = active.any(axis=0) if self.fired is None else self.fired | active.any(axis=0)

    def merged(self, other: StreamingMetrics) -> StreamingMetrics:
        """The metrics of this one's tokens and ``other``'s together (same x̄; e.g. two processes' parts): sums
        added, the residual means merged by the same pairwise update, fired latents OR-ed."""
        out = StreamingMetrics(self.x_mean, None, tol=self.tol)
        out.sums = {k: self.sums[k] + other.sums[k] for k in self.sums}
        out.counts = {k: self.counts[k] + other.counts[k] for k in self.counts}
        out.n = self.n + other.n
        delta = other.r_mean - self.r_mean
        out.r_mean = self.r_mean + delta * (other.n / out.n) if out.n else self.r_mean.copy()
        out.r_m2 = self.r_m2 + other.r_m2 + (float(delta @ delta) * self.n * other.n / out.n if out.n else 0.0)
        fired = [f for f in (self.fired, other.fired) if f is not None]
        out.fired = None if not fired else (fired[0] | fired[1] if len(fired) == 2 else fired[0].copy())
        return out

    def result(self) -> dict[str, float]:
        """The metrics of every token seen (ValueError in the undefined cases of the module docstring)."""
        if self.n == 0:
            raise ValueError("no tokens were seen")
        s, n, D = self.sums, self.n, self.x_mean.size
        if s["tv"] <= ZERO_VARIANCE_REL * s["x_sq"]:
            raise ValueError("x has zero variance over the evaluation set (Σ_t ‖x_t − x̄‖² = 0): fvu / ve / fve_dl / "
                             "ve_legacy_per_token are undefined")
        if self.counts["nonzero"] == 0:
            raise ValueError("every x_t is zero: cossim is undefined")
        if s["xh_sq"] == 0.0:
            raise ValueError("x_hat is identically zero: rel_recon_bias (E‖x̂‖²/E[x̂ᵀx]) is undefined")
        out: dict[str, float] = {"mse": s["sq_err"] / n, "mse_per_element": s["sq_err"] / (n * D),
                                 "fvu": s["sq_err"] / s["tv"]}
        out["ve"] = 1.0 - out["fvu"]
        out["ve_legacy_per_token"] = s["legacy"] / self.counts["legacy"]
        out["fve_dl"] = 1.0 - self.r_m2 / s["tv"]
        out["cossim"] = s["cos"] / self.counts["nonzero"]
        out["l2_ratio"] = s["ratio"] / self.counts["nonzero"]
        out["rel_recon_bias"] = float("inf") if s["xh_x"] == 0.0 else s["xh_sq"] / s["xh_x"]
        if self.fired is not None:
            out["l0"] = s["nnz"] / n
            out["dead_frac"] = float(np.mean(~self.fired))
            out["n_eval_tokens"] = n
        return out


# --------------------------------------------------------------------------------------------------
# amortisation gap (docs/theory.md §6) — THEORY LAYOUT: X (D, N), W (D, d_z), Z (d_z, N)


def _theory_args(
    W: Any, Z: Any, b: Any, X: Any, zname: str
) -> tuple[NDArray, NDArray, NDArray, NDArray]:
    Wa = _as_f64(W, "W")
    Za = _as_f64(Z, zname)
    ba = _as_f64(b, "b").reshape(-1)
    Xa = _as_f64(X, "X")
    if Wa.ndim != 2 or Za.ndim != 2 or Xa.ndim != 2:
        raise ValueError("W (D, d_z), Z (d_z, N) and X (D, N) must be 2-D (theory layout: columns)")
    D, d_z = Wa.shape
    if Xa.shape[0] != D:
        raise ValueError(f"X must be (D, N) = ({D}, N) with points as COLUMNS; got {Xa.shape}")
    if Xa.shape[1] == 0:
        raise ValueError("X has N = 0 points")
    if Za.shape != (d_z, Xa.shape[1]):
        raise ValueError(f"{zname} must be (d_z, N) = ({d_z}, {Xa.shape[1]}); got {Za.shape}")
    if ba.shape != (D,):
        raise ValueError(f"b must have shape ({D},); got {ba.shape}")
    if np.any(Za < 0):
        raise ValueError(f"{zname} has negative entries; objective (1) needs Z ≥ 0")
    return Wa, Za, ba, Xa


def unit_atom_objective(W: Any, Z: Any, b: Any, X: Any, lam: float) -> float:
    """Objective (1) of docs/theory.md §1 for a decoder W with ARBITRARY column norms.

    Converts with ``theory.objective.to_unit_atoms`` (ŵ_d = w_d/‖w_d‖, codes z_d· ← ‖w_d‖ z_d·,
    zero atoms → zero codes), which leaves the reconstruction W Z unchanged, then evaluates
    O = (1/N) Σ_i [‖Ŵ ẑ_i + b − x_i‖² + 2λ‖ẑ_i‖₁] with ``theory.objective.sae_objective``.
    Theory layout: W (D, d_z), Z (d_z, N) ≥ 0, b (D,), X (D, N) points as columns.
    """
    Wa, Za, ba, Xa = _theory_args(W, Z, b, X, "Z")
    W_unit, Z_unit = to_unit_atoms(Wa, Za)
    return sae_objective(W_unit, Z_unit, ba, Xa, lam)


def amortisation_gap(W: Any, Z_encoder: Any, Z_exact: Any, b: Any, X: Any, lam: float) -> float:
    """``amortisation_gap`` = O(W, Z_encoder, b) − O(W, Z_exact, b) (docs/theory.md §6).

    Both objectives are objective (1) evaluated by :func:`unit_atom_objective`: W normalised to unit
    columns and each code matrix rescaled by the column norms (z_d· ← ‖w_d‖ z_d·). Both code
    matrices are therefore given in the scale of the decoder W *as passed* (for a unit-norm W this
    is no conversion at all).

    ``Z_exact`` should be the exact codes of the normalised decoder, in W's scale:
    ``solvers.lasso_codes.exact_codes(Ŵ, X, b, lam).Z / ‖w_d‖`` (rows of dead atoms: 0). Pass
    ``Z_exact=None`` to have exactly that computed here. (Note: ``exact_codes(W, …)`` on an
    un-normalised W solves a *different* lasso, penalty 2λ‖z‖₁ without the column norms.) With
    exact Z_exact the gap is ≥ 0 up to the solver tolerance; it is not clipped, so a small
    negative value reports solver inaccuracy.

    Theory layout: W (D, d_z), Z_* (d_z, N) ≥ 0, b (D,), X (D, N) points as COLUMNS.
    """
    if Z_exact is None:
        from dictcheck.solvers.lasso_codes import exact_codes

        Wa = _as_f64(W, "W")
        Xa = _as_f64(X, "X")
        W_unit, _ = to_unit_atoms(Wa, np.zeros((Wa.shape[1], 0)))
        Z_unit = np.asarray(exact_codes(W_unit, Xa, _as_f64(b, "b").reshape(-1), lam).Z)
        norms = np.linalg.norm(Wa, axis=0)
        safe = np.where(norms > 0, norms, 1.0)[:, None]
        Z_exact = np.where(norms[:, None] > 0, Z_unit / safe, 0.0)
    return unit_atom_objective(W, Z_encoder, b, X, lam) - unit_atom_objective(W, Z_exact, b, X, lam)
