"""SAELens-compatible save format for dictcheck SAEs (spec/ecosystem.md §1).

One folder per SAE:

* ``cfg.json``: the SAELens top-level fields (``d_in``, ``d_sae``, ``dtype``, ``device``,
  ``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``, ``architecture``,
  ``k`` for the TopK family, ``metadata``). Every dictcheck-specific field lives under
  ``metadata["dictcheck"]`` because SAELens silently drops unknown top-level fields (Decision).
* ``sae_weights.safetensors``: the weights. Linear SAEs store W_enc [d_in, d_sae], b_enc [d_sae],
  W_dec [d_sae, d_in], b_dec [d_in]; ``jumprelu`` adds ``threshold`` [d_sae]. The math's dictionary
  W (D x d_z) is W_dec transposed.
* optionally ``sparsity.safetensors`` (key ``"sparsity"``: log10 firing frequency, [d_sae]) and
  ``metrics.json``.

Every file is written atomically: to a temporary file in the same folder, flushed and fsynced,
then moved into place with :func:`os.replace`. ``cfg.json`` is moved last, so a folder whose
``cfg.json`` is present was completely written (for a fresh folder).

Loading (:func:`load_sae`) asserts every tensor name, shape and dtype against the config and
checks finiteness; any problem raises :class:`SaeFormatError` with a one-line message naming the
file, the tensor and both shapes.

``metadata["dictcheck"]`` keys (written by :meth:`SaeConfig.new`):

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
``<family>``           architecture-specific fields, family = ``vasae`` | ``bsf`` | ``bilinear`` | arch
=====================  ==========================================================================

Required architecture fields: BSF needs ``bsf.n_b`` and ``bsf.q`` (n_b·q = d_sae); the compound
bilinear prior needs ``bilinear.n_atoms``.

Optional readers convert other libraries' layouts to ours: :func:`load_sparsify` (EleutherAI
sparsify) and :func:`load_dictionary_learning` (saprmarks/dictionary_learning).
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

from dictcheck.empirics.atomic_files import fsync_dir as _fsync_dir
from dictcheck.empirics.atomic_files import staged_file as _atomic_write_bytes

__all__ = [
    "CFG_FILE",
    "WEIGHTS_FILE",
    "SPARSITY_FILE",
    "METRICS_FILE",
    "SAVED_ARCHITECTURE",
    "SaeConfig",
    "SaeFormatError",
    "dictcheck_version",
    "saved_architecture",
    "dictcheck_arch",
    "expected_shapes",
    "save_sae",
    "load_sae",
    "load_sparsity",
    "load_metrics",
    "load_sparsify",
    "load_dictionary_learning",
]

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
SPARSITY_FILE = "sparsity.safetensors"
METRICS_FILE = "metrics.json"

#: dictcheck arch -> saved ``architecture`` string (ecosystem spec §1 table).
SAVED_ARCHITECTURE: dict[str, str] = {
    "relu": "standard",
    "topk": "topk",
    "batchtopk": "batchtopk",
    "jumprelu": "jumprelu",
    "vasae": "topk",
    "abs": "dictcheck/abs",
    "bsf-vanilla": "dictcheck/bsf-vanilla",
    "bsf-grassmann": "dictcheck/bsf-grassmann",
    "bsf-grouplasso": "dictcheck/bsf-grouplasso",
    "bilinear-quadratic": "dictcheck/bilinear-quadratic",
    "bilinear-atomic": "dictcheck/bilinear-atomic",
    "bilinear-compound": "dictcheck/bilinear-compound",
}
# Saved string -> dictcheck arch when metadata.dictcheck.arch is absent (foreign SAELens files).
_DEFAULT_ARCH = {"standard": "relu", "topk": "topk", "batchtopk": "batchtopk", "jumprelu": "jumprelu"}
_KNOWN_SAVED = frozenset(SAVED_ARCHITECTURE.values())
_TOPK_FAMILY = frozenset({"topk", "batchtopk"})

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_NORMALIZE = frozenset({"none", "expected_average_only_in", "constant_norm_rescale", "layer_norm"})
_RESHAPE = frozenset({"none", "hook_z"})
_STANDARD_METADATA = ("model_name", "hook_name", "hook_head_index", "context_size", "prepend_bos")

_DECODER_NORM_DEFAULT = {  # ecosystem spec §3 "Decoder norms"
    "relu": "unit",
    "topk": "unit",
    "batchtopk": "unit",
    "jumprelu": "unit",
    "abs": "unit",
    "vasae": "none",
    "bsf-vanilla": "unit_frobenius_block",
    "bsf-grouplasso": "unit_frobenius_block",
    "bsf-grassmann": "qr_orthonormal",
    "bilinear-quadratic": "none",
    "bilinear-atomic": "none",
    "bilinear-compound": "none",
}


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


def saved_architecture(arch: str) -> str:
    """The ``architecture`` string saved for dictcheck arch ``arch`` (spec table)."""
    if arch in SAVED_ARCHITECTURE:
        return SAVED_ARCHITECTURE[arch]
    if arch.startswith(("bsf-", "bilinear-")):
        return f"dictcheck/{arch}"
    raise SaeFormatError(f"unknown dictcheck architecture {arch!r}; known: {sorted(SAVED_ARCHITECTURE)}")


def _family(arch: str) -> str:
    return arch.split("-", 1)[0]


def _canonical_json(obj: Any, what: str) -> Any:
    """Deep copy through JSON (tuples -> lists, int keys -> str) so a saved config compares equal."""
    try:
        return json.loads(json.dumps(obj, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise SaeFormatError(f"{what} is not strict-JSON serialisable: {exc}") from None


@dataclass
class SaeConfig:
    """The SAELens top-level fields of ``cfg.json`` (ecosystem spec §1).

    ``architecture`` is the *saved* string (``standard``, ``topk``, ``dictcheck/abs``, ...);
    the dictcheck name is :attr:`arch`. ``metadata`` holds the SAELens standard keys and
    ``metadata["dictcheck"]`` every dictcheck-specific field. Build one with :meth:`new`.
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

    def __post_init__(self) -> None:
        self.metadata = _canonical_json(dict(self.metadata), "metadata")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def new(
        cls,
        arch: str,
        d_in: int,
        d_sae: int,
        *,
        k: int | None = None,
        lam: float | None = None,
        act_scale: float = 1.0,
        seed: int | None = None,
        n_tokens: int | None = None,
        data_hash: str | None = None,
        decoder_norm_policy: str | None = None,
        hook: Mapping[str, Any] | None = None,
        arch_fields: Mapping[str, Any] | None = None,
        model_name: str | None = None,
        hook_name: str | None = None,
        hook_head_index: int | None = None,
        context_size: int | None = None,
        prepend_bos: bool = True,
        dtype: str = "float32",
        device: str = "cpu",
        apply_b_dec_to_input: bool | None = None,
        normalize_activations: str = "none",
        reshape_activations: str = "none",
        version: str | None = None,
    ) -> SaeConfig:
        """Config for dictcheck arch ``arch`` with the spec defaults filled in.

        ``apply_b_dec_to_input`` defaults to True (False for ``vasae``); ``decoder_norm_policy``
        to the §3 per-architecture policy; ``arch_fields`` go to ``metadata.dictcheck[<family>]``.
        """
        saved = saved_architecture(arch)
        if apply_b_dec_to_input is None:
            apply_b_dec_to_input = arch != "vasae"
        dc: dict[str, Any] = {
            "arch": arch,
            "lam": lam,
            "act_scale": act_scale,
            "seed": seed,
            "n_tokens": n_tokens,
            "data_hash": data_hash,
            "version": dictcheck_version() if version is None else version,
            "decoder_norm_policy": decoder_norm_policy or _DECODER_NORM_DEFAULT.get(arch, "none"),
            "hook": dict(hook) if hook is not None else None,
            _family(arch): dict(arch_fields or {}),
        }
        metadata = {
            "model_name": model_name,
            "hook_name": hook_name,
            "hook_head_index": hook_head_index,
            "context_size": context_size,
            "prepend_bos": prepend_bos,
            "dictcheck": dc,
        }
        cfg = cls(
            d_in=d_in,
            d_sae=d_sae,
            architecture=saved,
            dtype=dtype,
            device=device,
            apply_b_dec_to_input=apply_b_dec_to_input,
            normalize_activations=normalize_activations,
            reshape_activations=reshape_activations,
            k=k,
            metadata=metadata,
        )
        cfg.validate()
        return cfg

    # ------------------------------------------------------------------ accessors
    @property
    def dictcheck(self) -> dict[str, Any]:
        """``metadata["dictcheck"]`` (empty dict for a foreign SAELens file)."""
        dc = self.metadata.get("dictcheck")
        return dc if isinstance(dc, dict) else {}

    @property
    def arch(self) -> str:
        """The dictcheck architecture name."""
        return dictcheck_arch(self)

    @property
    def arch_fields(self) -> dict[str, Any]:
        """Architecture-specific fields, ``metadata.dictcheck[<family>]``."""
        sub = self.dictcheck.get(_family(self.arch))
        return sub if isinstance(sub, dict) else {}

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

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
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = CFG_FILE) -> SaeConfig:
        """Parse a ``cfg.json`` dict. Unknown top-level fields are ignored (as SAELens does).

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
        if kwargs.get("normalize_activations") is None:
            kwargs.pop("normalize_activations", None)
        if kwargs.get("reshape_activations") is None:
            kwargs.pop("reshape_activations", None)
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
        if self.dtype not in _DTYPES:
            raise bad(f"field 'dtype' must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.device, str):
            raise bad(f"field 'device' must be a string, got {self.device!r}")
        if not isinstance(self.apply_b_dec_to_input, bool):
            raise bad(f"field 'apply_b_dec_to_input' must be a bool, got {self.apply_b_dec_to_input!r}")
        if self.normalize_activations not in _NORMALIZE:
            raise bad(f"field 'normalize_activations' must be one of {sorted(_NORMALIZE)}, got {self.normalize_activations!r}")
        if self.reshape_activations not in _RESHAPE:
            raise bad(f"field 'reshape_activations' must be one of {sorted(_RESHAPE)}, got {self.reshape_activations!r}")
        if not isinstance(self.architecture, str) or self.architecture not in _KNOWN_SAVED:
            raise bad(f"unknown architecture {self.architecture!r}; known: {sorted(_KNOWN_SAVED)}")
        if "dictcheck" in self.metadata and not isinstance(self.metadata["dictcheck"], dict):
            raise bad("field 'metadata.dictcheck' must be an object")
        arch = dictcheck_arch(self, source=source)
        if arch in _TOPK_FAMILY or arch == "vasae":
            if self.k is None:
                raise bad(f"architecture {self.architecture!r} requires field 'k'")
        if self.k is not None:
            if not isinstance(self.k, int) or isinstance(self.k, bool) or not 0 < self.k <= self.d_sae:
                raise bad(f"field 'k' must be an int in [1, d_sae={self.d_sae}], got {self.k!r}")
        expected_shapes(self, source=source)  # checks the arch-specific fields


def dictcheck_arch(cfg: SaeConfig, *, source: str = CFG_FILE) -> str:
    """dictcheck arch of ``cfg``: ``metadata.dictcheck.arch``, else inferred from ``architecture``."""
    dc = cfg.metadata.get("dictcheck")
    arch = dc.get("arch") if isinstance(dc, dict) else None
    if arch is None:
        if cfg.architecture in _DEFAULT_ARCH:
            return _DEFAULT_ARCH[cfg.architecture]
        if isinstance(cfg.architecture, str) and cfg.architecture.startswith("dictcheck/"):
            arch = cfg.architecture.split("/", 1)[1]
        else:
            raise SaeFormatError(f"{source}: unknown architecture {cfg.architecture!r}")
    if not isinstance(arch, str) or arch not in SAVED_ARCHITECTURE:
        raise SaeFormatError(f"{source}: unknown dictcheck architecture {arch!r} in metadata.dictcheck.arch")
    if SAVED_ARCHITECTURE[arch] != cfg.architecture:
        raise SaeFormatError(
            f"{source}: metadata.dictcheck.arch {arch!r} must be saved as architecture "
            f"{SAVED_ARCHITECTURE[arch]!r}, got {cfg.architecture!r}"
        )
    return arch


def _int_field(cfg: SaeConfig, arch: str, name: str, source: str) -> int:
    fam = _family(arch)
    sub = cfg.metadata.get("dictcheck", {}).get(fam)
    v = sub.get(name) if isinstance(sub, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise SaeFormatError(f"{source}: architecture {arch!r} requires positive int metadata.dictcheck.{fam}.{name}, got {v!r}")
    return v


def expected_shapes(cfg: SaeConfig, *, source: str = CFG_FILE) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Tensor name -> (shape, required) for ``cfg`` (ecosystem spec §1 "Weights").

    Unknown names are rejected by :func:`save_sae` and :func:`load_sae`. ``b_dec`` is optional
    for BSF (its spec centres the data instead); everything else listed is required.
    """
    arch = dictcheck_arch(cfg, source=source)
    D, Z = cfg.d_in, cfg.d_sae
    linear = {"W_enc": ((D, Z), True), "b_enc": ((Z,), True), "W_dec": ((Z, D), True), "b_dec": ((D,), True)}
    if arch in ("relu", "topk", "batchtopk", "vasae", "abs"):
        return linear
    if arch == "jumprelu":
        return {**linear, "threshold": ((Z,), True)}
    if arch.startswith("bsf-"):
        n_b, q = _int_field(cfg, arch, "n_b", source), _int_field(cfg, arch, "q", source)
        if n_b * q != Z:
            raise SaeFormatError(f"{source}: n_b*q = {n_b}*{q} = {n_b * q} != d_sae = {Z}")
        if arch == "bsf-grassmann":
            return {"B": ((n_b, D, q), True), "log_gamma": ((), True), "b_dec": ((D,), False)}
        shapes = {**linear, "b_dec": ((D,), False)}
        if arch == "bsf-grouplasso":
            shapes["log_theta"] = ((), False)
            shapes["theta_raw"] = ((n_b,), False)
        return shapes
    if arch == "bilinear-quadratic":
        return {"U": ((Z, D), True), "V": ((Z, D), True)}
    if arch == "bilinear-atomic":
        return {"U": ((Z, D), True)}
    if arch == "bilinear-compound":
        n_a = _int_field(cfg, arch, "n_atoms", source)
        return {"U": ((n_a, D), True), "C": ((Z, n_a), True)}
    raise SaeFormatError(f"{source}: no weight schema for architecture {arch!r}")  # pragma: no cover


def _shape(s: Any) -> str:
    return "[" + ", ".join(str(int(n)) for n in s) + "]"


def _check_tensors(
    tensors: Mapping[str, torch.Tensor], cfg: SaeConfig, source: str, *, check_dtype: bool = True
) -> None:
    """Names, shapes, dtype and finiteness of ``tensors`` against ``cfg`` (one-line errors)."""
    schema = expected_shapes(cfg)
    for name, (shape, required) in schema.items():
        if name not in tensors:
            if required:
                raise SaeFormatError(
                    f"{source}: tensor {name!r} is missing (expected shape {_shape(shape)} for architecture {cfg.architecture!r})"
                )
            continue
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise SaeFormatError(
                f"{source}: tensor {name!r} has shape {_shape(t.shape)}, expected {_shape(shape)} "
                f"(d_in={cfg.d_in}, d_sae={cfg.d_sae})"
            )
        if check_dtype and t.dtype != cfg.torch_dtype:
            raise SaeFormatError(f"{source}: tensor {name!r} has dtype {t.dtype}, cfg.json dtype is {cfg.dtype!r}")
        if not bool(torch.isfinite(t).all()):
            n_bad = int((~torch.isfinite(t)).sum())
            raise SaeFormatError(f"{source}: tensor {name!r} (shape {_shape(t.shape)}) has {n_bad} non-finite values")
    extra = sorted(set(tensors) - set(schema))
    if extra:
        raise SaeFormatError(
            f"{source}: unexpected tensor(s) {extra} for architecture {cfg.architecture!r}; expected {sorted(schema)}"
        )


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


def save_sae(
    directory: str | os.PathLike[str],
    weights: Mapping[str, torch.Tensor | np.ndarray],
    cfg: SaeConfig,
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
    _check_tensors(tensors, cfg, "weights")
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
        raise SaeFormatError(f"{source}: tensor 'sparsity' has shape {_shape(sp.shape)}, expected {_shape((cfg.d_sae,))}")
    if bool(torch.isnan(sp).any()) or bool((sp > 0).any()):
        raise SaeFormatError(f"{source}: tensor 'sparsity' (shape {_shape(sp.shape)}) must be log10 frequencies <= 0 without NaN")


# ---------------------------------------------------------------------- loading
def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise SaeFormatError(f"{path}: file is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SaeFormatError(f"{path}: unreadable JSON ({exc})") from None


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise SaeFormatError(f"{path}: file is missing")
    try:
        return safetensors.torch.load(path.read_bytes())
    except Exception as exc:  # SafetensorError derives from Exception only
        raise SaeFormatError(f"{path}: unreadable or truncated safetensors file ({exc})") from None


def load_sae(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Load an SAE folder written by :func:`save_sae` (or by SAELens for the standard archs).

    Returns ``(weights, cfg)`` with CPU tensors. Every tensor name, shape and dtype is asserted
    against the config and finiteness is checked; any problem raises :class:`SaeFormatError`
    with a one-line message naming the file, the tensor and both shapes.
    """
    directory = Path(directory)
    cfg_path = directory / CFG_FILE
    cfg = SaeConfig.from_dict(_read_json(cfg_path), source=str(cfg_path))
    w_path = directory / WEIGHTS_FILE
    tensors = _read_safetensors(w_path)
    _check_tensors(tensors, cfg, str(w_path))
    return tensors, cfg


def load_sparsity(directory: str | os.PathLike[str], cfg: SaeConfig | None = None) -> torch.Tensor | None:
    """log10 firing frequency [d_sae] from ``sparsity.safetensors``, or None if absent."""
    directory = Path(directory)
    path = directory / SPARSITY_FILE
    if not path.exists():
        return None
    if cfg is None:
        cfg = SaeConfig.from_dict(_read_json(directory / CFG_FILE), source=str(directory / CFG_FILE))
    data = _read_safetensors(path)
    if "sparsity" not in data:
        raise SaeFormatError(f"{path}: tensor 'sparsity' is missing (expected shape {_shape((cfg.d_sae,))})")
    _check_sparsity(data["sparsity"], cfg, str(path))
    return data["sparsity"]


def load_metrics(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Contents of ``metrics.json``, or None if absent."""
    path = Path(directory) / METRICS_FILE
    if not path.exists():
        return None
    m = _read_json(path)
    if not isinstance(m, dict):
        raise SaeFormatError(f"{path}: top level must be a JSON object")
    return m


# ---------------------------------------------------------------------- foreign readers
def _cast_all(tensors: Mapping[str, torch.Tensor], cfg: SaeConfig) -> dict[str, torch.Tensor]:
    return {n: t.detach().to("cpu", cfg.torch_dtype).contiguous() for n, t in tensors.items()}


def _dtype_name(t: torch.Tensor) -> str:
    for name, dt in _DTYPES.items():
        if t.dtype == dt:
            return name
    return "float32"


def load_sparsify(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Read an EleutherAI sparsify hookpoint folder (``cfg.json`` + ``sae.safetensors``).

    encoder.weight [num_latents, d_in] -> W_enc = transpose [d_in, d_sae]; encoder.bias -> b_enc;
    W_dec [num_latents, d_in] and b_dec unchanged. sparsify is a TopK SAE whose encoder does see
    x - b_dec, so the result is ``topk`` with ``apply_b_dec_to_input=True``. Skip connections
    (``W_skip``) are not representable and raise :class:`SaeFormatError`.
    """
    directory = Path(directory)
    cfg_path, w_path = directory / "cfg.json", directory / "sae.safetensors"
    raw = _read_json(cfg_path)
    if not isinstance(raw, dict):
        raise SaeFormatError(f"{cfg_path}: top level must be a JSON object")
    t = _read_safetensors(w_path)
    for name in ("encoder.weight", "encoder.bias", "W_dec", "b_dec"):
        if name not in t:
            raise SaeFormatError(f"{w_path}: tensor {name!r} is missing")
    extra = sorted(set(t) - {"encoder.weight", "encoder.bias", "W_dec", "b_dec"})
    if extra:
        raise SaeFormatError(f"{w_path}: unsupported tensor(s) {extra} (skip connections are not representable)")
    enc = t["encoder.weight"]
    if enc.ndim != 2:
        raise SaeFormatError(f"{w_path}: tensor 'encoder.weight' has shape {_shape(enc.shape)}, expected [num_latents, d_in]")
    n_lat, d_in = enc.shape
    if "d_in" in raw and raw["d_in"] != d_in:
        raise SaeFormatError(f"{w_path}: tensor 'encoder.weight' has shape {_shape(enc.shape)}, expected [num_latents, {raw['d_in']}] (cfg.json d_in)")
    if raw.get("num_latents") and raw["num_latents"] != n_lat:
        raise SaeFormatError(f"{w_path}: tensor 'encoder.weight' has shape {_shape(enc.shape)}, expected [{raw['num_latents']}, d_in] (cfg.json num_latents)")
    k = raw.get("k")
    if not isinstance(k, int):
        raise SaeFormatError(f"{cfg_path}: missing or non-int field 'k'")
    cfg = SaeConfig.new(
        "topk",
        int(d_in),
        int(n_lat),
        k=k,
        dtype=_dtype_name(enc),
        decoder_norm_policy="unit" if raw.get("normalize_decoder", True) else "none",
        arch_fields={"source": "sparsify", "sparsify_cfg": raw},
    )
    weights = _cast_all(
        {"W_enc": enc.T, "b_enc": t["encoder.bias"], "W_dec": t["W_dec"], "b_dec": t["b_dec"]}, cfg
    )
    _check_tensors(weights, cfg, str(w_path))
    return weights, cfg


_DL_CLASSES = {"AutoEncoder": "relu", "AutoEncoderTopK": "topk", "BatchTopKSAE": "batchtopk", "JumpReluAutoEncoder": "jumprelu"}


def load_dictionary_learning(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], SaeConfig]:
    """Read a saprmarks/dictionary_learning folder (``ae.pt`` + ``config.json``).

    Supported ``trainer.dict_class``: AutoEncoder (-> relu; its decoder bias is named ``bias``),
    AutoEncoderTopK (-> topk), BatchTopKSAE (-> batchtopk; the scalar inference ``threshold`` is
    kept in ``metadata.dictcheck.batchtopk.threshold``) and JumpReluAutoEncoder (-> jumprelu, whose
    tensors already use our names). encoder.weight [dict, act] -> W_enc = transpose;
    decoder.weight [act, dict] -> W_dec = transpose. ``ae.pt`` is read with ``weights_only=True``.
    """
    directory = Path(directory)
    cfg_path, w_path = directory / "config.json", directory / "ae.pt"
    raw = _read_json(cfg_path)
    trainer = raw.get("trainer") if isinstance(raw, dict) else None
    if not isinstance(trainer, dict):
        raise SaeFormatError(f"{cfg_path}: missing field 'trainer'")
    cls_name = trainer.get("dict_class")
    if cls_name not in _DL_CLASSES:
        raise SaeFormatError(f"{cfg_path}: unsupported trainer.dict_class {cls_name!r}; supported: {sorted(_DL_CLASSES)}")
    arch = _DL_CLASSES[cls_name]
    if not w_path.is_file():
        raise SaeFormatError(f"{w_path}: file is missing")
    try:
        sd = torch.load(w_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SaeFormatError(f"{w_path}: unreadable torch state dict ({exc})") from None
    if not isinstance(sd, Mapping):
        raise SaeFormatError(f"{w_path}: expected a state dict, got {type(sd).__name__}")

    def get(name: str) -> torch.Tensor:
        if name not in sd:
            raise SaeFormatError(f"{w_path}: tensor {name!r} is missing (dict_class {cls_name})")
        return sd[name]

    arch_fields: dict[str, Any] = {"source": "dictionary_learning", "dict_class": cls_name}
    if arch == "jumprelu":
        w = {n: get(n) for n in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
    else:
        enc, dec = get("encoder.weight"), get("decoder.weight")
        w = {
            "W_enc": enc.T,
            "b_enc": get("encoder.bias"),
            "W_dec": dec.T,
            "b_dec": get("bias") if arch == "relu" else get("b_dec"),
        }
        if arch == "batchtopk" and "threshold" in sd:
            arch_fields["threshold"] = float(sd["threshold"])
    d_in, d_sae = int(w["W_enc"].shape[0]), int(w["W_enc"].shape[-1])
    for key, val in (("activation_dim", d_in), ("dict_size", d_sae)):
        if key in trainer and trainer[key] != val:
            raise SaeFormatError(f"{w_path}: tensor 'W_enc' implies {key}={val}, config.json says {trainer[key]}")
    k = trainer.get("k")
    if arch in _TOPK_FAMILY and not isinstance(k, int):
        kt = sd.get("k")
        k = int(kt) if isinstance(kt, torch.Tensor) and kt.numel() == 1 else None
    cfg = SaeConfig.new(
        arch,
        d_in,
        d_sae,
        k=k if arch in _TOPK_FAMILY else None,
        dtype=_dtype_name(w["W_enc"]),
        lam=None,
        arch_fields=arch_fields,
        seed=trainer.get("seed"),
    )
    weights = _cast_all(w, cfg)
    _check_tensors(weights, cfg, str(w_path))
    return weights, cfg

