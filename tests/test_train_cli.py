"""`dictcheck train`: trains on a toy or an .npy file, saves a loadable SAE, resumes, rejects bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dictcheck.empirics.io.sae_folder import load_sae
from dictcheck.proofs_checks.cli import main


def test_train_on_a_toy_then_check_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sae"
    argv = ["train", "--arch", "relu", "--toy", "independent_features", "--d-sae", "3", "--lam", "0.1",
            "--steps", "60", "--batch-size", "32", "--checkpoint-every", "20", "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 60 and summary["n_tokens"] == 60 * 32
    assert 0 < summary["metrics"]["ve"] <= 1
    weights, cfg = load_sae(out)
    assert cfg.architecture == "standard" and cfg.dictcheck["lam"] == 0.1 and weights["W_dec"].shape == (3, 3)
    assert main(argv + ["--resume"]) == 0  # resuming a finished run only re-saves
    capsys.readouterr()


def test_freeze_b_dec_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--freeze-b-dec keeps b_dec at its initial value (the same after 1 and after 40 steps); without it b_dec moves."""
    def b_dec(steps: int, *flags: str) -> np.ndarray:
        out = tmp_path / f"sae-{steps}-{'-'.join(flags) or 'free'}"
        assert main(["train", "--arch", "relu", "--toy", "independent_features", "--d-sae", "3", "--lam", "0.1",
                     "--steps", str(steps), "--batch-size", "32", "--out", str(out), *flags]) == 0
        capsys.readouterr()
        weights, cfg = load_sae(out)
        assert cfg.dictcheck["training"]["options"].get("freeze_b_dec", False) == ("--freeze-b-dec" in flags)
        return np.asarray(weights["b_dec"])

    np.testing.assert_array_equal(b_dec(1, "--freeze-b-dec"), b_dec(40, "--freeze-b-dec"))
    assert np.abs(b_dec(1) - b_dec(40)).max() > 1e-4


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--toy", "nope"], "unknown toy"),
        ([], "exactly one of"),
        (["--toy", "rank_one", "--data", "x.npy"], "exactly one of"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "train", "--arch", "topk", "--k", "1",
                           "--d-sae", "2", "--out", str(tmp_path / "o"), *extra], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_missing_k_for_topk_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(40, 3)))
    assert main(["train", "--arch", "topk", "--data", str(tmp_path / "x.npy"), "--d-sae", "4", "--out",
                 str(tmp_path / "o")]) == 2
    assert "needs k" in capsys.readouterr().err


def test_wandb_asked_for_but_missing_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # importing it raises ImportError
    assert main(["train", "--arch", "relu", "--toy", "rank_one", "--d-sae", "2", "--lam", "0.1", "--steps", "3",
                 "--batch-size", "8", "--out", str(tmp_path / "o"), "--wandb", "proj"]) == 2
    assert "wandb package is not installed" in capsys.readouterr().err


def test_wandb_run_receives_every_log_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, object]] = []

    class FakeRun:
        def log(self, record: dict, step: int) -> None:
            calls.append(("log", step))

        def finish(self) -> None:
            calls.append(("finish", None))

    class FakeWandb:
        @staticmethod
        def init(**kwargs: object) -> FakeRun:
            calls.append(("init", kwargs["project"]))
            return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", FakeWandb)
    assert main(["train", "--arch", "relu", "--toy", "rank_one", "--d-sae", "2", "--lam", "0.1", "--steps", "4",
                 "--batch-size", "8", "--checkpoint-every", "2", "--out", str(tmp_path / "o"), "--wandb", "proj"]) == 0
    capsys.readouterr()
    assert calls[0] == ("init", "proj") and calls[-1] == ("finish", None)
    assert [c for c in calls if c[0] == "log"]  # the JSONL records also went to W&B
