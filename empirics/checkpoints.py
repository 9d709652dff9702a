"""Training checkpoints: files ``checkpoints/ckpt_<step:08d>.pt`` written atomically, the newest readable
one chosen on resume, and the training log cut back to the steps a checkpoint covers
(:mod:`dictcheck.empirics.training`)."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from dictcheck.empirics.atomic_files import atomic_write_bytes
from dictcheck.empirics.distributed import World

__all__ = ["CHECKPOINT_DIR", "CKPT_FORMAT", "checkpoints", "latest_checkpoint", "load_checkpoint", "resume_checkpoint",
           "save_checkpoint", "truncate_log", "to_cpu"]

CHECKPOINT_DIR = "checkpoints"
CKPT_FORMAT = 1
_CKPT_RE = re.compile(r"^ckpt_(\d{8})\.pt$")


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


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint dict (tensors only, ``weights_only``), or None when unreadable or foreign."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a checkpoint is written atomically, but be robust to foreign damage
        return None
    if not isinstance(ck, dict) or ck.get("format") != CKPT_FORMAT:
        return None
    return ck


def resume_checkpoint(ckpt_dir: Path, world: World) -> dict[str, Any] | None:
    """The newest readable checkpoint (None if there is none); rank 0 chooses it and the other ranks
    load the same file."""
    ck: dict[str, Any] | None = None
    chosen: Path | None = None
    if world.is_main:
        for _, path in reversed(checkpoints(ckpt_dir)):
            ck = load_checkpoint(path)
            if ck is not None:
                chosen = path
                break
    chosen = world.broadcast(chosen)
    if world.is_main or chosen is None:
        return ck
    ck = load_checkpoint(chosen)
    if ck is None:
        raise ValueError(f"checkpoint {chosen} is not readable by rank {world.rank}")
    return ck


def truncate_log(log_path: Path, upto_step: int) -> None:
    """Keep the well-formed records with step ≤ upto_step (drops a torn last line too)."""
    if not log_path.exists():
        return
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
