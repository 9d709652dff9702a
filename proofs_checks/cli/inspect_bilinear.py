"""``dictcheck inspect-bilinear``: the geometry readout of a saved bilinear autoencoder (docs/bilinear.md §6).

    dictcheck inspect-bilinear DIR [--latent I] [--top K] [--json] [--figure PATH --data X.npy]

Reads the folder with :func:`empirics.io.sae_folder.load_sae` (``bilinear-quadratic|atomic|compound``) and
reports, from the weights alone, per latent: the §6 label, numerical rank (τ_eig = 1e-6), effective
rank, importance (‖B‖_F² normalised over all latents), captured (top 3), top eigenvalues and, for the
compound prior, the support ‖C_k‖₀. Without ``--latent`` it prints the ``--top`` most important latents
as a table; with ``--latent I`` one latent in detail (more eigenvalues and the largest coordinates of
its top-3 eigenvectors; ``--json`` then includes the eigenvectors). ``--figure`` draws the normalised
rows of ``--data`` projected onto the latent's top-3 |μ| eigenvectors (the most important latent
unless ``--latent`` is given).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from dictcheck.proofs_checks.cli.inputs import FIGURE_SUFFIXES, finite_result, load_points, output_file
from dictcheck.proofs_checks.errors import UserError
from dictcheck.theory.bilinear_lifted import BilinearDictionary
from dictcheck.theory.quadric_geometry import FactoredForms, LatentGeometry, readout

#: Eigenvalues listed per latent in the table, and in the detail view.
TABLE_EIGENVALUES = 3
DETAIL_EIGENVALUES = 10
DETAIL_COORDINATES = 5


def _forms(directory: str) -> tuple[FactoredForms, dict[str, Any]]:
    from dictcheck.empirics.architectures import architecture
    from dictcheck.empirics.io.sae_folder import arch_fields_of, arch_of, load_sae
    from dictcheck.empirics.io.saelens import SaeFormatError

    try:
        weights, cfg = load_sae(directory)
    except SaeFormatError as exc:
        raise UserError(str(exc)) from None
    arch = arch_of(cfg)
    if architecture(arch).family != "bilinear":
        raise UserError(f"{directory}: architecture {arch!r} is not a bilinear autoencoder")
    w = {name: t.double().numpy() for name, t in weights.items()}
    decoder = arch_fields_of(cfg).get("decoder", "symmetric")
    try:
        dictionary = BilinearDictionary(arch.removeprefix("bilinear-"), w["U"], w.get("V"), w.get("C"), decoder)
    except ValueError as exc:
        raise UserError(f"{directory}: {exc}") from None
    info = {"dir": str(directory), "arch": arch, "d_in": cfg.d_in, "d_sae": cfg.d_sae, "decoder": decoder}
    return FactoredForms.from_dictionary(dictionary), info


def _detail(g: LatentGeometry, with_vectors: bool) -> dict[str, Any]:
    out = g.summary(DETAIL_EIGENVALUES)
    coords = []
    for i in range(g.eigenvectors.shape[1]):
        e = g.eigenvectors[:, i]
        top = np.argsort(-np.abs(e), kind="stable")[:DETAIL_COORDINATES]
        coords.append([[int(j), float(e[j])] for j in top])
    out["eigenvector_top_coordinates"] = coords
    if with_vectors:
        out["eigenvectors"] = g.eigenvectors.T.tolist()
    return out


def _figure(args: argparse.Namespace, X: np.ndarray, forms: FactoredForms, g: LatentGeometry) -> str:
    from dictcheck.proofs_checks.figures_bilinear import ProjectionPanel, plot_latent_projections

    if X.shape[1] != forms.D:
        raise UserError(f"data file {args.data} has D = {X.shape[1]}, the model has d_in = {forms.D}")
    if not np.any(np.linalg.norm(X, axis=1) > 0):
        raise UserError(f"data file {args.data} has only zero rows (nothing to normalise)")
    title = f"latent {g.index}: {g.label}, rank {g.rank}, top μ {', '.join(f'{m:.3g}' for m in g.eigenvalues[:3])}"
    path = plot_latent_projections(Path(args.figure), X, [ProjectionPanel(g.eigenvectors, title)],
                                   title="normalised inputs on the latent's top |μ| eigenvectors")
    return str(path)


def run_inspect(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck inspect-bilinear``."""
    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    X = None
    if args.figure is not None:
        output_file(args.figure, "--figure", FIGURE_SUFFIXES)
        if args.data is None:
            raise UserError("--figure needs --data X.npy (the inputs to project)")
        X = load_points(args.data)
    forms, info = _forms(args.dir)
    if args.latent is not None and not 0 <= args.latent < forms.d:
        raise UserError(f"--latent must lie in [0, {forms.d}), got {args.latent}")
    fro = forms.frobenius_sq()
    if args.latent is not None:
        chosen = [args.latent]
    else:
        chosen = list(np.argsort(-fro, kind="stable")[: args.top])
    geo = readout(forms, latents=chosen)
    if args.latent is not None:
        result: dict[str, Any] = {**info, "latent": _detail(geo[0], with_vectors=args.json)}
    else:
        result = {**info, "n_shown": len(geo), "latents": [g.summary(TABLE_EIGENVALUES) for g in geo]}
    finite_result(result, "inspect-bilinear")
    figure = _figure(args, X, forms, geo[0]) if X is not None else None
    if figure:
        result["figure"] = figure
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{info['arch']} (decoder {info['decoder']}): d_in {info['d_in']}, d_sae {info['d_sae']}  [{info['dir']}]")
    if args.latent is not None:
        d = result["latent"]
        print(f"latent {d['latent']}: {d['label']}, rank {d['rank']}, effective rank {d['effective_rank']:.3f}, "
              f"importance {d['importance']:.4g}, captured(top3) {d['captured_top3']:.3f}"
              + (f", support {d['support']}" if d["support"] is not None else ""))
        print("  eigenvalues (by |μ|): " + ", ".join(f"{m:.4g}" for m in d["top_eigenvalues"]))
        for i, coords in enumerate(d["eigenvector_top_coordinates"]):
            print(f"  e{i + 1} largest coordinates: " + ", ".join(f"[{j}] {v:+.3f}" for j, v in coords))
    else:
        support = forms.mix is not None
        head = f"{'latent':>7} {'label':<12} {'rank':>5} {'eff.rank':>9} {'importance':>11} {'captured3':>10}"
        print(head + (f" {'support':>8}" if support else "") + "  top eigenvalues")
        for s in result["latents"]:
            line = (f"{s['latent']:>7} {s['label']:<12} {s['rank']:>5} {s['effective_rank']:>9.3f} "
                    f"{s['importance']:>11.4g} {s['captured_top3']:>10.3f}")
            line += f" {s['support']:>8}" if support else ""
            print(line + "  " + ", ".join(f"{m:.3g}" for m in s["top_eigenvalues"]))
        print(f"({len(geo)} of {forms.d} latents, by importance; --top K to change, --latent I for one latent)")
    if figure:
        print(f"figure: {figure}")
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck inspect-bilinear``."""
    p = commands.add_parser("inspect-bilinear", help="geometry readout of a saved bilinear autoencoder (from weights)")
    p.add_argument("dir", metavar="DIR", help="folder written by `dictcheck train --arch bilinear-...`")
    p.add_argument("--latent", type=int, help="show one latent in detail")
    p.add_argument("--top", type=int, default=20, help="latents shown in the table, most important first (default 20)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--figure", metavar="PATH", help="PNG of --data projected onto the latent's top-3 eigenvectors")
    p.add_argument("--data", metavar="X.npy", help="inputs (N, D) for --figure")
    p.set_defaults(handler=run_inspect)
