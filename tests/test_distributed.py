"""Data-parallel training (issue 8, empirics.training.distributed): two gloo ranks started by
``dictcheck train --nproc 2`` train the same SAE as one process with the doubled per-rank batch;
a rank killed mid-run fails the job with one clear line and ``--resume`` finishes it exactly."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.data.activation_store import FORMAT, MANIFEST, open_activations
from dictcheck.empirics.architectures import architecture, build_model
from dictcheck.empirics.training.distributed import World, rank_seed
from dictcheck.empirics.io.sae_folder import load_sae
from dictcheck.empirics.training.loop import TrainConfig, train
from dictcheck.proofs_checks.cli import build_parser, main
from dictcheck.proofs_checks.cli.ranks import root_failure as _root_failure, worker_argv as _worker_argv

REPO = Path(__file__).resolve().parents[1]
#: Per-rank batch 16, global batch 32; float64 makes the DDP/one-process comparison tight.
_MODEL = dict(arch="topk", k=3, d_sae=32, dtype="float64")
_RUN = dict(steps=30, batch_size=32, seed=3, checkpoint_every=10, log_every=5, device="cpu")


def _model(d_in: int = 12):
    """The model the CLI builds for _MODEL + _RUN (init seed = --seed)."""
    return build_model("topk", d_in, 32, {"k": 3}, seed=_RUN["seed"], dtype=torch.float64)


def _data(n: int = 400, d: int = 12) -> np.ndarray:
    rng = np.random.default_rng(0)
    atoms = rng.standard_normal((24, d))
    codes = rng.exponential(1.0, (n, 24)) * (rng.random((n, 24)) < 0.15)
    return (codes @ atoms + 0.05 * rng.standard_normal((n, d)) + 0.5).astype(np.float32)


def _write_store(X: np.ndarray, out: Path, shard_rows: int) -> Path:
    """A minimal activation store (manifest + float32 .npy shards) holding the rows of X in order."""
    out.mkdir()
    shards = []
    for i, start in enumerate(range(0, X.shape[0], shard_rows)):
        path = out / f"shard_{i:05d}.npy"
        np.save(path, X[start:start + shard_rows])
        shards.append({"file": path.name, "rows": int(min(shard_rows, X.shape[0] - start)),
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    (out / MANIFEST).write_text(json.dumps({"format": FORMAT, "d": int(X.shape[1]), "shards": shards}))
    return out


def _cli_args(data: Path, out: Path) -> list[str]:
    flags = {k: v for k, v in {**_MODEL, **_RUN}.items() if k != "arch"}
    return ["train", "--arch", _MODEL["arch"], "--data", str(data), "--out", str(out),
            *[a for k, v in flags.items() for a in ("--" + k.replace("_", "-"), str(v))]]


def _launch(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", *args, "--nproc", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One process on the array (batch 32) and two gloo ranks on a 3-shard store of the same rows."""
    tmp = tmp_path_factory.mktemp("ddp")
    X = _data()
    store = _write_store(X, tmp / "store", shard_rows=150)
    single = train(_model(), X, TrainConfig(**_RUN), tmp / "single", progress=False)
    proc = _launch(_cli_args(store, tmp / "ddp") + ["--json"])
    assert proc.returncode == 0, proc.stderr
    return SimpleNamespace(tmp=tmp, store=store, single=single, ddp_dir=tmp / "ddp", proc=proc)


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_gloo_ranks_train_what_one_process_with_the_doubled_batch_trains(runs: SimpleNamespace) -> None:
    weights, cfg = load_sae(runs.ddp_dir)
    assert cfg.dictcheck["training"]["world_size"] == 2 and cfg.dictcheck["training"]["batch_size"] == 32
    assert sorted(weights) == sorted(runs.single.weights)
    for name, w in runs.single.weights.items():
        # float64: 30 Adam steps whose gradients differ only in summation order (measured ~2e-16)
        torch.testing.assert_close(weights[name], w, rtol=0, atol=1e-12)
    one, two = _log(runs.single.log_path), _log(runs.ddp_dir / "train_log.jsonl")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [5, 10, 15, 20, 25, 30]
    for a, b in zip(one, two):  # logged means are global: equal to the one-process batch means
        for key in ("loss", "mse", "l0", "grad_norm", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-12, abs=1e-12), key
        assert a["dead_frac_train"] == b["dead_frac_train"]  # dead counters see the global batch
    summary = json.loads(runs.proc.stdout)  # only rank 0 prints
    assert summary["n_tokens"] == 30 * 32 and summary["metrics"]["fvu"] == pytest.approx(runs.single.metrics["fvu"])
    assert "[dictcheck.train] step 30/30" in runs.proc.stderr and runs.proc.stderr.count("step 30/30") == 1


def test_killed_rank_fails_with_one_line_and_resume_finishes_exactly(runs: SimpleNamespace) -> None:
    out = runs.tmp / "killed"
    args = _cli_args(runs.store, out)
    proc = _launch(args, DICTCHECK_FAULT_INJECT="1:14")  # rank 1 SIGKILLs itself after step 14
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("[dictcheck.train]")]
    assert len(errors) == 1, proc.stderr
    assert "rank 1 was killed by SIGKILL" in errors[0] and "ckpt_00000010.pt" in errors[0] and "--resume" in errors[0]
    assert "Traceback" not in proc.stderr
    resumed = _launch(args + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr
    a, _ = load_sae(out)
    b, _ = load_sae(runs.ddp_dir)
    for name in b:  # same ranks, same two-term sums: bit-identical to the uninterrupted run
        assert torch.equal(a[name], b[name]), name
    # one process cannot continue a two-rank run
    with pytest.raises(ValueError, match="written by 2 rank"):
        train(_model(), open_activations(runs.store), TrainConfig(**_RUN), out, resume=True, progress=False)


@settings(max_examples=20, deadline=None)
@given(size=st.sampled_from([1, 2, 4]), per_rank=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_shards_partition_the_global_batch(size: int, per_rank: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(50, (size * per_rank,), generator=g)
    parts = [World(rank=r, size=size).shard(idx) for r in range(size)]
    assert all(p.shape == (per_rank,) for p in parts)
    assert torch.equal(torch.cat(parts), idx)  # contiguous, in rank order: the one-process batch


def test_batch_not_divisible_by_ranks_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="divisible by the number of ranks 3"):
        train(_model(), _data(40), TrainConfig(**_RUN), tmp_path / "o", world=World(rank=0, size=3))


def test_rank_seeds() -> None:
    assert rank_seed(7, 0) == 7  # one process keeps its seed
    assert len({rank_seed(s, r) for s in range(3) for r in range(4)}) == 12


def ddp_inexactness(arch: str, options: dict) -> str | None:
    a = architecture(arch)
    return a.ddp_inexactness(a.options(options, 8))


def test_inexact_architectures_are_named() -> None:
    for arch, options in [("relu", {"lam": 0.1}), ("topk", {"k": 2}), ("jumprelu", {"lam": 0.1}), ("abs", {"lam": 0.1}),
                          ("bsf-vanilla", {"k": 1, "block_size": 2, "denoise": 0.0}),
                          ("bsf-grouplasso", {"block_size": 2, "denoise": 0.0, "gate": "shrink"}),
                          ("vasae", {"k": 2, "anchor_coef": 0.1, "anchor_source": "x.npy"})]:
        assert ddp_inexactness(arch, options) is None, arch
    assert "AuxK" in ddp_inexactness("topk", {"k": 2, "aux_coef": 1 / 32})
    assert "top k·B/P" in ddp_inexactness("batchtopk", {"k": 2})
    assert "denois" in ddp_inexactness("bsf-grassmann", {"k": 1, "block_size": 2, "denoise": 0.1})
    assert "cold start" in ddp_inexactness("bsf-grouplasso", {"block_size": 2, "denoise": 0.0, "gate": "ste",
                                                              "k_target": 2})
    assert "Hoyer" in ddp_inexactness("bilinear-quadratic", {})


def test_worker_argv_round_trips_without_nproc() -> None:
    parser = build_parser()
    argv = ["train", "--arch", "bsf-vanilla", "--data", "d", "--d-sae", "8", "--k", "2", "--block-size", "2",
            "--denoise", "0.1", "--lr", "0.0003", "--dtype", "float64", "--resume", "--json", "--nproc", "2",
            "--out", "o"]
    args = parser.parse_args(argv)
    again = parser.parse_args(["train", *_worker_argv(args)])
    expected = {k: v for k, v in vars(args).items() if k != "nproc"}
    assert {k: v for k, v in vars(again).items() if k != "nproc"} == expected and again.nproc == 1


def _failure(exitcode: int, timestamp: int, message: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp,
                           error_file_data={"message": message} if message else {})


def test_root_failure_explains_the_others() -> None:
    killed, terminated, crashed = _failure(-9, 5), _failure(-15, 4), _failure(1, 3, "RuntimeError: reset")
    assert _root_failure({0: terminated, 1: killed})[0] == 1  # SIGTERM is the launcher tearing down
    assert _root_failure({0: crashed, 1: killed})[0] == 1  # a lost peer is a consequence
    assert _root_failure({0: crashed, 1: _failure(2, 9, "bad data")})[0] == 1  # a user error explains all
    assert _root_failure({0: crashed, 1: terminated})[0] == 0


def test_nproc_under_torchrun_is_a_user_error(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--arch", "relu", "--lam", "0.1", "--toy", "rank_one", "--d-sae", "2",
                 "--out", "unused", "--nproc", "2"]) == 2
    assert "under torchrun leave --nproc out" in capsys.readouterr().err
