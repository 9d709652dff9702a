"""Residual-stream activations of a real LM, written to disk in shards and memory-mapped back
(docs/ecosystem.md §5, docs/vasae.md §1).

**Token windows** (Decision). The corpus documents (:mod:`empirics.data.corpus`) are put in a random
order (``numpy.random.default_rng(seed).permutation``), each is followed by a blank line
(``"\\n\\n"``), and they are tokenised without special tokens and concatenated into one stream. The
stream is cut into consecutive windows of ``context`` tokens; when the tokenizer prepends a BOS token
by default (``LoadedLM.bos_token_id``, e.g. tinycoder's ``<s>``), each window is that BOS followed by
``context − 1`` stream tokens, otherwise (SmolLM2: ``add_bos_token`` false) ``context`` stream tokens.
**Position 0 of every window is dropped** (the BOS, or a token without context; its residual norm is
an outlier), so each window gives ``context − 1`` rows. Every window is full length, so no padding
arises (the attention mask is all ones). Rows are stored in window order, positions in order.

**Store layout.** ``out_dir/plan.json`` (what is being extracted; written first),
``shard_00000.npy`` … (float32, ``shard_tokens`` rows each except the last, each written atomically),
beside each shard ``shard_00000.npy.sha256`` (the SHA-256 of the bytes written, computed from
memory when the shard was written, not from the file), and ``manifest.json`` (plan + shard list with
row counts and SHA-256 + dictcheck version), written last.

**Resuming and integrity.** An extraction killed at any moment resumes: a shard is kept only when
it has the right shape and size *and* its file's SHA-256 equals the one recorded beside it when it
was written; any other shard (torn, missing, unrecorded, or changed since, even at the same size) is
recomputed, and a changed one is reported on stderr. Rerunning a finished extraction reopens it;
when a shard no longer matches the manifest, the rerun recomputes it the same way. Stale temporary
files are removed. A directory holding a different extraction is a ValueError. The manifest is
validated before use (fields, types, shard names) and every reader verifies the shards against it.
One process at a time writes a store (:func:`dictcheck.empirics.io.safe_files.folder_lock`); before any
work, :func:`check_extraction` checks the request against the model's size, the memory a forward
pass takes and the free disk the shards need.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.data.corpus import load_corpus
from dictcheck.empirics.data.lm_models import LMShape, LoadedLM, residual_at, sha256_file
from dictcheck.empirics.io.safe_files import (
    LOCK_FILE,
    check_free_space,
    check_memory,
    folder_lock,
)
from dictcheck.empirics.io.safe_files import read_json as safe_read_json
from dictcheck.empirics.io.safe_files import read_npy
from dictcheck.empirics.io.saelens import dictcheck_version

FORMAT = "dictcheck-activations"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PLAN = "plan.json"
#: Documents tokenised per tokenizer call while building the stream.
_TOKENIZE_CHUNK = 64
#: Suffix of the file beside each shard that records its SHA-256 when it was written.
SHA_SUFFIX = ".sha256"
_SHARD_NAME = re.compile(r"^shard_\d{5}\.npy$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: Limits of manifest.json and plan.json (a manifest lists ~100 bytes per shard; nesting is 3 levels).
_JSON_MAX_BYTES = 64 << 20
_JSON_MAX_DEPTH = 16
#: Copies of a shard's rows alive while it is assembled and serialised (parts, concatenation, bytes).
_SHARD_COPIES = 3


def _shard_name(index: int) -> str:
    return f"shard_{index:05d}.npy"


def _read_json(path: Path) -> dict[str, Any]:
    data = safe_read_json(path, "activation file", max_bytes=_JSON_MAX_BYTES, max_depth=_JSON_MAX_DEPTH)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dictcheck activation file (format {FORMAT!r} expected)")
    return data


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def validate_manifest(manifest: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """The shard entries of a manifest after checking its fields (ValueError naming ``path`` and the
    field): ``d`` a positive int, ``shards`` a non-empty list of {file: ``shard_NNNNN.npy`` (no paths),
    rows: positive int, sha256: 64 hex digits}, and ``n_tokens``, when present, their total."""
    if not _is_count(manifest.get("d")):
        raise ValueError(f"{path}: field 'd' must be a positive integer, got {manifest.get('d')!r}")
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise ValueError(f"{path}: field 'shards' must be a non-empty list of shard entries")
    for i, entry in enumerate(shards):
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) \
                or not _SHARD_NAME.match(entry["file"]) or not _is_count(entry.get("rows")) \
                or not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
            raise ValueError(f"{path}: shard entry {i} must be {{file: shard_NNNNN.npy, rows: int >= 1, "
                             f"sha256: 64 hex digits}}, got {str(entry)[:120]}")
    if len({e["file"] for e in shards}) != len(shards):
        raise ValueError(f"{path}: a shard file is listed twice")
    total = sum(e["rows"] for e in shards)
    if "n_tokens" in manifest and manifest["n_tokens"] != total:
        raise ValueError(f"{path}: n_tokens is {manifest['n_tokens']!r} but the shards hold {total} rows")
    return shards


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
    """The memory-mapped shard if it is complete (a regular file: never a FIFO or a device, which would block
    or never end; float32, shape (rows, d), full file), else None."""
    try:
        arr = read_npy(path, "activation shard")
    except ValueError:
        return None
    if arr.dtype != np.float32 or arr.shape != (rows, d) or arr.offset + arr.nbytes != path.stat().st_size:
        return None
    return arr


def is_activation_dir(path: str | Path) -> bool:
    """True if ``path`` is a directory holding a completed activation manifest."""
    try:
        _read_json(Path(path) / MANIFEST)
    except ValueError:
        return False
    return True


def open_activations(path: str | Path, *, verify: bool = True) -> ActivationStore:
    """Open a completed activation directory (memory-mapped). ValueError (one line) for a missing or
    foreign manifest, a missing or mis-shaped shard, or (``verify``) a shard whose SHA-256 differs."""
    directory = Path(path)
    if not (directory / MANIFEST).is_file():
        raise ValueError(f"{directory} is not an activation directory (no {MANIFEST}; run `dictcheck activations`)")
    manifest = _read_json(directory / MANIFEST)
    shards = []
    for entry in validate_manifest(manifest, directory / MANIFEST):
        file = directory / entry["file"]
        arr = _load_shard(file, entry["rows"], manifest["d"])
        if arr is None:
            kind = "" if file.is_file() or not file.exists() else " (not a regular file: a FIFO, device or folder)"
            raise ValueError(f"activation shard {file} is missing or not float32 of shape ({entry['rows']}, "
                             f"{manifest['d']}){kind}")
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


def check_extraction(shape: LMShape, layer: int, n_tokens: int, out_dir: str | Path, *, context: int = 128,
                     batch_size: int = 8, shard_tokens: int = 65536) -> None:
    """ValueError (one line) unless the extraction can run on a model of this ``shape`` (pass it to
    :func:`dictcheck.empirics.data.lm_models.load_lm` as ``check`` to refuse before the weights load): the
    counts are positive integers, ``layer`` and ``context`` fit the model, a forward pass over a batch
    and the assembly of a shard fit in memory, and the shards fit on ``out_dir``'s file system."""
    for name, value, low in (("n_tokens", n_tokens, 1), ("context", context, 2), ("batch_size", batch_size, 1),
                             ("shard_tokens", shard_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    shape.check_layer(layer)
    shape.check_context(context)
    shard_bytes = min(shard_tokens, n_tokens) * shape.d_model * 4
    check_memory(shape.forward_bytes(batch_size, context, logits=False) + _SHARD_COPIES * shard_bytes,
                 f"extracting {shape.name} activations (batch {batch_size} x context {context}, shards of "
                 f"{min(shard_tokens, n_tokens)} rows)")
    check_free_space(out_dir, n_tokens * shape.d_model * 4,
                     f"the activation store ({n_tokens} x {shape.d_model} float32)")


def _prepare_dir(out: Path, plan: dict[str, Any]) -> bool:
    """Whether ``out`` (created and locked by the caller) holds this extraction already (to resume or
    reopen; False when it is empty); ValueError if it holds something else."""
    for marker in (MANIFEST, PLAN):
        if (out / marker).exists():
            existing = {k: v for k, v in _read_json(out / marker).items() if k in plan}
            if existing != plan:
                diff = sorted(k for k in plan if existing.get(k) != plan[k])
                raise ValueError(f"{out} holds a different extraction (differs in: {', '.join(diff)})")
            return True
    if any(p.name != LOCK_FILE for p in out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no activation extraction")
    return False


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


def _recorded_sha256(shard: Path) -> str | None:
    """The SHA-256 recorded beside ``shard`` when it was written (None when absent or malformed)."""
    sidecar = shard.with_name(shard.name + SHA_SUFFIX)
    if not sidecar.is_file():  # absent, or a FIFO or device that reading would block on
        return None
    try:
        text = sidecar.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _SHA256.match(text) else None


def _kept_shard(path: Path, rows: int, d: int) -> str | None:
    """The recorded SHA-256 of a finished shard that can be kept as it is, else None (and a note on
    stderr when the file is there but cannot be trusted)."""
    if not path.exists():
        return None
    recorded = _recorded_sha256(path)
    if recorded is None:
        why = "has no SHA-256 recorded when it was written"
    elif _load_shard(path, rows, d) is None:
        why = "is not float32 of the planned shape"
    elif sha256_file(path) != recorded:
        why = "does not match the SHA-256 recorded when it was written"
    else:
        return recorded
    print(f"activations: {path.name} {why}; recomputing it", file=sys.stderr, flush=True)
    return None


def extract_activations(lm: LoadedLM, layer: int, n_tokens: int, out_dir: str | Path, *, context: int = 128,
                        batch_size: int = 8, shard_tokens: int = 65536, seed: int = 0,
                        progress: bool | None = None) -> ActivationStore:
    """Write ``n_tokens`` rows of h^(layer) (float32) from the corpus to ``out_dir`` and open them.

    Resumable: rerunning with the same arguments after a crash recomputes only the shards that are not
    complete and verified (module docstring); rerunning after completion opens the store, or repairs
    the shards that no longer match its manifest. ``progress``: None = tqdm bar on a terminal and
    one log line per shard otherwise; True = bar; False = silent. ValueError (one line) for bad
    arguments (:func:`check_extraction`), too few corpus tokens, a model that produces NaN or inf, or
    an ``out_dir`` holding a different extraction; :class:`dictcheck.empirics.io.safe_files.FolderInUseError`
    while another process writes ``out_dir``. A failed first run leaves no folder behind.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    check_extraction(lm, layer, n_tokens, out, context=context, batch_size=batch_size, shard_tokens=shard_tokens)
    corpus = load_corpus()
    plan = _plan(lm, layer, n_tokens, context, shard_tokens, seed, corpus.source, corpus.sha256)
    with folder_lock(out, "dictcheck activations"):
        resuming = _prepare_dir(out, plan)
        if (out / MANIFEST).exists():
            try:
                return open_activations(out)
            except ValueError as exc:
                print(f"activations: {exc}; checking every shard again", file=sys.stderr, flush=True)
        windows = token_windows(lm, math.ceil(n_tokens / (context - 1)), context=context, seed=seed,
                                texts=corpus.texts)
        if not resuming:
            _write_json(out / PLAN, plan)
        for stale in out.glob(".shard_*.tmp"):
            stale.unlink()
        entries = _write_shards(lm, layer, n_tokens, out, windows, batch_size, shard_tokens, progress)
        _write_json(out / MANIFEST, plan | {"shards": entries, "dictcheck_version": dictcheck_version()})
    return open_activations(out)


def _write_shards(lm: LoadedLM, layer: int, n_tokens: int, out: Path, windows: np.ndarray, batch_size: int,
                  shard_tokens: int, progress: bool | None) -> list[dict[str, Any]]:
    """Keep the verified shards, compute and write the others (each with its recorded SHA-256); the
    manifest's shard entries."""
    bar = _progress_bar(progress, n_tokens)
    log = progress is None and bar is None
    entries = []
    t0 = time.perf_counter()
    for index, start, stop in _shard_bounds(n_tokens, shard_tokens):
        path = out / _shard_name(index)
        digest = _kept_shard(path, stop - start, lm.d_model)
        if digest is None:
            rows = _shard_rows(lm, layer, windows, start, stop, batch_size, bar)
            if not np.isfinite(rows).all():
                raise ValueError(f"{lm.name} layer {layer} produced NaN or inf activations (rows {start}..{stop - 1}); "
                                 "nothing of them was written")
            data = _npy_bytes(rows)
            digest = hashlib.sha256(data).hexdigest()
            atomic_write_bytes(path, data)
            atomic_write_bytes(path.with_name(path.name + SHA_SUFFIX), (digest + "\n").encode())
        elif bar is not None:
            bar.update(stop - start)
        entries.append({"file": path.name, "rows": stop - start, "sha256": digest})
        if log:
            rate = stop / max(time.perf_counter() - t0, 1e-9)
            print(f"activations: {path.name} done, {stop}/{n_tokens} tokens ({rate:.0f} tok/s incl. resumed)",
                  file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    return entries
