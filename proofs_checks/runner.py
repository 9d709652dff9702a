"""``dictcheck run``: run the registered checks, print a PASS/FAIL table, write the report.

Outputs in ``--out DIR``: ``results.json`` (rewritten atomically after every check, so nothing
is lost if the run dies), ``report.md`` and PNG figures under ``figures/``. The exit code is 0 only
if every selected check passed. A check that raises is recorded with status ``error`` and the
others still run.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tqdm import tqdm

from proofs_checks.errors import UserError
from proofs_checks.registry import Check, CheckContext, load_all_checks
from proofs_checks.report import write_json_atomic, write_report


def select_checks(quick: bool, only: str | None) -> list[Check]:
    """The registered checks in id order, filtered by ``--quick`` and the ``--only`` glob(s)."""
    checks = sorted(load_all_checks().values(), key=lambda c: c.id)
    if quick:
        checks = [c for c in checks if c.quick]
    if only:
        patterns = [p.strip() for p in only.split(",") if p.strip()]
        checks = [c for c in checks if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
        if not checks:
            raise UserError(f"--only {only!r} matches no check; see `dictcheck run --list`")
    return checks


def _json_safe(value: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats into JSON-safe values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def run_check(check: Check, ctx: CheckContext) -> dict[str, Any]:
    """Run one check and return its result record (status pass | fail | error)."""
    start = time.perf_counter()
    record: dict[str, Any] = {"id": check.id, "title": check.title, "spec": check.spec, "predicted": check.predicted}
    try:
        outcome = check.func(ctx)
    except Exception as exc:  # noqa: BLE001 — a failing check must not stop the others
        record.update(
            status="error", measured=None, tolerance=None, tolerance_reason=None,
            error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(),
        )
    else:
        record.update(
            status="pass" if outcome.passed else "fail", measured=outcome.measured, tolerance=outcome.tolerance,
            tolerance_reason=outcome.tolerance_reason, details=outcome.details, figures=outcome.figures,
            finding=outcome.finding,
        )
    record["seconds"] = round(time.perf_counter() - start, 3)
    return _json_safe(record)


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
    checks = select_checks(args.quick, args.only)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = CheckContext(out_dir=out, seed=args.seed, quick=args.quick)
    summary: dict[str, Any] = {"seed": args.seed, "quick": args.quick, "only": args.only, "results": []}
    show_bar = not args.json and sys.stderr.isatty()
    for check in tqdm(checks, desc="checks", unit="check", disable=not show_bar):
        if not args.json and not show_bar:
            print(f"[{check.id}] predicts: {check.predicted}", file=sys.stderr, flush=True)
        summary["results"].append(run_check(check, ctx))
        summary["passed"] = all(r["status"] == "pass" for r in summary["results"])
        write_json_atomic(out / "results.json", summary)
    summary["passed"] = all(r["status"] == "pass" for r in summary["results"])
    write_json_atomic(out / "results.json", summary)
    write_report(out / "report.md", summary)
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
