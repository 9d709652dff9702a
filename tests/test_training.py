"""Tests for empirics.training (spec/ecosystem.md §3): schedule, determinism, kill/resume, files."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dictcheck.empirics.sae_io import load_metrics, load_sae, load_sparsity
from dictcheck.empirics.training import (
    CHECKPOINT_DIR,
    LOG_FILE,
    TrainConfig,
    data_hash,
    default_lr,
    latest_checkpoint,
    lr_schedule,
    t_dead,
    train,
)

REPO = Path(__file__).resolve().parents[1]


def _data(n: int = 512, d: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    atoms = rng.standard_normal((24, d))
    codes = rng.exponential(1.0, (n, 24)) * (rng.random((n, 24)) < 0.15)
    return (codes @ atoms + 0.05 * rng.standard_normal((n, d)) + 0.5).astype(np.float32)


def _cfg(**kw) -> TrainConfig:
    base = dict(arch="topk", d_sae=32, k=3, steps=40, batch_size=32, seed=3, checkpoint_every=10,
                log_every=7, device="cpu", aux_coef=1 / 32)
    base.update(kw)
    return TrainConfig(**base)


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype
        assert torch.equal(a[name], b[name]), f"tensor {name} differs"


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _strip_time(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in recs]


# ------------------------------------------------------------------------------- schedule


def test_lr_schedule_key_steps():
    steps = 10_000  # warm-up W = 500, decay T = 2000
    assert lr_schedule(0, steps) == pytest.approx(1 / 500)
    assert lr_schedule(249, steps) == pytest.approx(250 / 500)
    assert lr_schedule(499, steps) == 1.0
    assert lr_schedule(500, steps) == 1.0
    assert lr_schedule(7_999, steps) == 1.0
    assert lr_schedule(8_000, steps) == 1.0  # first decay step
    assert lr_schedule(9_000, steps) == pytest.approx(0.5)
    assert lr_schedule(9_999, steps) == pytest.approx(1 / 2000)
    # warm-up capped at 1000 steps
    assert lr_schedule(999, 100_000) == 1.0
    assert lr_schedule(499, 100_000) == pytest.approx(0.5)
    # edge cases: no warm-up below 20 steps, no decay below 5
    assert lr_schedule(0, 1) == 1.0
    assert [lr_schedule(s, 4) for s in range(4)] == [1.0] * 4
    assert [lr_schedule(s, 10) for s in range(10)] == [1.0] * 8 + [1.0, 0.5]
    vals = [lr_schedule(s, 100) for s in range(100)]
    assert vals[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert all(0 < v <= 1 for v in vals)
    for bad in [(10, 10), (-1, 10), (0, 0), (1.5, 10)]:
        with pytest.raises(ValueError):
            lr_schedule(*bad)


def test_defaults():
    assert default_lr(2**14) == pytest.approx(2e-4)
    assert TrainConfig(arch="topk", d_sae=2**16, k=8).lr == pytest.approx(1e-4)
    assert TrainConfig(arch="topk", d_sae=64, k=8, lr=1e-3).lr == 1e-3
    assert t_dead(100, 64) == 1600
    assert t_dead(10**6, 4096) == 10_000_000
    assert t_dead(1, 1) == 1


# ------------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(arch="gated"), "arch"),
        (dict(k=None), "needs k"),
        (dict(k=33), "needs k"),
        (dict(arch="relu", k=None), "needs lam"),
        (dict(arch="relu", k=None, lam=-1.0), "lam"),
        (dict(lam=0.1), "lam is only used"),
        (dict(b_dec_init="huber_median"), "huber_median"),
        (dict(b_dec_init="median"), "b_dec_init"),
        (dict(lr=-1e-3), "lr"),
        (dict(batch_size=0), "batch_size"),
        (dict(steps=0), "steps"),
        (dict(checkpoint_every=-1), "checkpoint_every"),
        (dict(aux_coef=float("nan")), "aux_coef"),
        (dict(dtype="int8"), "dtype"),
        (dict(device="tpu:x"), "device"),
    ],
)
def test_bad_config_raises(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        train(_data(64), _cfg(**kw), tmp_path)


def test_bad_data_raises(tmp_path):
    X = _data(64)
    with pytest.raises(ValueError, match="shape"):
        train(X[:, 0], _cfg(), tmp_path)
    X[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        train(X, _cfg(), tmp_path)
    with pytest.raises(ValueError, match="numpy"):
        train(torch.zeros(4, 4), _cfg(), tmp_path)


# ------------------------------------------------------------------------------- determinism, files


def test_deterministic_under_seed(tmp_path):
    X = _data()
    r1 = train(X, _cfg(), tmp_path / "a", progress=False)
    r2 = train(X, _cfg(), tmp_path / "b", progress=False)
    _assert_same_weights(r1.weights, r2.weights)
    assert _strip_time(_log(r1.log_path)) == _strip_time(_log(r2.log_path))
    r3 = train(X, _cfg(seed=4), tmp_path / "c", progress=False)
    assert not torch.equal(r1.weights["W_dec"], r3.weights["W_dec"])


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(arch="relu", k=None, lam=0.05, b_dec_init="huber_median"),
        dict(arch="batchtopk", b_dec_init="mean"),
        dict(arch="jumprelu", k=None, lam=0.01, b_dec_init="zero"),
        dict(arch="abs", k=None, lam=0.05),
    ],
)
def test_saved_folder_log_and_metrics(tmp_path, kw):
    X = _data()
    cfg = _cfg(**kw)
    res = train(X, cfg, tmp_path, progress=False)
    weights, sae_cfg = load_sae(tmp_path)
    _assert_same_weights(weights, res.weights)
    dc = sae_cfg.dictcheck
    assert dc["arch"] == cfg.arch and dc["seed"] == cfg.seed
    assert dc["n_tokens"] == cfg.steps * cfg.batch_size
    assert dc["data_hash"] == data_hash(X)
    assert dc["training"]["T_dead"] == t_dead(cfg.steps, cfg.batch_size)
    if cfg.arch == "batchtopk":
        assert dc["batchtopk"]["threshold"] > 0
    # unit-norm decoder rows
    assert torch.allclose(weights["W_dec"].norm(dim=1), torch.ones(cfg.d_sae), atol=1e-5)
    # log: one JSON object per line, every log_every steps plus the last
    lines = (tmp_path / LOG_FILE).read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) for r in recs)
    assert [r["step"] for r in recs] == [7, 14, 21, 28, 35, 40]
    for r in recs:
        assert {"loss", "mse", "l0", "dead_frac_train", "lr", "tokens"} <= set(r)
        assert math.isclose(r["loss"], r["mse"] + r["sparsity_loss"] + r["aux_loss"], rel_tol=1e-5)
    m = load_metrics(tmp_path)
    assert m is not None and "explained_variance" not in m
    assert {"mse", "fvu", "ve", "l0", "dead_frac", "n_eval_tokens", "dead_frac_train"} <= set(m)
    assert m["n_eval_tokens"] == X.shape[0] and m["eval_split"] == "train"
    assert m["ve"] > 0.0
    sp = load_sparsity(tmp_path)
    assert sp is not None and sp.shape == (cfg.d_sae,)
    # checkpoints: only the newest keep_checkpoints, the final one included
    names = sorted(p.name for p in (tmp_path / CHECKPOINT_DIR).iterdir())
    assert names == ["ckpt_00000030.pt", "ckpt_00000040.pt"]


def test_progress_line_when_not_a_tty(tmp_path, capsys):
    train(_data(128), _cfg(steps=14), tmp_path, progress=None)
    err = capsys.readouterr().err
    assert "step 7/14" in err and "step 14/14" in err and "dead" in err
    train(_data(128), _cfg(steps=14), tmp_path / "bar", progress=True)  # tqdm bar path runs


def test_dead_latents_tracked_and_fed_to_auxk(tmp_path):
    from dictcheck.empirics.sae_models import make_sae

    def factory(*args, **kwargs):  # latents 16.. can never fire (and get no gradient)
        m = make_sae(*args, **kwargs)
        with torch.no_grad():
            m.b_enc[16:] = -1e6
        return m

    cfg = _cfg(steps=40, batch_size=32)  # T_dead = 1280 // 4 = 320 tokens = 10 steps
    res = train(_data(), cfg, tmp_path, progress=False, model_factory=factory)
    recs = _log(res.log_path)
    assert recs[0]["step"] == 7 and recs[0]["dead_frac_train"] == 0.0 and recs[0]["aux_loss"] == 0.0
    assert all(r["dead_frac_train"] >= 0.5 and r["aux_loss"] > 0.0 for r in recs[1:])
    assert res.dead_frac_train >= 0.5 and res.metrics["dead_frac_train"] == res.dead_frac_train


def test_resume_guards(tmp_path):
    X = _data()
    train(X, _cfg(steps=20), tmp_path, progress=False)
    with pytest.raises(FileExistsError):
        train(X, _cfg(steps=20), tmp_path)
    with pytest.raises(ValueError, match="config differs"):
        train(X, _cfg(steps=20, seed=9), tmp_path, resume=True)
    with pytest.raises(ValueError, match="data differ"):
        train(X + 1, _cfg(steps=20), tmp_path, resume=True)


def test_resume_after_finish_only_redoes_the_save(tmp_path):
    X = _data()
    r1 = train(X, _cfg(steps=20), tmp_path, progress=False)
    (tmp_path / "cfg.json").unlink()
    with (tmp_path / LOG_FILE).open("a") as fh:
        fh.write('{"step": 21, "loss": 1.0')  # a torn line
    r2 = train(X, _cfg(steps=20), tmp_path, resume=True, progress=False)
    assert r2.resumed_from == 20
    _assert_same_weights(r1.weights, r2.weights)
    assert [r["step"] for r in _log(r2.log_path)] == [7, 14, 20]
    load_sae(tmp_path)


def test_resume_in_process_from_middle_checkpoint(tmp_path):
    X = _data()
    ref = train(X, _cfg(keep_checkpoints=10), tmp_path / "ref", progress=False)
    part = tmp_path / "part"
    (part / CHECKPOINT_DIR).mkdir(parents=True)
    src = tmp_path / "ref" / CHECKPOINT_DIR / "ckpt_00000020.pt"
    (part / CHECKPOINT_DIR / src.name).write_bytes(src.read_bytes())
    # the log as a kill just after step 22 would leave it: lines past the checkpoint, a torn tail
    lines = (tmp_path / "ref" / LOG_FILE).read_text().splitlines()
    (part / LOG_FILE).write_text("\n".join(lines[:3]) + "\n" + lines[3][:9])
    res = train(X, _cfg(keep_checkpoints=10), part, resume=True, progress=False)
    assert res.resumed_from == 20
    _assert_same_weights(ref.weights, res.weights)
    assert _strip_time(_log(res.log_path)) == _strip_time(_log(ref.log_path))


# ------------------------------------------------------------------------------- real kill test

_CHILD = """
import json, sys, time
import numpy as np
from dictcheck.empirics.training import TrainConfig, train
X = np.load(sys.argv[1])
cfg = TrainConfig(**json.loads(sys.argv[2]))
train(X, cfg, sys.argv[3], progress=False, on_step=lambda s: time.sleep(0.01))
print("FINISHED")
"""


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    X = _data(1024)
    kw = dict(arch="topk", d_sae=48, k=2, steps=300, batch_size=32, seed=11, checkpoint_every=5,
              log_every=3, device="cpu", aux_coef=1 / 32)
    np.save(tmp_path / "X.npy", X)
    run_dir = tmp_path / "killed"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "X.npy"), json.dumps(kw), str(run_dir)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while latest_checkpoint(run_dir) is None:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 30 s"
            time.sleep(0.01)
        time.sleep(0.37)  # somewhere mid-run, not aligned with a checkpoint
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert b"FINISHED" not in out
    assert not (run_dir / "cfg.json").exists()
    ck = latest_checkpoint(run_dir)
    assert ck is not None
    killed_at = int(ck.stem.split("_")[1])
    assert 0 < killed_at < kw["steps"]

    cfg = TrainConfig(**kw)
    resumed = train(X, cfg, run_dir, resume=True, progress=False)
    assert resumed.resumed_from is not None and 0 < resumed.resumed_from < kw["steps"]
    reference = train(X, TrainConfig(**kw), tmp_path / "reference", progress=False)
    _assert_same_weights(reference.weights, resumed.weights)
    w_saved, _ = load_sae(run_dir)
    _assert_same_weights(reference.weights, w_saved)
    # the log of the killed-and-resumed run equals the uninterrupted one, line for line
    assert _strip_time(_log(resumed.log_path)) == _strip_time(_log(reference.log_path))
    assert not list((run_dir / CHECKPOINT_DIR).glob(".*.tmp"))
