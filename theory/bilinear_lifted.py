"""Bilinear autoencoders in the lifted space: forms, the kernel-trick loss, its gradients, Hoyer density.

docs/bilinear.md §0–§3, §5 and §10. float64 numpy references; the test oracles of
:mod:`empirics.architectures.bilinear`.

Layout (as everywhere in dictcheck): tokens are ROWS. ``X`` is (N, D) with unit-norm rows,
``Z`` is (N, d_z). The spec writes the batch as columns (X ∈ R^{D×N}); its formulas are transposed
accordingly. ``U`` (d_z × D) and ``V`` hold the GLU factors as rows; the compound prior has atoms
``U`` (n_a × D) and composition ``C`` (d_z × n_a) (the EFFECTIVE, already sparsified C).

Priors (spec §2) and their kernels K_jl = ⟨W_j, W_l⟩_F:

=====================  ===============================  ==========================================
prior / decoder        latent z_j                       K
=====================  ===============================  ==========================================
quadratic, symmetric   (u_j·x)(v_j·x)                   ½[(UUᵀ)⊙(VVᵀ) + (UVᵀ)⊙(VUᵀ)]  (W_j = sym(u_j v_jᵀ))
quadratic, asymmetric  (u_j·x)(v_j·x)                   (UUᵀ)⊙(VVᵀ)                    (W_j = u_j v_jᵀ)
atomic                 (u_j·x)²                         (UUᵀ)^∘2                       (W_j = u_j u_jᵀ)
compound               z = C y, y = (Ux)^∘2             C (UUᵀ)^∘2 Cᵀ                  (W_k = Σ_j C_kj u_j u_jᵀ)
compound, GLU atoms    z = C y, y = (Ux)⊙(Vx)           C K_GLU Cᵀ                     (W_k = Σ_j C_kj sym(u_j v_jᵀ))
=====================  ===============================  ==========================================

GLU atoms (spec §2, the workshop's "mixed" model): the compound prior with atoms u_j v_jᵀ, i.e. V
given; K_GLU is the quadratic prior's kernel of the atoms (symmetric decoder, or asymmetric
(UUᵀ)⊙(VVᵀ), the authors' kernel). The atomic prior with GLU atoms IS the quadratic prior.

Batch loss (spec §3), with ‖x‖ = 1 so ‖T‖_F = 1 and ⟨T, W_j⟩ = z_j:

    L = (1/N) Σ_i ‖x_i x_iᵀ − Σ_j z_ij W_j‖_F² = (1/N)[⟨K, ZᵀZ⟩_F − 2‖Z‖_F² + N].

For the compound prior the quadratic term is evaluated in atom space (spec §3): with H = Z C,
⟨K, ZᵀZ⟩ = ⟨(UUᵀ)^∘2, HᵀH⟩. Tiling (spec §3, §9 pitfall 1): the quadratic term is
Σ_{I≤J} w_IJ ⟨K_IJ, M_Iᵀ M_J⟩ over blocks of the latent (compound: atom) axis with w = 1 on
diagonal block pairs and w = 2 off the diagonal (K and MᵀM are symmetric).

:func:`kernel_block`, :func:`block_pairs` and :func:`quadratic_term` use only ``@``, ``*``, ``.T``
and ``.sum()``, so the torch model evaluates the same expressions on tensors (one definition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "PRIORS",
    "DECODERS",
    "BilinearDictionary",
    "normalise_tokens",
    "naive_lifted_loss",
    "kernel_block",
    "block_pairs",
    "quadratic_term",
    "kernel_lifted_loss",
    "lifted_loss_gradients",
    "HoyerDensity",
    "hoyer_density",
    "ordered_lifted_loss",
    "naive_ordered_lifted_loss",
    "SPAN_RTOL",
    "span_fraction",
    "lifted_principal_forms",
    "lifted_spectrum",
]

PRIORS = ("quadratic", "atomic", "compound")
DECODERS = ("symmetric", "asymmetric")
#: |‖x‖ − 1| above this means the rows were not normalised (the "+N" of the kernel loss needs ‖x‖ = 1).
UNIT_NORM_TOL = 1e-8


def _matrix(name: str, A: Any, cols: int | None = None) -> NDArray[np.float64]:
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"{name} must be a 2-d array, got shape {A.shape}")
    if cols is not None and A.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns, got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError(f"{name} contains non-finite entries")
    return A


@dataclass(frozen=True)
class BilinearDictionary:
    """The weights of one bilinear autoencoder (spec §2), validated, float64.

    ``quadratic``: U, V (d_z × D), ``decoder`` symmetric (default, spec §4) or asymmetric.
    ``atomic``: U (d_z × D); V is None. ``compound``: U (n_a × D) atoms, C (d_z × n_a), the
    effective (sparsified) composition used by the forward pass; with V (n_a × D) the atoms are GLU
    pairs u_j v_jᵀ (then ``decoder`` may be asymmetric too).
    """

    prior: str
    U: NDArray[np.float64]
    V: NDArray[np.float64] | None = None
    C: NDArray[np.float64] | None = None
    decoder: str = "symmetric"

    def __post_init__(self) -> None:
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {self.decoder!r}")
        if self.V is None and self.decoder != "symmetric":
            raise ValueError(f"decoder={self.decoder!r} exists only for GLU forms (quadratic prior, compound GLU atoms)")
        U = _matrix("U", self.U)
        object.__setattr__(self, "U", U)
        needs_c = self.prior == "compound"
        if self.prior == "quadratic" and self.V is None:
            raise ValueError("V must be given for the quadratic prior")
        if self.prior == "atomic" and self.V is not None:
            raise ValueError("V must be None for the atomic prior (GLU atoms without C are the quadratic prior)")
        needs_v = self.V is not None
        if (self.C is not None) != needs_c:
            raise ValueError(f"C must be {'given' if needs_c else 'None'} for the {self.prior} prior")
        if needs_v:
            V = _matrix("V", self.V, U.shape[1])
            if V.shape != U.shape:
                raise ValueError(f"U and V must have the same shape, got {U.shape} and {V.shape}")
            object.__setattr__(self, "V", V)
        if needs_c:
            object.__setattr__(self, "C", _matrix("C", self.C, U.shape[0]))

    @property
    def d_in(self) -> int:
        return self.U.shape[1]

    @property
    def d_z(self) -> int:
        return self.C.shape[0] if self.C is not None else self.U.shape[0]

    def atom_activations(self, X: NDArray) -> NDArray[np.float64]:
        """Y (N, n): y_j = (u_j·x)(v_j·x), or (u_j·x)² without V; the latents unless the prior is compound."""
        X = _matrix("X", X, self.d_in)
        P = X @ self.U.T
        return P * (X @ self.V.T) if self.V is not None else P**2

    def latents(self, X: NDArray) -> NDArray[np.float64]:
        """Z (N, d_z): z_j = xᵀW_j x for each row x of X (no normalisation here)."""
        Y = self.atom_activations(X)
        return Y @ self.C.T if self.C is not None else Y

    def forms(self) -> NDArray[np.float64]:
        """The decoder's forms W_j, (d_z, D, D): sym(u_j v_jᵀ) | u_j v_jᵀ (asymmetric) | u_j u_jᵀ, mixed by C
        for the compound prior (Σ_j C_kj of the atoms).

        The encoder sees only sym(W_j); the asymmetric decoder's forms are not symmetric.
        """
        U = self.U
        W = np.einsum("jd,je->jde", U, U if self.V is None else self.V)
        if self.V is not None and self.decoder == "symmetric":
            W = 0.5 * (W + W.transpose(0, 2, 1))
        return W if self.C is None else np.einsum("kj,jde->kde", self.C, W)

    def kernel(self) -> NDArray[np.float64]:
        """K (d_z × d_z), K_jl = ⟨W_j, W_l⟩_F, from Gram matrices (nothing D×D formed)."""
        m = self.U.shape[0]
        K = kernel_block(self.prior, self.decoder, self.U, self.V, slice(0, m), slice(0, m))
        return K if self.prior != "compound" else self.C @ K @ self.C.T


def normalise_tokens(X: NDArray) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """(rows x/‖x‖ of the nonzero rows, mask of the kept rows) (spec §0; zero rows are dropped)."""
    X = _matrix("X", X)
    norms = np.linalg.norm(X, axis=1)
    keep = norms > 0
    return X[keep] / norms[keep, None], keep


def _unit_rows(X: NDArray, d_in: int) -> NDArray[np.float64]:
    X = _matrix("X", X, d_in)
    if X.shape[0] == 0:
        raise ValueError("X has no rows")
    dev = np.max(np.abs(np.linalg.norm(X, axis=1) - 1.0))
    if dev > UNIT_NORM_TOL:
        raise ValueError(f"rows of X must have unit norm (max |‖x‖ − 1| = {dev:.3g}); use normalise_tokens")
    return X


def naive_lifted_loss(X: NDArray, W: NDArray) -> float:
    """The test oracle: (1/N) Σ_i ‖x_i x_iᵀ − Σ_j z_ij W_j‖_F² with z_ij = x_iᵀW_j x_i (spec §1).

    Forms T_i = x_i x_iᵀ and T̂_i explicitly (N·D² memory). ``X`` (N, D) rows as given (the
    definition needs no normalisation); ``W`` (d_z, D, D) the forms, e.g. ``BilinearDictionary.forms()``.
    """
    X = _matrix("X", X)
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 3 or W.shape[1:] != (X.shape[1], X.shape[1]):
        raise ValueError(f"W must have shape (d_z, {X.shape[1]}, {X.shape[1]}), got {W.shape}")
    if X.shape[0] == 0:
        raise ValueError("X has no rows")
    T = np.einsum("nd,ne->nde", X, X)
    Z = np.einsum("nd,jde,ne->nj", X, W, X)
    T_hat = np.einsum("nj,jde->nde", Z, W)
    return float(np.sum((T - T_hat) ** 2) / X.shape[0])


def kernel_block(prior: str, decoder: str, U: Any, V: Any, rows: slice, cols: slice) -> Any:
    """K[rows, cols] from Gram blocks (numpy arrays or torch tensors alike).

    GLU forms (V given: quadratic prior, compound GLU atoms): ½[(U_I U_Jᵀ)⊙(V_I V_Jᵀ) + (U_I V_Jᵀ)⊙(V_I U_Jᵀ)]
    (symmetric decoder) or (U_I U_Jᵀ)⊙(V_I V_Jᵀ) (asymmetric); rank-1 forms (V None: atomic and compound):
    (U_I U_Jᵀ)^∘2. For the compound prior this is the ATOM kernel (U, V hold the atoms). ``prior`` is
    validated only; the kernel is decided by V.
    """
    if prior not in PRIORS:
        raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
    UU = U[rows] @ U[cols].T
    if V is None:
        return UU * UU
    K = UU * (V[rows] @ V[cols].T)
    if decoder == "asymmetric":
        return K
    return 0.5 * (K + (U[rows] @ V[cols].T) * (V[rows] @ U[cols].T))


def block_pairs(m: int, tile: int) -> list[tuple[slice, slice, float]]:
    """Unordered block pairs (I ≤ J) of an axis of length m in tiles of ``tile`` (0 = one block).

    Weight 1 for diagonal pairs and 2 for off-diagonal ones (spec §3; §9 pitfall 1).
    """
    if tile < 0:
        raise ValueError(f"tile must be >= 0, got {tile}")
    step = m if tile == 0 or tile >= m else tile
    starts = range(0, m, step)
    return [
        (slice(a, min(a + step, m)), slice(b, min(b + step, m)), 1.0 if a == b else 2.0)
        for a in starts
        for b in starts
        if a <= b
    ]


def quadratic_term(prior: str, decoder: str, U: Any, V: Any, M: Any, tile: int = 0) -> Any:
    """Σ_i m_iᵀ K m_i = Σ_{I≤J} w_IJ ⟨K_IJ, M_Iᵀ M_J⟩ (M (N, m): Z, or H = Z C for the compound prior)."""
    return sum(
        w * (kernel_block(prior, decoder, U, V, I, J) * (M[:, I].T @ M[:, J])).sum()
        for I, J, w in block_pairs(M.shape[1], tile)
    )


def kernel_lifted_loss(X: NDArray, dictionary: BilinearDictionary, tile: int = 0) -> float:
    """The kernel-trick loss (1/N)[⟨K, ZᵀZ⟩ − 2‖Z‖² + N] (spec §3); X (N, D) with unit rows.

    Nothing D×D is formed. ``tile`` > 0 evaluates ⟨K, ZᵀZ⟩ in tiles (same value).
    """
    d = dictionary
    X = _unit_rows(X, d.d_in)
    Z = d.latents(X)
    M = Z @ d.C if d.prior == "compound" else Z
    q = quadratic_term(d.prior, d.decoder, d.U, d.V, M, tile)
    N = X.shape[0]
    return float((q - 2.0 * np.sum(Z * Z) + N) / N)


def lifted_loss_gradients(X: NDArray, dictionary: BilinearDictionary) -> dict[str, NDArray[np.float64]]:
    """Closed-form gradients of the kernel loss (spec §3), rows layout; keys "U" (, "V") (, "C").

    With G = ∂L/∂Z = (2ZK − 4Z)/N, S = ZᵀZ/N, P_U = XUᵀ, P_V = XVᵀ, and in atom space G_a = G, S_a = S
    (quadratic, atomic) or, chaining through z = Cy with K = C A Cᵀ (A the atom kernel), G_a = GC,
    S_a = CᵀSC and ∇_C = GᵀY + 2SCA (compound; Y the atom activations):

    * GLU atoms, symmetric decoder: ∇_U = (G_a⊙P_V)ᵀX + (S_a⊙VVᵀ)U + (S_a⊙VUᵀ)V, and ∇_V likewise with U ↔ V;
    * GLU atoms, asymmetric decoder: ∇_U = (G_a⊙P_V)ᵀX + 2(S_a⊙VVᵀ)U, and symmetrically for V;
    * rank-1 atoms: ∇_U = (G_a⊙2P_U)ᵀX + 4(S_a⊙UUᵀ)U.

    ∇_C is with respect to the effective C; the model passes it straight through to all entries.
    """
    d = dictionary
    X = _unit_rows(X, d.d_in)
    N = X.shape[0]
    U, V, C = d.U, d.V, d.C
    Z = d.latents(X)
    G = (2.0 * Z @ d.kernel() - 4.0 * Z) / N
    S = Z.T @ Z / N
    PU = X @ U.T
    out: dict[str, NDArray[np.float64]] = {}
    if C is not None:
        m = U.shape[0]
        A = kernel_block(d.prior, d.decoder, U, V, slice(0, m), slice(0, m))
        out["C"] = G.T @ d.atom_activations(X) + 2.0 * S @ C @ A
        G, S = G @ C, C.T @ S @ C
    if V is None:
        out["U"] = (G * 2.0 * PU).T @ X + 4.0 * (S * (U @ U.T)) @ U
        return out
    PV = X @ V.T
    if d.decoder == "symmetric":
        out["U"] = (G * PV).T @ X + (S * (V @ V.T)) @ U + (S * (V @ U.T)) @ V
        out["V"] = (G * PU).T @ X + (S * (U @ U.T)) @ V + (S * (U @ V.T)) @ U
    else:
        out["U"] = (G * PV).T @ X + 2.0 * (S * (V @ V.T)) @ U
        out["V"] = (G * PU).T @ X + 2.0 * (S * (U @ U.T)) @ V
    return out


class HoyerDensity(NamedTuple):
    """Per-latent Hoyer density (spec §5): ``eta`` (d_z,), 0.0 as a placeholder where ``dead``;
    ``dead`` (d_z,) bool (a_j = 0 over the batch); ``mean`` η̄ over the live latents (0.0 if none);
    ``n_dead``."""

    eta: NDArray[np.float64]
    dead: NDArray[np.bool_]
    mean: float
    n_dead: int


def hoyer_density(A: NDArray) -> HoyerDensity:
    """η_j = (‖a_j‖₁/‖a_j‖₂ − 1)/(√N − 1) ∈ [0, 1] per latent over the N rows of A (N, d_z) (spec §5).

    |a| is used implicitly (norms). Dead latents (a_j = 0, 0/0) are excluded from η̄ and counted,
    never NaN. Needs N ≥ 2 (√N − 1 = 0 otherwise). The rows must be the batch's real tokens only.
    """
    A = _matrix("A", A)
    N = A.shape[0]
    if N < 2:
        raise ValueError(f"Hoyer density needs at least 2 tokens, got {N}")
    l1 = np.sum(np.abs(A), axis=0)
    l2 = np.sqrt(np.sum(A * A, axis=0))
    dead = l2 == 0
    eta = np.where(dead, 0.0, (l1 / np.where(dead, 1.0, l2) - 1.0) / (np.sqrt(N) - 1.0))
    live = ~dead
    mean = float(np.mean(eta[live])) if np.any(live) else 0.0
    return HoyerDensity(eta, dead, mean, int(np.sum(dead)))


def ordered_lifted_loss(X: NDArray, dictionary: BilinearDictionary) -> float:
    """Prefix-averaged (nested) loss of spec §10: mean_i [z_iᵀ(K⊙Γ)z_i − 2Σ_j c_j z_ij²] + 1,

    Γ_jl = (d_z − max(j, l))/d_z, c_j = (d_z − j)/d_z (0-based j), i.e. E_p over p uniform on
    {1..d_z} of the loss of the prefix dictionary {W_j : j < p}. X (N, D) with unit rows.
    """
    d = dictionary
    X = _unit_rows(X, d.d_in)
    Z = d.latents(X)
    n = d.d_z
    j = np.arange(n)
    gamma = (n - np.maximum.outer(j, j)) / n
    c = (n - j) / n
    quad = np.einsum("nj,jl,nl->n", Z, d.kernel() * gamma, Z)
    return float(np.mean(quad - 2.0 * (Z * Z) @ c) + 1.0)


def naive_ordered_lifted_loss(X: NDArray, dictionary: BilinearDictionary) -> float:
    """Oracle of :func:`ordered_lifted_loss`: the mean over p = 1..d_z of the naive loss of the first p forms.

    The latents are those of the full dictionary (a prefix only truncates the decoder's sum).
    """
    d = dictionary
    X = _matrix("X", X, d.d_in)
    W = d.forms()
    Z = d.latents(X)
    T = np.einsum("nd,ne->nde", X, X)
    losses = [np.sum((T - np.einsum("nj,jde->nde", Z[:, :p], W[:p])) ** 2) / X.shape[0] for p in range(1, d.d_z + 1)]
    return float(np.mean(losses))


# ------------------------------------------------------------------------------------------------
# Span-level recovery (docs/bilinear.md §6a; issue 16 item 2)

#: Singular values of the stacked forms below SPAN_RTOL · the largest do not span (numerical rank).
SPAN_RTOL = 1e-8


def span_fraction(W: NDArray, H: NDArray) -> float:
    """‖P_𝒲 vec H‖² / ‖vec H‖² ∈ [0, 1]: the fraction of the form H inside span{W_j} (Frobenius inner product).

    ``W`` (d, D, D) forms, ``H`` (D, D). P_𝒲 is the orthogonal projector onto the span of the vec W_j, from
    an SVD of the (D², d) stack keeping singular values above SPAN_RTOL·max. Invariant to any invertible
    mixing of the W_j; 1 iff H is a combination of them; a random d-dimensional subspace of Sym(R^{D×D})
    holds d/(D(D+1)/2) of a symmetric H on average.
    """
    W = np.asarray(W, dtype=np.float64)
    H = np.asarray(H, dtype=np.float64)
    if W.ndim != 3 or W.shape[1] != W.shape[2] or H.shape != W.shape[1:]:
        raise ValueError(f"W must be (d, D, D) and H (D, D) of the same D, got {W.shape} and {H.shape}")
    if not (np.all(np.isfinite(W)) and np.all(np.isfinite(H))):
        raise ValueError("W and H must be finite")
    h = H.ravel()
    hh = float(h @ h)
    if hh == 0.0:
        raise ValueError("H is zero")
    Q, sv, _ = np.linalg.svd(W.reshape(W.shape[0], -1).T, full_matrices=False)
    if sv.size == 0 or sv[0] == 0.0:
        return 0.0
    Q = Q[:, sv > SPAN_RTOL * sv[0]]
    return float(np.sum((Q.T @ h) ** 2) / hh)


def lifted_principal_forms(X: NDArray, r: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(the top-r principal forms (r, D, D), all eigenvalues of the lifts' second moment, descending).

    The forms are the top-r eigenvectors of the UNcentred second moment (1/N) Σ_i vec(T_i) vec(T_i)ᵀ of the
    lifts T_i = x_i x_iᵀ (rows of X), reshaped to D×D: orthonormal in Frobenius and symmetric. They are the
    optimum of a tied linear autoencoder of the lifts with r forms (Eckart–Young), so with unit rows
    naive_lifted_loss(X, forms) = 1 − (sum of the top r eigenvalues) (the eigenvalues sum to 1), the lowest
    lifted NMSE of ANY r forms, and span_fraction(forms, H) is the most of H an optimal r-form model can hold.
    Works in the D(D+1)/2 coordinates of Sym(R^{D×D}) (off-diagonal pairs weighted √2), so small D only.
    """
    X = _matrix("X", X)
    N, D = X.shape
    m = D * (D + 1) // 2
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 1 <= r <= m:
        raise ValueError(f"r must be an int in [1, D(D+1)/2 = {m}], got {r!r}")
    if N == 0:
        raise ValueError("X has no rows")
    iu = np.triu_indices(D)
    w = np.where(iu[0] == iu[1], 1.0, np.sqrt(2.0))
    L = np.einsum("ni,nj->nij", X, X)[:, iu[0], iu[1]] * w  # isometric coordinates of the lifts
    evals, evecs = np.linalg.eigh(L.T @ L / N)
    order = np.argsort(evals)[::-1]
    evals, evecs = evals[order], evecs[:, order[:r]]
    forms = np.zeros((r, D, D))
    forms[:, iu[0], iu[1]] = (evecs / w[:, None]).T
    forms = forms + np.triu(forms, 1).transpose(0, 2, 1)
    return forms, np.clip(evals, 0.0, None)


def lifted_spectrum(X: NDArray) -> NDArray[np.float64]:
    """The nonzero spectrum (descending, summing to 1 for unit rows) of the lifts' uncentred second moment.

    Same values as :func:`lifted_principal_forms`'s eigenvalues, by the cheaper route: for N < D(D+1)/2 the
    N × N Gram (1/N)[(x_i·x_j)²] (⟨T_i, T_j⟩_F = (x_i·x_j)², so it shares the nonzero spectrum), otherwise the
    D(D+1)/2 Sym coordinates. Large D (e.g. a residual stream) is fine when N is moderate.
    """
    X = _matrix("X", X)
    N, D = X.shape
    if N == 0:
        raise ValueError("X has no rows")
    if N >= D * (D + 1) // 2:
        return lifted_principal_forms(X, 1)[1]
    G = X @ X.T
    return np.clip(np.sort(np.linalg.eigvalsh(G * G / N))[::-1], 0.0, None)
