"""Geometry of bilinear latents read from the weights alone (docs/bilinear.md §6).

Every latent of a bilinear autoencoder is a quadratic form. All three priors (§2) are sparse sums of
symmetrised rank-≤2 atoms, so one factored representation serves them all (:class:`FactoredForms`):

    B_k = Σ_p C_kp · sym(l_p r_pᵀ),      sym(A) = ½(A + Aᵀ),

* quadratic / GLU: atoms (l_p, r_p) = (u_p, v_p), C = I (the symmetric part of u vᵀ, §1: the encoder
  sees only sym(W));
* atomic: l_p = r_p = u_p, C = I;
* compound: l_p = r_p = u_p (the atoms), C the (sparse) composition matrix.

**Readout of latent k** (§6): B_k is never formed at size D×D. Its support atoms give
B_k = A M Aᵀ with A ∈ R^{D×r} (r ≤ 2·support) and a symmetric r×r core M; with the thin QR A = QR,
B_k = Q (R M Rᵀ) Qᵀ, so the nonzero spectrum of B_k is that of the r×r matrix R M Rᵀ and its
eigenvectors are Q times the small ones (cost O(D r²) per latent). Dense (d, D, D) arrays are
accepted too and eigendecomposed directly (small D: tests, oracles).

Statistics (§6 table), with μ sorted by |μ| (descending):

* numerical rank: #{|μ| > τ_eig·max|μ|}, τ_eig = 1e-6 (Decision, :data:`TAU_EIG`);
* effective rank (Σ|μ|)²/Σμ²; importance Σμ² = ‖B‖_F², normalised to sum 1 over latents;
  captured (top 3) (|μ₁|+|μ₂|+|μ₃|)/Σ|μ|; support ‖C_k‖₀ (compound only).
  For a zero form (label ``null``) the effective rank and captured fraction are 0 (Decision: the
  ratios are 0/0 there); if every form is zero every importance is 0.
* label: ``null`` (rank 0); ``paraboloid`` when a linear term b_k is given and is not in the range of
  B_k (‖b − P_range b‖ > τ_eig·‖b‖, the same threshold; Decision); else ``slab`` (rank 1),
  ``ellipsoid`` (rank ≥ 2, all nonzero μ of one sign) or ``hyperboloid`` (mixed signs).
  Only eigenvalues above the rank threshold count for the sign test.

Eigenvectors are returned as columns, the top-``top_k`` by |μ|, each signed so that its largest-
magnitude entry is positive (deterministic output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.theory.bilinear_lifted import BilinearDictionary

__all__ = [
    "TAU_EIG",
    "LABELS",
    "FactoredForms",
    "LatentGeometry",
    "symmetrise",
    "classify",
    "numerical_rank",
    "effective_rank",
    "captured_fraction",
    "compound_support",
    "readout",
]

#: Relative eigenvalue threshold of the numerical rank (§6 step 3, Decision).
TAU_EIG = 1e-6
LABELS = ("slab", "ellipsoid", "hyperboloid", "paraboloid", "null")

Array = NDArray[np.float64]


def _matrix(x: ArrayLike, name: str, ndim: int) -> Array:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf")
    return a


@dataclass(frozen=True)
class FactoredForms:
    """Forms B_k = Σ_p C_kp·sym(l_p r_pᵀ), k = 1..d (module docstring).

    ``left`` (n, D) rows l_p; ``right`` (n, D) rows r_p, or None for symmetric atoms (r_p = l_p);
    ``mix`` (d, n) the matrix C, or None for C = I (d = n).
    """

    left: Array
    right: Array | None = None
    mix: Array | None = None

    def __post_init__(self) -> None:
        left = _matrix(self.left, "left atoms", 2)
        object.__setattr__(self, "left", left)
        if self.right is not None:
            right = _matrix(self.right, "right atoms", 2)
            if right.shape != left.shape:
                raise ValueError(f"right atoms must have the shape of the left ones {left.shape}, got {right.shape}")
            object.__setattr__(self, "right", right)
        if self.mix is not None:
            mix = _matrix(self.mix, "composition matrix C", 2)
            if mix.shape[1] != left.shape[0]:
                raise ValueError(f"C must have {left.shape[0]} columns (one per atom), got shape {mix.shape}")
            object.__setattr__(self, "mix", mix)
        if left.shape[0] < 1 or left.shape[1] < 1:
            raise ValueError(f"atoms must be a non-empty (n, D) matrix, got shape {left.shape}")

    @classmethod
    def from_dictionary(cls, dictionary: BilinearDictionary) -> FactoredForms:
        """The symmetrised forms of a :class:`theory.bilinear_lifted.BilinearDictionary` (any decoder:
        the readout and the similarity use sym(W_j), §6 step 1 and §7)."""
        return cls(dictionary.U, right=dictionary.V, mix=dictionary.C)

    @property
    def d(self) -> int:
        """Number of forms (latents)."""
        return int(self.left.shape[0] if self.mix is None else self.mix.shape[0])

    @property
    def D(self) -> int:
        return int(self.left.shape[1])

    @property
    def symmetric_atoms(self) -> bool:
        return self.right is None

    def atom_gram(self, other: FactoredForms) -> Array:
        """⟨sym(l_p r_pᵀ), sym(l'_q r'_qᵀ)⟩_F = ½[(l·l')(r·r') + (l·r')(r·l')], shape (n, n')."""
        if self.D != other.D:
            raise ValueError(f"forms live in different dimensions: D = {self.D} and {other.D}")
        ra = self.left if self.right is None else self.right
        rb = other.left if other.right is None else other.right
        ll, rr = self.left @ other.left.T, ra @ rb.T
        if self.symmetric_atoms and other.symmetric_atoms:
            return ll * ll
        return 0.5 * (ll * rr + (self.left @ rb.T) * (ra @ other.left.T))

    def gram(self, other: FactoredForms) -> Array:
        """The (d, d') Gram matrix ⟨B_k, B'_m⟩_F = C K_atoms C'ᵀ; nothing D×D is formed."""
        K = self.atom_gram(other)
        if self.mix is not None:
            K = self.mix @ K
        if other.mix is not None:
            K = K @ other.mix.T
        return K

    def frobenius_sq(self) -> Array:
        """‖B_k‖_F² for every k without any n×n or d×d Gram matrix: for C = I, ‖l‖⁴ (symmetric atoms) or
        ½(‖l‖²‖r‖² + (l·r)²); otherwise tr(M G M G) with G = AᵀA from :meth:`factor` (O(D r²) per form)."""
        if self.mix is None:
            ll = np.einsum("pi,pi->p", self.left, self.left)
            if self.right is None:
                return ll * ll
            rr = np.einsum("pi,pi->p", self.right, self.right)
            lr = np.einsum("pi,pi->p", self.left, self.right)
            return 0.5 * (ll * rr + lr * lr)
        out = np.empty(self.d)
        for k in range(self.d):
            A, M = self.factor(k)
            MG = M @ (A.T @ A)
            out[k] = np.sum(MG * MG.T)
        return out

    def support(self, k: int) -> Array:
        """Indices p with C_kp ≠ 0 (for C = I: just k)."""
        if self.mix is None:
            return np.array([k])
        return np.flatnonzero(self.mix[k])

    def factor(self, k: int) -> tuple[Array, Array]:
        """(A, M) with B_k = A M Aᵀ: A (D, r) holds the support atoms, M (r, r) is symmetric."""
        p = self.support(k)
        c = np.ones(1) if self.mix is None else self.mix[k, p]
        if self.right is None:
            return self.left[p].T, np.diag(c)
        s = p.size
        M = np.zeros((2 * s, 2 * s))
        M[:s, s:] = M[s:, :s] = 0.5 * np.diag(c)
        return np.concatenate([self.left[p].T, self.right[p].T], axis=1), M

    def dense(self) -> Array:
        """The symmetric forms as a (d, D, D) array (O(d D²) memory: small D only)."""
        ra = self.left if self.right is None else self.right
        mix = np.eye(self.left.shape[0]) if self.mix is None else self.mix
        W = np.einsum("kp,pi,pj->kij", mix, self.left, ra)
        return 0.5 * (W + np.swapaxes(W, 1, 2))


def symmetrise(W: ArrayLike) -> Array:
    """½(W + Wᵀ) over the last two axes of a (D, D) or (d, D, D) array."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim < 2 or W.shape[-1] != W.shape[-2]:
        raise ValueError(f"forms must be square in their last two axes, got shape {W.shape}")
    return 0.5 * (W + np.swapaxes(W, -1, -2))


def _sorted_by_magnitude(mu: Array, vecs: Array) -> tuple[Array, Array]:
    order = np.argsort(-np.abs(mu), kind="stable")
    vecs = vecs[:, order]
    if vecs.size:
        pivots = np.argmax(np.abs(vecs), axis=0)
        vecs = vecs * np.where(vecs[pivots, np.arange(vecs.shape[1])] < 0, -1.0, 1.0)
    return mu[order], vecs


def _factored_spectrum(A: Array, M: Array) -> tuple[Array, Array]:
    """Nonzero-candidate spectrum of A M Aᵀ via the thin QR of A (module docstring)."""
    Q, R = np.linalg.qr(A)
    mu, V = np.linalg.eigh(R @ M @ R.T)
    return _sorted_by_magnitude(mu, Q @ V)


def _dense_spectrum(B: Array) -> tuple[Array, Array]:
    mu, V = np.linalg.eigh(B)
    return _sorted_by_magnitude(mu, V)


def numerical_rank(mu: ArrayLike, tau: float = TAU_EIG) -> int:
    """#{|μ| > τ·max|μ|} (0 for an all-zero spectrum)."""
    a = np.abs(np.asarray(mu, dtype=np.float64))
    if a.size == 0 or a.max() == 0.0:
        return 0
    return int(np.sum(a > tau * a.max()))


def effective_rank(mu: ArrayLike) -> float:
    """(Σ|μ|)²/Σμ² (0 for an all-zero spectrum)."""
    a = np.abs(np.asarray(mu, dtype=np.float64))
    sq = float(np.sum(a * a))
    return float(np.sum(a)) ** 2 / sq if sq > 0 else 0.0


def captured_fraction(mu: ArrayLike, top: int = 3) -> float:
    """(|μ₁|+…+|μ_top|)/Σ|μ| with μ sorted by |μ| (0 for an all-zero spectrum)."""
    a = np.sort(np.abs(np.asarray(mu, dtype=np.float64)))[::-1]
    total = float(np.sum(a))
    return float(np.sum(a[:top])) / total if total > 0 else 0.0


def classify(mu: ArrayLike, *, linear_outside_range: bool = False, tau: float = TAU_EIG) -> str:
    """The §6 label of a form with eigenvalues μ (module docstring)."""
    mu = np.asarray(mu, dtype=np.float64)
    rank = numerical_rank(mu, tau)
    if rank == 0:
        return "null"
    if linear_outside_range:
        return "paraboloid"
    if rank == 1:
        return "slab"
    kept = mu[np.abs(mu) > tau * np.max(np.abs(mu))]
    return "ellipsoid" if (np.all(kept > 0) or np.all(kept < 0)) else "hyperboloid"


def compound_support(C: ArrayLike) -> Array:
    """‖C_k‖₀ for every composite (row) k of the composition matrix."""
    return np.count_nonzero(_matrix(C, "C", 2), axis=1)


@dataclass(frozen=True)
class LatentGeometry:
    """The §6 readout of one latent. ``eigenvalues`` sorted by |μ| (the factored route lists the
    ≤ r candidates only; the rest of the spectrum is exactly 0); ``eigenvectors`` (D, ≤ top_k)."""

    index: int
    label: str
    rank: int
    effective_rank: float
    importance: float
    frobenius_sq: float
    captured_top3: float
    eigenvalues: Array
    eigenvectors: Array
    support: int | None

    def summary(self, n_eigenvalues: int = 3) -> dict[str, Any]:
        """JSON-ready fields (eigenvectors omitted)."""
        return {"latent": self.index, "label": self.label, "rank": self.rank,
                "effective_rank": self.effective_rank, "importance": self.importance,
                "frobenius_sq": self.frobenius_sq, "captured_top3": self.captured_top3,
                "top_eigenvalues": [float(m) for m in self.eigenvalues[:n_eigenvalues]],
                "support": self.support}


def readout(forms: FactoredForms | ArrayLike, *, linear: ArrayLike | None = None, top_k: int = 3,
            latents: Sequence[int] | None = None, tau: float = TAU_EIG) -> list[LatentGeometry]:
    """The §6 readout of the latents ``latents`` (default all) of ``forms``.

    ``forms``: a :class:`FactoredForms` or a dense (d, D, D) array (symmetrised here). ``linear``:
    optional (d, D) linear terms b_k (for the paraboloid test). Importance is normalised over ALL d
    latents, whichever are read out.
    """
    if not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if not (np.isfinite(tau) and 0 < tau < 1):
        raise ValueError(f"tau must lie in (0, 1), got {tau}")
    if isinstance(forms, FactoredForms):
        d, D = forms.d, forms.D
        fro = forms.frobenius_sq()
        dense = None
    else:
        dense = symmetrise(_matrix(forms, "forms", 3))
        d, D = dense.shape[0], dense.shape[1]
        fro = np.einsum("kij,kij->k", dense, dense)
    b = None
    if linear is not None:
        b = _matrix(linear, "linear terms", 2)
        if b.shape != (d, D):
            raise ValueError(f"linear terms must have shape {(d, D)}, got {b.shape}")
    idx = list(range(d)) if latents is None else [int(k) for k in latents]
    bad = [k for k in idx if not 0 <= k < d]
    if bad:
        raise ValueError(f"latent index {bad[0]} out of range [0, {d})")
    total = float(np.sum(fro))
    out = []
    for k in idx:
        mu, vecs = _dense_spectrum(dense[k]) if dense is not None else _factored_spectrum(*forms.factor(k))
        rank = numerical_rank(mu, tau)
        outside = False
        if b is not None and rank > 0 and np.any(b[k] != 0):
            rng = vecs[:, :rank]
            residual = b[k] - rng @ (rng.T @ b[k])
            outside = bool(np.linalg.norm(residual) > tau * np.linalg.norm(b[k]))
        support = None
        if isinstance(forms, FactoredForms) and forms.mix is not None:
            support = int(np.count_nonzero(forms.mix[k]))
        out.append(LatentGeometry(
            index=k, label=classify(mu, linear_outside_range=outside, tau=tau), rank=rank,
            effective_rank=effective_rank(mu), importance=float(fro[k]) / total if total > 0 else 0.0,
            frobenius_sq=float(fro[k]), captured_top3=captured_fraction(mu, 3),
            eigenvalues=mu, eigenvectors=vecs[:, :top_k], support=support))
    return out
