"""Writing results.json (atomically) and report.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.proofs_checks.registry import KINDS


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON atomically (temporary file, then rename): a crash never leaves a partial file."""
    atomic_write_bytes(path, (json.dumps(payload, indent=2) + "\n").encode("utf-8"))


def _fmt(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text.replace("|", "\\|").replace("\n", " ")


def _status(r: dict[str, Any]) -> str:
    return str(r.get("verdict") or r["status"]).upper()


def write_report(path: Path, summary: dict[str, Any]) -> None:
    """A Markdown report (written atomically): per kind a table, then per check its kind, source, regime,
    prediction, measurement, tolerance, a replication's verdict and controls, and figures. A summary with
    ``"complete": false`` gets a banner saying the run is incomplete."""
    results = summary["results"]
    counts = "; ".join(f"{kind}: " + ", ".join(f"{n} {status}" for status, n in by.items())
                       for kind, by in (summary.get("counts") or {}).items())
    verdict = {True: "every theorem and invariant check passed", False: "FAILED", None: "no verdict yet"}[
        summary.get("passed")]
    lines = [
        "# dictcheck verification report",
        "",
        f"seed {summary['seed']}, quick={summary['quick']}, strict={summary.get('strict', False)}: "
        f"**{verdict}** ({counts})",
        "",
    ]
    if not summary.get("complete", True):
        lines += [f"**INCOMPLETE: {len(results)} of {summary.get('n_checks', '?')} checks have run** (the run is "
                  "still going, or it was interrupted; no verdict)", ""]
    for kind in KINDS:
        rows = [r for r in results if r["kind"] == kind]
        if rows:
            lines += [f"**{kind}**", "", "| check | status | tier | seconds | spec |", "|---|---|---|---|---|"]
            lines += [f"| `{r['id']}` | {_status(r)} | {r['tier']} | {r['seconds']:.2f} | {r['spec']} |" for r in rows]
            lines.append("")
    for r in results:
        lines += ["", f"## `{r['id']}`: {r['title']}", "", f"*Kind:* {r['kind']} ({r['tier']})  ",
                  f"*Source:* {r['source']}  ", f"*Regime:* {r['regime']}  ", f"*Spec:* {r['spec']}  ",
                  f"*Status:* **{_status(r)}**", ""]
        lines += [f"- **Predicted:** {_fmt(r['predicted'])}", f"- **Measured:** {_fmt(r.get('measured'))}"]
        lines += [f"- **Tolerance:** {_fmt(r.get('tolerance'))} — {r.get('tolerance_reason') or ''}"]
        for c in r.get("controls") or []:
            lines.append(f"- **Control ({c['role']}) {c['name']}:** expected {_fmt(c['expected'])}; showed "
                         f"{_fmt(c['showed'])} — {'as expected' if c['ok'] else 'NOT as expected'}")
        if r.get("finding"):
            lines.append(f"- **Finding:** {r['finding']}")
        if r.get("error"):
            lines += ["", "```", r.get("traceback", r["error"]).rstrip(), "```"]
        lines += ["", *[f"![{fig}]({fig})" for fig in r.get("figures") or []]]
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))
