"""SAELens-compatible folder format (docs/ecosystem.md §1): files, fields and validation, with no
knowledge of any architecture. The caller gives the weight schema (tensor name -> (shape, required));
:mod:`dictcheck.empirics.io.sae_folder` supplies it from the architecture registry.

One folder per SAE:

* ``cfg.json``: the SAELens top-level fields (``d_in``, ``d_sae``, ``dtype``, ``device``,
  ``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``, ``architecture``,
  ``k`` for the TopK family, ``metadata``). Every dictcheck-specific field lives under
  ``metadata["dictcheck"]`` because SAELens silently drops unknown top-level fields (Decision).
* ``sae_weights.safetensors``: the weights (linear SAEs: W_enc [d_in, d_sae], b_enc [d_sae],
  W_dec [d_sae, d_in], b_dec [d_in]; the math's dictionary W (D x d_z) is W_dec transposed).
* optionally ``sparsity.safetensors`` (key ``"sparsity"``: log10 firing frequency, [d_sae]) and
  ``metrics.json``.

Every file is written atomically: to a temporary file in the same folder, flushed and fsynced,
then moved into place with :func:`os.replace`. ``cfg.json`` is moved last, so a folder whose
``cfg.json`` is present was completely written (for a fresh folder).

Reading (:func:`read_sae_files`) asserts every tensor name, shape and dtype against the schema and
checks finiteness; any problem raises :class:`SaeFormatError` with a one-line message naming the
file, the tensor and both shapes.

``metadata["dictcheck"]`` keys (written by :func:`dictcheck.empirics.io.sae_folder.new_sae_config`):

=====================  ==========================================================================
``arch``               dictcheck architecture name (``relu``, ``topk``, ..., ``bsf-grassmann``)
``lam``                λ of theory objective (1), or null
``act_scale``          activation-scaling factor already folded into the weights (1.0 = none)
``seed``               training seed
``n_tokens``           number of training tokens
``data_hash``          hash of the training data
``version``            dictcheck version that wrote the file
``decoder_norm_policy``  ``unit`` | ``none`` | ``unit_frobenius_block`` | ``qr_orthonormal``
``hook``               unambiguous hook: ``{"module": "model.layers.5", "output": ..., "hidden_states_index": ...}``
``<fields key>``       architecture-specific fields (``vasae`` | ``bsf`` | ``bilinear`` | the arch name)
=====================  ==========================================================================
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from dictcheck.empirics.io.atomic_files import fsync_dir as _fsync_dir
from dictcheck.empirics.io.atomic_files import staged_file as _atomic_write_bytes
from dictcheck.empirics.io.safe_files import read_json as safe_read_json
from dictcheck.theory.scaling import MAX_ENTRY

__all__ = [
    "CFG_FILE",
    "WEIGHTS_FILE",
    "SPARSITY_FILE",
    "METRICS_FILE",
    "DTYPES",
    "Schema",
    "SaeConfig",
    "SaeFormatError",
    "dictcheck_version",
    "cast_weights",
    "check_tensors",
    "dtype_name",
    "write_sae_files",
    "read_config",
    "read_sae_files",
    "read_json",
    "read_safetensors",
    "shape_text",
    "load_sparsity",
    "load_metrics",
]

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
SPARSITY_FILE = "sparsity.safetensors"
METRICS_FILE = "metrics.json"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_NORMALIZE = frozenset({"none", "expected_average_only_in", "constant_norm_rescale", "layer_norm",
                        "covariance_whitening"})
#: Top-level cfg.json fields SaeConfig models itself.
_MODELLED = frozenset({"d_in", "d_sae", "architecture", "dtype", "device", "apply_b_dec_to_input",
                       "normalize_activations", "reshape_activations", "k", "metadata"})
_RESHAPE = frozenset({"none", "hook_z"})
_STANDARD_METADATA = ("model_name", "hook_name", "hook_head_index", "context_size", "prepend_bos")

class SaeFormatError(ValueError):
    """A saved SAE folder (or the data to save) violates the format. The message is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def dictcheck_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("dictcheck")
        except PackageNotFoundError:
            return "unknown"
    except Exception:  # pragma: no cover
        return "unknown"


def _canonical_json(obj: Any, what: str) -> Any:
    """Deep copy through JSON (tuples -> lists, int keys -> str) so a saved config compares equal."""
    try:
        return json.loads(json.dumps(obj, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise SaeFormatError(f"{what} is not strict-JSON serialisable: {exc}") from None


@dataclass
class SaeConfig:
    """The SAELens top-level fields of ``cfg.json`` (docs/ecosystem.md §1).

    ``architecture`` is the *saved* string (``standard``, ``topk``, ``dictcheck/abs``, ...); the
    dictcheck name is :func:`dictcheck.empirics.io.sae_folder.arch_of`. ``metadata`` holds the SAELens
    standard keys and ``metadata["dictcheck"]`` every dictcheck-specific field. Build one for an
    architecture with :func:`dictcheck.empirics.io.sae_folder.new_sae_config`.
    """

    d_in: int
    d_sae: int
    architecture: str
    dtype: str = "float32"
    device: str = "cpu"
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    reshape_activations: str = "none"
    k: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.metadata = _canonical_json(dict(self.metadata), "metadata")
        self.extra_fields = _canonical_json(dict(self.extra_fields), "extra fields")

    # ------------------------------------------------------------------ accessors
    @property
    def dictcheck(self) -> dict[str, Any]:
        """``metadata["dictcheck"]`` (empty dict for a foreign SAELens file)."""
        dc = self.metadata.get("dictcheck")
        return dc if isinstance(dc, dict) else {}

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": self.dtype,
            "device": self.device,
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "normalize_activations": self.normalize_activations,
            "reshape_activations": self.reshape_activations,
            "architecture": self.architecture,
            "metadata": copy.deepcopy(self.metadata),
        }
        if self.k is not None:
            d["k"] = self.k
        d.update(copy.deepcopy(self.extra_fields))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = CFG_FILE) -> SaeConfig:
        """Parse a ``cfg.json`` dict. Top-level fields this class does not model are kept in
        ``extra_fields`` (never dropped): whether they change what the SAE computes is the architecture's
        call (:func:`dictcheck.empirics.io.sae_folder.validate_config`).

        Standard metadata keys found at top level (SAELens < 6 layout) are moved into
        ``metadata`` when ``metadata`` lacks them.
        """
        if not isinstance(d, Mapping):
            raise SaeFormatError(f"{source}: top level must be a JSON object, got {type(d).__name__}")
        for name in ("d_in", "d_sae", "architecture"):
            if name not in d:
                raise SaeFormatError(f"{source}: missing required field {name!r}")
        metadata = d.get("metadata", {})
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, Mapping):
            raise SaeFormatError(f"{source}: field 'metadata' must be an object, got {type(metadata).__name__}")
        metadata = dict(metadata)
        for key in _STANDARD_METADATA:
            if key not in metadata and key in d:
                metadata[key] = d[key]
        kwargs: dict[str, Any] = {"metadata": metadata}
        for name in (
            "d_in",
            "d_sae",
            "architecture",
            "dtype",
            "device",
            "apply_b_dec_to_input",
            "normalize_activations",
            "reshape_activations",
            "k",
        ):
            if name in d:
                kwargs[name] = d[name]
        if isinstance(kwargs.get("k"), float) and kwargs["k"].is_integer():  # SAELens' BatchTopK k is a float
            kwargs["k"] = int(kwargs["k"])
        if kwargs.get("normalize_activations") is None:
            kwargs.pop("normalize_activations", None)
        if kwargs.get("reshape_activations") is None:
            kwargs.pop("reshape_activations", None)
        kwargs["extra_fields"] = {k: v for k, v in d.items() if k not in _MODELLED and k not in _STANDARD_METADATA}
        try:
            cfg = cls(**kwargs)
        except SaeFormatError as exc:
            raise SaeFormatError(f"{source}: {exc}") from None
        cfg.validate(source=source)
        return cfg

    def validate(self, *, source: str = CFG_FILE) -> None:
        """Check field types and values; raise :class:`SaeFormatError` (one line) otherwise."""

        def bad(msg: str) -> SaeFormatError:
            return SaeFormatError(f"{source}: {msg}")

        for name in ("d_in", "d_sae"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(f"field {name!r} must be a positive int, got {v!r}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise bad(f"field 'dtype' must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.device, str):
            raise bad(f"field 'device' must be a string, got {self.device!r}")
        if not isinstance(self.apply_b_dec_to_input, bool):
            raise bad(f"field 'apply_b_dec_to_input' must be a bool, got {self.apply_b_dec_to_input!r}")
        if not isinstance(self.normalize_activations, str) or self.normalize_activations not in _NORMALIZE:
            raise bad(f"field 'normalize_activations' must be one of {sorted(_NORMALIZE)}, got {self.normalize_activations!r}")
        if not isinstance(self.reshape_activations, str) or self.reshape_activations not in _RESHAPE:
            raise bad(f"field 'reshape_activations' must be one of {sorted(_RESHAPE)}, got {self.reshape_activations!r}")
        if not isinstance(self.architecture, str) or not self.architecture:
            raise bad(f"field 'architecture' must be a non-empty string, got {self.architecture!r}")
        if "dictcheck" in self.metadata and not isinstance(self.metadata["dictcheck"], dict):
            raise bad("field 'metadata.dictcheck' must be an object")
        if self.k is not None:
            if not isinstance(self.k, int) or isinstance(self.k, bool) or not 0 < self.k <= self.d_sae:
                raise bad(f"field 'k' must be an int in [1, d_sae={self.d_sae}], got {self.k!r}")


def shape_text(s: Any) -> str:
    """A shape as ``[a, b]``."""
    return "[" + ", ".join(str(int(n)) for n in s) + "]"


#: Tensor name -> (shape, required), as :class:`dictcheck.empirics.architectures.Architecture` declares it.
Schema = Mapping[str, tuple[tuple[int, ...], bool]]


def cast_weights(tensors: Mapping[str, torch.Tensor], cfg: SaeConfig) -> dict[str, torch.Tensor]:
    """The tensors detached, on the CPU and in the dtype of ``cfg`` (a tensor already so is returned as it is,
    so a view of a memory-mapped file stays one)."""
    return {n: t.detach().to("cpu", cfg.torch_dtype) for n, t in tensors.items()}


def dtype_name(t: torch.Tensor) -> str:
    """The cfg.json ``dtype`` name of ``t``'s dtype (float32 for a dtype without one)."""
    for name, dt in DTYPES.items():
        if t.dtype == dt:
            return name
    return "float32"


def check_tensors(
    tensors: Mapping[str, torch.Tensor], cfg: SaeConfig, schema: Schema, source: str, *, check_dtype: bool = True
) -> None:
    """Names, types, shapes, dtype, finiteness and magnitude (≤ :data:`dictcheck.theory.scaling.MAX_ENTRY`) of
    ``tensors`` against ``schema`` and ``cfg`` (one-line errors)."""
    for name, (shape, required) in schema.items():
        if name not in tensors:
            if required:
                raise SaeFormatError(
                    f"{source}: tensor {name!r} is missing (expected shape {shape_text(shape)} for architecture {cfg.architecture!r})"
                )
            continue
        t = tensors[name]
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise SaeFormatError(f"{source}: tensor {name!r} must be a floating-point tensor, got "
                                 f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        if tuple(t.shape) != shape:
            raise SaeFormatError(
                f"{source}: tensor {name!r} has shape {shape_text(t.shape)}, expected {shape_text(shape)} "
                f"(d_in={cfg.d_in}, d_sae={cfg.d_sae})"
            )
        if check_dtype and t.dtype != cfg.torch_dtype:
            raise SaeFormatError(f"{source}: tensor {name!r} has dtype {t.dtype}, cfg.json dtype is {cfg.dtype!r}")
        n_bad, biggest = _entry_stats(t)
        if n_bad:
            raise SaeFormatError(f"{source}: tensor {name!r} (shape {shape_text(t.shape)}) has {n_bad} non-finite values")
        if biggest > MAX_ENTRY:
            raise SaeFormatError(f"{source}: tensor {name!r} has entries up to {biggest:.3g} in magnitude, more than "
                                 f"the {MAX_ENTRY:g} accepted (its products would overflow)")
    extra = sorted(set(tensors) - set(schema))
    if extra:
        raise SaeFormatError(
            f"{source}: unexpected tensor(s) {extra} for architecture {cfg.architecture!r}; expected {sorted(schema)}"
        )


def _entry_stats(t: torch.Tensor, block: int = 1 << 24) -> tuple[int, float]:
    """(how many entries of t are NaN or ±inf, the largest |entry| among the finite ones), a block of entries at
    a time (no full-size temporary: a memory-mapped million-latent decoder is read once, never copied)."""
    flat = t.reshape(-1)
    n_bad, biggest = 0, 0.0
    for lo in range(0, flat.numel(), block):
        part = flat[lo:lo + block]
        finite = torch.isfinite(part)
        n_bad += int((~finite).sum())
        if n_bad == 0 and part.numel():
            biggest = max(biggest, float(part.abs().max()))
    return n_bad, biggest


def _to_tensor(name: str, x: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.floating):
            raise SaeFormatError(f"weights: tensor {name!r} must be floating point, got numpy {x.dtype}")
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise SaeFormatError(f"weights: tensor {name!r} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    if not x.is_floating_point():
        raise SaeFormatError(f"weights: tensor {name!r} must be floating point, got {x.dtype}")
    # clone: safetensors refuses tensors sharing storage (e.g. tied W_enc = W_dec.T views).
    return x.detach().to(device="cpu", dtype=dtype).contiguous().clone()


# ---------------------------------------------------------------------- atomic writing
def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        return (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode()
    except (TypeError, ValueError) as exc:
        raise SaeFormatError(f"{what}: not strict-JSON serialisable: {exc}") from None


def write_sae_files(
    directory: str | os.PathLike[str],
    weights: Mapping[str, torch.Tensor | np.ndarray],
    cfg: SaeConfig,
    schema: Schema,
    *,
    sparsity: torch.Tensor | np.ndarray | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> Path:
    """Save an SAE folder (``cfg.json``, ``sae_weights.safetensors``, optional ``sparsity.safetensors``
    and ``metrics.json``); return the folder path.

    Tensors are cast to ``cfg.dtype`` (bit-identical when they already have it) and validated
    (names, shapes, finiteness) before anything is written. ``sparsity`` is log10 firing
    frequency [d_sae]; -inf (never fired) is allowed, NaN and values > 0 are not. All files are
    staged as temporary files and then moved into place, ``cfg.json`` last.
    """
    cfg.validate()
    directory = Path(directory)
    dtype = cfg.torch_dtype
    tensors = {str(n): _to_tensor(str(n), t, dtype) for n, t in weights.items()}
    check_tensors(tensors, cfg, schema, "weights")
    payloads: list[tuple[Path, bytes]] = [(directory / WEIGHTS_FILE, safetensors.torch.save(tensors))]
    if sparsity is not None:
        sp = _to_tensor("sparsity", sparsity, dtype)
        _check_sparsity(sp, cfg, "sparsity")
        payloads.append((directory / SPARSITY_FILE, safetensors.torch.save({"sparsity": sp})))
    if metrics is not None:
        payloads.append((directory / METRICS_FILE, _json_bytes(dict(metrics), METRICS_FILE)))
    payloads.append((directory / CFG_FILE, _json_bytes(cfg.to_dict(), CFG_FILE)))

    directory.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in payloads:
            staged.append((_atomic_write_bytes(path, data), path))
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            if tmp.exists():
                with contextlib.suppress(OSError):
                    tmp.unlink()
    _fsync_dir(directory)
    return directory


def _check_sparsity(sp: torch.Tensor, cfg: SaeConfig, source: str) -> None:
    if tuple(sp.shape) != (cfg.d_sae,):
        raise SaeFormatError(f"{source}: tensor 'sparsity' has shape {shape_text(sp.shape)}, expected {shape_text((cfg.d_sae,))}")
    if bool(torch.isnan(sp).any()) or bool((sp > 0).any()):
        raise SaeFormatError(f"{source}: tensor 'sparsity' (shape {shape_text(sp.shape)}) must be log10 frequencies <= 0 without NaN")


# ---------------------------------------------------------------------- loading
def read_json(path: Path) -> Any:
    """A JSON file of an SAE folder, read with the limits of :func:`dictcheck.empirics.io.safe_files.read_json`
    (1 MiB, 64 levels: a folder may come from anyone); SaeFormatError (one line) otherwise."""
    if not path.is_file():
        raise SaeFormatError(f"{path}: file is missing")
    try:
        return safe_read_json(path, "SAE file")
    except ValueError as exc:
        raise SaeFormatError(str(exc)) from None


def read_safetensors(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (SaeFormatError, one line, for a missing or unreadable one). With ``mmap``
    they are views of the file mapped copy-on-write (:func:`mapped_safetensors`: nothing read until used, no
    copy), else read into memory."""
    if not path.is_file():
        raise SaeFormatError(f"{path}: file is missing")
    try:
        return mapped_safetensors(path) if mmap else safetensors.torch.load(path.read_bytes())
    except SaeFormatError:
        raise
    except Exception as exc:  # SafetensorError derives from Exception only
        raise SaeFormatError(f"{path}: unreadable or truncated safetensors file ({exc})") from None


#: safetensors dtype names -> (numpy dtype of the stored bytes, torch dtype they are viewed as).
_SAFETENSORS_DTYPES = {"F64": (np.float64, torch.float64), "F32": (np.float32, torch.float32),
                       "F16": (np.float16, torch.float16), "BF16": (np.uint16, torch.bfloat16),
                       "I64": (np.int64, torch.int64), "I32": (np.int32, torch.int32)}


def mapped_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file as views of the file itself (np.memmap, copy-on-write, so a write to
    a tensor never reaches the file): the format's 8-byte little-endian header length, its JSON header of
    dtype, shape and [begin, end) byte offsets from the end of the header, then the bytes. SaeFormatError (one
    line) for a header or offsets that do not fit the file, or a dtype this reader does not take."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise SaeFormatError(f"{path}: truncated safetensors file (no header)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise SaeFormatError(f"{path}: safetensors header of {n} bytes does not fit a {size}-byte file")
        try:
            header = json.loads(fh.read(n))
        except ValueError as exc:
            raise SaeFormatError(f"{path}: unreadable safetensors header ({exc})") from None
    base = 8 + n
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            np_dtype, t_dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            shape = tuple(int(v) for v in info["shape"])
            lo, hi = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SaeFormatError(f"{path}: tensor {name!r}: dtype {info.get('dtype') if isinstance(info, dict) else info!r} "
                                 "or its shape and offsets are not readable here") from None
        count = int(np.prod(shape, dtype=np.int64))
        if lo < 0 or hi != lo + count * np.dtype(np_dtype).itemsize or base + hi > size:
            raise SaeFormatError(f"{path}: tensor {name!r}: offsets [{lo}, {hi}) do not fit shape {list(shape)} "
                                 f"in a {size}-byte file")
        array = (np.memmap(path, dtype=np_dtype, mode="c", offset=base + lo, shape=shape) if count
                 else np.zeros(shape, dtype=np_dtype))
        out[name] = torch.from_numpy(array).view(t_dtype)
    return out


def read_config(directory: str | os.PathLike[str]) -> SaeConfig:
    """``directory/cfg.json`` parsed and checked field by field (:class:`SaeFormatError`, one line)."""
    cfg_path = Path(directory) / CFG_FILE
    return SaeConfig.from_dict(read_json(cfg_path), source=str(cfg_path))


def read_sae_files(directory: str | os.PathLike[str], cfg: SaeConfig, schema: Schema) -> dict[str, torch.Tensor]:
    """The weights of an SAE folder (CPU tensors). Every tensor name, shape and dtype is asserted against
    ``schema`` and ``cfg`` and finiteness is checked; any problem raises :class:`SaeFormatError` with a
    one-line message naming the file, the tensor and both shapes."""
    w_path = Path(directory) / WEIGHTS_FILE
    tensors = read_safetensors(w_path)
    check_tensors(tensors, cfg, schema, str(w_path))
    return tensors


def load_sparsity(directory: str | os.PathLike[str], cfg: SaeConfig | None = None) -> torch.Tensor | None:
    """log10 firing frequency [d_sae] from ``sparsity.safetensors``, or None if absent."""
    directory = Path(directory)
    path = directory / SPARSITY_FILE
    if not path.exists():
        return None
    if cfg is None:
        cfg = read_config(directory)
    data = read_safetensors(path)
    if "sparsity" not in data:
        raise SaeFormatError(f"{path}: tensor 'sparsity' is missing (expected shape {shape_text((cfg.d_sae,))})")
    _check_sparsity(data["sparsity"], cfg, str(path))
    return data["sparsity"]


def load_metrics(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Contents of ``metrics.json``, or None if absent."""
    path = Path(directory) / METRICS_FILE
    if not path.exists():
        return None
    m = read_json(path)
    if not isinstance(m, dict):
        raise SaeFormatError(f"{path}: top level must be a JSON object")
    return m
