"""Metrics of the manifold benchmark: recovery R², MDL bits, stable rank, half variance (docs/bsf.md §6–§9).

LAYOUT: samples are ROWS. A trained model is described by its per-block codes and decoder blocks:

* ``Z`` (N, n_b, q): the block code z_ig of sample i (exactly zero where block g is inactive);
* ``W`` (n_b, D, q): the decoder blocks W_g, so that the contribution of block g is c_ig = W_g z_ig.

A linear SAE is the case q = 1: block g is latent g, W[g, :, 0] = W_dec[g] and Z[i, g, 0] = z_ig
(:func:`sae_blocks`). For Grassmannian BSF the global γ is inside z (spec §6).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dictcheck.empirics.data.manifold_toy import ManifoldSplit
from dictcheck.solvers.assignment import max_weight_matching

__all__ = [
    "sae_blocks", "RecoveryResult", "recovery", "recovery_r2_matrix",
    "MDLPrecisions", "MDLResult", "default_precisions", "binary_entropy", "mdl_bits", "DOF_KINDS",
    "orthonormal_codes",
    "stable_rank", "contribution_stable_ranks", "decoder_stable_ranks",
    "normalised_cov_eigenvalues", "best_direction_fraction", "nonnegative_atom_r2",
]


def _blocks(Z: Any, W: Any, N: int | None = None, D: int | None = None) -> tuple[NDArray, NDArray]:
    Z = np.asarray(Z, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if Z.ndim != 3 or W.ndim != 3:
        raise ValueError(f"need Z (N, n_b, q) and W (n_b, D, q), got shapes {Z.shape} and {W.shape}")
    if Z.shape[1] != W.shape[0] or Z.shape[2] != W.shape[2]:
        raise ValueError(f"Z {Z.shape} and W {W.shape} disagree on n_b or q")
    if N is not None and Z.shape[0] != N:
        raise ValueError(f"Z has {Z.shape[0]} samples, expected {N}")
    if D is not None and W.shape[1] != D:
        raise ValueError(f"W has D = {W.shape[1]}, expected {D}")
    if not (np.isfinite(Z).all() and np.isfinite(W).all()):
        raise ValueError("Z or W contains NaN or inf")
    return Z, W


def sae_blocks(codes: Any, W_dec: Any) -> tuple[NDArray, NDArray]:
    """(Z, W) of a linear SAE with one latent per block: codes (N, d_z), W_dec (d_z, D) rows = atoms."""
    codes = np.asarray(codes, dtype=np.float64)
    W_dec = np.asarray(W_dec, dtype=np.float64)
    if codes.ndim != 2 or W_dec.ndim != 2 or codes.shape[1] != W_dec.shape[0]:
        raise ValueError(f"need codes (N, d_z) and W_dec (d_z, D), got {codes.shape} and {W_dec.shape}")
    return codes[:, :, None], W_dec[:, :, None]


# ------------------------------------------------------------------------------------------------ §6


def recovery_r2_matrix(split: ManifoldSplit, Z: Any, W: Any, *, over: str = "active") -> NDArray[np.float64]:
    """R²_{j,g} (n_m, n_b) of spec §6.

    R²_{j,g} = 1 − Σ_{i∈A} ‖m_ij − c_ig‖² / Σ_{i∈A} ‖m_ij − m̄_j‖², with A = A_j (samples where j is
    active; ``over="active"``, the default) or all samples (``over="all"``, m_ij = 0 where j is
    inactive); m̄_j is the mean of m_ij over A. Not clipped. Computed without materialising every
    m_ij: with e_ij = s_j φ_j masked by the support (m_ij = E_j e_ij),
    ‖m − c‖² = e ᵀ(E_jᵀE_j)e − 2 eᵀE_jᵀW_g z + zᵀ(W_gᵀW_g)z.
    ValueError when a manifold has no sample in A or no variance there.
    """
    if over not in ("active", "all"):
        raise ValueError(f"over must be 'active' or 'all', got {over!r}")
    Z, W = _blocks(Z, W, split.N, split.X.shape[1])
    mask = split.support.astype(np.float64) if over == "active" else np.ones_like(split.support, dtype=np.float64)
    counts = mask.sum(axis=0)
    if np.any(counts == 0):
        raise ValueError(f"manifold(s) {np.flatnonzero(counts == 0).tolist()} are never active")
    n_m = split.n_m
    dims = np.diff(split.offsets)
    E_all = split.frames
    emb = np.hstack([split.embedding(j) for j in range(n_m)])  # (N, Σn), zero where inactive
    m2 = np.empty((split.N, n_m))
    den = np.empty(n_m)
    for j in range(n_m):
        e = emb[:, split.offsets[j]:split.offsets[j + 1]]
        G = split.frame(j).T @ split.frame(j)
        m2[:, j] = np.einsum("ia,ab,ib->i", e, G, e)
        mean = mask[:, j] @ e / counts[j]
        dev = e - mean
        den[j] = mask[:, j] @ np.einsum("ia,ab,ib->i", dev, G, dev)
    if np.any(den <= 0):
        raise ValueError(f"manifold(s) {np.flatnonzero(den <= 0).tolist()} have zero variance over their samples")
    base = (mask * m2).sum(axis=0)
    starts = split.offsets[:-1]
    r2 = np.empty((n_m, W.shape[0]))
    for g in range(W.shape[0]):
        z = Z[:, g, :]
        c2 = np.einsum("ia,ab,ib->i", z, W[g].T @ W[g], z)
        P = z @ (W[g].T @ E_all)  # (N, Σn) = c_igᵀ E_all
        cross = np.add.reduceat(emb * P, starts, axis=1) if dims.size else np.zeros((split.N, 0))
        num = base - 2.0 * (mask * cross).sum(axis=0) + mask.T @ c2
        r2[:, g] = 1.0 - num / den
    return r2


@dataclass(frozen=True)
class RecoveryResult:
    """R² matrix (n_m, n_b), best single block per manifold, and the Hungarian assignment.

    ``hungarian_block[j]`` = −1 for a manifold left unassigned (n_b < n_m), which scores 0.
    """

    r2: NDArray[np.float64]
    types: tuple[str, ...]
    best: NDArray[np.float64]
    best_block: NDArray[np.int64]
    hungarian: NDArray[np.float64]
    hungarian_block: NDArray[np.int64]

    def summary(self) -> dict[str, Any]:
        """Mean best-block R², mean Hungarian R², and both per manifold type (JSON-ready)."""
        kinds = sorted(set(self.types), key=self.types.index)
        sel = {t: np.array([x == t for x in self.types]) for t in kinds}
        return {
            "mean_best": float(self.best.mean()),
            "mean_hungarian": float(self.hungarian.mean()),
            "per_type_best": {t: float(self.best[m].mean()) for t, m in sel.items()},
            "per_type_hungarian": {t: float(self.hungarian[m].mean()) for t, m in sel.items()},
            "best": [float(v) for v in self.best],
            "best_block": [int(v) for v in self.best_block],
            "hungarian_block": [int(v) for v in self.hungarian_block],
        }


def recovery(split: ManifoldSplit, types: tuple[str, ...], Z: Any, W: Any, *, over: str = "active") -> RecoveryResult:
    """Spec §6 recovery: best single block per manifold (headline) and the Hungarian one-to-one match."""
    r2 = recovery_r2_matrix(split, Z, W, over=over)
    if len(types) != r2.shape[0]:
        raise ValueError(f"types names {len(types)} manifolds, the split has {r2.shape[0]}")
    best_block = np.argmax(r2, axis=1)
    best = r2[np.arange(r2.shape[0]), best_block]
    rows, cols = max_weight_matching(r2)
    hungarian = np.zeros(r2.shape[0])
    h_block = np.full(r2.shape[0], -1, dtype=np.int64)
    hungarian[rows] = r2[rows, cols]
    h_block[rows] = cols
    return RecoveryResult(r2=r2, types=tuple(types), best=best, best_block=best_block.astype(np.int64),
                          hungarian=hungarian, hungarian_block=h_block)


# ------------------------------------------------------------------------------------------------ §7

#: dof per block: "frobenius" q·D (Vanilla, Group-Lasso, SAEs); "stiefel" q·D − q(q+1)/2 (Grassmannian).
DOF_KINDS = ("frobenius", "stiefel")


@dataclass(frozen=True)
class MDLPrecisions:
    """The documented precisions of spec §7: δ_x, δ_z, B_w bits per weight, N_ref, and σ_x behind them."""

    delta_x: float
    delta_z: float
    B_w: float
    N_ref: int
    sigma_x: float


def default_precisions(X: Any, *, B_w: float = 16.0, rel: float = 0.01) -> MDLPrecisions:
    """Spec §7 defaults: δ_x = δ_z = 0.01·σ_x (σ_x² = mean per-coordinate variance of X), B_w = 16,
    N_ref = number of rows of X (the evaluation set)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2 or not np.isfinite(X).all():
        raise ValueError(f"X must be a finite (N >= 2, D) array, got shape {X.shape}")
    sigma_x = float(np.sqrt(X.var(axis=0).mean()))
    if sigma_x <= 0:
        raise ValueError("X has zero variance: the precisions 0.01*sigma_x would be 0")
    return MDLPrecisions(delta_x=rel * sigma_x, delta_z=rel * sigma_x, B_w=float(B_w), N_ref=int(X.shape[0]),
                         sigma_x=sigma_x)


def binary_entropy(p: Any) -> NDArray[np.float64]:
    """H_b(p) = −p log₂ p − (1−p) log₂(1−p) in bits, with 0·log 0 = 0."""
    p = np.asarray(p, dtype=np.float64)
    if np.any((p < 0) | (p > 1)) or not np.isfinite(p).all():
        raise ValueError("probabilities must lie in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(np.where(p > 0, p * np.log2(p), 0.0) + np.where(p < 1, (1 - p) * np.log2(1 - p), 0.0))
    return h


@dataclass(frozen=True)
class MDLResult:
    """Bits per sample of spec §7, with every ingredient recorded.

    total = L_support + L_code + L_resid + L_dict (entropy-form support, Frobenius/Stiefel dof as
    requested). ``L_support_fixed_k`` = log₂ C(n_b, k) (None without k); ``L_dict_grassmann`` uses
    dof = q(D − q).
    """

    total: float
    L_support: float
    L_code: float
    L_resid: float
    L_dict: float
    L_support_fixed_k: float | None
    L_dict_grassmann: float
    B_z: float
    z_absmax: float
    nnz_per_sample: float
    mean_sigma_r2: float
    n_b: int
    q: int
    D: int
    dof_kind: str
    precisions: MDLPrecisions

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def mdl_bits(X: Any, X_hat: Any, Z: Any, *, dof_kind: str, k: int | None = None,
             precisions: MDLPrecisions | None = None) -> MDLResult:
    """MDL cost in bits per sample (spec §7) of codes Z (N, n_b, q) and reconstruction X_hat of X (N, D).

    * L_support = Σ_g H_b(p_g), p_g = fraction of samples with z_g ≠ 0 (exact zeros: Π_k and sh_θ
      zero whole blocks).
    * L_code = mean_i (number of non-zero scalars of z_i)·B_z, B_z = max(0, log₂(2·z_absmax/δ_z)),
      z_absmax = max |z| over the set (Decision: B_z ≥ 0; when z_absmax < δ_z/2 every code rounds to 0).
    * L_resid = Σ_d max(0, ½ log₂(2πe σ̂²_{r,d}) − log₂ δ_x), σ̂²_{r,d} = mean_i (x_id − x̂_id)² per
      coordinate d (Decision: per coordinate, not pooled).
    * L_dict = n_b·dof·B_w/N_ref with dof = q·D (``frobenius``) or q·D − q(q+1)/2 (``stiefel``).
    ``precisions`` default to :func:`default_precisions` of X.
    """
    if dof_kind not in DOF_KINDS:
        raise ValueError(f"dof_kind must be one of {list(DOF_KINDS)}, got {dof_kind!r}")
    X = np.asarray(X, dtype=np.float64)
    X_hat = np.asarray(X_hat, dtype=np.float64)
    if X.ndim != 2 or X.shape != X_hat.shape or not (np.isfinite(X).all() and np.isfinite(X_hat).all()):
        raise ValueError(f"X and X_hat must be finite arrays of one (N, D) shape, got {X.shape} and {X_hat.shape}")
    Z = np.asarray(Z, dtype=np.float64)
    if Z.ndim != 3 or Z.shape[0] != X.shape[0] or not np.isfinite(Z).all():
        raise ValueError(f"Z must be a finite (N={X.shape[0]}, n_b, q) array, got shape {Z.shape}")
    N, D = X.shape
    _, n_b, q = Z.shape
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n_b):
        raise ValueError(f"k must be an int in [1, n_b={n_b}] or None, got {k!r}")
    prec = default_precisions(X) if precisions is None else precisions
    if not (prec.delta_x > 0 and prec.delta_z > 0 and prec.B_w >= 0 and prec.N_ref >= 1):
        raise ValueError(f"precisions must be positive, got {prec}")
    active = np.any(Z != 0, axis=2)
    L_support = float(binary_entropy(active.mean(axis=0)).sum())
    fixed_k = None if k is None else math.log2(math.comb(n_b, int(k)))
    z_absmax = float(np.abs(Z).max()) if Z.size else 0.0
    B_z = max(0.0, math.log2(2.0 * z_absmax / prec.delta_z)) if z_absmax > 0 else 0.0
    nnz = float(np.count_nonzero(Z) / N)
    L_code = nnz * B_z
    sigma_r2 = ((X - X_hat) ** 2).mean(axis=0)
    with np.errstate(divide="ignore"):
        per_coord = 0.5 * np.log2(2 * np.pi * np.e * sigma_r2) - math.log2(prec.delta_x)
    L_resid = float(np.maximum(per_coord, 0.0).sum())
    dof = q * D if dof_kind == "frobenius" else q * D - q * (q + 1) / 2
    L_dict = n_b * dof * prec.B_w / prec.N_ref
    L_dict_g = n_b * q * (D - q) * prec.B_w / prec.N_ref
    return MDLResult(total=L_support + L_code + L_resid + L_dict, L_support=L_support, L_code=L_code,
                     L_resid=L_resid, L_dict=float(L_dict), L_support_fixed_k=fixed_k, L_dict_grassmann=float(L_dict_g),
                     B_z=B_z, z_absmax=z_absmax, nnz_per_sample=nnz, mean_sigma_r2=float(sigma_r2.mean()),
                     n_b=int(n_b), q=int(q), D=int(D), dof_kind=dof_kind, precisions=prec)


def orthonormal_codes(Z: Any, W: Any) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Re-express block codes in orthonormal frames without changing any contribution (Decision).

    With the reduced QR W_g = Q_g R_g (diag R_g ≥ 0), c_ig = W_g z_ig = Q_g (R_g z_ig): returns
    (Z', Q) with z'_ig = R_g z_ig. Vanilla and Group-Lasso blocks are unit-Frobenius, so their codes
    scale like √q; in orthonormal coordinates a code coordinate is a length in data units, which is
    what the precision δ_z = 0.01·σ_x of spec §7 measures. (Q_g, R_g) carry the q·D numbers of W_g.
    """
    Z, W = _blocks(Z, W)
    Q, R = np.linalg.qr(W)
    signs = np.where(np.diagonal(R, axis1=1, axis2=2) < 0, -1.0, 1.0)
    Q = Q * signs[:, None, :]
    R = R * signs[:, :, None]
    return np.einsum("gab,igb->iga", R, Z), Q


# ------------------------------------------------------------------------------------------------ §8


def stable_rank(A: Any) -> float:
    """srank(A) = ‖A‖_F² / ‖A‖₂² ∈ [1, rank A]; ValueError for a zero or non-finite matrix."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2 or not np.isfinite(A).all():
        raise ValueError(f"A must be a finite 2-D matrix, got shape {A.shape}")
    s = np.linalg.svd(A, compute_uv=False)
    if s.size == 0 or s[0] == 0:
        raise ValueError("stable rank of a zero matrix is undefined")
    return float(np.sum(s**2) / s[0] ** 2)


def contribution_stable_ranks(Z: Any, W: Any, *, min_active: int = 2) -> list[float | None]:
    """Per block g: srank of the centred cloud {c_ig − mean} over samples where z_g ≠ 0 (spec §8 default).

    None for a block active on fewer than ``min_active`` samples or whose centred cloud is zero.
    """
    Z, W = _blocks(Z, W)
    out: list[float | None] = []
    for g in range(W.shape[0]):
        on = np.any(Z[:, g, :] != 0, axis=1)
        if on.sum() < min_active:
            out.append(None)
            continue
        C = Z[on, g, :] @ W[g].T
        C = C - C.mean(axis=0)
        out.append(stable_rank(C) if np.any(C != 0) else None)
    return out


def decoder_stable_ranks(W: Any) -> list[float]:
    """srank(W_g) per block (exactly q for orthonormal blocks, hence uninformative there)."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 3:
        raise ValueError(f"W must be (n_b, D, q), got shape {W.shape}")
    return [stable_rank(W[g]) for g in range(W.shape[0])]


# ------------------------------------------------------------------------------------------------ §9


def normalised_cov_eigenvalues(points: Any) -> NDArray[np.float64]:
    """Eigenvalues (descending) of the covariance of ``points`` (N, n) divided by its trace."""
    P = np.asarray(points, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] < 2 or not np.isfinite(P).all():
        raise ValueError(f"points must be a finite (N >= 2, n) array, got shape {P.shape}")
    C = np.cov(P, rowvar=False, bias=True).reshape(P.shape[1], P.shape[1])
    tr = np.trace(C)
    if tr <= 0:
        raise ValueError("points have zero variance")
    return np.sort(np.linalg.eigvalsh(C))[::-1] / tr


def best_direction_fraction(points: Any) -> float:
    """λ_max(Cov)/tr(Cov): the largest R² any single direction with a free scalar code reaches (§6 ceiling)."""
    return float(normalised_cov_eigenvalues(points)[0])


def nonnegative_atom_r2(points: Any, w: Any) -> float:
    """R² of the non-negative atom through the origin, c_i = (wᵀm_i)_+ w (unit w), against the centred cloud."""
    P = np.asarray(points, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if P.ndim != 2 or w.shape != (P.shape[1],) or not np.isclose(np.linalg.norm(w), 1.0, rtol=0, atol=1e-12):
        raise ValueError(f"need points (N, n) and a unit w (n,), got {P.shape} and {w.shape}")
    t = np.maximum(P @ w, 0.0)
    num = np.sum((P - t[:, None] * w) ** 2)
    den = np.sum((P - P.mean(axis=0)) ** 2)
    if den <= 0:
        raise ValueError("points have zero variance")
    return float(1.0 - num / den)
