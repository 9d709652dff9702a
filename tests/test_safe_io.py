"""Untrusted files, output folders and how the command line ends (empirics/io/safe_files.py,
empirics/io/atomic_files.py, proofs_checks/cli/__init__.py)."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.io.safe_files import (
    LOCK_FILE,
    FolderInUseError,
    check_output_dir,
    folder_lock,
    json_depth,
    read_json,
    read_npy,
)
from dictcheck.proofs_checks import api
from dictcheck.proofs_checks.cli import main


def test_read_npy_refuses_what_is_not_a_plain_array(tmp_path: Path) -> None:
    X = np.arange(6.0).reshape(3, 2)
    np.savez(tmp_path / "a.npz", X)
    with open(tmp_path / "npz_named.npy", "wb") as fh:
        np.savez(fh, X)
    np.save(tmp_path / "objects.npy", np.array([None, {}], dtype=object), allow_pickle=True)
    (tmp_path / "pickle.npy").write_bytes(b"\x80\x04K\x01.")
    (tmp_path / "text.npy").write_text("1 2 3")
    np.save(tmp_path / "td.npy", X.astype("timedelta64[s]"))
    np.save(tmp_path / "ok.npy", X)
    (tmp_path / "short.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:-8])
    for name, message in (("a.npz", "is an .npz archive"), ("npz_named.npy", "is an .npz archive"),
                          ("objects.npy", "holds Python objects"), ("pickle.npy", "is a pickle"),
                          ("text.npy", "no NumPy header"), ("td.npy", "must hold real numbers, got dtype timedelta64"),
                          ("short.npy", "not a readable .npy array"), ("missing.npy", "does not exist"),
                          (".", "not a file")):
        with pytest.raises(ValueError, match=message):
            read_npy(tmp_path / name, "data file")
    np.testing.assert_array_equal(read_npy(tmp_path / "ok.npy", "data file"), X)


def test_read_json_limits_size_and_depth_before_parsing(tmp_path: Path) -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[[{{{{"}]}') == 3  # brackets inside strings do not count
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested 100000 levels deep, more than the 64 allowed"):
        read_json(tmp_path / "deep.json", "cfg")
    (tmp_path / "big.json").write_text(json.dumps({"x": "y" * 2_000_000}))
    with pytest.raises(ValueError, match="more than the 1.0 MiB allowed"):
        read_json(tmp_path / "big.json", "cfg")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="unreadable JSON"):
        read_json(tmp_path / "bad.json", "cfg")
    (tmp_path / "ok.json").write_text('{"a": [[1]]}')
    assert read_json(tmp_path / "ok.json", "cfg", max_depth=3) == {"a": [[1]]}


def test_folder_lock_refuses_a_second_holder_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "new" / "out"
    with folder_lock(out, "first writer"):
        assert (out / LOCK_FILE).is_file()
        with pytest.raises(FolderInUseError, match=rf"{out} is in use by first writer \(pid {os.getpid()}, since"):
            with folder_lock(out, "second writer"):
                pass
        with pytest.raises(FolderInUseError, match="in use by first writer"):
            check_output_dir(out)  # the probe every command runs first
    assert not (tmp_path / "new").exists()  # created by the lock and left empty: removed again
    with folder_lock(out, "writer"):
        (out / "result.txt").write_text("kept")
    assert sorted(p.name for p in out.iterdir()) == ["result.txt"]
    check_output_dir(out)


def test_check_output_dir_messages(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(ValueError, match="lies under .*file, which is not a directory"):
        check_output_dir(tmp_path / "file" / "below" / "deeper")
    check_output_dir(tmp_path / "missing" / "parents")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_atomic_writes_are_readable_by_the_group(tmp_path: Path, umask: int, mode: int) -> None:
    """Before: every atomically written file kept mkstemp's 0600."""
    previous = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "f.json", b"{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == mode


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_internal_failures_are_one_line_with_exit_1_and_debug_shows_the_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(5, 2)))
    argv = ["solve", "huber-median", "--data", str(tmp_path / "X.npy"), "--lam", "0.5"]

    def broken(X: np.ndarray, lam: float) -> dict:
        raise RuntimeError("a bug\nwith two lines")

    monkeypatch.setattr(api, "huber_median", broken)
    assert main(argv) == 1
    assert _one_line(capsys) == ("dictcheck: internal error: RuntimeError: a bug (rerun with --debug or "
                                 "DICTCHECK_DEBUG=1 for the traceback)")
    assert main([*argv, "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.splitlines()[-1].startswith("dictcheck: internal error")
    monkeypatch.setenv("DICTCHECK_DEBUG", "1")
    assert main(argv) == 1 and "Traceback" in capsys.readouterr().err


def test_a_non_finite_result_is_never_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Before: NaN results were printed with exit code 0."""
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(5, 2)))
    monkeypatch.setattr(api, "huber_median", lambda X, lam: {"b": np.array([0.0, np.nan]), "objective": float("inf")})
    assert main(["solve", "huber-median", "--data", str(tmp_path / "X.npy"), "--lam", "0.5", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "solve huber-median produced non-finite values (b (1 non-finite entries); objective = inf)" in captured.err


def test_a_full_disk_is_one_line_naming_the_file(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from dictcheck.proofs_checks.cli import run as cmd_run

    def full(args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", "/out/results.json")

    monkeypatch.setattr(cmd_run, "run", full)
    assert main(["run", "--quick"]) == 2
    assert _one_line(capsys) == ("dictcheck: error: No space left on device (/out/results.json); the files written "
                                 "before are complete (every write is atomic)")


def test_missing_parents_of_an_output_folder_are_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a" / "b" / "c"
    assert main(["run", "--quick", "--only", "wide.q_reformulation", "--out", str(out), "--json"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is True and not (out / LOCK_FILE).exists()
    capsys.readouterr()
