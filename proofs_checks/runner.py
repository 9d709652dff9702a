"""Run the registered checks and write their results (the library behind ``dictcheck run``).

Outputs in the output folder: ``results.json`` and ``report.md`` (both rewritten atomically at the
start and after every check, so nothing is lost if the run dies) and PNG figures under ``figures/``.
``results.json`` says ``"complete": false`` (and ``"passed": null``) until the last check has run,
then ``"complete": true`` with the verdict ``passed``; ``report.md`` says when a run is incomplete.
One run at a time writes a folder (:func:`dictcheck.empirics.io.safe_files.folder_lock`): a second one
is refused with one line. A check that raises is recorded with status ``error`` and the others still run.

Every row records the check's ``kind``, ``source``, ``regime`` and ``tier`` (quick or full). Its ``status``
is ``pass``, ``fail`` or ``error``; a replication's is ``pass`` (verdict ``replicated``), ``fail`` (``not
replicated``) or ``inconclusive``, and its row also carries ``verdict`` and ``controls``. A theorem or invariant
check's row carries its ``controls`` too: it passes only when its claim holds, it has at least one negative
control (its measurement at a perturbed point where the identity breaks) and every control came out as expected
(:func:`dictcheck.proofs_checks.registry.must_pass_verdict`). The run's verdict
``passed`` (and the exit code of ``dictcheck run``, :func:`suite_passed`): every theorem and invariant
check passed and no check raised; ``strict`` also requires every replication, hypothesis and descriptive
check to pass.
"""

from __future__ import annotations

import fnmatch
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from dictcheck.empirics.io.safe_files import check_output_dir, folder_lock
from dictcheck.proofs_checks.errors import UserError
from dictcheck.proofs_checks.registry import (
    KINDS,
    MUST_PASS,
    Check,
    CheckContext,
    CheckListing,
    list_checks,
    load_all_checks,
    must_pass_verdict,
    replication_verdict,
)
from dictcheck.proofs_checks.report import write_json_atomic, write_report


def select_checks(quick: bool, only: str | None, kinds: str | None = None, *,
                  listing: bool = False) -> list[Check] | list[CheckListing]:
    """The registered checks grouped by kind (in :data:`KINDS` order), in id order within a kind, filtered by
    ``--quick``, ``--kind`` (comma-separated kinds) and the ``--only`` glob(s); with ``listing``, their
    :class:`CheckListing` (no check module imported). Both filters are checked before the checks are imported
    (UserError for a filter that names nothing)."""
    wanted = None if kinds is None else {k.strip() for k in kinds.split(",") if k.strip()}
    if wanted is not None:
        if not wanted:
            raise UserError(f"--kind {kinds!r} names no kind; the kinds are {', '.join(KINDS)}")
        unknown = wanted - set(KINDS)
        if unknown:
            raise UserError(f"--kind {', '.join(sorted(unknown))} is not a kind; the kinds are {', '.join(KINDS)}")
    patterns = None if only is None else [p.strip() for p in only.split(",") if p.strip()]
    if patterns is not None and not patterns:
        raise UserError(f"--only {only!r} names no check (give check ids or globs, comma-separated; "
                        "see `dictcheck run --list`)")
    every = list_checks() if listing else load_all_checks().values()
    checks = sorted(every, key=lambda c: (KINDS.index(c.kind), c.id))
    if quick:
        checks = [c for c in checks if c.quick]
    if wanted is not None:
        checks = [c for c in checks if c.kind in wanted]
    if patterns is not None:
        checks = [c for c in checks if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    if not checks:
        raise UserError(f"no check matches --only {only!r} --kind {kinds!r}; see `dictcheck run --list`"
                        if kinds else f"--only {only!r} matches no check; see `dictcheck run --list`")
    return checks


def json_safe(value: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats into JSON-safe values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


#: A replication's status by verdict.
_REPLICATION_STATUS = {"replicated": "pass", "not replicated": "fail", "inconclusive": "inconclusive"}


def run_check(check: Check, ctx: CheckContext) -> dict[str, Any]:
    """Run one check and return its result record (module docstring: status, and a replication's verdict and
    controls). A replication that returns no verdict of its own is judged by :func:`replication_verdict` from
    ``passed`` and its controls (without a positive and a negative control: inconclusive)."""
    start = time.perf_counter()
    record: dict[str, Any] = {"id": check.id, "title": check.title, "kind": check.kind, "spec": check.spec,
                              "source": check.source, "regime": check.regime,
                              "tier": "quick" if check.quick else "full", "predicted": check.predicted}
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
        if check.kind in MUST_PASS:
            passed, why = must_pass_verdict(outcome.passed, outcome.controls)
            record.update(status="pass" if passed else "fail", controls=[c.record() for c in outcome.controls])
            if why:
                record["finding"] = ((record["finding"] + " ") if record["finding"] else "") + why
        if check.kind == "replication":
            verdict = outcome.verdict or replication_verdict(outcome.passed, outcome.controls)
            record.update(status=_REPLICATION_STATUS[verdict], verdict=verdict,
                          controls=[c.record() for c in outcome.controls])
            if not outcome.controls:
                record["finding"] = ((record["finding"] + " ") if record["finding"] else "") + (
                    f"No controls declared: inconclusive (the claim itself {'held' if outcome.passed else 'failed'}).")
    record["seconds"] = round(time.perf_counter() - start, 3)
    return json_safe(record)


def suite_passed(results: list[dict[str, Any]], strict: bool = False) -> bool:
    """The run's verdict (module docstring): no check raised, every theorem and invariant check passed, and with
    ``strict`` every other check too (replications replicated)."""
    return all(r["status"] == "pass" if (strict or r["kind"] in MUST_PASS) else r["status"] != "error"
               for r in results)


def status_counts(results: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{kind: {status: count}} over the rows, kinds in :data:`KINDS` order."""
    counts: dict[str, dict[str, int]] = {}
    for kind in KINDS:
        rows = [r for r in results if r["kind"] == kind]
        if rows:
            counts[kind] = {status: sum(r["status"] == status for r in rows)
                            for status in dict.fromkeys(r["status"] for r in rows)}
    return counts


def run_suite(
    checks: list[Check],
    out: Path,
    *,
    seed: int = 0,
    quick: bool = False,
    only: str | None = None,
    kinds: str | None = None,
    strict: bool = False,
    progress: bool = False,
    announce: bool = False,
) -> dict[str, Any]:
    """Run ``checks`` in order and return the summary ``{"seed", "quick", "only", "kinds", "strict", "complete",
    "passed", "counts", "n_checks", "results"}`` (``passed``: :func:`suite_passed`; ``counts``:
    :func:`status_counts`).

    ``out`` is checked and locked first (ValueError when it cannot be a writable folder,
    :class:`dictcheck.empirics.io.safe_files.FolderInUseError` while another run writes it).
    ``out/results.json`` and ``out/report.md`` are rewritten atomically at the start and after every
    check (a crash loses nothing, and leaves ``"complete": false``); temporary files a killed run left
    are removed at the start. ``progress`` shows a tqdm bar over
    the checks; ``announce`` prints each check's prediction to stderr before it runs.
    """
    from tqdm import tqdm

    check_output_dir(out)
    with folder_lock(out, "dictcheck run"):
        for stale in (*out.glob(".*.tmp"), *out.glob("figures/.*.tmp")):  # staged by a run killed mid-write
            stale.unlink(missing_ok=True)
        ctx = CheckContext(out_dir=out, seed=seed, quick=quick)
        summary: dict[str, Any] = {"seed": seed, "quick": quick, "only": only, "kinds": kinds, "strict": strict,
                                   "complete": False, "passed": None, "counts": {}, "n_checks": len(checks),
                                   "results": []}
        _write(out, summary)
        for check in tqdm(checks, desc="checks", unit="check", disable=not progress):
            if announce:
                print(f"[{check.id}] predicts: {check.predicted}", file=sys.stderr, flush=True)
            summary["results"].append(run_check(check, ctx))
            summary["counts"] = status_counts(summary["results"])
            _write(out, summary)
        summary["complete"] = True
        summary["passed"] = suite_passed(summary["results"], strict)
        _write(out, summary)
    return summary


def _write(out: Path, summary: dict[str, Any]) -> None:
    """results.json, then report.md, each replaced atomically."""
    write_json_atomic(out / "results.json", summary)
    write_report(out / "report.md", summary)
