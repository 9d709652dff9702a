"""Training checkpoints: files ``checkpoints/ckpt_<step:08d>.pt`` written atomically, the newest one
validated and chosen on resume, and the training log cut back to the steps a checkpoint covers
(:mod:`dictcheck.empirics.training.loop`).

Checkpoints are written atomically, so a kill never leaves a torn one; a checkpoint that cannot be
read was damaged or replaced from outside (truncated, a symlink, a foreign file, pickled code,
which ``weights_only`` loading refuses to run). Resuming never skips such a file silently:
:func:`resume_checkpoint` stops with one line naming every unreadable checkpoint (and the newest
readable one, if any), and :func:`check_checkpoint` validates the fields of the one chosen (step,
world size, every tensor's shape, the optimizer state, the RNG states) before anything is loaded
from it."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.io.safe_files import read_torch
from dictcheck.empirics.training.distributed import World

__all__ = ["CHECKPOINT_DIR", "CKPT_FORMAT", "CheckpointError", "check_checkpoint", "checkpoints", "latest_checkpoint",
           "load_checkpoint", "resume_checkpoint", "save_checkpoint", "truncate_log", "to_cpu"]

CHECKPOINT_DIR = "checkpoints"
CKPT_FORMAT = 1
_CKPT_RE = re.compile(r"^ckpt_(\d{8})\.pt$")
#: Every checkpoint holds these fields (:func:`dictcheck.empirics.training.loop.train` writes them).
_REQUIRED = ("format", "step", "tokens", "model", "optimizer", "batch_rng", "since_fired", "config", "data_hash",
             "d_in", "torch_rng", "world_size", "rank_rng")


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed from (one line naming the file and the reason)."""


def save_checkpoint(obj: Any, path: Path) -> None:
    """``torch.save`` into a temporary file in the same folder, fsynced, then moved into place."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint file in ``ckpt_dir``, by step."""
    if not ckpt_dir.is_dir():
        return []
    found = []
    for p in ckpt_dir.iterdir():
        m = _CKPT_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """Path of the newest checkpoint in ``out_dir/checkpoints`` (by step), or None."""
    found = checkpoints(Path(out_dir) / CHECKPOINT_DIR)
    return found[-1][1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint dict (tensors only: ``weights_only``, so pickled code is refused, never run);
    :class:`CheckpointError` saying why when it cannot be read."""
    if path.is_symlink():
        raise CheckpointError(f"{path.name} is a symlink (checkpoints are written as regular files)")
    try:
        ck = read_torch(path, "checkpoint")
    except ValueError as exc:
        raise CheckpointError(str(exc).replace(f"checkpoint {path} ", f"{path.name} ", 1)) from None
    if not isinstance(ck, dict) or ck.get("format") != CKPT_FORMAT:
        raise CheckpointError(f"{path.name} is not a dictcheck checkpoint (format {CKPT_FORMAT} expected)")
    return ck


def resume_checkpoint(ckpt_dir: Path, world: World) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint, (path, contents) (None if there is none); rank 0 chooses it and the other
    ranks load the same file. :class:`CheckpointError` (one line) when any checkpoint is unreadable: it
    names them, and the newest readable one if there is one, instead of skipping them silently."""
    ck: dict[str, Any] | None = None
    chosen: Path | None = None
    if world.is_main:
        unreadable: list[str] = []
        readable: Path | None = None
        for _, path in reversed(checkpoints(ckpt_dir)):
            try:
                loaded = load_checkpoint(path)
            except CheckpointError as exc:
                unreadable.append(str(exc))
                continue
            if readable is None:
                readable, ck = path, loaded
        if unreadable:
            fallback = (f"the newest readable one is {readable.name}: move the others out of {ckpt_dir} to resume "
                        "from it" if readable is not None else f"none is readable: move them out of {ckpt_dir} to "
                        "start afresh")
            raise CheckpointError(f"cannot resume: {'; '.join(unreadable)}; {fallback}")
        chosen = readable
    chosen = world.broadcast(chosen)
    if chosen is None:
        return None
    if world.is_main:
        assert ck is not None
        return chosen, ck
    try:
        return chosen, load_checkpoint(chosen)
    except CheckpointError as exc:
        raise CheckpointError(f"rank {world.rank}: {exc}") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_rng(state: Any, what: str, like: torch.Tensor) -> None:
    """``state`` must be a CPU generator state a generator accepts (same size and dtype as ``like``)."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.shape != like.shape:
        got = f"{state.dtype} {tuple(state.shape)}" if isinstance(state, torch.Tensor) else type(state).__name__
        raise CheckpointError(f"{what} is not a generator state (uint8 {tuple(like.shape)} expected, got {got})")
    try:
        torch.Generator().set_state(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{what} is not a valid generator state ({str(exc).splitlines()[0]})") from None


def check_checkpoint(ck: dict[str, Any], path: Path, *, model: torch.nn.Module, steps: int, d_sae: int) -> None:
    """Validate the fields of a checkpoint of ``path`` before anything is loaded from it, for a run of
    ``steps`` steps of ``model`` (CheckpointError, one line): every required field; the step an int in
    [0, steps] equal to the file name's; the world size a positive int with one RNG state per rank;
    the model's tensors with exactly the model's names, shapes and dtypes, all finite; the optimizer
    state one group over the model's parameters with moments of their shapes; the dead-latent
    counters (d_sae,) non-negative ints; the RNG states valid generator states."""
    name = path.name

    def bad(msg: str) -> CheckpointError:
        return CheckpointError(f"cannot resume from {name}: {msg}")

    missing = [k for k in _REQUIRED if k not in ck]
    if missing:
        raise bad(f"fields {missing} are missing")
    step, world_size = ck["step"], ck["world_size"]
    match = _CKPT_RE.match(name)
    if not _is_int(step) or not 0 <= step <= steps or (match and step != int(match.group(1))):
        raise bad(f"step {step!r} is not an int in [0, {steps}] matching the file name")
    if not _is_int(world_size) or world_size < 1:
        raise bad(f"world_size {world_size!r} is not a positive int")
    if not isinstance(ck["config"], dict) or not isinstance(ck["data_hash"], str) or not _is_int(ck["d_in"]):
        raise bad("config, data_hash or d_in has the wrong type")
    expected = model.state_dict()
    state = ck["model"]
    if not isinstance(state, dict) or set(state) != set(expected):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise bad(f"model tensors {got} are not the model's {sorted(expected)}")
    for key, t in expected.items():
        v = state[key]
        if not isinstance(v, torch.Tensor) or v.shape != t.shape or v.dtype != t.dtype:
            got = f"{v.dtype} {list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
            raise bad(f"model tensor {key!r} is {got}, the model's is {t.dtype} {list(t.shape)}")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise bad(f"model tensor {key!r} holds NaN or inf")
    _check_optimizer(ck["optimizer"], [p.shape for p in model.parameters()], bad)
    since = ck["since_fired"]
    if not isinstance(since, torch.Tensor) or since.dtype != torch.int64 or since.shape != (d_sae,) \
            or bool((since < 0).any()):
        raise bad(f"since_fired is not a non-negative int64 tensor of shape ({d_sae},)")
    like = torch.get_rng_state()
    rank_rng = ck["rank_rng"]
    if not isinstance(rank_rng, (list, tuple)) or len(rank_rng) != world_size:
        raise bad(f"rank_rng does not hold one state per rank ({world_size})")
    for what, rng in (("batch_rng", ck["batch_rng"]), ("torch_rng", ck["torch_rng"]),
                      *((f"rank_rng[{r}]", v) for r, v in enumerate(rank_rng))):
        try:
            _check_rng(rng, what, like)
        except CheckpointError as exc:
            raise bad(str(exc)) from None


def _check_optimizer(opt: Any, shapes: list[torch.Size], bad: Any) -> None:
    """Adam's state dict over parameters of ``shapes``: one group listing them all, moments of their shapes."""
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if not isinstance(groups, list) or len(groups) != 1 or not isinstance(groups[0], dict) \
            or groups[0].get("params") != list(range(len(shapes))) or not isinstance(opt.get("state"), dict):
        raise bad("the optimizer state is not one parameter group over the model's parameters")
    for index, entry in opt["state"].items():
        if not _is_int(index) or not 0 <= index < len(shapes) or not isinstance(entry, dict):
            raise bad(f"the optimizer state has an entry for unknown parameter {index!r}")
        for moment in ("exp_avg", "exp_avg_sq"):
            v = entry.get(moment)
            if not isinstance(v, torch.Tensor) or v.shape != shapes[index] or not bool(torch.isfinite(v).all()):
                raise bad(f"the optimizer's {moment} of parameter {index} is not a finite tensor of shape "
                          f"{list(shapes[index])}")


def truncate_log(log_path: Path, upto_step: int) -> None:
    """Keep the well-formed records with step ≤ upto_step (drops a torn last line too). ValueError when the log
    is not a regular file (a FIFO or device, which reading would block on)."""
    if not log_path.exists():
        return
    if not log_path.is_file():
        raise ValueError(f"{log_path} is not a regular file; remove it to resume")
    kept = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= upto_step:
            kept.append(line)
    atomic_write_bytes(log_path, "".join(s + "\n" for s in kept).encode("utf-8"))


def to_cpu(obj: Any) -> Any:
    """A deep copy of tensors (in dicts, lists, tuples) on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_cpu(v) for v in obj)
    return obj
