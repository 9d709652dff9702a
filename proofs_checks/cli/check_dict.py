"""``dictcheck check-dict``: which local optimality conditions a dictionary satisfies (spec §3, §6).

    dictcheck check-dict --dict W.npy --data X.npy --lam L [--bias b.npy | --learn-bias] [--json]

W has shape (D, d_z), one atom per column; its columns are normalised on load (the output says so
and lists the original norms). X has shape (N, D), one point per row. Codes are the exact
non-negative lasso codes of the normalised dictionary. Without --bias or --learn-bias the bias is 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dictcheck.proofs_checks.cli.inputs import (
    CODES_TOL_RANGE,
    checked_bias,
    checked_dictionary,
    checked_range,
    finite_result,
    load_array,
    load_points,
    positive_lambda,
)
from dictcheck.proofs_checks.errors import UserError


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2e}"


def print_human(s: dict[str, Any]) -> None:
    """The readable summary and per-atom table."""
    tol = s["tolerances"]
    print(f"dictionary: {s['n_atoms']} atoms, {s['n_points']} points; bias {s['bias_mode']}; "
          f"objective (1) = {s['objective']:.8g}")
    if s["atoms_renormalised"]:
        print("note: atoms were normalised to unit norm on load (norms listed per atom)")
    verdict = "STATIONARY" if s["stationary"] else f"NOT stationary (fails: {', '.join(s['failed_conditions'])})"
    print(f"verdict: {verdict}")
    rows = [
        ("KKT-z (R1)", s["kkt_violation"], tol.get("kkt")),
        ("atom stationarity (S1)", s["stationarity_violation"], tol.get("stationarity")),
        ("convex hull (5)", s["hull_violation"], tol.get("hull")),
        ("bias identity (4)", s["bias_identity_violation"], tol.get("bias")),
    ]
    for name, value, t in rows:
        print(f"  {name:<24} max violation {_fmt(value)}   (tolerance {t:g})")
    print(f"  atoms firing on > 1/2 of points: {s['atoms_firing_over_half'] or 'none'}")
    print(f"  nested supports [d, j]: {s['nested_pairs'] or 'none'}")
    print(f"  best new-atom gain {s['best_new_atom_gain']:.3e}   wide-limit gap {s['wide_gap']:.3e}   "
          f"cert ratio {s['cert_ratio']:.4f}")
    print(f"\n{'atom':>4} {'norm':>8} {'p_d':>6} {'S1':>9} {'hull(5)':>9} {'hull dist':>9} "
          f"{'off-mean φ':>10} {'−p/(1−p)':>9} {'antipode':>9}  nested in")
    for a in s["atoms"]:
        print(f"{a['atom']:>4} {a['norm_on_load']:>8.4g} {a['firing_fraction']:>6.3f} {_fmt(a['stationarity']):>9} "
              f"{_fmt(a['hull']):>9} {_fmt(a['hull_distance']):>9} "
              f"{('—' if a['bias_off_mean'] is None else format(a['bias_off_mean'], '.4f')):>10} "
              f"{('—' if a['bias_target'] is None else format(a['bias_target'], '.4f')):>9} "
              f"{a['antipode_gain']:>9.2e}  {a['nested_in'] or ''}{' (dead)' if a['dead'] else ''}")


def check_dict(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck check-dict``."""
    lam = positive_lambda(args.lam)
    tol = checked_range(args.tol, "--tol", *CODES_TOL_RANGE)
    X = load_points(args.data)
    W = checked_dictionary(load_array(args.dict, "dictionary"), X.shape[1], f"dictionary file {args.dict}")
    bias = None if args.bias is None else checked_bias(load_array(args.bias, "bias"), X.shape[1],
                                                        f"bias file {args.bias}")
    from dictcheck.proofs_checks.dictionary_report import summary
    from dictcheck.solvers.dictionary_check import check_dictionary

    try:
        result = check_dictionary(W, X.T, lam, b=bias, learn=args.learn_bias, tol=tol,
                                  hull_candidates=args.hull, progress=sys.stderr.isatty())
    except ValueError as exc:  # what cannot be computed (solvers.dictionary_check.require_exact)
        raise UserError(str(exc).splitlines()[0]) from None
    s = finite_result(summary(result), "check-dict")
    if args.json:
        print(json.dumps(s))
    else:
        print_human(s)
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck check-dict``."""
    p = commands.add_parser("check-dict", help="check a dictionary against the local optimality conditions")
    p.add_argument("--dict", required=True, metavar="W.npy", help="dictionary (D, d_z), one atom per column")
    p.add_argument("--data", required=True, metavar="X.npy", help="data (N, D), one point per row")
    p.add_argument("--lam", required=True, type=float, help="λ of objective (1)")
    bias = p.add_mutually_exclusive_group()
    bias.add_argument("--bias", metavar="b.npy", help="fixed decoder bias (D,)")
    bias.add_argument("--learn-bias", action="store_true", help="use the bias that is optimal for this dictionary")
    p.add_argument("--tol", type=float, default=1e-8, help="relative KKT tolerance of the exact codes, in "
                   f"[{CODES_TOL_RANGE[0]:g}, {CODES_TOL_RANGE[1]:g}] (default 1e-8)")
    p.add_argument("--hull", action="store_true", help="also the distances to the four hull candidates of "
                   "docs/theory.md §8 Q1 (one QP per atom; slow on large data)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(handler=check_dict)
