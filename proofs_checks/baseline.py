"""A committed baseline of verdicts and key measured values, and what changed against it
(``dictcheck run --baseline FILE``, ``--write-baseline FILE``; docs/verdicts.md).

A baseline file holds, per check id: its kind, status (and a replication's verdict) and its key values: the
scalar leaves (numbers, booleans, strings) of ``measured`` down to :data:`MAX_DEPTH` levels of dicts, each with
a tolerance. Lists are not key values. A value has changed when

* a number: |now − then| > abs_tol + rel_tol·|then| (both stored per value, so they can be edited by hand);
* a boolean or string: now ≠ then;

and a check has changed when its status or verdict differs, a key value changed, appeared or disappeared, or
the check is missing from one side. The default tolerances depend on the kind: theorem and invariant values
are deterministic computations (relative 1e-6, absolute 1e-9: float rounding differs across BLAS builds, an
error rising from 1e-13 to 1e-8 is a change); trained checks vary with the platform's float arithmetic
(relative 5%, absolute 1e-6).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BASELINE_FORMAT", "DEFAULT_TOLERANCES", "MAX_DEPTH", "baseline_changes", "baseline_of", "key_values"]

BASELINE_FORMAT = 1
#: Nesting depth of ``measured`` searched for key values.
MAX_DEPTH = 3
#: (rel_tol, abs_tol) by kind.
DEFAULT_TOLERANCES = {"theorem": (1e-6, 1e-9), "invariant": (1e-6, 1e-9), "replication": (0.05, 1e-6),
                      "hypothesis": (0.05, 1e-6), "descriptive": (0.05, 1e-6)}


def key_values(measured: Any, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """The scalar leaves of ``measured`` by dotted path (a bare scalar is the path ``""``), lists skipped;
    non-finite floats appear as the strings JSON stores them as."""
    if isinstance(measured, dict):
        if depth >= MAX_DEPTH:
            return {}
        out: dict[str, Any] = {}
        for k, v in measured.items():
            out.update(key_values(v, f"{prefix}.{k}" if prefix else str(k), depth + 1))
        return out
    if isinstance(measured, (bool, int, float, str)):
        return {prefix: measured}
    return {}


def baseline_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The baseline of a finished run's summary (results.json), with :data:`DEFAULT_TOLERANCES`."""
    if not summary.get("complete", False):
        raise ValueError("a baseline needs a complete run (results.json says complete: false)")
    checks: dict[str, Any] = {}
    for r in summary["results"]:
        rel, abs_ = DEFAULT_TOLERANCES[r["kind"]]
        entry: dict[str, Any] = {"kind": r["kind"], "status": r["status"]}
        if "verdict" in r:
            entry["verdict"] = r["verdict"]
        entry["values"] = {path: ({"value": v, "rel_tol": rel, "abs_tol": abs_}
                                  if isinstance(v, (int, float)) and not isinstance(v, bool) else {"value": v})
                           for path, v in key_values(r.get("measured")).items()}
        checks[r["id"]] = entry
    return {"format": BASELINE_FORMAT, "seed": summary["seed"], "quick": summary["quick"], "checks": checks}


def _value_changed(then: dict[str, Any], now: Any) -> bool:
    old = then["value"]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (old, now))
    if not numbers:
        return old != now
    if not (math.isfinite(old) and math.isfinite(now)):
        return old != now
    return abs(now - old) > then.get("abs_tol", 0.0) + then.get("rel_tol", 0.0) * abs(old)


def baseline_changes(summary: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed between a run's summary and a baseline (module docstring): one record per change with
    ``id``, ``what`` (``status``, ``verdict``, ``value``, ``new value``, ``missing value``, ``new check``,
    ``not run``), ``path`` (for values), ``baseline`` and ``now``. Checks the run did not select are ``not run``
    only when the run had no ``--only``/``--kind`` filter and the same tier."""
    if baseline.get("format") != BASELINE_FORMAT or not isinstance(baseline.get("checks"), dict):
        raise ValueError(f"not a dictcheck baseline (format {BASELINE_FORMAT} with a 'checks' object)")
    if summary["seed"] != baseline.get("seed"):
        raise ValueError(f"the baseline was recorded with --seed {baseline.get('seed')}, this run used "
                         f"--seed {summary['seed']}")
    changes: list[dict[str, Any]] = []
    ran = {r["id"]: r for r in summary["results"]}
    for cid, r in ran.items():
        then = baseline["checks"].get(cid)
        if then is None:
            changes.append({"id": cid, "what": "new check", "baseline": None, "now": r["status"]})
            continue
        for field in ("status", "verdict"):
            if then.get(field) != r.get(field):
                changes.append({"id": cid, "what": field, "baseline": then.get(field), "now": r.get(field)})
        now_values = key_values(r.get("measured"))
        for path, old in then["values"].items():
            if path not in now_values:
                changes.append({"id": cid, "what": "missing value", "path": path, "baseline": old["value"],
                                "now": None})
            elif _value_changed(old, now_values[path]):
                changes.append({"id": cid, "what": "value", "path": path, "baseline": old["value"],
                                "now": now_values[path], "rel_tol": old.get("rel_tol"), "abs_tol": old.get("abs_tol")})
        for path in now_values.keys() - then["values"].keys():
            changes.append({"id": cid, "what": "new value", "path": path, "baseline": None, "now": now_values[path]})
    unfiltered = not summary.get("only") and not summary.get("kinds")
    if unfiltered and summary.get("quick") == baseline.get("quick"):
        for cid in baseline["checks"].keys() - ran.keys():
            changes.append({"id": cid, "what": "not run", "baseline": baseline["checks"][cid]["status"], "now": None})
    return changes
