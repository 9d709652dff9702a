"""The dictcheck CLI: JSON contracts of `solve`, error paths (exit 2, one line), and `run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dictcheck.proofs_checks import registry
from dictcheck.proofs_checks.cli import main

C3 = np.array([(0, 0), (0.1, 0.05), (-0.05, 0.1), (3.0, 0.2), (2.5, 2.0), (-2.0, 1.0)], dtype=float)


@pytest.fixture()
def c3(tmp_path: Path) -> Path:
    path = tmp_path / "c3.npy"
    np.save(path, C3)
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_solve_huber_and_geometric_median_json(c3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, ["solve", "huber-median", "--data", str(c3), "--lam", "0.8", "--json"])
    np.testing.assert_allclose(out["b"], [0.241520, 0.284281], atol=5e-7)
    assert out["objective"] == pytest.approx(1.855247, abs=5e-7)
    out = _json(capsys, ["solve", "geometric-median", "--data", str(c3), "--json"])
    np.testing.assert_allclose(out["b"], [0.070623, 0.071584], atol=5e-7)
    assert out["objective"] == pytest.approx(1.427347, abs=5e-7)


def test_solve_wide_limit_and_dnn_json(c3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wide = _json(capsys, ["solve", "wide-limit", "--data", str(c3), "--lam", "0.8", "--json"])
    assert {"b", "objective", "n_rays", "atoms", "certified_gap"} <= set(wide)
    assert wide["objective"] == pytest.approx(1.855247, abs=5e-7)
    assert wide["n_rays"] == 3 and len(wide["atoms"]) == 3 and len(wide["atoms"][0]) == 2
    assert 0 <= wide["certified_gap"] < 1e-10
    dnn = _json(capsys, ["solve", "dnn", "--data", str(c3), "--lam", "0.8", "--json"])
    assert {"objective", "b", "status"} <= set(dnn)
    assert dnn["status"] == "optimal"
    assert dnn["objective"] == pytest.approx(wide["objective"], abs=1e-6)


def test_solve_with_fixed_bias(c3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "b.npy", np.zeros(2))
    wide = _json(capsys, ["solve", "wide-limit", "--data", str(c3), "--lam", "0.8", "--bias", str(tmp_path / "b.npy"), "--json"])
    assert wide["b"] == [0.0, 0.0]


@pytest.mark.parametrize(
    "make, args",
    [
        (None, ["--data", "{tmp}/missing.npy", "--lam", "1"]),
        (np.array([1.0, 2.0]), ["--data", "{f}", "--lam", "1"]),
        (np.array([[1.0, np.nan]]), ["--data", "{f}", "--lam", "1"]),
        (np.array([[1.0, np.inf]]), ["--data", "{f}", "--lam", "1"]),
        (np.zeros((0, 3)), ["--data", "{f}", "--lam", "1"]),
        (C3, ["--data", "{f}", "--lam", "0"]),
        (C3, ["--data", "{f}", "--lam", "-1"]),
        (C3, ["--data", "{f}", "--lam", "nan"]),
        (C3, ["--data", "{f}", "--lam", "1", "--no-such-option"]),
        (C3, ["--data", "{f}"]),
        (C3, ["--data", "{f}", "--lam", "abc"]),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, make: np.ndarray | None, args: list[str]) -> None:
    f = tmp_path / "data.npy"
    if make is not None:
        np.save(f, make)
    argv = [a.format(tmp=tmp_path, f=f) for a in args]
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "solve", "huber-median", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dictcheck: error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_bias_file_and_not_npy(tmp_path: Path, c3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "b.npy", np.zeros(3))
    assert main(["solve", "dnn", "--data", str(c3), "--lam", "1", "--bias", str(tmp_path / "b.npy")]) == 2
    (tmp_path / "junk.npy").write_text("not an array")
    assert main(["solve", "wide-limit", "--data", str(tmp_path / "junk.npy"), "--lam", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "bias file" in err and "not an .npy file" in err


def test_run_writes_results_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["run", "--quick", "--only", "wide.huber_vs_geometric_median,wide.q_reformulation", "--out", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "THEOREM (must pass)" in table and "PASS" in table and "2 pass" in table
    results = json.loads((out / "results.json").read_text())
    assert results["passed"] is True and results["counts"] == {"theorem": {"pass": 2}}
    for r in results["results"]:
        assert {"id", "title", "kind", "source", "regime", "tier", "spec", "status", "predicted", "measured",
                "tolerance", "seconds"} <= set(r)
        assert r["status"] == "pass" and r["kind"] == "theorem" and r["tier"] == "quick"
    assert "wide.q_reformulation" in (out / "report.md").read_text()


def test_a_raising_check_is_an_error_and_the_others_still_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    registry.load_all_checks()

    def broken(ctx: registry.CheckContext) -> registry.Outcome:
        raise RuntimeError("boom")

    broken_check = registry.Check("zz.broken", "broken", "none", "nothing", broken, kind="replication",
                                  source="a test", regime="none")
    monkeypatch.setitem(registry.REGISTRY, "zz.broken", broken_check)  # an error counts whatever the kind
    code = main(["run", "--only", "zz.broken,wide.q_reformulation", "--out", str(tmp_path), "--json"])
    assert code == 1
    results = json.loads(capsys.readouterr().out)["results"]
    status = {r["id"]: r["status"] for r in results}
    assert status == {"zz.broken": "error", "wide.q_reformulation": "pass"}
    assert "boom" in next(r for r in results if r["id"] == "zz.broken")["error"]


def test_run_only_matching_nothing_is_a_user_error(tmp_path: Path) -> None:
    assert main(["run", "--only", "no.such.*", "--out", str(tmp_path)]) == 2


def test_dnn_refuses_large_n_with_a_pointer_to_wide_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "big.npy", np.random.default_rng(0).normal(size=(101, 2)))
    assert main(["solve", "dnn", "--data", str(tmp_path / "big.npy"), "--lam", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-points" in err and "wide-limit" in err
