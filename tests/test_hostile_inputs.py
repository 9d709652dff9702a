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


def _npy_with_shape(path: Path, shape: str) -> None:
    """A (3, 4) float64 .npy file whose header declares ``shape`` instead (the data are left as they are)."""
    np.save(path, np.zeros((3, D)))
    data = path.read_bytes()
    head_len = int.from_bytes(data[8:10], "little")
    head = data[10:10 + head_len].replace(f"(3, {D})".encode(), shape.encode())
    head = head.rstrip(b"\n ")[: head_len - 1].ljust(head_len - 1) + b"\n"
    path.write_bytes(data[:10] + head + data[10 + head_len:])


def _store(folder: Path, shards: list[np.ndarray | None]) -> None:
    """An activation store of float32 shards (``None``: the shard file is a FIFO), with a valid manifest."""
    import hashlib

    from dictcheck.empirics.data.activation_store import FORMAT, MANIFEST

    folder.mkdir()
    entries = []
    for i, shard in enumerate(shards):
        path = folder / f"shard_{i:05d}.npy"
        if shard is None:
            os.mkfifo(path)
            entries.append({"file": path.name, "rows": 6, "sha256": "0" * 64})
        else:
            np.save(path, shard.astype(np.float32))
            entries.append({"file": path.name, "rows": len(shard), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "d": D, "n_tokens": sum(e["rows"] for e in entries),
                                               "shards": entries}))


def _dictionary_learning(folder: Path, *, dict_class: object = "AutoEncoder", tensor: object = None,
                         raw: bytes | None = None) -> None:
    """A dictionary_learning folder (config.json + ae.pt) of an AutoEncoder with d_in 4, 6 latents; ``tensor``
    replaces its encoder weight, ``raw`` the whole ae.pt."""
    g = torch.Generator().manual_seed(0)
    sd = {"encoder.weight": torch.randn(6, D, generator=g), "encoder.bias": torch.randn(6, generator=g),
          "decoder.weight": torch.randn(D, 6, generator=g), "bias": torch.randn(D, generator=g)}
    if tensor is not None:
        sd["encoder.weight"] = tensor
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"trainer": {"dict_class": dict_class, "activation_dim": D,
                                                                "dict_size": 6}}))
    if raw is not None:
        (folder / "ae.pt").write_bytes(raw)
    else:
        torch.save(sd, folder / "ae.pt")


def _foreign_and_store_folders(root: Path) -> None:
    """Foreign SAE folders with a bad field (dictionary_learning, sparsify, SAELens' λ), activation stores with a
    FIFO or a NaN shard, .npy headers with a negative or overflowing shape, data beyond float32."""
    import safetensors.torch

    X = np.load(root / "data.npy")
    _store(root / "store_fifo", [X[:6], None])
    _store(root / "store_nan", [X[:6], np.where(np.eye(6, D) > 0, np.nan, X[6:])])
    _dictionary_learning(root / "dl_class_list", dict_class=["AutoEncoder"])
    _dictionary_learning(root / "dl_tensor_list", tensor=[[1.0, 2.0]])
    _dictionary_learning(root / "dl_tensor_str", tensor="weights")
    _dictionary_learning(root / "dl_tensor_int", tensor=torch.ones(6, D, dtype=torch.int64))
    _dictionary_learning(root / "dl_pickle", raw=pickle.dumps({"encoder.weight": _Payload(str(root / "PAYLOAD_RAN"))}))
    for name, edit in (("sae_lam_1e300", {"lam": 1e300}), ("sae_lam_1e-300", {"lam": 1e-300})):
        shutil.copytree(root / "sae", root / name)
        cfg = json.loads((root / name / "cfg.json").read_text())
        cfg["metadata"]["dictcheck"].update(edit)
        (root / name / "cfg.json").write_text(json.dumps(cfg))
    shutil.copytree(root / "sae", root / "sae_l1_1e300")
    cfg = json.loads((root / "sae_l1_1e300" / "cfg.json").read_text())
    cfg["metadata"]["dictcheck"].pop("lam", None)
    cfg["metadata"]["training_architecture_details"] = {"l1_coefficient": 1e300}
    (root / "sae_l1_1e300" / "cfg.json").write_text(json.dumps(cfg))
    shutil.copytree(root / "sae", root / "sae_dtype_list")
    cfg = json.loads((root / "sae_dtype_list" / "cfg.json").read_text())
    cfg["dtype"] = ["float32"]
    (root / "sae_dtype_list" / "cfg.json").write_text(json.dumps(cfg))
    (root / "sp_huge").mkdir()
    g = torch.Generator().manual_seed(0)
    safetensors.torch.save_file({"encoder.weight": torch.randn(6, D, generator=g, dtype=torch.float64) * 1e300,
                                 "encoder.bias": torch.zeros(6, dtype=torch.float64),
                                 "W_dec": torch.randn(6, D, generator=g, dtype=torch.float64),
                                 "b_dec": torch.zeros(D, dtype=torch.float64)}, root / "sp_huge" / "sae.safetensors")
    (root / "sp_huge" / "cfg.json").write_text(json.dumps({"num_latents": 6, "k": 2, "d_in": D}))
    _npy_with_shape(root / "neg_shape.npy", f"(-3, {D})")
    _npy_with_shape(root / "huge_shape.npy", f"(10000000000000000000000, {D})")
    np.save(root / "beyond_float32.npy", X * 1e40)
    np.save(root / "big_for_float32.npy", X * 1e20)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hostile")
    _arrays(root)
    _sae_folders(root)
    _foreign_and_store_folders(root)
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
    # issue 30: non-regular files in a store, every field of a foreign folder, the folder's λ, .npy shapes,
    # devices, float options, settings that leave nothing to compute, data beyond the model's dtype
    for store in ("store_fifo", "store_nan"):
        add(f"check-sae-{store}", "check-sae", "{sae}", "--data", f"{{{store}}}", "--lam", "0.5", "--json")
        add(f"train-{store}", *TRAIN, "--data", f"{{{store}}}", "--out", "{new_out}")
    for folder in ("dl_class_list", "dl_tensor_list", "dl_tensor_str", "dl_tensor_int", "dl_pickle", "sae_lam_1e300",
                   "sae_lam_1e-300", "sae_l1_1e300", "sae_dtype_list", "sp_huge"):
        add(f"check-sae-folder-{folder}", "check-sae", f"{{{folder}}}", "--data", "{data.npy}", "--json")
    for f in ("neg_shape.npy", "huge_shape.npy"):
        add(f"check-dict-data-{f}", "check-dict", "--dict", "{W.npy}", "--data", f"{{{f}}}", "--lam", "0.5")
        add(f"check-sae-data-{f}", "check-sae", "{sae}", "--data", f"{{{f}}}", "--lam", "0.5")
        add(f"train-data-{f}", *TRAIN, "--data", f"{{{f}}}", "--out", "{new_out}")
    for device in ("weird", "meta", ""):  # the rest of the device rule: test_one_device_rule_for_every_command
        add(f"check-sae-device-{device or 'empty'}", "check-sae", "{sae}", "--data", "{data.npy}", "--lam", "0.5",
            "--device", device)
        add(f"train-device-{device or 'empty'}", *TRAIN, "--data", "{data.npy}", "--device", device, "--out",
            "{new_out}")
    for lr in ("1e300", "0", "nan"):
        add(f"train-lr-{lr}", *TRAIN, "--data", "{data.npy}", "--lr", lr, "--out", "{new_out}")
    for option, value in (("--aux-coef", "1e300"), ("--aux-coef", "nan"), ("--batchtopk-momentum", "2")):
        add(f"train-batchtopk{option}-{value}", "train", "--arch", "batchtopk", "--k", "2", "--d-sae", "6", option,
            value, "--steps", "2", "--batch-size", "4", "--data", "{data.npy}", "--out", "{new_out}")
    add("train-bilinear-hoyer-1e300", "train", "--arch", "bilinear-quadratic", "--d-sae", "3", "--hoyer-coef",
        "1e300", "--steps", "2", "--batch-size", "4", "--data", "{data.npy}", "--out", "{new_out}")
    add("train-data-beyond-float32", *TRAIN, "--data", "{beyond_float32.npy}", "--out", "{new_out}")
    add("train-data-squares-overflow-float32", *TRAIN, "--data", "{big_for_float32.npy}", "--out", "{new_out}")
    add("check-sae-float32-sae-on-1e40-data", "check-sae", "{sae}", "--data", "{beyond_float32.npy}", "--lam", "auto",
        "--json")
    for flag, value in (("--polish-tokens", "0"), ("--polish-holdout", "0.999"), ("--polish-holdout", "1"),
                        ("--hull-atoms", "0"), ("--batch-size", "0")):
        add(f"check-sae{flag}-{value}", "check-sae", "{sae}", "--data", "{data.npy}", "--lam", "0.5", "--polish", "--hull",
            flag, value)
    # λ so small against the data that float64 exact codes cannot meet the verdicts' tolerance: refused, no verdict
    add("check-dict-lam-too-small-for-float64", "check-dict", "--dict", "{W.npy}", "--data", "{data.npy}", "--lam",
        "1e-12")
    add("check-sae-lam-too-small-for-float64", "check-sae", "{sae}", "--data", "{data.npy}", "--lam", "1e-12",
        "--json")
    add("run-only-empty", "run", "--quick", "--only", "", "--out", "{new_out}")
    add("run-only-commas", "run", "--quick", "--only", " , ", "--out", "{new_out}")
    add("run-kind-empty", "run", "--quick", "--kind", "", "--out", "{new_out}")
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


def test_sigterm_ends_train_with_one_line_like_sigint(world: World, tmp_path: Path) -> None:
    """SIGTERM (what `kill`, a scheduler or a container stop sends) unwinds like Ctrl-C: one line, exit 143,
    the checkpoints written so far kept, and ``--resume`` continues from them."""
    import signal
    import time

    out = tmp_path / "run"
    argv = [sys.executable, "-m", "dictcheck.proofs_checks.cli", "train", "--arch", "relu", "--d-sae", "6", "--lam",
            "0.1", "--steps", "10000000", "--batch-size", "4", "--checkpoint-every", "5", "--data", world["data.npy"],
            "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not list((out / "checkpoints").glob("ckpt_*.pt")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert err.splitlines()[-1] == "dictcheck: terminated (SIGTERM)" and "Traceback" not in err
    assert list((out / "checkpoints").glob("ckpt_*.pt")) and not (out / ".dictcheck.lock").exists()


def test_an_interrupted_first_run_leaves_no_folder(world: World, tmp_path: Path) -> None:
    """A run stopped before its first checkpoint (here by SIGTERM) removes what it created."""
    import signal
    import time

    out = tmp_path / "a" / "run"
    argv = [sys.executable, "-m", "dictcheck.proofs_checks.cli", "train", "--arch", "relu", "--d-sae", "6", "--lam",
            "0.1", "--steps", "10000000", "--batch-size", "4", "--checkpoint-every", "0", "--log-every", "1",
            "--data", world["data.npy"], "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not (out / "train_log.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143 and not (tmp_path / "a").exists()


@pytest.mark.parametrize("settings, message", [
    ({"batch_size": 0}, "batch_size (--batch-size) must be an int >= 1, got 0"),
    ({"hull_atoms": 0}, "hull_atoms (--hull-atoms) must be an int >= 1, got 0"),
    ({"polish_tokens": 0}, "polish_tokens (--polish-tokens) must be an int >= 1, got 0"),
    ({"polish_holdout": 1.5}, "polish_holdout (--polish-holdout) must be a finite number in [0, 1], got 1.5"),
    ({"device": "meta"}, "device (--device) must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'meta'"),
    ({"tol": 0.5}, "tol (--tol) must be a finite number in [1e-15, 0.001], got 0.5"),
])
def test_the_api_refuses_what_the_cli_refuses_with_its_message(world: World, settings: dict, message: str) -> None:
    import dictcheck

    with pytest.raises(ValueError) as e:
        dictcheck.check_sae(world["sae"], np.load(world["data.npy"]), 0.5, **settings)
    assert str(e.value) == message


def test_the_cli_says_what_the_api_says(world: World) -> None:
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "check-sae", world["sae"], "--data",
                           world["data.npy"], "--lam", "0.5", "--hull-atoms", "0"], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == EXIT_USER
    assert proc.stderr == "dictcheck: error: hull_atoms (--hull-atoms) must be an int >= 1, got 0\n"


@pytest.mark.parametrize("device", ["weird", "meta", "", "cpu:3", "mps", "cuda:99", 3, None]
                         + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"]))
def test_one_device_rule_for_every_command(device: object) -> None:
    """``check-sae``, ``train`` and the API take a device through one function and refuse the same values."""
    from dictcheck.empirics.training.loop import TrainConfig
    from dictcheck.proofs_checks.sae_report import SaeCheckSettings
    from dictcheck.solvers.devices import resolve_device

    with pytest.raises(ValueError) as e:
        resolve_device(device, "device")
    expected = str(e.value).removeprefix("device")
    with pytest.raises(ValueError, match=None) as e_sae:
        SaeCheckSettings(device=device)
    with pytest.raises(ValueError) as e_train:
        TrainConfig(device=device).validate()
    assert str(e_sae.value).endswith(expected) and str(e_train.value).endswith(expected)
    for lr in (0, -1, float("nan"), float("inf"), 11, 1e300, True):
        with pytest.raises(ValueError, match="lr must be a number in"):
            TrainConfig(lr=lr).validate()


#: Values put into every field of a foreign folder's config and into every tensor of its weights.
HOSTILE_VALUES = [None, True, -1, 0, 1e300, -1e300, 1e-300, "abc", "", [], [1, 2], {}, {"a": 1}, 10**30]
HOSTILE_TENSORS = {"list": [1.0, 2.0], "string": "abc", "none": None, "dict": {"a": 1.0}, "scalar": torch.tensor(1.0),
                   "int": lambda t: t.to(torch.int64), "3-d": lambda t: t.reshape(1, *t.shape), "empty": torch.zeros(0),
                   "nan": lambda t: torch.full_like(t, float("nan")), "huge": lambda t: t.double() * 1e300}


def _paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a nested dict (the dicts themselves included)."""
    out = []
    for k, v in d.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += _paths(v, (*prefix, k))
    return out


def _set(d: dict, path: tuple, value: object) -> dict:
    import copy

    d = copy.deepcopy(d)
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return d


def _config_variants(root: Path, base: str, cfg_file: str, label: str,
                     extra: list[tuple] = ()) -> list[tuple[str, Path, object]]:
    """Copies of the folder ``root/base`` with one field of its ``cfg_file`` (any depth, plus ``extra`` paths)
    set to each hostile value: (what, folder, the value)."""
    cfg = json.loads((root / base / cfg_file).read_text())
    variants = []
    for path in [*_paths(cfg), *extra]:
        for i, value in enumerate(HOSTILE_VALUES):
            folder = root / f"{base}_cfg_{'.'.join(path)}_{i}"
            shutil.copytree(root / base, folder)
            (folder / cfg_file).write_text(json.dumps(_set(cfg, path, value)))
            variants.append((f"{label} {'.'.join(path)} = {value!r}", folder, value))
    return variants


def _tensor_variants(root: Path, base: str, tensors: dict, save: Callable[[dict, Path], None],
                     label: str) -> list[tuple[str, Path, object]]:
    """Copies of ``root/base`` with one of its ``tensors`` replaced by each hostile value ``save`` can write (each
    one is checked on tokens: its value is given as a number)."""
    variants = []
    for name in tensors:
        for kind, value in HOSTILE_TENSORS.items():
            folder = root / f"{base}_t_{name}_{kind}"
            shutil.copytree(root / base, folder)
            try:
                save({**tensors, name: value(tensors[name].clone()) if callable(value) else value}, folder)
            except (TypeError, ValueError, AttributeError):  # a format that cannot even hold this value
                continue
            variants.append((f"{label} tensor {name} = {kind}", folder, 1.0))
    return variants


def _foreign_variants(root: Path) -> list[tuple[str, Path, object]]:
    """Folders of every format with one config field or one tensor replaced by a hostile value."""
    import safetensors.torch

    def save_dl(sd: dict, folder: Path) -> None:
        torch.save(sd, folder / "ae.pt")

    def save_sp(sd: dict, folder: Path) -> None:
        safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, folder / "sae.safetensors")

    return [*_config_variants(root, "dl_base", "config.json", "dictionary_learning"),
            *_tensor_variants(root, "dl_base", torch.load(root / "dl_base" / "ae.pt", weights_only=True), save_dl,
                              "dictionary_learning"),
            *_config_variants(root, "sp_base", "cfg.json", "sparsify"),
            *_tensor_variants(root, "sp_base", safetensors.torch.load_file(root / "sp_base" / "sae.safetensors"),
                              save_sp, "sparsify"),
            *_config_variants(root, "sae", "cfg.json", "SAELens", [("metadata", "training_architecture_details")])]


def test_every_field_of_every_foreign_folder_is_validated_before_use(tmp_path: Path, world: World) -> None:
    """Every config field and every tensor of a dictionary_learning, sparsify and SAELens folder replaced by a
    hostile value (wrong type, out of range, non-finite, huge, empty): loading it, reading its λ and checking
    it on a few tokens either works or raises one ValueError of one line (SaeFormatError for the folder),
    with no warning; never another exception."""
    import warnings

    import dictcheck
    from dictcheck.empirics.io.formats import load_any_sae

    _dictionary_learning(tmp_path / "dl_base")
    (tmp_path / "sp_base").mkdir()
    g = torch.Generator().manual_seed(0)
    import safetensors.torch

    safetensors.torch.save_file({"encoder.weight": torch.randn(6, D, generator=g), "encoder.bias": torch.randn(6, generator=g),
                                 "W_dec": torch.randn(6, D, generator=g), "b_dec": torch.randn(D, generator=g)},
                                tmp_path / "sp_base" / "sae.safetensors")
    (tmp_path / "sp_base" / "cfg.json").write_text(json.dumps({"expansion_factor": 2, "normalize_decoder": True,
                                                                "num_latents": 6, "k": 2, "d_in": D}))
    shutil.copytree(world["sae"], tmp_path / "sae")
    X = np.load(world["data.npy"])[:6]
    bad, loaded = [], 0
    for what, folder, value in _foreign_variants(tmp_path):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                load_any_sae(folder)
                loaded += 1
                if isinstance(value, (int, float)) and not isinstance(value, bool):  # what arithmetic could trip on
                    dictcheck.check_sae(folder, X, None if "SAELens" in what else 0.5)
            except ValueError as exc:
                if "\n" in str(exc).strip() or not str(exc):
                    bad.append(f"{what}: a message of {len(str(exc).splitlines())} lines")
            except Exception as exc:  # noqa: BLE001 — what the test is looking for
                bad.append(f"{what}: {type(exc).__name__}: {str(exc)[:160]}")
    assert not bad, "\n".join(bad[:40])
    assert loaded > 0
