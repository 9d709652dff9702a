"""``dictcheck check-sae DIR --data X.npy --lam L [--json]``: a trained SAE against the theory.

Loads any SAE folder in the SAELens layout (empirics.sae_io), then reports:
* the narrow-dictionary diagnostics of its decoder W = W_decᵀ with exact codes at the SAE's own
  bias b_dec (spec/theory.md §3, §6; the same keys as ``check-dict``);
* the amortisation gap O(W, Z_encoder, b) − O(W, Z_exact, b) (theory.md §6, §7), for SAEs with
  non-negative codes (not defined for the signed codes of ``abs``);
* per-latent firing fractions of the encoder, antipodal pairs (decoder cosine < −0.9) and dense
  latents (firing on more than half of the points);
* the reconstruction metrics of spec/ecosystem.md §2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.metrics import reconstruction_metrics, unit_atom_objective
from dictcheck.empirics.sae_folder import load_sae_model
from dictcheck.empirics.sae_io import SaeFormatError
from dictcheck.proofs_checks.cli.check_dict import print_human as print_dictionary_report
from dictcheck.proofs_checks.cli.check_dict import summary as dictionary_summary
from dictcheck.proofs_checks.errors import UserError
from dictcheck.proofs_checks.cli.inputs import load_points, positive_lambda
from dictcheck.solvers.dictionary_check import check_dictionary

ANTIPODAL_COSINE = -0.9


def antipodal_pairs(W_dec: np.ndarray, threshold: float = ANTIPODAL_COSINE) -> list[list[int]]:
    """Pairs [i, j], i < j, of decoder rows with cosine below ``threshold``."""
    norms = np.linalg.norm(W_dec, axis=1)
    unit = W_dec / np.where(norms > 0, norms, 1.0)[:, None]
    cos = unit @ unit.T
    i, j = np.nonzero(np.triu(cos < threshold, k=1))
    return [[int(a), int(b)] for a, b in zip(i, j)]


def sae_report(directory: str, X: np.ndarray, lam: float, *, progress: bool = False) -> dict[str, Any]:
    """Everything ``check-sae`` prints, for data X (N, D) with tokens as rows."""
    try:
        model, cfg = load_sae_model(directory)
    except (SaeFormatError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if X.shape[1] != cfg.d_in:
        raise UserError(f"data have D = {X.shape[1]} columns but the SAE has d_in = {cfg.d_in}")
    weights = {k: v.detach().double().numpy() for k, v in model.state_weights().items()}
    W, b = weights["W_dec"].T, weights["b_dec"]
    if np.any(np.linalg.norm(W, axis=0) == 0):
        raise UserError(f"{directory}: some decoder rows are zero; the dictionary cannot be normalised")
    with torch.no_grad():
        x = torch.as_tensor(X, dtype=cfg.torch_dtype)
        codes = model.encode(x)
        x_hat = model.decode(codes)
    codes_np = codes.double().numpy()
    check = check_dictionary(W, X.T, lam, b=b, progress=progress)
    report = dictionary_summary(check)
    signed = bool(np.any(codes_np < 0))
    report["amortisation_gap"] = None if signed else (
        unit_atom_objective(W, codes_np.T, b, X.T, lam) - check.diagnostics.objective)
    firing = np.mean(codes_np != 0, axis=0)
    report.update(
        arch=cfg.arch, d_in=cfg.d_in, d_sae=cfg.d_sae, signed_codes=signed,
        encoder_firing_fraction=firing.tolist(),
        dense_latents=[int(d) for d in np.flatnonzero(firing > 0.5)],
        antipodal_pairs=antipodal_pairs(weights["W_dec"]),
        metrics=reconstruction_metrics(X, x_hat.double().numpy(), codes_np),
    )
    return report


def check_sae(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck check-sae``."""
    lam = positive_lambda(args.lam)
    X = load_points(args.data)
    report = sae_report(args.directory, X, lam, progress=sys.stderr.isatty() and not args.json)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"SAE {args.directory}: arch {report['arch']}, d_in {report['d_in']}, d_sae {report['d_sae']}")
    gap = report["amortisation_gap"]
    print(f"amortisation gap: {'n/a (signed codes)' if gap is None else f'{gap:.4e}'}")
    metrics = report["metrics"]
    print(f"reconstruction: fvu {metrics['fvu']:.4f}  ve {metrics['ve']:.4f}  l0 {metrics['l0']:.2f}  "
          f"dead_frac {metrics['dead_frac']:.3f}")
    print(f"encoder latents firing on > 1/2 of points: {report['dense_latents'] or 'none'}")
    print(f"antipodal pairs (decoder cosine < {ANTIPODAL_COSINE}): {report['antipodal_pairs'] or 'none'}")
    print("\ndecoder with exact codes at b_dec:")
    print_dictionary_report(report)
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck check-sae``."""
    p = commands.add_parser("check-sae", help="check a trained SAE (SAELens layout) against the theory")
    p.add_argument("directory", metavar="DIR", help="SAE folder: cfg.json + sae_weights.safetensors")
    p.add_argument("--data", required=True, metavar="X.npy", help="data (N, D), one point per row")
    p.add_argument("--lam", required=True, type=float, help="λ of objective (1) for the diagnostics")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(handler=check_sae)
