"""Figures of the block-sparse featurizer checks (docs/bsf.md §6, §7): PNG files, headless Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dictcheck.proofs_checks.figures import plt, save_figure

__all__ = ["plot_recovered_circle", "plot_mdl_curve"]


def plot_recovered_circle(path: Path, theta: NDArray, codes: NDArray, plane: NDArray, title: str) -> Path:
    """A circle recovered by one block: its code coordinates against the true angle θ (left) and the
    block's contributions projected onto the circle's true plane E_jᵀc_ig (right).

    theta (n,), codes (n, q), plane (n, 2), over the samples where the circle is active.
    """
    order = np.argsort(theta)
    fig, (ax_c, ax_p) = plt.subplots(1, 2, figsize=(10.5, 4.2))
    for a in range(codes.shape[1]):
        ax_c.plot(theta[order], codes[order, a], ".", ms=2, label=f"z[{a}]")
    ax_c.set_xlabel("true angle θ")
    ax_c.set_ylabel("block code coordinate")
    ax_c.legend(fontsize=8, markerscale=4)
    ax_p.scatter(plane[:, 0], plane[:, 1], c=theta, cmap="twilight", s=3)
    t = np.linspace(0, 2 * np.pi, 200)
    ax_p.plot(np.cos(t), np.sin(t), "k--", lw=0.8, label="true circle")
    ax_p.set_aspect("equal")
    ax_p.set_xlabel("E_jᵀ c (1)")
    ax_p.set_ylabel("E_jᵀ c (2)")
    ax_p.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def plot_mdl_curve(path: Path, curves: dict[str, list[dict[str, Any]]], title: str) -> Path:
    """Total MDL bits per sample against block size q, one line per curve (rows with q, total and the
    four terms); the minimum of each curve is ringed. A second panel stacks the terms of each q."""
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, rows in curves.items():
        q = [r["q"] for r in rows]
        tot = [r["total"] for r in rows]
        line = ax_t.plot(q, tot, marker="o", label=label)[0]
        i = int(np.argmin(tot))
        ax_t.plot(q[i], tot[i], "o", ms=14, mfc="none", color=line.get_color())
    ax_t.set_xlabel("block size q")
    ax_t.set_ylabel("MDL (bits per sample)")
    ax_t.legend(fontsize=8)
    terms = ("L_support", "L_code", "L_resid", "L_dict")
    labels = list(curves)
    width = 0.8 / max(len(labels), 1)
    for c, label in enumerate(labels):
        rows = curves[label]
        x = np.arange(len(rows)) + c * width
        bottom = np.zeros(len(rows))
        for t_i, term in enumerate(terms):
            vals = np.array([r[term] for r in rows])
            ax_s.bar(x, vals, width, bottom=bottom, color=plt.cm.tab10(t_i), label=term if c == 0 else None)
            bottom += vals
    first = curves[labels[0]] if labels else []
    ax_s.set_xticks(np.arange(len(first)) + 0.4 - width / 2, [str(r["q"]) for r in first])
    ax_s.set_xlabel("block size q (bars: " + ", ".join(labels) + ")")
    ax_s.set_ylabel("bits per sample")
    ax_s.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
