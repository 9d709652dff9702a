"""``dictcheck check-sae DIR --data X.npy --lam L [--json]``: a trained SAE against the theory
(:func:`dictcheck.proofs_checks.sae_report.sae_report`), printed as a table or JSON.

"""

from __future__ import annotations

import argparse
import json
import sys

from dictcheck.empirics.sae_io import SaeFormatError
from dictcheck.proofs_checks.cli.check_dict import print_human as print_dictionary_report
from dictcheck.proofs_checks.cli.inputs import load_points, positive_lambda
from dictcheck.proofs_checks.errors import UserError
from dictcheck.proofs_checks.sae_report import ANTIPODAL_COSINE, sae_report


def check_sae(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck check-sae``."""
    lam = positive_lambda(args.lam)
    X = load_points(args.data)
    try:
        report = sae_report(args.directory, X, lam, progress=sys.stderr.isatty() and not args.json)
    except (SaeFormatError, ValueError) as exc:
        raise UserError(str(exc)) from None
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
