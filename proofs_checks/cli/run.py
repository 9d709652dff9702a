"""``dictcheck run``: run the registered checks, print a table grouped by kind, write the report.

Outputs in ``--out DIR`` (:func:`dictcheck.proofs_checks.runner.run_suite`): ``results.json`` and
``report.md`` (rewritten atomically after every check; ``"complete": false`` until the run ends) and
PNG figures under ``figures/``. ``--out`` is checked before any check runs, and is locked for the run:
a second ``dictcheck run`` into the same folder ends with one line.

Exit code (docs/verdicts.md): 0 when every theorem and invariant check passed and no check raised; 1
otherwise; ``--strict`` also requires every replication to be replicated (and every hypothesis and
descriptive check to pass). 2 for a usage error. ``--baseline FILE`` prints what changed against a
baseline (:mod:`dictcheck.proofs_checks.baseline`); ``--write-baseline FILE`` records this run as one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.io.safe_files import read_json
from dictcheck.proofs_checks.baseline import baseline_changes, baseline_of
from dictcheck.proofs_checks.cli.inputs import output_dir, output_file
from dictcheck.proofs_checks.errors import UserError
from dictcheck.proofs_checks.registry import KINDS, MUST_PASS
from dictcheck.proofs_checks.runner import run_suite, select_checks

#: Baseline files are small, but a full run's measured values are more than cfg.json's limit.
_BASELINE_MAX_BYTES = 16 << 20


def status_label(row: dict[str, Any]) -> str:
    """PASS / FAIL / ERROR, or a replication's verdict in capitals."""
    return str(row.get("verdict") or row["status"]).upper()


def _table(results: list[dict[str, Any]], strict: bool) -> str:
    width = max([len(r["id"]) for r in results] + [5])
    lines: list[str] = []
    for kind in KINDS:
        rows = [r for r in results if r["kind"] == kind]
        if not rows:
            continue
        rule = "must pass" if kind in MUST_PASS or strict else "reported"
        lines += ["", f"{kind.upper()} ({rule})", f"{'check':<{width}}  {'status':<14}  tier   seconds  spec",
                  "-" * (width + 44)]
        lines += [f"{r['id']:<{width}}  {status_label(r):<14}  {r['tier']:<5}  {r['seconds']:7.2f}  {r['spec']}"
                  for r in rows]
        tally = {}
        for r in rows:
            tally[status_label(r).lower()] = tally.get(status_label(r).lower(), 0) + 1
        lines.append(", ".join(f"{n} {label}" for label, n in tally.items()))
    return "\n".join(lines[1:])


def _list(checks: list[Any]) -> None:
    for kind in KINDS:
        rows = [c for c in checks if c.kind == kind]
        if rows:
            print(f"{kind.upper()}")
            for c in rows:
                print(f"  {c.id:<34} {'quick' if c.quick else 'full':<5}  {c.spec:<18} {c.title}")


def _print_changes(changes: list[dict[str, Any]], baseline: str) -> None:
    if not changes:
        print(f"baseline {baseline}: nothing changed")
        return
    print(f"baseline {baseline}: {len(changes)} change(s)")
    for c in changes:
        where = f" {c['path']}" if c.get("path") else ""
        print(f"  {c['id']}: {c['what']}{where}: {c['baseline']!r} → {c['now']!r}")


def run(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck run``."""
    if args.list:
        _list(select_checks(args.quick, args.only, args.kind, listing=True))
        return 0
    out = output_dir(args.out)  # before the checks are imported: a folder in use is refused at once
    baseline = None
    if args.baseline:
        try:
            baseline = read_json(args.baseline, "baseline file", max_bytes=_BASELINE_MAX_BYTES)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    write_to = output_file(args.write_baseline, "--write-baseline", (".json",)) if args.write_baseline else None
    checks = select_checks(args.quick, args.only, args.kind)
    show_bar = not args.json and sys.stderr.isatty()
    summary = run_suite(checks, out, seed=args.seed, quick=args.quick, only=args.only, kinds=args.kind,
                        strict=args.strict, progress=show_bar, announce=not args.json and not show_bar)
    if baseline is not None:
        try:
            summary["baseline_changes"] = baseline_changes(summary, baseline)
        except ValueError as exc:
            raise UserError(f"--baseline {args.baseline}: {exc}") from None
    if write_to is not None:
        atomic_write_bytes(Path(write_to), (json.dumps(baseline_of(summary), indent=1) + "\n").encode("utf-8"))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_table(summary["results"], args.strict))
        verdict = "every theorem and invariant check passed" if summary["passed"] else "FAILED"
        print(f"\nrun: {verdict}{' (strict: replications included)' if args.strict else ''}")
        if baseline is not None:
            _print_changes(summary["baseline_changes"], args.baseline)
        print(f"report: {out / 'report.md'}   results: {out / 'results.json'}")
    return 0 if summary["passed"] else 1


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck run``."""
    p = commands.add_parser("run", help="run the verification checks and write a report")
    p.add_argument("--quick", action="store_true", help="only the quick checks (the `make run` suite)")
    p.add_argument("--only", metavar="GLOB", help="comma-separated glob(s) of check ids, e.g. 'wide.*'")
    p.add_argument("--kind", metavar="KIND", help=f"comma-separated kinds to run ({', '.join(KINDS)})")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every check passes (replications replicated), "
                   "not only the theorems and invariants")
    p.add_argument("--baseline", metavar="FILE", help="print what changed against this baseline file")
    p.add_argument("--write-baseline", metavar="FILE", help="record this run's verdicts and key values as a baseline")
    p.add_argument("--out", default="dictcheck-out", metavar="DIR", help="output directory (default: dictcheck-out)")
    p.add_argument("--seed", type=int, default=0, help="seed for every random draw (default 0)")
    p.add_argument("--json", action="store_true", help="print results as JSON instead of the table")
    p.add_argument("--list", action="store_true", help="list the selected checks by kind and exit")
    p.set_defaults(handler=run)
