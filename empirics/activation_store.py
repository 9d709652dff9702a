"""Residual-stream activations of a real LM, written to disk in shards and memory-mapped back
(docs/ecosystem.md §5, docs/vasae.md §1).

**Token windows** (Decision). The corpus documents (:mod:`empirics.corpus`) are put in a random
order (``numpy.random.default_rng(seed).permutation``), each is followed by a blank line
(``"\\n\\n"``), and they are tokenised without special tokens and concatenated into one stream. The
stream is cut into consecutive windows of ``context`` tokens; when the tokenizer prepends a BOS token
by default (``LoadedLM.bos_token_id``, e.g. tinycoder's ``<s>``), each window is that BOS followed by
``context − 1`` stream tokens, otherwise (SmolLM2: ``add_bos_token`` false) ``context`` stream tokens.
**Position 0 of every window is dropped** (the BOS, or a token without context; its residual norm is
an outlier), so each window gives ``context − 1`` rows. Every window is full length, so no padding
arises (the attention mask is all ones). Rows are stored in window order, positions in order.

**Store layout.** ``out_dir/plan.json`` (what is being extracted; written first),
``shard_00000.npy`` … (float32, ``shard_tokens`` rows each except the last, each written atomically)
and ``manifest.json`` (plan + shard list with row counts and SHA-256 + dictcheck version), written
last. An extraction killed at any moment resumes: complete shards (right shape and size) are kept,
stale temporary files are removed, and the rest is recomputed. A directory holding a different
extraction is a ValueError.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.atomic_files import atomic_write_bytes
from dictcheck.empirics.corpus import load_corpus
from dictcheck.empirics.lm_models import LoadedLM, residual_at, sha256_file
from dictcheck.empirics.sae_io import dictcheck_version

FORMAT = "dictcheck-activations"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PLAN = "plan.json"
#: Documents tokenised per tokenizer call while building the stream.
_TOKENIZE_CHUNK = 64


def _shard_name(index: int) -> str:
    return f"shard_{index:05d}.npy"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dictcheck activation file (format {FORMAT!r} expected)")
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


class ActivationStore:
    """Memory-mapped view of an activation directory: rows (N, D) float32 across shards."""

    def __init__(self, path: Path, manifest: dict[str, Any], shards: list[np.ndarray]) -> None:
        self.path = path
        self.manifest = manifest
        self._shards = shards
        self._offsets = np.cumsum([0] + [s.shape[0] for s in shards])
        self.shape: tuple[int, int] = (int(self._offsets[-1]), int(manifest["d"]))
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (1-D integer array, any order, repeats allowed) as an array (len(rows), D)."""
        rows = np.asarray(rows)
        if rows.ndim != 1 or not (np.issubdtype(rows.dtype, np.integer) or rows.size == 0):
            raise ValueError(f"rows must be a 1-D integer array, got shape {rows.shape} dtype {rows.dtype}")
        rows = rows.astype(np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise ValueError(f"row index out of range [0, {self.shape[0]}): min {rows.min()}, max {rows.max()}")
        out = np.empty((rows.size, self.shape[1]), dtype=np.float32)
        which = np.searchsorted(self._offsets, rows, side="right") - 1
        for s in np.unique(which):
            sel = which == s
            out[sel] = self._shards[s][rows[sel] - self._offsets[s]]
        return out

    def to_array(self) -> np.ndarray:
        """All rows in memory, (N, D) float32."""
        return np.concatenate([np.asarray(s) for s in self._shards], axis=0)

    def content_hash(self) -> str:
        """SHA-256 over the shards' SHA-256 digests in order (identifies the data for resume checks)."""
        return hashlib.sha256("".join(s["sha256"] for s in self.manifest["shards"]).encode()).hexdigest()


def _load_shard(path: Path, rows: int, d: int) -> np.ndarray | None:
    """The memory-mapped shard if it is complete (float32, shape (rows, d), full file), else None."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if arr.dtype != np.float32 or arr.shape != (rows, d) or arr.offset + arr.nbytes != path.stat().st_size:
        return None
    return arr


def is_activation_dir(path: str | Path) -> bool:
    """True if ``path`` is a directory holding a completed activation manifest."""
    try:
        return json.loads((Path(path) / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def open_activations(path: str | Path, *, verify: bool = True) -> ActivationStore:
    """Open a completed activation directory (memory-mapped). ValueError (one line) for a missing or
    foreign manifest, a missing or mis-shaped shard, or (``verify``) a shard whose SHA-256 differs."""
    directory = Path(path)
    if not (directory / MANIFEST).is_file():
        raise ValueError(f"{directory} is not an activation directory (no {MANIFEST}; run `dictcheck activations`)")
    manifest = _read_json(directory / MANIFEST)
    shards = []
    for entry in manifest["shards"]:
        file = directory / entry["file"]
        arr = _load_shard(file, entry["rows"], manifest["d"])
        if arr is None:
            raise ValueError(f"activation shard {file} is missing or not float32 of shape ({entry['rows']}, {manifest['d']})")
        if verify and sha256_file(file) != entry["sha256"]:
            raise ValueError(f"activation shard {file} does not match the sha256 in {MANIFEST}")
        shards.append(arr)
    return ActivationStore(directory, manifest, shards)


def _stream(lm: LoadedLM, texts: list[str], n_stream: int, seed: int) -> np.ndarray:
    """The first ``n_stream`` tokens of the seeded document stream (see module docstring)."""
    order = np.random.default_rng(seed).permutation(len(texts))
    pieces: list[list[int]] = []
    total = 0
    for start in range(0, len(order), _TOKENIZE_CHUNK):
        batch = [texts[i] + "\n\n" for i in order[start:start + _TOKENIZE_CHUNK]]
        for ids in lm.tokenizer(batch, add_special_tokens=False).input_ids:
            pieces.append(ids)
            total += len(ids)
        if total >= n_stream:
            return np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces])[:n_stream]
    raise ValueError(f"the corpus holds only {total} tokens for {lm.name}, fewer than the {n_stream} needed; "
                     "ask for fewer tokens")


def _plan(lm: LoadedLM, layer: int, n_tokens: int, context: int, shard_tokens: int, seed: int,
          corpus_source: str, corpus_sha256: str) -> dict[str, Any]:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "model": lm.source, "model_name": lm.name,
            "layer": layer, "hook": lm.hook_spec(layer), "d": lm.d_model, "dtype": "float32",
            "n_tokens": n_tokens, "context": context, "rows_per_window": context - 1,
            "bos_prepended": lm.bos_token_id is not None, "position0_kept": False, "padding": "none",
            "shard_tokens": shard_tokens, "seed": seed,
            "corpus": {"source": corpus_source, "sha256": corpus_sha256}}


def _check_args(lm: LoadedLM, layer: int, n_tokens: int, context: int, batch_size: int, shard_tokens: int) -> None:
    lm.check_layer(layer)
    for name, value, low in (("n_tokens", n_tokens, 1), ("context", context, 2), ("batch_size", batch_size, 1),
                             ("shard_tokens", shard_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if lm.max_context is not None and context > lm.max_context:
        raise ValueError(f"context {context} exceeds the model's maximum of {lm.max_context} positions")


def _prepare_dir(out: Path, plan: dict[str, Any]) -> None:
    """Create ``out`` or accept it for resuming; ValueError if it holds something else."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for marker in (MANIFEST, PLAN):
        if (out / marker).exists():
            existing = {k: v for k, v in _read_json(out / marker).items() if k in plan}
            if existing != plan:
                diff = sorted(k for k in plan if existing.get(k) != plan[k])
                raise ValueError(f"{out} holds a different extraction (differs in: {', '.join(diff)})")
            return
    if any(out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no activation extraction")
    _write_json(out / PLAN, plan)


def _progress_bar(enabled: bool | None, total: int) -> Any:
    if enabled is False or (enabled is None and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="tok", desc="activations", dynamic_ncols=True)


def _shard_rows(lm: LoadedLM, layer: int, windows: np.ndarray, start: int, stop: int, batch_size: int,
                bar: Any) -> np.ndarray:
    """Rows [start, stop) of the store: h^(layer) at positions 1.. of the windows that hold them
    (advancing the tqdm ``bar``, if any, after each batch)."""
    per = windows.shape[1] - 1
    first, last = start // per, math.ceil(stop / per)
    parts = []
    for b in range(first, last, batch_size):
        end = min(b + batch_size, last)
        ids = torch.from_numpy(windows[b:end])
        h = residual_at(lm, layer, ids, torch.ones_like(ids))
        parts.append(h[:, 1:].reshape(-1, h.shape[-1]).to(torch.float32).numpy())
        if bar is not None:  # count only this shard's rows among those of windows b..end-1
            bar.update(min(end * per, stop) - max(b * per, start))
    rows = np.concatenate(parts)
    return np.ascontiguousarray(rows[start - first * per: stop - first * per])


def token_windows(lm: LoadedLM, n_windows: int, *, context: int = 128, seed: int = 0,
                  texts: list[str] | None = None) -> np.ndarray:
    """The first ``n_windows`` token windows (n_windows, context) int64 of the seeded stream over
    ``texts`` (default: the shipped corpus), BOS-prefixed when the tokenizer prepends one (module
    docstring). The windows of an extraction with the same seed and context are these, in order."""
    for name, value, low in (("n_windows", n_windows, 1), ("context", context, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    texts = load_corpus().texts if texts is None else texts
    stream_per_window = context - (lm.bos_token_id is not None)
    stream = _stream(lm, texts, n_windows * stream_per_window, seed).reshape(n_windows, stream_per_window)
    if lm.bos_token_id is None:
        return stream
    return np.concatenate([np.full((n_windows, 1), lm.bos_token_id, dtype=np.int64), stream], axis=1)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _shard_bounds(n_tokens: int, shard_tokens: int) -> Iterator[tuple[int, int, int]]:
    for index, start in enumerate(range(0, n_tokens, shard_tokens)):
        yield index, start, min(start + shard_tokens, n_tokens)


def extract_activations(lm: LoadedLM, layer: int, n_tokens: int, out_dir: str | Path, *, context: int = 128,
                        batch_size: int = 8, shard_tokens: int = 65536, seed: int = 0,
                        progress: bool | None = None) -> ActivationStore:
    """Write ``n_tokens`` rows of h^(layer) (float32) from the corpus to ``out_dir`` and open them.

    Resumable: rerunning with the same arguments after a crash recomputes only incomplete shards;
    rerunning after completion just opens the store. ``progress``: None = tqdm bar on a terminal and
    one log line per shard otherwise; True = bar; False = silent. ValueError (one line) for bad
    arguments, too few corpus tokens, or an ``out_dir`` holding a different extraction.
    """
    _check_args(lm, layer, n_tokens, context, batch_size, shard_tokens)
    corpus = load_corpus()
    out = Path(out_dir)
    plan = _plan(lm, layer, n_tokens, context, shard_tokens, seed, corpus.source, corpus.sha256)
    _prepare_dir(out, plan)
    if (out / MANIFEST).exists():
        return open_activations(out)
    for stale in out.glob(".shard_*.tmp"):
        stale.unlink()
    windows = token_windows(lm, math.ceil(n_tokens / (context - 1)), context=context, seed=seed, texts=corpus.texts)
    bar = _progress_bar(progress, n_tokens)
    log = progress is None and bar is None
    entries = []
    t0 = time.perf_counter()
    for index, start, stop in _shard_bounds(n_tokens, shard_tokens):
        path = out / _shard_name(index)
        if _load_shard(path, stop - start, lm.d_model) is None:
            rows = _shard_rows(lm, layer, windows, start, stop, batch_size, bar)
            atomic_write_bytes(path, _npy_bytes(rows))
        elif bar is not None:
            bar.update(stop - start)
        entries.append({"file": path.name, "rows": stop - start, "sha256": sha256_file(path)})
        if log:
            rate = stop / max(time.perf_counter() - t0, 1e-9)
            print(f"activations: {path.name} done, {stop}/{n_tokens} tokens ({rate:.0f} tok/s incl. resumed)",
                  file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    _write_json(out / MANIFEST, plan | {"shards": entries, "dictcheck_version": dictcheck_version()})
    return open_activations(out)
