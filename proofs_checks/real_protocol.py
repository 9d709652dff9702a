"""The real-activation protocol shared by the real.* and vasae.* checks (docs/ecosystem.md §5).

Data (fixed once, Decision): SmolLM2-135M-Instruct (:func:`dictcheck.empirics.data.lm_models.load_lm`,
"smollm2"), the output of decoder layer :data:`LAYER`, :data:`N_TOKENS` rows from the shipped corpus
(:func:`dictcheck.empirics.data.activation_store.extract_activations`, context 128, seed 0). The last
:data:`N_HELDOUT` rows are held out for evaluation; the rest train. Extraction (about 2 minutes on
2 busy cores, plus the ~20–60 s model load) happens once into a cache keyed by these settings,
``<tempdir>/dictcheck-real/<key>/`` (activations, the frozen W_E as ``embedding.npy`` and the
training tokens' counts ``token_counts.npy``); later runs open it (shard SHA-256s verified) without
loading the model. ``real_data(layer)`` extracts and caches another layer the same way (the vasae.*
checks also read layers 0 and 28). :func:`train_real` writes trained models under
``out_dir/real_models/`` and reuses them (``train(resume=True)``) within a run and across reruns into
the same out_dir.

Widths are far below the paper's (d_z = n_vocab = 49152): models have :data:`D_SAE` latents unless a
check passes ``d_sae`` (vasae.*: 8192), so that each check fits in a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.data.activation_store import extract_activations, is_activation_dir, open_activations, token_windows
from dictcheck.empirics.architectures import build_model
from dictcheck.empirics.io.atomic_files import atomic_write_bytes
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.training.loop import TrainConfig, TrainResult, torch_threads, train

__all__ = ["MODEL", "LAYER", "N_TOKENS", "N_HELDOUT", "CONTEXT", "EXTRACT_SEED", "D_SAE", "STEPS", "BATCH",
           "RealData", "real_data", "train_real"]

MODEL = "smollm2"
LAYER = 10
N_TOKENS = 16384
N_HELDOUT = 2048
CONTEXT = 128
EXTRACT_SEED = 0
D_SAE = 512
STEPS = 600
BATCH = 256


@dataclass(frozen=True)
class RealData:
    """Cached real activations: training and held-out rows (float32, tokens as rows) and side files."""

    X_train: np.ndarray
    X_eval: np.ndarray
    embedding_path: str
    token_counts: np.ndarray
    manifest: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        return {"model": MODEL, "layer": self.manifest.get("layer"), "hook": self.manifest.get("hook"),
                "n_train": len(self.X_train), "n_eval": len(self.X_eval), "context": CONTEXT, "seed": EXTRACT_SEED,
                "corpus": self.manifest.get("corpus"), "cache": str(Path(self.embedding_path).parent)}


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


@functools.lru_cache(maxsize=4)
def real_data(layer: int = LAYER) -> RealData:
    """Extract (first time) or open the cached activations of decoder layer ``layer`` (default
    :data:`LAYER`; the other settings fixed); see the module docstring."""
    root = Path(tempfile.gettempdir()) / "dictcheck-real" / f"{MODEL}_L{layer}_T{N_TOKENS}_c{CONTEXT}_s{EXTRACT_SEED}"
    act, emb, counts = root / "activations", root / "embedding.npy", root / "token_counts.npy"
    if not (is_activation_dir(act) and emb.is_file() and counts.is_file()):
        from dictcheck.empirics.data.lm_models import load_lm

        lm = load_lm(MODEL)
        root.mkdir(parents=True, exist_ok=True)
        extract_activations(lm, layer, N_TOKENS, act, context=CONTEXT, seed=EXTRACT_SEED, progress=False)
        windows = token_windows(lm, math.ceil(N_TOKENS / (CONTEXT - 1)), context=CONTEXT, seed=EXTRACT_SEED)
        train_ids = windows[:, 1:].reshape(-1)[:N_TOKENS - N_HELDOUT]  # the rows' tokens (position 0 dropped)
        atomic_write_bytes(counts, _npy(np.bincount(train_ids, minlength=lm.vocab_size)))
        atomic_write_bytes(emb, _npy(lm.embedding().detach().cpu().numpy().astype(np.float32)))
    store = open_activations(act)
    X = store.to_array()
    return RealData(X_train=X[:-N_HELDOUT], X_eval=X[-N_HELDOUT:], embedding_path=str(emb),
                    token_counts=np.load(counts), manifest=store.manifest)


def train_real(out_dir: Path, seed: int, name: str, arch: str, options: dict[str, Any], *, layer: int = LAYER,
               d_sae: int = D_SAE, on_step: Callable[[int, Featurizer], None] | None = None,
               **config: Any) -> TrainResult:
    """Train a float32 ``arch`` model of width ``d_sae`` (default :data:`D_SAE`; init and batch seed ``seed``)
    on the cached training rows of ``layer`` into ``out_dir/real_models/<name>-<settings hash>`` (resumable).
    ``on_step(step, model)`` is called after every completed step (not for steps a reused model already
    covers)."""
    data = real_data(layer)
    settings = {"steps": STEPS, "batch_size": BATCH, "seed": seed, "device": "cpu", "checkpoint_every": 0,
                "log_every": 100, "keep_checkpoints": 1, **config}
    spec = {"arch": arch, "d_sae": d_sae, "options": options, **settings}
    if layer != LAYER:
        spec["layer"] = layer  # the default layer's key is unchanged, so earlier folders stay reusable
    key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:10]
    model = build_model(arch, data.X_train.shape[1], d_sae, options, seed=seed, dtype=torch.float32)
    hook = None if on_step is None else lambda step: on_step(step, model)
    with torch_threads(1):  # a shared 2-core machine: one intra-op thread per check
        return train(model, data.X_train, TrainConfig(**settings), out_dir / "real_models" / f"{name}-{key}",
                     resume=True, progress=False, on_step=hook)
