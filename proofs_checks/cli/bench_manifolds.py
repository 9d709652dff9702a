"""``dictcheck bench-manifolds``: the synthetic manifold benchmark of docs/bsf.md §5–§7
(:mod:`dictcheck.empirics.metrics.manifold_bench`), printed as two tables.

    dictcheck bench-manifolds [--json] [--seed S] [--quick] [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import replace
from typing import Any

from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.io.safe_files import folder_lock
from dictcheck.proofs_checks.cli.inputs import finite_result, output_dir
from dictcheck.proofs_checks.errors import UserError


def _print_tables(result: dict[str, Any]) -> None:
    kinds = list(result["recovery"][0]["per_type_best"])
    head = f"{'model':<16}{'n_b':>5}{'q':>3}{'k':>5}{'best R²':>9}" + "".join(f"{t:>9}" for t in kinds) + f"{'Hungarian':>11}"
    print("Recovery R² on the evaluation split (best single block per manifold; docs/bsf.md §6)")
    print(head)
    for r in result["recovery"]:
        k = "-" if r["k"] is None else str(r["k"])
        print(f"{r['model']:<16}{r['n_b']:>5}{r['q']:>3}{k:>5}{r['mean_best']:>9.3f}"
              + "".join(f"{r['per_type_best'][t]:>9.3f}" for t in kinds) + f"{r['mean_hungarian']:>11.3f}")
    m = result["mdl"]
    p = m["precisions"]
    print(f"\nMDL bits per sample, {m['variant']} at total width {m['width']} (spec §7; δ_x = δ_z = "
          f"{p['delta_x']:.3g} = 0.01·σ_x, B_w = {p['B_w']:g}, N_ref = {p['N_ref']})")
    print(f"{'q':>3}{'n_b':>5}{'k':>4}{'total':>9}{'support':>9}{'code':>9}{'resid':>9}{'dict':>8}{'log2C':>8}"
          f"{'R²':>7}{'total (orth. codes)':>21}")
    for r in m["rows"]:
        print(f"{r['q']:>3}{r['n_b']:>5}{r['k']:>4}{r['total']:>9.1f}{r['L_support']:>9.1f}{r['L_code']:>9.1f}"
              f"{r['L_resid']:>9.1f}{r['L_dict']:>8.1f}{r['L_support_fixed_k']:>8.1f}{r['recovery_mean_best']:>7.3f}"
              f"{r['total_orthonormal_codes']:>21.1f}")
    print(f"MDL-minimising block size: q = {m['argmin_q']}")


def run_bench_manifolds(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck bench-manifolds``."""
    from dictcheck.empirics.metrics.manifold_bench import DEFAULT, QUICK, run_benchmark

    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    s = QUICK if args.quick else DEFAULT
    if args.steps is not None:
        if args.steps < 1:
            raise UserError(f"--steps must be >= 1, got {args.steps}")
        s = replace(s, steps=args.steps)
    out = None if args.out is None else output_dir(args.out)

    def log(msg: str) -> None:
        sys.stderr.write(f"[bench-manifolds] {msg}\n")
        sys.stderr.flush()

    with folder_lock(out, "dictcheck bench-manifolds") if out is not None else contextlib.nullcontext():
        try:
            result = finite_result(run_benchmark(s, args.seed, log=log), "bench-manifolds")
        except ValueError as exc:
            raise UserError(str(exc).splitlines()[0]) from None
        if out is not None:
            atomic_write_bytes(out / "bench_manifolds.json", (json.dumps(result, indent=2) + "\n").encode())
    if args.json:
        print(json.dumps(result))
    else:
        _print_tables(result)
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck bench-manifolds``."""
    p = commands.add_parser("bench-manifolds", help="the synthetic manifold benchmark: BSF vs SAE recovery and MDL by block size")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of every model")
    p.add_argument("--quick", action="store_true", help="a tiny version (seconds; for tests)")
    p.add_argument("--steps", type=int, help="training steps per model (default 1500; --quick 40)")
    p.add_argument("--out", metavar="DIR", help="also write bench_manifolds.json here (checked before the benchmark "
                   "runs, locked while it runs)")
    p.set_defaults(handler=run_bench_manifolds)
