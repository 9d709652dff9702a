"""Figures of bilinear latents (docs/bilinear.md §6 step 5), matplotlib Agg PNGs.

A latent's picture is the projection of the NORMALISED inputs onto its top-3 |μ| eigenvectors,
which come from the weights (not from a PCA of the inputs). Points are coloured by a label per
token (e.g. the quadric toy's planted component); with fewer than 3 eigenvectors the panel is 2-D
(or a histogram for 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from dictcheck.proofs_checks.figures import plt, save_figure

__all__ = ["ProjectionPanel", "plot_latent_projections"]

#: At most this many points are drawn per panel (a seeded subsample keeps the PNG small).
MAX_POINTS = 3000


@dataclass(frozen=True)
class ProjectionPanel:
    """One panel: ``eigenvectors`` (D, 1..3) of a latent, its ``title``."""

    eigenvectors: NDArray[np.float64]
    title: str


def plot_latent_projections(path: Path, X: NDArray, panels: Sequence[ProjectionPanel],
                            labels: NDArray | None = None, label_names: dict[int, str] | None = None,
                            title: str | None = None) -> Path:
    """Scatter the rows of X (N, D; normalised here) projected onto each panel's eigenvectors.

    ``labels`` (N,) int colour classes (None: one colour); ``label_names`` their legend names.
    ValueError when a panel's eigenvectors do not have D rows and 1..3 columns.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must be a non-empty (N, D) array, got shape {X.shape}")
    norms = np.linalg.norm(X, axis=1)
    keep = norms > 0
    Xn = X[keep] / norms[keep, None]
    lab = np.zeros(X.shape[0], dtype=int) if labels is None else np.asarray(labels)
    if lab.shape != (X.shape[0],):
        raise ValueError(f"labels must have shape ({X.shape[0]},), got {lab.shape}")
    lab = lab[keep]
    if Xn.shape[0] > MAX_POINTS:
        pick = np.sort(np.random.default_rng(0).choice(Xn.shape[0], MAX_POINTS, replace=False))
        Xn, lab = Xn[pick], lab[pick]
    for p in panels:
        E = np.asarray(p.eigenvectors)
        if E.ndim != 2 or E.shape[0] != X.shape[1] or not 1 <= E.shape[1] <= 3:
            raise ValueError(f"panel {p.title!r}: eigenvectors must be (D={X.shape[1]}, 1..3), got {E.shape}")
    classes = np.unique(lab)
    colours = plt.cm.tab10(np.arange(len(classes)) % 10)
    fig = plt.figure(figsize=(4.8 * len(panels), 4.6))
    for i, p in enumerate(panels):
        E = np.asarray(p.eigenvectors)
        P = Xn @ E
        dim = E.shape[1]
        ax = fig.add_subplot(1, len(panels), i + 1, projection="3d" if dim == 3 else None)
        for colour, c in zip(colours, classes):
            on = lab == c
            name = (label_names or {}).get(int(c), str(c)) if labels is not None else None
            if dim == 1:
                ax.hist(P[on, 0], bins=40, alpha=0.6, color=colour, label=name)
            else:
                ax.scatter(*P[on].T, s=3, alpha=0.6, color=colour, label=name)
        ax.set_xlabel("e₁·x")
        if dim >= 2:
            ax.set_ylabel("e₂·x")
        if dim == 3:
            ax.set_zlabel("e₃·x")
        ax.set_title(p.title, fontsize=9)
        if labels is not None and i == 0:
            ax.legend(fontsize=7, markerscale=3, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi=100)
