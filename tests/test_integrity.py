"""Data integrity under concurrency, kills and a full disk: nothing lost, nothing kept that is wrong.

* a second writer into an output folder (``run``, ``train``, ``bench-manifolds``, ``activations``) is
  refused with one line, and the first writer's files are untouched; a holder killed by SIGKILL
  releases the folder;
* a ``dictcheck run`` killed mid-way leaves ``"complete": false`` and an INCOMPLETE report;
* a full file system: refused before the work when the estimate does not fit, and one line with the
  last complete state intact when the disk fills during a write (a small tmpfs; needs root).

Shard corruption and unreadable checkpoints are tested with their modules
(tests/test_activation_store.py, tests/test_training.py) and through the CLI in
tests/test_hostile_inputs.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dictcheck.empirics.architectures import build_model
from dictcheck.empirics.training.checkpoints import check_checkpoint, checkpoints
from dictcheck.empirics.io.safe_files import LOCK_FILE
from dictcheck.empirics.training.loop import TrainConfig, train
from dictcheck.proofs_checks.runner import select_checks

CLI = [sys.executable, "-m", "dictcheck.proofs_checks.cli"]
#: Two quick checks, the second taking seconds: a window to act while a run is under way.
SLOW_RUN = ["run", "--quick", "--only", "narrow.absorption,narrow.antipodal_50pct"]
_HOLD = """
import sys, time
from dictcheck.empirics.io.safe_files import folder_lock
with folder_lock(sys.argv[1], "a test holder"):
    print("locked", flush=True)
    time.sleep(600)
"""


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: size and mtime."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def _one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == code and len(lines) == 1 and lines[0].startswith("dictcheck: error: "), proc.stderr
    return lines[0]


def _wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(64, 4)))
    return tmp_path / "X.npy"


def _commands(tmp_path: Path, data: Path) -> dict[str, list[str]]:
    return {
        "run": ["run", "--quick", "--only", "wide.q_reformulation"],
        "train": ["train", "--arch", "relu", "--lam", "0.1", "--d-sae", "4", "--steps", "3", "--batch-size", "8",
                  "--data", str(data)],
        "bench-manifolds": ["bench-manifolds", "--quick", "--steps", "1"],
        "activations": ["activations", "--model", "tinycoder", "--layer", "0", "--tokens", "20", "--context", "8"],
    }


@pytest.mark.parametrize("command", ["run", "train", "bench-manifolds", "activations"])
def test_a_second_writer_is_refused_and_a_killed_holder_releases(tmp_path: Path, data: Path, command: str) -> None:
    """Before: two writers into one --out both exited 0 and the last finisher's files won."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("the first writer's file\n")
    argv = [*CLI, *_commands(tmp_path, data)[command], "--out", str(out)]
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _files(out)
        line = _one_line_error(subprocess.run(argv, capture_output=True, text=True, timeout=300))
        assert f"{out} is in use by a test holder (pid {holder.pid}" in line
        assert _files(out) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    (out / "mine.txt").unlink()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not (out / LOCK_FILE).exists()


def test_two_concurrent_runs_the_second_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = subprocess.Popen([*CLI, "run", "--quick", "--only", "narrow.*", "--out", str(out), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (out / LOCK_FILE).exists() or first.poll() is not None)
        assert first.poll() is None, "the first run ended before the second could start"
        line = _one_line_error(subprocess.run([*CLI, "run", "--quick", "--only", "wide.*", "--out", str(out)],
                                              capture_output=True, text=True, timeout=300))
        assert "is in use by dictcheck run" in line
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is True and results["passed"] is True
    assert len(results["results"]) == results["n_checks"] == len(select_checks(quick=True, only="narrow.*", kinds=None))
    assert json.loads(stdout) == results


def test_a_killed_run_says_complete_false(tmp_path: Path) -> None:
    """Before: a killed run left "passed": true in results.json and nothing marking it incomplete."""
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, *SLOW_RUN, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def one_result() -> bool:
        try:
            return len(json.loads((out / "results.json").read_text())["results"]) == 1
        except (OSError, ValueError):
            return False

    try:
        _wait_for(lambda: one_result() or proc.poll() is not None)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is False and results["passed"] is None
    assert results["n_checks"] == 2 and [r["status"] for r in results["results"]] == ["pass"]
    # report.md is replaced right after results.json: a kill in between leaves it one check behind
    assert re.search(r"\*\*INCOMPLETE: [01] of 2 checks have run\*\*", (out / "report.md").read_text())
    (out / ".results.json.killed.tmp").write_text('{"partial')  # what a kill inside an atomic write leaves
    done = subprocess.run([*CLI, "run", "--quick", "--only", "narrow.absorption", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is True and results["passed"] is True
    assert "INCOMPLETE" not in (out / "report.md").read_text()
    assert not list(out.glob(".*.tmp"))  # the rerun removed the killed run's temporary files


# ------------------------------------------------------------------------------------------ full disk
PAGE = os.sysconf("SC_PAGE_SIZE")  # tmpfs allocates whole pages


@pytest.fixture()
def small_fs(tmp_path: Path):
    """A 256 KiB tmpfs (root only; skipped otherwise)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "fs"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def _fill(fs: Path, leave: int) -> None:
    """Fill ``fs`` until ``leave`` bytes are free (in whole pages)."""
    free = shutil.disk_usage(fs).free
    with open(fs / "filler", "ab") as fh:
        fh.write(b"\0" * max(0, free - leave))


@pytest.mark.parametrize("command", ["train", "activations"])
def test_too_little_disk_is_refused_before_the_work(small_fs: Path, data: Path, tmp_path: Path, command: str) -> None:
    """Before: the run worked, then ended in an OSError traceback when the disk was full."""
    argv = {"train": ["train", "--arch", "relu", "--lam", "0.1", "--d-sae", "4000", "--steps", "3", "--batch-size",
                      "8", "--data", str(data)],
            "activations": ["activations", "--model", "tinycoder", "--layer", "0", "--tokens", "10000", "--context",
                            "8"]}[command]
    line = _one_line_error(subprocess.run([*CLI, *argv, "--out", str(small_fs / "out")], capture_output=True,
                                          text=True, timeout=300))
    assert "needs about" in line and "of disk but the file system of" in line
    assert not (small_fs / "out").exists()


def test_a_disk_full_during_a_run_is_one_line_and_keeps_the_last_state(small_fs: Path) -> None:
    out = small_fs / "out"
    _fill(small_fs, 3 * PAGE)  # the lock's note, results.json and report.md fit; the next rewrite does not
    proc = subprocess.run([*CLI, "run", "--quick", "--only", "wide.*", "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    # the run announces each check on stderr as it starts; it ends in one error line, no traceback
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.splitlines()[-1]
    assert line.startswith("dictcheck: error: No space left on device (") and "every write is atomic" in line
    assert not [p for p in small_fs.rglob("*.tmp")]
    results = json.loads((out / "results.json").read_text())  # the last complete state: intact JSON
    assert results["complete"] is False and results["passed"] is None


def test_a_disk_full_during_training_keeps_the_last_checkpoint(small_fs: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 8)).astype(np.float32)
    model = build_model("relu", 8, 64, {"lam": 0.1}, seed=0)
    out = small_fs / "run"

    def fill_after_first_checkpoint(step: int) -> None:
        if step == 4:
            _fill(small_fs, 0)

    with pytest.raises(OSError, match="No space left on device"):
        train(model, X, TrainConfig(steps=12, batch_size=16, checkpoint_every=4, device="cpu"), out, progress=False,
              on_step=fill_after_first_checkpoint)
    found = checkpoints(out / "checkpoints")
    assert [step for step, _ in found] == [4]
    ck = torch.load(found[0][1], weights_only=True)
    check_checkpoint(ck, found[0][1], model=build_model("relu", 8, 64, {"lam": 0.1}, seed=0), steps=12, d_sae=64)
    assert not [p for p in small_fs.rglob("*.tmp")]
