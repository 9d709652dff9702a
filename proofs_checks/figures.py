"""Matplotlib PNG figures for the checks (headless Agg backend)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from numpy.typing import NDArray  # noqa: E402

from dictcheck.empirics.io.atomic_files import atomic_write_bytes  # noqa: E402


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 110) -> Path:
    """Lay out, write ``fig`` at ``path`` (format from its suffix, PNG without one; its folder created
    with its parents; written atomically, so a failure leaves no partial file) and close it (frees its
    memory); returns the path."""
    path = Path(path)
    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buffer, dpi=dpi, format=path.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def plot_wide_limit_2d(path: Path, panels: list[dict]) -> Path:
    """Data, optimal bias b*, the λ-ball around it and one ray per atom, one panel per solution.

    Each panel dict holds: title, X (2, N), b (2,), lam, atoms (2, k), assignment (N,).
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        X, b, lam = panel["X"], panel["b"], panel["lam"]
        reach = np.max(np.linalg.norm(X - b[:, None], axis=0)) * 1.1
        colours = plt.cm.tab10(np.arange(max(panel["atoms"].shape[1], 1)) % 10)
        for k in range(panel["atoms"].shape[1]):
            end = b + reach * panel["atoms"][:, k]
            ax.plot([b[0], end[0]], [b[1], end[1]], color=colours[k], lw=1.2, alpha=0.8)
        assigned = panel["assignment"]
        ax.scatter(X[0, assigned < 0], X[1, assigned < 0], c="grey", s=28, label="within λ (no atom)")
        for k in range(panel["atoms"].shape[1]):
            on = assigned == k
            ax.scatter(X[0, on], X[1, on], color=colours[k], s=28)
        ax.add_patch(plt.Circle(tuple(b), lam, fill=False, ls="--", color="k", label="λ-ball"))
        ax.plot(*b, marker="*", ms=14, color="k", ls="none", label="bias b")
        ax.set_aspect("equal")
        ax.set_title(panel["title"], fontsize=10)
        ax.legend(loc="lower left", fontsize=8)
    return save_figure(fig, path)


def plot_threshold_1d(path: Path, p: NDArray, curves: dict[float, dict[str, NDArray]]) -> Path:
    """b* and the number of atoms of the wide-limit optimum against the firing probability p."""
    fig, (ax_b, ax_n) = plt.subplots(1, 2, figsize=(10, 4))
    for lam, curve in curves.items():
        ax_b.plot(p, curve["b"], marker="o", ms=3, label=f"b*, λ = {lam}")
        ax_b.plot(p[p < 0.5], lam * p[p < 0.5] / (1 - p[p < 0.5]), ls=":", color="k", lw=1)
        ax_n.step(p, curve["n_atoms"], where="mid", label=f"λ = {lam}")
    for ax in (ax_b, ax_n):
        ax.axvline(0.5, color="grey", ls="--", lw=1)
        ax.set_xlabel("firing probability p")
        ax.legend(fontsize=8)
    ax_b.set_ylabel("optimal bias b*  (dotted: λp/(1−p))")
    ax_n.set_ylabel("atoms in the wide-limit optimum")
    ax_n.set_yticks([0, 1, 2])
    fig.suptitle("Dense scalar toy, active values U[1, 3]: one atom below p = 1/2, an antipodal pair above")
    return save_figure(fig, path)


def plot_absorption(path: Path, X: NDArray, labels: NDArray, before: NDArray, after: NDArray) -> Path:
    """Parent/child toy: the data and the atoms before (ground truth) and after the fit, in two planes."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
    names = ["parent-only", "child 1", "child 2"]
    for ax, (i, j) in zip(axes, [(0, 1), (0, 2)]):
        for lab in range(3):
            on = labels == lab
            ax.scatter(X[i, on], X[j, on], s=10, alpha=0.5, label=names[lab])
        for k in range(before.shape[1]):
            ax.annotate("", xy=(2.2 * before[i, k], 2.2 * before[j, k]), xytext=(0, 0),
                        arrowprops={"arrowstyle": "->", "color": "grey", "lw": 1.5, "ls": "--"})
            ax.annotate("", xy=(2.2 * after[i, k], 2.2 * after[j, k]), xytext=(0, 0),
                        arrowprops={"arrowstyle": "->", "color": "k", "lw": 2})
        ax.set_xlim(-0.1, 2.3)
        ax.set_ylim(-0.1, 2.3)
        ax.set_xlabel(f"x{i + 1} (parent)")
        ax.set_ylabel(f"x{j + 1}")
        ax.set_aspect("equal")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Absorption: ground-truth atoms (grey, dashed) vs the stationary point (black)")
    return save_figure(fig, path)


def plot_firing_against_p(path: Path, p: NDArray, without_spare: NDArray, with_spare: NDArray) -> Path:
    """Largest firing fraction of the dense feature's atoms against its firing probability."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(p, without_spare, marker="o", label="d_z = 3 (no spare latent): one atom")
    ax.plot(p, with_spare, marker="s", label="d_z = 4 (spare latent): max over the pair")
    ax.plot(p, p, ls=":", color="grey", label="p")
    ax.axhline(0.5, color="k", ls="--", lw=1, label="50% rule")
    ax.set_xlabel("firing probability of the dense feature")
    ax.set_ylabel("firing fraction of its atom(s) at the optimum")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_antipodal_against_p(path: Path, rows: list[dict], pair_cos: float) -> Path:
    """Per arch: most negative decoder cosine between live latents, and the largest firing fraction, against p."""
    fig, (ax_c, ax_f) = plt.subplots(1, 2, figsize=(10, 4))
    for arch in dict.fromkeys(r["arch"] for r in rows):
        sel = [r for r in rows if r["arch"] == arch]
        p = [r["p"] for r in sel]
        ax_c.plot(p, [np.nan if r["min_live_pair_cosine"] is None else r["min_live_pair_cosine"] for r in sel],
                  marker="o", label=arch)
        ax_f.plot(p, [r["max_live_firing"] for r in sel], marker="o", label=arch)
    ax_c.axhline(pair_cos, color="k", ls=":", lw=1, label=f"pair threshold {pair_cos}")
    ax_f.axhline(0.5, color="k", ls=":", lw=1, label="50% rule")
    for ax in (ax_c, ax_f):
        ax.axvline(0.5, color="grey", ls="--", lw=1)
        ax.set_xlabel("firing probability p of the dense scalar")
        ax.legend(fontsize=8)
    ax_c.set_ylabel("most negative decoder cosine between live latents")
    ax_f.set_ylabel("largest firing fraction of a live latent")
    fig.suptitle("Trained SAEs (d_sae = 4) on the dense-scalar toy: antipodal pair above p = 1/2?")
    return save_figure(fig, path)
