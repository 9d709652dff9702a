"""Tests for empirics.training.loop (docs/ecosystem.md §3): schedule, determinism, kill/resume, files."""

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

from dictcheck.empirics.architectures import build_model
from dictcheck.empirics.training.checkpoints import CheckpointError
from dictcheck.empirics.io.safe_files import ResourceError
from dictcheck.empirics.io.sae_folder import load_sae
from dictcheck.empirics.io.saelens import load_metrics, load_sparsity
from dictcheck.empirics.training.loop import (
    CHECKPOINT_DIR,
    LOG_FILE,
    TrainConfig,
    check_training_memory,
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


_MODEL = ("arch", "d_sae", "options")
_TOPK = {"k": 3, "aux_coef": 1 / 32}


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=40, batch_size=32, seed=3, checkpoint_every=10, log_every=7, device="cpu")
    base.update({k: v for k, v in kw.items() if k not in _MODEL})
    return TrainConfig(**base)


def _model(X: np.ndarray, arch: str = "topk", d_sae: int = 32, options: dict | None = None, seed: int = 3,
           dtype: torch.dtype = torch.float32):
    return build_model(arch, X.shape[1], d_sae, _TOPK if options is None else options, seed=seed, dtype=dtype)


def _train(X: np.ndarray, out, *, resume: bool = False, progress: bool | None = False, **kw):
    """Build the model (init seed = the config's seed, as the CLI does) and train it into ``out``."""
    model = _model(X, **{k: v for k, v in kw.items() if k in _MODEL}, seed=kw.get("seed", 3))
    return train(model, X, _cfg(**kw), out, resume=resume, progress=progress)


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
    wide = build_model("topk", 4, 2**16, {"k": 8})
    assert TrainConfig().for_model(wide).lr == pytest.approx(1e-4)
    assert TrainConfig(lr=1e-3).for_model(wide).lr == 1e-3
    assert TrainConfig().for_model(wide).b_dec_init == "geometric_median"
    assert t_dead(100, 64) == 1600
    assert t_dead(10**6, 4096) == 10_000_000
    assert t_dead(1, 1) == 1


# ------------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(arch="gated"), "arch"),
        (dict(options={}), "needs k"),
        (dict(options={"k": 33}), "needs k"),
        (dict(arch="relu", options={}), "needs lam"),
        (dict(arch="relu", options={"lam": -1.0}), "lam"),
        (dict(options={"k": 3, "lam": 0.1}), r"does not take option\(s\) \['lam'\]"),
        (dict(b_dec_init="huber_median"), "huber_median"),
        (dict(b_dec_init="median"), "b_dec_init"),
        (dict(arch="relu", options={"lam": 0.1}, b_dec_init="none"), "b_dec_init"),
        (dict(lr=-1e-3), "lr"),
        (dict(batch_size=0), "batch_size"),
        (dict(steps=0), "steps"),
        (dict(checkpoint_every=-1), "checkpoint_every"),
        (dict(options={"k": 3, "aux_coef": float("nan")}), "aux_coef"),
        (dict(device="tpu:x"), "device"),
    ],
)
def test_bad_config_raises(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        _train(_data(64), tmp_path, **kw)


def test_bad_model_or_data_raises(tmp_path):
    X = _data(64)
    model = _model(X)
    with pytest.raises(ValueError, match="shape"):
        train(model, X[:, 0], _cfg(), tmp_path)
    with pytest.raises(ValueError, match="d_in = 12"):
        train(model, X[:, :5], _cfg(), tmp_path)
    with pytest.raises(ValueError, match="built by its architecture"):
        train(torch.nn.Linear(2, 2), X, _cfg(), tmp_path)
    with pytest.raises(ValueError, match="resume=True needs"):
        train(model, X, _cfg(), resume=True)
    X[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        train(model, X, _cfg(), tmp_path)
    with pytest.raises(ValueError, match="numpy"):
        train(model, torch.zeros(4, 4), _cfg(), tmp_path)


# ------------------------------------------------------------------------------- determinism, files


def test_deterministic_under_seed(tmp_path):
    X = _data()
    r1 = _train(X, tmp_path / "a")
    r2 = _train(X, tmp_path / "b")
    _assert_same_weights(r1.weights, r2.weights)
    assert _strip_time(_log(r1.log_path)) == _strip_time(_log(r2.log_path))
    assert _strip_time(r1.log) == _strip_time(_log(r1.log_path))
    r3 = _train(X, tmp_path / "c", seed=4)
    assert not torch.equal(r1.weights["W_dec"], r3.weights["W_dec"])


def test_without_out_nothing_is_written_and_the_result_is_the_same(tmp_path, monkeypatch):
    X = _data()
    on_disk = _train(X, tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    in_memory = _train(X, None)
    _assert_same_weights(on_disk.weights, in_memory.weights)
    assert in_memory.out_dir is None and in_memory.log_path is None and in_memory.checkpoint_path is None
    assert _strip_time(in_memory.log) == _strip_time(_log(on_disk.log_path))
    assert in_memory.metrics == on_disk.metrics
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(arch="relu", options={"lam": 0.05}, b_dec_init="huber_median"),
        dict(arch="batchtopk", b_dec_init="mean"),
        dict(arch="jumprelu", options={"lam": 0.01}, b_dec_init="zero"),
        dict(arch="abs", options={"lam": 0.05}),
    ],
)
def test_saved_folder_log_and_metrics(tmp_path, kw):
    X = _data()
    cfg = _cfg(**kw)
    res = _train(X, tmp_path, **kw)
    weights, sae_cfg = load_sae(tmp_path)
    _assert_same_weights(weights, res.weights)
    dc = sae_cfg.dictcheck
    arch = kw.get("arch", "topk")
    assert dc["arch"] == arch and dc["seed"] == cfg.seed
    assert dc["n_tokens"] == cfg.steps * cfg.batch_size
    assert dc["data_hash"] == data_hash(X)
    assert dc["training"]["T_dead"] == t_dead(cfg.steps, cfg.batch_size)
    if arch == "batchtopk":
        assert dc["batchtopk"]["threshold"] > 0
    assert dc["lam"] == kw.get("options", {}).get("lam")
    assert dc["training"]["k"] == (None if "options" in kw else 3)
    assert dc["training"]["aux_coef"] == (0.0 if "options" in kw else 1 / 32)
    # unit-norm decoder rows
    assert torch.allclose(weights["W_dec"].norm(dim=1), torch.ones(32), atol=1e-5)
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
    assert sp is not None and sp.shape == (32,)
    # checkpoints: only the newest keep_checkpoints, the final one included
    names = sorted(p.name for p in (tmp_path / CHECKPOINT_DIR).iterdir())
    assert names == ["ckpt_00000030.pt", "ckpt_00000040.pt"]


def test_progress_line_when_not_a_tty(tmp_path, capsys):
    _train(_data(128), tmp_path, steps=14, progress=None)
    err = capsys.readouterr().err
    assert "step 7/14" in err and "step 14/14" in err and "dead" in err
    _train(_data(128), tmp_path / "bar", steps=14, progress=True)  # tqdm bar path runs


def test_dead_latents_tracked_and_fed_to_auxk(tmp_path):
    X = _data()
    model = _model(X)
    with torch.no_grad():  # latents 16.. can never fire (and get no gradient)
        model.b_enc[16:] = -1e6
    cfg = _cfg(steps=40, batch_size=32)  # T_dead = 1280 // 4 = 320 tokens = 10 steps
    res = train(model, X, cfg, tmp_path, progress=False)
    recs = _log(res.log_path)
    assert recs[0]["step"] == 7 and recs[0]["dead_frac_train"] == 0.0 and recs[0]["aux_loss"] == 0.0
    assert all(r["dead_frac_train"] >= 0.5 and r["aux_loss"] > 0.0 for r in recs[1:])
    assert res.dead_frac_train >= 0.5 and res.metrics["dead_frac_train"] == res.dead_frac_train


def test_resume_guards(tmp_path):
    X = _data()
    _train(X, tmp_path, steps=20)
    with pytest.raises(FileExistsError):
        _train(X, tmp_path, steps=20)
    with pytest.raises(ValueError, match="config differs"):
        _train(X, tmp_path, steps=20, seed=9, resume=True)
    with pytest.raises(ValueError, match="config differs"):
        _train(X, tmp_path, steps=20, options={"k": 4, "aux_coef": 1 / 32}, resume=True)
    with pytest.raises(ValueError, match="data differ"):
        _train(X + 1, tmp_path, steps=20, resume=True)


def test_resume_after_finish_only_redoes_the_save(tmp_path):
    X = _data()
    r1 = _train(X, tmp_path, steps=20)
    (tmp_path / "cfg.json").unlink()
    with (tmp_path / LOG_FILE).open("a") as fh:
        fh.write('{"step": 21, "loss": 1.0')  # a torn line
    r2 = _train(X, tmp_path, steps=20, resume=True)
    assert r2.resumed_from == 20
    _assert_same_weights(r1.weights, r2.weights)
    assert [r["step"] for r in _log(r2.log_path)] == [7, 14, 20]
    load_sae(tmp_path)


def test_resume_in_process_from_middle_checkpoint(tmp_path):
    X = _data()
    ref = _train(X, tmp_path / "ref", keep_checkpoints=10)
    part = tmp_path / "part"
    (part / CHECKPOINT_DIR).mkdir(parents=True)
    src = tmp_path / "ref" / CHECKPOINT_DIR / "ckpt_00000020.pt"
    (part / CHECKPOINT_DIR / src.name).write_bytes(src.read_bytes())
    # the log as a kill just after step 22 would leave it: lines past the checkpoint, a torn tail
    lines = (tmp_path / "ref" / LOG_FILE).read_text().splitlines()
    (part / LOG_FILE).write_text("\n".join(lines[:3]) + "\n" + lines[3][:9])
    res = _train(X, part, keep_checkpoints=10, resume=True)
    assert res.resumed_from == 20
    _assert_same_weights(ref.weights, res.weights)
    assert _strip_time(_log(res.log_path)) == _strip_time(_log(ref.log_path))


def test_unreadable_checkpoints_are_named_never_skipped_or_pruned(tmp_path):
    """Before: resume silently fell back to an older checkpoint (or restarted from step 0 when none was
    readable) and later pruned the damaged file."""
    X = _data()
    _train(X, tmp_path, steps=20)  # checkpoints at steps 10 and 20
    older, newest = sorted((tmp_path / CHECKPOINT_DIR).glob("ckpt_*.pt"))
    newest.write_bytes(newest.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=r"ckpt_00000020.pt is unreadable .*the newest readable one is "
                                              r"ckpt_00000010.pt"):
        _train(X, tmp_path, steps=20, resume=True)
    older.unlink()
    older.symlink_to(tmp_path / "cfg.json")
    with pytest.raises(CheckpointError, match=r"ckpt_00000020.pt is unreadable .*ckpt_00000010.pt is a symlink.*"
                                              r"none is readable"):
        _train(X, tmp_path, steps=20, resume=True)
    assert newest.stat().st_size == 200 and older.is_symlink()  # nothing was pruned or rewritten


@pytest.mark.parametrize("edit, message", [
    (lambda ck: ck.update(step=10**9), r"step 1000000000 is not an int in \[0, 20\]"),
    (lambda ck: ck.update(step=10), "matching the file name"),
    (lambda ck: ck["model"].update(W_dec=torch.zeros(3, 3)), "model tensor 'W_dec' is torch.float32 \\[3, 3\\]"),
    (lambda ck: ck["model"].pop("b_enc"), "model tensors"),
    (lambda ck: ck.pop("optimizer"), r"fields \['optimizer'\] are missing"),
    (lambda ck: ck["optimizer"]["state"][0].update(exp_avg=torch.zeros(2)), "exp_avg of parameter 0"),
    (lambda ck: ck.update(batch_rng=torch.zeros(7, dtype=torch.uint8)), "batch_rng is not a generator state"),
    (lambda ck: ck.update(rank_rng=[]), "rank_rng does not hold one state per rank"),
    (lambda ck: ck.update(world_size=0), "world_size 0 is not a positive int"),
    (lambda ck: ck.update(since_fired=-torch.ones(32, dtype=torch.int64)), "since_fired"),
])
def test_checkpoint_fields_are_validated_before_use(tmp_path, edit, message):
    X = _data()
    _train(X, tmp_path, steps=20)
    path = latest_checkpoint(tmp_path)
    ck = torch.load(path, weights_only=True)
    edit(ck)
    torch.save(ck, path)
    with pytest.raises(CheckpointError, match=message):
        _train(X, tmp_path, steps=20, resume=True)


def test_memory_and_disk_are_checked_before_allocating(tmp_path, monkeypatch):
    with pytest.raises(ResourceError, match="training topk with d_in 12, d_sae 1000000000000"):
        check_training_memory("topk", 12, 10**12, {"k": 2}, batch_size=32)
    with pytest.raises(ResourceError, match="bilinear-compound .* TiB"):  # U is small, C is (1e6, 2e6)
        check_training_memory("bilinear-compound", 16, 10**6, {}, batch_size=32)
    check_training_memory("bilinear-compound", 12, 16, {}, batch_size=32)  # a small one fits
    from dictcheck.empirics.io import safe_files

    monkeypatch.setattr(safe_files.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000})())
    with pytest.raises(ResourceError, match="needs about .* of disk but the file system of .* has 1000 B free"):
        _train(_data(), tmp_path / "out", steps=2)
    assert not (tmp_path / "out").exists()


def test_cuda_asked_for_without_cuda_is_a_config_error():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available")
    with pytest.raises(ValueError, match="no CUDA device is available"):
        TrainConfig(device="cuda").validate()
    with pytest.raises(ValueError, match="device must be"):
        TrainConfig(device="meta").validate()


# ------------------------------------------------------------------------------- real kill test

_CHILD = """
import json, sys, time
import numpy as np
from dictcheck.empirics.architectures import build_model
from dictcheck.empirics.training.checkpoints import CheckpointError
from dictcheck.empirics.io.safe_files import ResourceError
from dictcheck.empirics.training.loop import TrainConfig, train
X = np.load(sys.argv[1])
kw = json.loads(sys.argv[2])
model = build_model("topk", X.shape[1], 48, kw.pop("options"), seed=kw["seed"])
train(model, X, TrainConfig(**kw), sys.argv[3], progress=False, on_step=lambda s: time.sleep(0.01))
print("FINISHED")
"""


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    X = _data(1024)
    options = {"k": 2, "aux_coef": 1 / 32}
    kw = dict(steps=300, batch_size=32, seed=11, checkpoint_every=5, log_every=3, device="cpu")
    np.save(tmp_path / "X.npy", X)
    run_dir = tmp_path / "killed"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "X.npy"), json.dumps({**kw, "options": options}), str(run_dir)],
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

    resumed = train(build_model("topk", 12, 48, options, seed=11), X, TrainConfig(**kw), run_dir, resume=True,
                    progress=False)
    assert resumed.resumed_from is not None and 0 < resumed.resumed_from < kw["steps"]
    reference = train(build_model("topk", 12, 48, options, seed=11), X, TrainConfig(**kw), tmp_path / "reference",
                      progress=False)
    _assert_same_weights(reference.weights, resumed.weights)
    w_saved, _ = load_sae(run_dir)
    _assert_same_weights(reference.weights, w_saved)
    # the log of the killed-and-resumed run equals the uninterrupted one, line for line
    assert _strip_time(_log(resumed.log_path)) == _strip_time(_log(reference.log_path))
    assert not list((run_dir / CHECKPOINT_DIR).glob(".*.tmp"))
