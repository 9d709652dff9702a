"""``dictcheck solve``: single problems on an .npy data file of shape (N, D), one point per row.

    dictcheck solve geometric-median --data F.npy [--json]            → b, objective (mean distance)
    dictcheck solve huber-median     --data F.npy --lam L [--json]    → b, objective (mean of h_λ)
    dictcheck solve wide-limit       --data F.npy --lam L [--json]    → b, objective, n_rays, atoms, certified_gap
    dictcheck solve dnn              --data F.npy --lam L [--json]    → objective, b, status (learned bias)

The results are those of :mod:`dictcheck.proofs_checks.api` (the Python entry points), printed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from dictcheck.proofs_checks import api
from dictcheck.proofs_checks.cli.inputs import load_array, load_points, positive_lambda
from dictcheck.proofs_checks.errors import UserError
from dictcheck.proofs_checks.runner import json_safe
from dictcheck.solvers.dnn import DNNSolveError
from dictcheck.solvers.wide_limit import DEFAULT_RAY_TOL


def _fixed_bias(path: str | None, D: int) -> np.ndarray | None:
    if path is None:
        return None
    b = load_array(path, "bias").reshape(-1)
    if b.size != D:
        raise UserError(f"bias file {path} has {b.size} entries but the data have D = {D}")
    return b


def _solve(args: argparse.Namespace) -> dict[str, Any]:
    X = load_points(args.data)
    problem = args.problem
    if problem == "geometric-median":
        return api.geometric_median(X)
    lam = positive_lambda(args.lam)
    if problem == "huber-median":
        return api.huber_median(X, lam)
    bias = _fixed_bias(args.bias, X.shape[1])
    if problem == "wide-limit":
        return api.wide_limit(X, lam, bias=bias, ray_tol=args.ray_tol)
    if X.shape[0] > args.max_points:
        raise UserError(f"dnn: N = {X.shape[0]} points exceeds --max-points {args.max_points} "
                        "(the conic solve grows like N^5: ~40 s at N = 80; `solve wide-limit` gives the same "
                        "optimum for any N)")
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
    result = json_safe(_solve(args))
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
    p.add_argument("--ray-tol", type=float, default=DEFAULT_RAY_TOL, help="angle (rad) for merging rays (default 1e-6)")
    p.add_argument("--max-points", type=int, default=100, help="largest N accepted by the dnn solve (default 100)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(handler=_checked_solve)


def _checked_solve(args: argparse.Namespace) -> int:
    if args.problem != "geometric-median" and args.lam is None:
        raise UserError(f"solve {args.problem} needs --lam")
    if args.problem == "geometric-median" and args.lam is not None:
        raise UserError("solve geometric-median takes no --lam")
    if not np.isfinite(args.ray_tol) or args.ray_tol < 0:
        raise UserError(f"--ray-tol must be a non-negative angle in radians, got {args.ray_tol}")
    return solve(args)
