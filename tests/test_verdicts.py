"""Kinds, replication verdicts with controls, the run's exit code, --strict, --kind and baselines
(proofs_checks/registry.py, runner.py, baseline.py, cli/run.py; docs/verdicts.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dictcheck.proofs_checks import registry
from dictcheck.proofs_checks.baseline import baseline_changes, baseline_of, key_values
from dictcheck.proofs_checks.cli import main
from dictcheck.proofs_checks.registry import KINDS, Control, Outcome, replication_verdict

POS_OK = Control("effect engages", "positive", "gap > 0.1", "gap 0.4", True)
NEG_OK = Control("no effect without cause", "negative", "gap < 0.01", "gap 0.002", True)
POS_BAD = Control("effect engages", "positive", "gap > 0.1", "gap 0.0", False)
PRE_BAD = Control("near the reference", "precondition", "objective within 2%", "objective 30% above", False)


@pytest.mark.parametrize(("claim", "controls", "verdict"), [
    (True, [POS_OK, NEG_OK], "replicated"),
    (False, [POS_OK, NEG_OK], "not replicated"),
    (True, [POS_BAD, NEG_OK], "inconclusive"),
    (False, [POS_OK, NEG_OK, PRE_BAD], "inconclusive"),
    (True, [POS_OK], "inconclusive"),  # no negative control: the test cannot tell the claim from noise
    (True, [], "inconclusive"),
])
def test_replication_verdict(claim: bool, controls: list[Control], verdict: str) -> None:
    assert replication_verdict(claim, controls) == verdict
    out = Outcome.for_replication(claim_holds=claim, controls=controls, measured=1.0, tolerance=0.0,
                                  tolerance_reason="test")
    assert out.verdict == verdict and out.passed is (verdict == "replicated")


def test_registration_states_kind_source_and_regime() -> None:
    checks = registry.load_all_checks()
    assert {c.kind for c in checks.values()} <= set(KINDS)
    for c in checks.values():
        assert c.source.strip() and c.regime.strip(), c.id
    with pytest.raises(ValueError, match="kind must be one of"):
        registry.check("zz.x", "x", "none", "nothing", kind="lemma", source="s", regime="r")
    with pytest.raises(ValueError, match="source and regime"):
        registry.check("zz.x", "x", "none", "nothing", kind="theorem", source=" ", regime="r")
    with pytest.raises(ValueError, match="role"):
        Control("c", "sideways", "e", "s", True)


def _plant(monkeypatch: pytest.MonkeyPatch, cid: str, kind: str, outcome: Outcome) -> None:
    registry.load_all_checks()
    monkeypatch.setitem(registry.REGISTRY, cid, registry.Check(cid, cid, "none", "planted", lambda ctx: outcome,
                                                               kind=kind, source="a test", regime="none"))


def _failing(passed: bool = False) -> Outcome:
    return Outcome(measured={"value": 1.0}, tolerance=0.0, tolerance_reason="planted", passed=passed)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["run", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_exit_code_follows_the_theorem_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _plant(monkeypatch, "zz.replication", "replication",
           Outcome.for_replication(claim_holds=False, controls=[POS_OK, NEG_OK], measured=0.3, tolerance=0.5,
                                   tolerance_reason="planted"))
    _plant(monkeypatch, "zz.hypothesis", "hypothesis", _failing())
    only = ["--only", "zz.*,wide.q_reformulation", "--out", str(tmp_path / "a")]
    code, summary = _run(only, capsys)
    assert code == 0 and summary["passed"] is True  # only a replication and a hypothesis fail
    row = next(r for r in summary["results"] if r["id"] == "zz.replication")
    assert row["status"] == "fail" and row["verdict"] == "not replicated"
    assert [c["role"] for c in row["controls"]] == ["positive", "negative"] and row["controls"][0]["ok"] is True
    assert summary["counts"]["replication"] == {"fail": 1}
    code, summary = _run([*only[:-1], str(tmp_path / "b"), "--strict"], capsys)
    assert code == 1 and summary["passed"] is False and summary["strict"] is True
    _plant(monkeypatch, "zz.theorem", "theorem", _failing())
    code, summary = _run(["--only", "zz.*", "--out", str(tmp_path / "c")], capsys)
    assert code == 1 and summary["passed"] is False
    # the table groups by kind and says which kinds decide the exit code
    assert main(["run", "--only", "zz.*", "--out", str(tmp_path / "d")]) == 1
    text = capsys.readouterr().out
    assert text.index("THEOREM (must pass)") < text.index("REPLICATION (reported)") < text.index("HYPOTHESIS")
    assert "NOT REPLICATED" in text and "run: FAILED" in text
    report = (tmp_path / "d" / "report.md").read_text()
    assert "*Kind:* replication" in report and "**Control (positive) effect engages:**" in report


def test_a_replication_without_controls_is_inconclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _plant(monkeypatch, "zz.legacy", "replication", _failing(passed=True))
    code, summary = _run(["--only", "zz.legacy", "--out", str(tmp_path)], capsys)
    row = summary["results"][0]
    assert code == 0 and row["status"] == "inconclusive" and row["verdict"] == "inconclusive"
    assert "No controls declared" in row["finding"] and row["controls"] == []


@pytest.mark.parametrize(("controls", "status", "why"), [
    ([NEG_OK], "pass", None),
    ([], "fail", "No negative control"),
    ([POS_OK], "fail", "No negative control"),
    ([NEG_OK, Control("sees the break", "negative", "v > 1e-3", "v 0", False)], "fail", "sees the break"),
])
def test_a_theorem_passes_only_with_a_negative_control_that_came_out(
        controls: list[Control], status: str, why: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _plant(monkeypatch, "zz.theorem", "theorem", Outcome(measured=0.0, tolerance=1e-8, tolerance_reason="planted",
                                                         passed=True, controls=controls))
    code, summary = _run(["--only", "zz.theorem", "--out", str(tmp_path)], capsys)
    row = summary["results"][0]
    assert row["status"] == status and code == (0 if status == "pass" else 1)
    assert [c["name"] for c in row["controls"]] == [c.name for c in controls]
    assert (row["finding"] is None) if why is None else (why in row["finding"])


def test_negative_control_needs_the_break_and_the_independent_value() -> None:
    assert registry.negative_control("c", measured=0.5, threshold=1e-3, what="v", reference=0.5).ok
    assert not registry.negative_control("c", measured=0.0, threshold=1e-3, what="v", reference=0.5).ok  # blind
    assert not registry.negative_control("c", measured=0.25, threshold=1e-3, what="v", reference=0.5).ok  # scaled
    assert not registry.negative_control("c", measured=1e-4, threshold=1e-3, what="v").ok


def test_kind_filter_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--list", "--quick", "--kind", "invariant"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("INVARIANT") and "THEOREM" not in listed and "quick" in listed
    assert "sae.amortisation_gap" in listed and "bsf.grassmann_orthonormal" in listed
    assert main(["run", "--kind", "lemma", "--out", str(tmp_path)]) == 2
    assert "not a kind" in capsys.readouterr().err


def test_key_values_and_baseline_changes() -> None:
    measured = {"err": 1e-13, "ok": True, "atoms": "+u", "rows": [1, 2], "nested": {"a": {"b": 2.0, "c": {"d": 1}}}}
    assert key_values(measured) == {"err": 1e-13, "ok": True, "atoms": "+u", "nested.a.b": 2.0}
    assert key_values(0.5) == {"": 0.5}
    row = {"id": "t.x", "kind": "theorem", "status": "pass", "measured": {"err": 1e-13, "value": 2.0}}
    rep = {"id": "r.y", "kind": "replication", "status": "fail", "verdict": "not replicated",
           "measured": {"r2": 0.60}}
    summary = {"seed": 0, "quick": False, "only": None, "kinds": None, "complete": True, "results": [row, rep]}
    base = baseline_of(summary)
    assert base["checks"]["t.x"]["values"]["err"] == {"value": 1e-13, "rel_tol": 1e-6, "abs_tol": 1e-9}
    assert baseline_changes(summary, base) == []
    moved = {**summary, "results": [{**row, "measured": {"err": 5e-13, "value": 2.0 * (1 + 2e-6)}},
                                    {**rep, "status": "pass", "verdict": "replicated", "measured": {"r2": 0.62}}]}
    changes = {(c["id"], c["what"], c.get("path")) for c in baseline_changes(moved, base)}
    # err moved by 4e-13 < abs_tol 1e-9; value by 2e-6 relative > 1e-6; r2 by 3% < 5%; the verdict flipped
    assert changes == {("t.x", "value", "value"), ("r.y", "status", None), ("r.y", "verdict", None)}
    gone = {**summary, "results": [row]}
    assert [c["what"] for c in baseline_changes(gone, base)] == ["not run"]
    assert baseline_changes({**gone, "only": "t.*"}, base) == []  # a filtered run does not miss the others
    with pytest.raises(ValueError, match="--seed"):
        baseline_changes({**summary, "seed": 3}, base)
    with pytest.raises(ValueError, match="complete run"):
        baseline_of({**summary, "complete": False})


def test_run_writes_and_compares_a_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    only = ["--only", "wide.huber_vs_geometric_median,wide.q_reformulation"]
    base = tmp_path / "base.json"
    assert main(["run", *only, "--out", str(tmp_path / "a"), "--write-baseline", str(base)]) == 0
    capsys.readouterr()
    assert main(["run", *only, "--out", str(tmp_path / "b"), "--baseline", str(base)]) == 0
    assert "nothing changed" in capsys.readouterr().out
    data = json.loads(base.read_text())
    entry = data["checks"]["wide.huber_vs_geometric_median"]
    path = next(p for p, v in entry["values"].items() if isinstance(v["value"], float) and abs(v["value"]) > 0.1)
    entry["values"][path]["value"] *= 1.01
    entry["status"] = "fail"
    base.write_text(json.dumps(data))
    assert main(["run", *only, "--out", str(tmp_path / "c"), "--baseline", str(base)]) == 0
    out = capsys.readouterr().out
    assert "2 change(s)" in out and f"value {path}" in out and "status: 'fail' → 'pass'" in out
    (tmp_path / "junk.json").write_text("{")
    assert main(["run", *only, "--out", str(tmp_path / "d"), "--baseline", str(tmp_path / "junk.json")]) == 2
