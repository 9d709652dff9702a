"""The quadric toy: tokens on planted low-dimensional quadrics plus sparse linear features
(issue 5 item 7; docs/bilinear.md §6).

**Why the design survives normalisation.** Bilinear autoencoders see x/‖x‖ (§0). A quadric centred
in a subspace S does not survive that map: any radial family of points collapses to the unit sphere
of S, on which P_S and every planted form differ only by a constant. So the toy builds tokens that
are ALREADY unit vectors, with the quadric coordinates and the filler in orthogonal subspaces:

    x = S_c y + √(1 − ‖y‖²) · ŵ,      ‖x‖ = 1 exactly,

* S_c ∈ R^{D×m_c}: the orthonormal basis of component c's random subspace (the subspaces of the
  components and the linear complement are mutually orthogonal columns of one random orthogonal
  matrix);
* y ∈ R^{m_c}: a point on the planted quadric yᵀ A_c y = 1 with ‖y‖ ≤ ρ < 1;
* ŵ: the unit direction of a sparse non-negative combination of ``k_linear`` of the ``n_linear``
  linear features (random unit vectors in the complement).

Hence the planted form H_c = S_c A_c S_cᵀ satisfies xᵀH_c x = 1 on every token of component c and
0 on every other token: it is the component's exact quadratic indicator, and (because ‖y‖ varies on
ellipsoids and hyperboloids) it is NOT a multiple of P_S on the data. A fraction ``p_linear`` of
tokens carries no quadric (component −1): x = ŵ.

Shapes (m = subspace dimension; fixed constants below). ‖y‖² lies in [0.36, 0.97], so the quadric
usually carries most of a token and the filler never vanishes:

* ``circle`` (m = 2): y = r(cos θ, sin θ), r = 0.9; A = I/r² (label ``ellipsoid``, rank 2);
* ``ellipsoid`` (m = 3): y = diag(a)·s, s uniform on the unit 2-sphere, a = (0.95, 0.8, 0.65);
  A = diag(a)⁻² (label ``ellipsoid``, rank 3);
* ``hyperboloid`` (m = 3): one sheet of the two-sheeted hyperboloid y₁²/a₁² − y₂²/a₂² − y₃²/a₃² = 1,
  y = (a₁√(1+s²), a₂ s cos φ, a₃ s sin φ), s ~ U[0, 1], φ ~ U[0, 2π), a = (0.6, 0.5, 0.5);
  A = diag(a₁⁻², −a₂⁻², −a₃⁻²) (label ``hyperboloid``, rank 3).

Drawing order (``numpy.random.default_rng(seed)``): the D×D orthogonal matrix (QR of a Gaussian,
signs fixed by diag R > 0); the linear features; then per token the component (uniform over the
components, or −1 with probability ``p_linear``); the quadric parameters of all tokens, component by
component in order; the linear supports and weights (U[0.5, 1]) of all tokens.
Layout: ``X`` is (D, N), one token per column (project convention); ``rows`` is (N, D).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["SHAPES", "SHAPE_DIM", "SHAPE_LABEL", "QuadricToy", "make_quadric_toy"]

Array = NDArray[np.float64]

SHAPE_DIM = {"circle": 2, "ellipsoid": 3, "hyperboloid": 3}
#: The §6 label of each planted form (theory.quadric_geometry.classify of H_c).
SHAPE_LABEL = {"circle": "ellipsoid", "ellipsoid": "ellipsoid", "hyperboloid": "hyperboloid"}
SHAPES = tuple(SHAPE_DIM)
CIRCLE_RADIUS = 0.9
ELLIPSOID_AXES = (0.95, 0.8, 0.65)
HYPERBOLOID_AXES = (0.6, 0.5, 0.5)
HYPERBOLOID_S_MAX = 1.0


@dataclass(frozen=True, eq=False)
class QuadricToy:
    """Data and ground truth of the quadric toy.

    X (D, N) unit columns; component (N,) int, −1 = no quadric; shapes[c]; bases[c] (D, m_c);
    core_forms[c] (m_c, m_c) = A_c; coords[c] (m_c, N_c) the y of component c's tokens (in token
    order); linear_features (D, n_linear) unit columns; linear_codes (n_linear, N) the non-negative
    weights of the filler before it is scaled to √(1 − ‖y‖²)·ŵ; params: every parameter, seed included.
    """

    X: Array
    component: NDArray[np.int64]
    shapes: tuple[str, ...]
    bases: tuple[Array, ...]
    core_forms: tuple[Array, ...]
    coords: tuple[Array, ...]
    linear_features: Array
    linear_codes: Array
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def D(self) -> int:
        return int(self.X.shape[0])

    @property
    def N(self) -> int:
        return int(self.X.shape[1])

    @property
    def rows(self) -> Array:
        """(N, D) C-contiguous copy, the training loop's layout."""
        return np.ascontiguousarray(self.X.T)

    def planted_form(self, c: int) -> Array:
        """H_c = S_c A_c S_cᵀ (D, D): 1 on component c's tokens, 0 on all others."""
        S = self.bases[c]
        return S @ self.core_forms[c] @ S.T

    def expected_label(self, c: int) -> str:
        return SHAPE_LABEL[self.shapes[c]]


def _sample_shape(shape: str, n: int, rng: np.random.Generator) -> tuple[Array, Array]:
    """(y (m, n), A (m, m)) for n points on the planted quadric of ``shape``."""
    if shape == "circle":
        theta = rng.uniform(0.0, 2.0 * np.pi, n)
        y = CIRCLE_RADIUS * np.stack([np.cos(theta), np.sin(theta)])
        return y, np.eye(2) / CIRCLE_RADIUS**2
    if shape == "ellipsoid":
        s = rng.normal(size=(3, n))
        s /= np.linalg.norm(s, axis=0)
        a = np.asarray(ELLIPSOID_AXES)
        return a[:, None] * s, np.diag(a**-2.0)
    a = np.asarray(HYPERBOLOID_AXES)
    s = rng.uniform(0.0, HYPERBOLOID_S_MAX, n)
    phi = rng.uniform(0.0, 2.0 * np.pi, n)
    y = np.stack([a[0] * np.sqrt(1.0 + s**2), a[1] * s * np.cos(phi), a[2] * s * np.sin(phi)])
    return y, np.diag([a[0] ** -2.0, -a[1] ** -2.0, -a[2] ** -2.0])


def make_quadric_toy(*, seed: int = 0, N: int = 4000, D: int = 16,
                     shapes: Sequence[str] = ("circle", "ellipsoid", "hyperboloid"),
                     n_linear: int | None = None, k_linear: int = 1, p_linear: float = 0.1) -> QuadricToy:
    """Draw the quadric toy (module docstring). ``n_linear`` defaults to the complement dimension
    D − Σ m_c (which must be ≥ 1)."""
    shapes = tuple(shapes)
    unknown = [s for s in shapes if s not in SHAPE_DIM]
    if not shapes or unknown:
        raise ValueError(f"shapes must be a non-empty list from {list(SHAPES)}, got {list(shapes)}")
    dims = [SHAPE_DIM[s] for s in shapes]
    if not isinstance(D, int) or D - sum(dims) < 1:
        raise ValueError(f"D must leave at least one dimension for the linear features: D = {D}, Σm = {sum(dims)}")
    if not isinstance(N, int) or N < 1:
        raise ValueError(f"N must be a positive int, got {N!r}")
    n_comp = D - sum(dims)
    n_linear = n_comp if n_linear is None else n_linear
    if not isinstance(n_linear, int) or n_linear < 1:
        raise ValueError(f"n_linear must be a positive int, got {n_linear!r}")
    if not isinstance(k_linear, int) or not 1 <= k_linear <= n_linear:
        raise ValueError(f"k_linear must be an int in [1, n_linear = {n_linear}], got {k_linear!r}")
    if not 0.0 <= p_linear < 1.0:
        raise ValueError(f"p_linear must lie in [0, 1), got {p_linear}")

    rng = np.random.default_rng(seed)
    Q, R = np.linalg.qr(rng.normal(size=(D, D)))
    Q = Q * np.sign(np.diag(R))
    starts = np.cumsum([0, *dims])
    bases = tuple(Q[:, starts[c]:starts[c + 1]].copy() for c in range(len(shapes)))
    complement = Q[:, starts[-1]:]
    F = complement @ rng.normal(size=(n_comp, n_linear))
    F /= np.linalg.norm(F, axis=0)

    component = rng.integers(0, len(shapes), N)
    component[rng.random(N) < p_linear] = -1
    X = np.zeros((D, N))
    y_norm_sq = np.zeros(N)
    coords, cores = [], []
    for c, shape in enumerate(shapes):
        idx = np.flatnonzero(component == c)
        y, A = _sample_shape(shape, idx.size, rng)
        X[:, idx] = bases[c] @ y
        y_norm_sq[idx] = np.sum(y * y, axis=0)
        coords.append(y)
        cores.append(A)
    codes = np.zeros((n_linear, N))
    support = np.argsort(rng.random((N, n_linear)), axis=1)[:, :k_linear]
    codes[support.T, np.arange(N)] = rng.uniform(0.5, 1.0, (k_linear, N))
    filler = F @ codes
    filler_norm = np.linalg.norm(filler, axis=0)
    if filler_norm.min() < 1e-8:
        raise ValueError("linear features cancelled on a token (use more complement dimensions or k_linear = 1)")
    filler /= filler_norm
    X += np.sqrt(1.0 - y_norm_sq) * filler
    X /= np.linalg.norm(X, axis=0)  # a no-op up to rounding (‖x‖ = 1 by construction)
    params = {"seed": seed, "N": N, "D": D, "shapes": list(shapes), "n_linear": n_linear, "k_linear": k_linear,
              "p_linear": p_linear}
    return QuadricToy(X=X, component=component, shapes=shapes, bases=bases, core_forms=tuple(cores),
                      coords=tuple(coords), linear_features=F, linear_codes=codes, params=params)
