"""Writing results.json (atomically) and report.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dictcheck.empirics.atomic_files import atomic_write_bytes


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON atomically (temporary file, then rename): a crash never leaves a partial file."""
    atomic_write_bytes(path, (json.dumps(payload, indent=2) + "\n").encode("utf-8"))


def _fmt(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text.replace("|", "\\|").replace("\n", " ")


def write_report(path: Path, summary: dict[str, Any]) -> None:
    """A Markdown report (written atomically): the table, then per check prediction, measurement,
    tolerance, figures. A summary with ``"complete": false`` gets a banner saying the run is incomplete."""
    results = summary["results"]
    n_pass = sum(r["status"] == "pass" for r in results)
    lines = [
        "# dictcheck verification report",
        "",
        f"seed {summary['seed']}, quick={summary['quick']}: **{n_pass} passed, {len(results) - n_pass} failed**",
        "",
    ]
    if not summary.get("complete", True):
        lines += [f"**INCOMPLETE: {len(results)} of {summary.get('n_checks', '?')} checks have run** (the run is "
                  "still going, or it was interrupted; no verdict)", ""]
    lines += ["| check | status | seconds | spec |", "|---|---|---|---|"]
    lines += [f"| `{r['id']}` | {r['status'].upper()} | {r['seconds']:.2f} | {r['spec']} |" for r in results]
    for r in results:
        lines += ["", f"## `{r['id']}`: {r['title']}", "", f"*Spec:* {r['spec']}  ", f"*Status:* **{r['status'].upper()}**", ""]
        lines += [f"- **Predicted:** {_fmt(r['predicted'])}", f"- **Measured:** {_fmt(r.get('measured'))}"]
        lines += [f"- **Tolerance:** {_fmt(r.get('tolerance'))} — {r.get('tolerance_reason') or ''}"]
        if r.get("finding"):
            lines.append(f"- **Finding:** {r['finding']}")
        if r.get("error"):
            lines += ["", "```", r.get("traceback", r["error"]).rstrip(), "```"]
        lines += [f"", *[f"![{fig}]({fig})" for fig in r.get("figures") or []]]
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))
