"""``dictcheck solve``: single problems on an .npy data file of shape (N, D), one point per row.

    dictcheck solve geometric-median --data F.npy [--json]            → b, objective (mean distance)
    dictcheck solve huber-median     --data F.npy --lam L [--json]    → b, objective (mean of h_λ)
    dictcheck solve wide-limit       --data F.npy --lam L [--json]    → b, objective, n_rays, atoms, certified_gap
    dictcheck solve dnn              --data F.npy --lam L [--json]    → objective, b, status (learned bias)

The results are those of :mod:`dictcheck.proofs_checks.api` (the Python entry points), printed. The
inputs are validated (:mod:`dictcheck.proofs_checks.cli.inputs`) before the solvers are imported.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np

from dictcheck.proofs_checks.cli.inputs import (
    checked_bias,
    checked_range,
    finite_result,
    load_array,
    load_points,
    positive_lambda,
)
from dictcheck.proofs_checks.errors import UserError


def _fixed_bias(path: str | None, D: int) -> np.ndarray | None:
    if path is None:
        return None
    return checked_bias(load_array(path, "bias"), D, f"bias file {path}")


def _solve(args: argparse.Namespace) -> dict[str, Any]:
    X = load_points(args.data)
    problem = args.problem
    lam = None if problem == "geometric-median" else positive_lambda(args.lam)
    bias = _fixed_bias(args.bias, X.shape[1]) if problem in ("wide-limit", "dnn") else None
    if problem == "dnn" and X.shape[0] > args.max_points:
        raise UserError(f"dnn: N = {X.shape[0]} points exceeds --max-points {args.max_points} "
                        "(the conic solve grows like N^5: ~40 s at N = 80; `solve wide-limit` gives the same "
                        "optimum for any N)")
    from dictcheck.proofs_checks import api

    if problem == "geometric-median":
        return api.geometric_median(X)
    if problem == "huber-median":
        return api.huber_median(X, lam)
    if problem == "wide-limit":
        return api.wide_limit(X, lam, bias=bias, **({} if args.ray_tol is None else {"ray_tol": args.ray_tol}))
    from dictcheck.solvers.dnn import DNNSolveError

    try:
        return api.dnn(X, lam, bias=bias)
    except DNNSolveError as exc:
        raise UserError(str(exc)) from None


def _print_human(problem: str, result: dict[str, Any]) -> None:
    print(f"{problem}")
    for key, value in result.items():
        if key == "atoms":
            print(f"  atoms: {len(value)} unit atoms (use --json for their coordinates)")
        elif isinstance(value, list):
            print(f"  {key}: [{', '.join(f'{v:.6g}' for v in value)}]")
        elif isinstance(value, float):
            print(f"  {key}: {value:.10g}")
        else:
            print(f"  {key}: {value}")


def solve(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck solve``."""
    from dictcheck.proofs_checks.runner import json_safe

    result = json_safe(finite_result(_solve(args), f"solve {args.problem}"))
    if args.json:
        print(json.dumps(result))
    else:
        _print_human(args.problem, result)
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck solve``."""
    p = commands.add_parser("solve", help="solve one problem on an .npy data file (N, D)")
    p.add_argument("problem", choices=["geometric-median", "huber-median", "wide-limit", "dnn"])
    p.add_argument("--data", required=True, metavar="F.npy", help="data, shape (N, D), one point per row")
    p.add_argument("--lam", type=float, help="λ of objective (1) (required except for geometric-median)")
    p.add_argument("--bias", metavar="b.npy", help="fixed bias (D,) for wide-limit / dnn (default: learned)")
    p.add_argument("--ray-tol", type=float, help="angle (rad) for merging rays (default 1e-6, "
                   "dictcheck.solvers.wide_limit.DEFAULT_RAY_TOL)")
    p.add_argument("--max-points", type=int, default=100, help="largest N accepted by the dnn solve (default 100)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(handler=_checked_solve)


def _checked_solve(args: argparse.Namespace) -> int:
    if args.problem != "geometric-median" and args.lam is None:
        raise UserError(f"solve {args.problem} needs --lam")
    if args.problem == "geometric-median" and args.lam is not None:
        raise UserError("solve geometric-median takes no --lam")
    if args.ray_tol is not None:
        checked_range(args.ray_tol, "--ray-tol (radians)", 0.0, math.pi)
    if args.max_points < 1:
        raise UserError(f"--max-points must be >= 1, got {args.max_points}")
    return solve(args)
