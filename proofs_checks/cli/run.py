"""``dictcheck run``: run the registered checks, print a PASS/FAIL table, write the report.

Outputs in ``--out DIR`` (:func:`dictcheck.proofs_checks.runner.run_suite`): ``results.json`` and
``report.md`` (rewritten atomically after every check; ``"complete": false`` until the run ends) and
PNG figures under ``figures/``. ``--out`` is checked before any check runs, and is locked for the run:
a second ``dictcheck run`` into the same folder ends with one line. The exit code is 0 only if every
selected check passed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dictcheck.proofs_checks.cli.inputs import output_dir
from dictcheck.proofs_checks.runner import run_suite, select_checks


def _table(results: list[dict[str, Any]]) -> str:
    width = max([len(r["id"]) for r in results] + [5])
    lines = [f"{'check':<{width}}  status  seconds  spec", "-" * (width + 30)]
    for r in results:
        lines.append(f"{r['id']:<{width}}  {r['status'].upper():<6}  {r['seconds']:7.2f}  {r['spec']}")
    n_pass = sum(r["status"] == "pass" for r in results)
    lines.append(f"{n_pass} passed, {len(results) - n_pass} failed")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck run``."""
    if args.list:
        for c in select_checks(args.quick, args.only):
            print(f"{c.id:<36} {c.spec:<18} {c.title}")
        return 0
    out = output_dir(args.out)
    checks = select_checks(args.quick, args.only)
    show_bar = not args.json and sys.stderr.isatty()
    summary = run_suite(checks, out, seed=args.seed, quick=args.quick, only=args.only, progress=show_bar,
                        announce=not args.json and not show_bar)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_table(summary["results"]))
        print(f"report: {out / 'report.md'}   results: {out / 'results.json'}")
    return 0 if summary["passed"] else 1


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck run``."""
    p = commands.add_parser("run", help="run the verification checks and write a report")
    p.add_argument("--quick", action="store_true", help="only the quick checks (the `make run` suite)")
    p.add_argument("--only", metavar="GLOB", help="comma-separated glob(s) of check ids, e.g. 'wide.*'")
    p.add_argument("--out", default="dictcheck-out", metavar="DIR", help="output directory (default: dictcheck-out)")
    p.add_argument("--seed", type=int, default=0, help="seed for every random draw (default 0)")
    p.add_argument("--json", action="store_true", help="print results as JSON instead of the table")
    p.add_argument("--list", action="store_true", help="list the selected checks and exit")
    p.set_defaults(handler=run)
