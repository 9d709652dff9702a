"""Hostile inputs through every subcommand, run as a user would (a subprocess per case).

Each case must end with exit code 2 (bad input) and exactly one line on stderr, ``dictcheck: error:
...``, with no traceback, nothing on stdout, and no file created or changed anywhere under the
test's folder (so nothing half-written). The families are those of the hostile-input sweep:
array files that are not plain .npy arrays of real finite numbers (npz, pickles, timedelta,
magnitudes near the float64 maximum), λ and tolerances out of range, degenerate data, output
paths that cannot be written, cfg.json nested too deeply or too large, damaged model and SAE
files, checkpoints that cannot be resumed, and sizes beyond the model's limits or the machine's
memory. Cases on a read-only file system need root (a read-only tmpfs) and are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

D = 4
EXIT_USER = 2


class _Payload:
    """A pickle that would create a marker file when unpickled (it must never be)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (open, (self.marker, "w"))


@dataclass(frozen=True)
class World:
    root: Path
    ro: Path | None

    def __getitem__(self, name: str) -> str:
        return str(self.root / name)


def _mount_read_only(path: Path) -> bool:
    """A read-only tmpfs at ``path`` (root only); False when it cannot be mounted."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True)
    return proc.returncode == 0


def _local_model(tmp: Path, name: str, *, truncate: bool = False, nan: bool = False,
                 pickled: str | None = None) -> None:
    """A local Hugging Face model folder: tinycoder's config and tokenizer with damaged weights."""
    from safetensors.torch import save_file

    from dictcheck.empirics.data.lm_models import load_lm

    tiny = load_lm("tinycoder")
    folder = tmp / name
    tiny.model.config.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    state = {k: v.contiguous().clone() for k, v in tiny.model.state_dict().items()}
    if pickled is not None:
        with open(folder / "pytorch_model.bin", "wb") as fh:
            pickle.dump(_Payload(pickled), fh)
        return
    if nan:
        for v in state.values():
            v.fill_(float("nan"))
    save_file(state, folder / "model.safetensors")
    if truncate:
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _checkpoint_variants(root: Path, X: Path) -> None:
    """A finished training run in ckpt_ok/ and copies whose newest checkpoint is damaged."""
    from dictcheck.proofs_checks.cli import main

    base = root / "ckpt_ok"
    assert main(["train", "--arch", "relu", "--data", str(X), "--d-sae", "6", "--lam", "0.1", "--steps", "4",
                 "--batch-size", "4", "--checkpoint-every", "2", "--out", str(base)]) == 0
    ckpts = sorted((base / "checkpoints").glob("ckpt_*.pt"))

    def variant(name: str, edit: Callable[[dict], object] | None = None,
                raw: Callable[[Path], None] | None = None) -> None:
        folder = root / f"ckpt_{name}"
        shutil.copytree(base, folder, symlinks=True)
        for p in (folder / "checkpoints").glob("ckpt_*.pt"):
            if edit is not None:
                ck = torch.load(p, weights_only=True)
                replaced = edit(ck)
                torch.save(ck if replaced is None else replaced, p)
            if raw is not None:
                raw(p)

    variant("shapes", lambda ck: ck["model"].update(W_dec=torch.zeros(3, 3)))
    variant("keys", lambda ck: ck.pop("optimizer"))
    variant("rng", lambda ck: ck.update(batch_rng=torch.zeros(7, dtype=torch.uint8),
                                        torch_rng=torch.ones(9, dtype=torch.uint8)))
    variant("step", lambda ck: ck.update(step=10**9))

    def truncate(p: Path) -> None:
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 3])

    def symlink(p: Path) -> None:
        p.unlink()
        p.symlink_to(X)

    def payload(p: Path) -> None:
        with open(p, "wb") as fh:
            pickle.dump(_Payload(str(root / "PAYLOAD_RAN")), fh)

    variant("truncated", raw=truncate)
    variant("symlink", raw=symlink)
    variant("pickle", raw=payload)
    assert len(ckpts) == 2


def _sae_folders(root: Path) -> None:
    """A relu SAE (d_in 4), a bilinear model, and copies with a deep, a huge and a truncated file."""
    import dictcheck
    from dictcheck.empirics.architectures import build_model
    from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae

    X = np.load(root / "data.npy").astype(np.float32)
    dictcheck.train(X, "relu", 6, {"lam": 0.1}, steps=3, batch_size=4, out=str(root / "sae"), progress=False)
    for junk in ("checkpoints", "train_log.jsonl"):
        shutil.rmtree(root / "sae" / junk, ignore_errors=True)
        (root / "sae" / junk).unlink(missing_ok=True)
    model = build_model("bilinear-quadratic", D, 3, {}, seed=1, dtype=torch.float64)
    save_sae(root / "bil", model.state_weights(), new_sae_config("bilinear-quadratic", D, 3,
                                                                    arch_fields=model.arch_fields(), dtype="float64"))
    cfg = json.loads((root / "sae" / "cfg.json").read_text())
    shutil.copytree(root / "sae", root / "sae_deep")
    depth = 100_000
    deep_cfg = json.dumps({**cfg, "metadata": {**cfg["metadata"], "note": "PLACEHOLDER"}})
    (root / "sae_deep" / "cfg.json").write_text(deep_cfg.replace('"PLACEHOLDER"', "[" * depth + "]" * depth))
    shutil.copytree(root / "bil", root / "bil_deep")
    bil_cfg = json.loads((root / "bil" / "cfg.json").read_text())
    bil_cfg["metadata"]["note"] = "PLACEHOLDER"
    deep_objects = '{"a":' * depth + "1" + "}" * depth
    (root / "bil_deep" / "cfg.json").write_text(json.dumps(bil_cfg).replace('"PLACEHOLDER"', deep_objects))
    shutil.copytree(root / "sae", root / "sae_huge")
    (root / "sae_huge" / "cfg.json").write_text(json.dumps({**cfg, "padding": "x" * (8 << 20)}))
    shutil.copytree(root / "sae", root / "sae_truncated")
    w = root / "sae_truncated" / "sae_weights.safetensors"
    w.write_bytes(w.read_bytes()[:-40])
    X16 = np.random.default_rng(1).normal(size=(12, 16)).astype(np.float32)  # tinycoder's width, for eval-lm
    dictcheck.train(X16, "relu", 6, {"lam": 0.1}, steps=2, batch_size=4, out=str(root / "sae16"), progress=False)
    shutil.copytree(root / "sae16", root / "sae_deep16")
    cfg16 = json.loads((root / "sae16" / "cfg.json").read_text())
    deep16 = json.dumps({**cfg16, "metadata": {**cfg16["metadata"], "note": "PLACEHOLDER"}})
    (root / "sae_deep16" / "cfg.json").write_text(deep16.replace('"PLACEHOLDER"', "[" * depth + "]" * depth))
    shutil.copytree(root / "sae16", root / "sae_truncated16")
    w16 = root / "sae_truncated16" / "sae_weights.safetensors"
    w16.write_bytes(w16.read_bytes()[:-40])


def _arrays(root: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, D))
    np.save(root / "data.npy", X)
    np.save(root / "W.npy", rng.normal(size=(D, 5)))
    np.save(root / "b.npy", np.zeros(D))
    np.savez(root / "arr.npz", X)
    with open(root / "npz_named.npy", "wb") as fh:
        np.savez(fh, X)
    np.save(root / "pickled.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    (root / "garbage.npy").write_bytes(b"\x93NUMPY this is not an array\n" * 4)
    np.save(root / "timedelta.npy", np.arange(12 * D).reshape(12, D).astype("timedelta64[s]"))
    np.save(root / "complex.npy", X.astype(np.complex128))
    np.save(root / "strings.npy", np.full((12, D), "abc"))
    np.save(root / "nan.npy", np.where(np.eye(12, D) > 0, np.nan, X))
    np.save(root / "inf.npy", np.where(np.eye(12, D) > 0, np.inf, X))
    np.save(root / "huge.npy", X * 1e307)
    np.save(root / "huge_W.npy", rng.normal(size=(D, 5)) * 1e300)
    np.save(root / "oned.npy", X[0])
    np.save(root / "empty.npy", np.zeros((0, D)))
    np.save(root / "threed.npy", X.reshape(3, 4, D))
    np.save(root / "zeros.npy", np.zeros((12, D)))
    np.save(root / "single.npy", X[:1])
    np.save(root / "dup.npy", np.repeat(X[:1], 12, axis=0))
    (root / "adir.npy").mkdir()
    (root / "afile").write_text("a file, not a folder\n")
    (root / "store_no_shards").mkdir()  # an activation store whose manifest lacks its shard list
    (root / "store_no_shards" / "manifest.json").write_text(json.dumps({"format": "dictcheck-activations", "d": D}))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hostile")
    _arrays(root)
    _sae_folders(root)
    _checkpoint_variants(root, root / "data.npy")
    _local_model(root, "model_truncated", truncate=True)
    _local_model(root, "model_nan", nan=True)
    _local_model(root, "model_pickle", pickled=str(root / "PAYLOAD_RAN"))
    ro = root / "ro"
    mounted = _mount_read_only(ro)
    yield World(root, ro if mounted else None)
    if mounted:
        subprocess.run(["umount", str(ro)], check=False)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (not following links into other folders): size and mtime."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            found[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return found


#: Arrays that must be refused wherever an .npy array is read.
BAD_FILES = ["missing.npy", "adir.npy", "arr.npz", "npz_named.npy", "pickled.npy", "garbage.npy", "timedelta.npy",
             "complex.npy", "strings.npy", "nan.npy", "inf.npy", "huge.npy"]
#: The subset run through every other place that reads an array (the loader is the same).
BAD_FILES_SHORT = ["arr.npz", "npz_named.npy", "pickled.npy", "timedelta.npy", "huge.npy"]
BAD_SHAPES = ["oned.npy", "empty.npy", "threed.npy"]
BAD_LAMBDAS = ["0", "-1", "nan", "inf", "1e308", "1e-320"]
BAD_LAMBDAS_SHORT = ["1e308", "nan", "0"]

TRAIN = ["train", "--arch", "relu", "--d-sae", "6", "--lam", "0.1", "--steps", "4", "--batch-size", "4"]
TRAIN_RESUME = [*TRAIN, "--checkpoint-every", "2", "--data", "{data.npy}", "--resume", "--out"]
ACTS = ["activations", "--model", "tinycoder", "--layer", "0", "--tokens", "20", "--context", "8"]
EVAL = ["eval-lm", "{sae16}", "--layer", "0", "--model", "tinycoder", "--tokens", "16", "--context", "8"]


def _cases() -> list[tuple[str, list[str]]]:
    cases: list[tuple[str, list[str]]] = []

    def add(name: str, *argv: str) -> None:
        cases.append((name, list(argv)))

    # arrays: every family through one slot, the format families through every other slot
    for f in BAD_FILES + BAD_SHAPES:
        add(f"solve-huber-data-{f}", "solve", "huber-median", "--data", f"{{{f}}}", "--lam", "0.5")
    for f in BAD_FILES_SHORT:
        add(f"solve-geomedian-data-{f}", "solve", "geometric-median", "--data", f"{{{f}}}")
        add(f"solve-wide-data-{f}", "solve", "wide-limit", "--data", f"{{{f}}}", "--lam", "0.5")
        add(f"solve-dnn-data-{f}", "solve", "dnn", "--data", f"{{{f}}}", "--lam", "0.5")
        add(f"solve-wide-bias-{f}", "solve", "wide-limit", "--data", "{data.npy}", "--lam", "0.5", "--bias",
            f"{{{f}}}")
        add(f"check-dict-dict-{f}", "check-dict", "--dict", f"{{{f}}}", "--data", "{data.npy}", "--lam", "0.5")
        add(f"check-dict-data-{f}", "check-dict", "--dict", "{W.npy}", "--data", f"{{{f}}}", "--lam", "0.5")
        add(f"check-dict-bias-{f}", "check-dict", "--dict", "{W.npy}", "--data", "{data.npy}", "--lam", "0.5",
            "--bias", f"{{{f}}}")
        add(f"check-sae-data-{f}", "check-sae", "{sae}", "--data", f"{{{f}}}", "--lam", "0.5")
        add(f"train-data-{f}", *TRAIN, "--data", f"{{{f}}}", "--out", "{new_out}")
        add(f"inspect-figure-data-{f}", "inspect-bilinear", "{bil}", "--figure", "{new_out}.png", "--data", f"{{{f}}}")
        add(f"train-vasae-anchor-{f}", "train", "--arch", "vasae", "--k", "2", "--d-sae", "6", "--anchor-coef", "0.1",
            "--anchor-source", f"{{{f}}}", "--data", "{data.npy}", "--steps", "2", "--batch-size", "4", "--out",
            "{new_out}")
    add("check-dict-dict-huge-norm", "check-dict", "--dict", "{huge_W.npy}", "--data", "{data.npy}", "--lam", "0.5")
    add("train-data-store-without-shards", *TRAIN, "--data", "{store_no_shards}", "--out", "{new_out}")
    # λ and tolerances
    for lam in BAD_LAMBDAS:
        add(f"solve-huber-lam-{lam}", "solve", "huber-median", "--data", "{data.npy}", "--lam", lam)
    for lam in BAD_LAMBDAS_SHORT:
        add(f"solve-wide-lam-{lam}", "solve", "wide-limit", "--data", "{data.npy}", "--lam", lam)
        add(f"solve-dnn-lam-{lam}", "solve", "dnn", "--data", "{data.npy}", "--lam", lam)
        add(f"check-dict-lam-{lam}", "check-dict", "--dict", "{W.npy}", "--data", "{data.npy}", "--lam", lam)
        add(f"check-sae-lam-{lam}", "check-sae", "{sae}", "--data", "{data.npy}", "--lam", lam)
        add(f"train-lam-{lam}", "train", "--arch", "relu", "--d-sae", "6", "--lam", lam, "--steps", "2",
            "--batch-size", "4", "--data", "{data.npy}", "--out", "{new_out}")
    for tol in ("0", "-1e-8", "nan", "inf", "2"):
        add(f"check-dict-tol-{tol}", "check-dict", "--dict", "{W.npy}", "--data", "{data.npy}", "--lam", "0.5",
            "--tol", tol)
    add("solve-ray-tol-inf", "solve", "wide-limit", "--data", "{data.npy}", "--lam", "0.5", "--ray-tol", "inf")
    # output paths
    for where in ("afile", "afile/below", "ro/out"):
        add(f"run-out-{where}", "run", "--quick", "--only", "wide.q_reformulation", "--out", f"{{{where}}}")
        add(f"train-out-{where}", *TRAIN, "--data", "{data.npy}", "--out", f"{{{where}}}")
        add(f"activations-out-{where}", *ACTS, "--out", f"{{{where}}}")
        add(f"bench-out-{where}", "bench-manifolds", "--quick", "--steps", "1", "--out", f"{{{where}}}")
        if where != "afile":  # afile.png is a fine figure path; afile/below.png lies under a file
            add(f"inspect-figure-{where}", "inspect-bilinear", "{bil}", "--figure", f"{{{where}}}.png", "--data",
                "{data.npy}")
    add("run-only-matches-nothing", "run", "--only", "nothing.*", "--out", "{new_out}")
    add("inspect-figure-unknown-ext", "inspect-bilinear", "{bil}", "--figure", "{new_out}.xyz", "--data", "{data.npy}")
    add("inspect-figure-is-dir", "inspect-bilinear", "{bil}", "--figure", "{adir.npy}", "--data", "{data.npy}")
    # untrusted SAE folders and model files
    add("check-sae-cfg-deep", "check-sae", "{sae_deep}", "--data", "{data.npy}", "--lam", "0.5")
    add("check-sae-cfg-huge", "check-sae", "{sae_huge}", "--data", "{data.npy}", "--lam", "0.5")
    add("check-sae-weights-truncated", "check-sae", "{sae_truncated}", "--data", "{data.npy}", "--lam", "0.5")
    add("inspect-cfg-deep", "inspect-bilinear", "{bil_deep}")
    add("eval-lm-cfg-deep", *[a.replace("{sae16}", "{sae_deep16}") for a in EVAL])
    add("eval-lm-weights-truncated", *[a.replace("{sae16}", "{sae_truncated16}") for a in EVAL])
    for model in ("model_truncated", "model_pickle", "model_nan"):
        add(f"activations-{model}", *[f"{{{model}}}" if a == "tinycoder" else a for a in ACTS], "--out", "{new_out}")
        add(f"eval-lm-{model}", *[f"{{{model}}}" if a == "tinycoder" else a for a in EVAL])
    # checkpoints
    for variant in ("shapes", "keys", "rng", "step", "truncated", "symlink", "pickle"):
        add(f"train-resume-{variant}", *TRAIN_RESUME, f"{{ckpt_{variant}}}")
    # sizes and devices
    add("train-d-sae-1e12", "train", "--arch", "relu", "--d-sae", str(10**12), "--lam", "0.1", "--data", "{data.npy}",
        "--out", "{new_out}")
    add("train-batch-1e12", *TRAIN[:-2], "--batch-size", str(10**12), "--data", "{data.npy}", "--out", "{new_out}")
    if not torch.cuda.is_available():
        add("train-device-cuda", *TRAIN, "--data", "{data.npy}", "--device", "cuda", "--out", "{new_out}")
    add("eval-lm-context-1e5", *EVAL[:-1], "100000")
    add("eval-lm-tokens-1e12", *EVAL[:-3], str(10**12), "--context", "8")
    add("activations-context-1e5", *ACTS[:-1], "100000", "--out", "{new_out}")
    add("activations-tokens-1e12", *ACTS[:6], str(10**12), "--context", "8", "--out", "{new_out}")
    return cases


CASES = _cases()


def _argv(template: list[str], w: World, name: str) -> list[str]:
    """The case's command line: ``{file}`` is a fixture under the test folder, ``{new_out}`` a path of
    this case only (so one case's leftovers cannot make another fail), ``{ro/...}`` a path on the
    read-only tmpfs."""
    out = []
    for a in template:
        if a.startswith("{") and "}" in a:
            key, rest = a[1:].split("}", 1)
            if key == "new_out":
                out.append(str(w.root / f"out_{name}") + rest)
            elif key.startswith("ro/") or key == "ro":
                if w.ro is None:
                    pytest.skip("needs root to mount a read-only tmpfs")
                out.append(str(w.ro / key[3:]) + rest)
            else:
                out.append(w[key] + rest)
        else:
            out.append(a)
    return out


@pytest.mark.parametrize("name, template", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_ends_in_one_line(world: World, name: str, template: list[str]) -> None:
    argv = _argv(template, world, name)
    before = _snapshot(world.root)
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", *argv], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONWARNINGS": "default"})
    lines = proc.stderr.splitlines()
    assert proc.returncode == EXIT_USER, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith("dictcheck: error: "), proc.stderr[-3000:]
    assert proc.stdout == ""
    assert _snapshot(world.root) == before, "files were created or changed"
    assert not (world.root / "PAYLOAD_RAN").exists()


@pytest.mark.parametrize("name", ["zeros.npy", "single.npy", "dup.npy"])
def test_check_sae_on_degenerate_data_reports_without_the_variance_metrics(world: World, name: str) -> None:
    """All-zero, single-point and duplicated data have no variance: check-sae (since its rework) reports
    the theory checks and says why fvu/ve are missing (``metrics_error``), with no NaN or inf anywhere."""
    before = _snapshot(world.root)
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "check-sae", world["sae"], "--data",
                           world[name], "--lam", "0.5", "--json"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"non-finite {c} in the report"))
    assert "zero variance" in report["metrics"]["metrics_error"]
    assert _snapshot(world.root) == before
