"""Training loop for every featurizer of :mod:`dictcheck.empirics.architectures` (docs/ecosystem.md §3).

``train(model, X, config, out=None)`` trains a model built by its architecture
(``architecture(name).build(d_in, d_sae, options, seed=...)``, or
:func:`dictcheck.empirics.architectures.build_model`): linear SAEs, block-sparse featurizers
(``bsf-*``), bilinear autoencoders (``bilinear-*``) and VASAE. It writes nothing unless ``out`` is
given; then ``out`` receives the log, the checkpoints and the SAE folder, and a killed run resumes.
:func:`best_of_runs` trains several candidates and keeps the one with the lowest training objective.

LAYOUT: ``X`` is a numpy array of shape (N, d_in), **one token per ROW** (like
:mod:`dictcheck.empirics.metrics.reconstruction`, unlike ``theory/`` and ``solvers/``).

What :func:`train` does, per the spec:

* **Optimiser.** Adam (torch defaults β = (0.9, 0.999), ε = 1e-8). Default lr: for SAEs
  2e-4/√(d_sae/2^14) (dictionary_learning's TopK rule), else the architecture's
  (:meth:`Architecture.default_lr`); overridable in :class:`TrainConfig`.
  The learning rate of step s is ``lr · lr_schedule(s, steps)`` (see :func:`lr_schedule`).
* **Gradient clipping** of the total gradient norm at 1.0 (``TrainConfig.clip_grad_norm``).
* **Constraints.** The model's hooks: ``set_step(step)`` before each forward pass,
  ``project_gradients_()`` before clipping and the step, ``project_parameters_()`` after the step
  and once at init. Linear SAEs keep unit-norm decoder rows this way (remove the parallel gradient,
  renormalise); BSFs project blocks to unit Frobenius norm.
* **Init.** SAE ``b_dec`` = geometric median of (up to 4096 rows of) the first batch by default;
  ``"huber_median"`` (relu only) uses the Huber-smoothed median with the model's λ (docs/theory.md
  §4.3); ``"mean"`` and ``"zero"`` are also offered, and ``"keep"`` leaves the model's own ``b_dec`` (a model
  warm-started from a folder, e.g. an encoder fitted to a given decoder). BSFs centre by the mean by default, bilinear
  autoencoders have no centring vector (``"none"``). The loop sets it with
  :meth:`Featurizer.set_centring_` on a fresh run; the rest of the init is the architecture's ``build``.
* **Batches** are drawn *with replacement* by ``torch.randint`` from a CPU ``torch.Generator``
  seeded with ``seed`` (whose state is checkpointed), so a run is deterministic under its seed.
* **Dead latents.** A per-latent counter of training tokens since the latent last fired
  (fired = non-zero code on at least one token of the batch; the whole batch counts). A latent is
  dead when the counter is ≥ T_dead = min(10M, 25% of the training tokens steps·batch_size)
  (at least 1). So nothing is dead during the first T_dead tokens. When the model asks for it
  (:meth:`Featurizer.wants_dead_mask`: TopK SAEs with ``aux_coef > 0``) the dead mask (computed
  *before* the batch) is passed to ``forward(x, dead_mask=...)``.
* **Progress.** A tqdm bar counting tokens with postfix loss, mse, l0, dead% when stderr is a
  terminal (``progress=None``), else one line to stderr every ``log_every`` steps; ``progress``
  True/False forces the bar on/off.
* **Log.** ``out/train_log.jsonl`` (and ``TrainResult.log``): one JSON object per line every ``log_every`` steps and at
  the last step, with keys step (completed steps, 1-based), tokens, lr, loss, mse, sparsity_loss,
  aux_loss, l0 (batch means), dead_frac_train, grad_norm (before clipping), elapsed_s.
* **Checkpoints** (only with ``out``; :mod:`dictcheck.empirics.training.checkpoints`) ``out/checkpoints/ckpt_<step:08d>.pt`` every ``checkpoint_every`` steps and
  after the last step, each written atomically (temporary file in the same folder, fsync,
  :func:`os.replace`). Each holds the model and Adam states, the batch generator, the global torch
  (and CUDA) RNG states, the step, the dead-latent counters, the weight-relevant config and the data
  hash. The newest ``keep_checkpoints`` are kept. ``train(..., out, resume=True)`` restarts from the
  newest checkpoint (a fresh run when there is none; CheckpointError naming the files when any is
  unreadable, and before use when the chosen one's fields do not fit this run), truncates the log to
  the steps the checkpoint covers and continues; on the CPU the final weights are bit-identical to an
  uninterrupted run (same machine, same torch thread count). Resuming with a model, config or data
  that changes the result raises ValueError; ``resume=False`` on a folder that already holds
  checkpoints raises FileExistsError rather than deleting them.
* **Several processes** (``torchrun``, ``dictcheck train --nproc P``; :mod:`dictcheck.empirics.training.distributed`):
  ``batch_size`` is the global batch, every rank draws the same indices and reads only its
  contiguous 1/P of them, gradients are averaged by DistributedDataParallel, dead-latent counters
  and logged means are global, only rank 0 writes the log, checkpoints (which then also hold every
  rank's RNG state and the world size) and the folder. Resuming needs the same number of ranks.
* **Output.** The SAE folder itself is ``out`` (:func:`dictcheck.empirics.io.sae_folder.save_sae`: cfg.json,
  sae_weights.safetensors, sparsity.safetensors, metrics.json). ``metadata.dictcheck`` gets seed,
  n_tokens (= steps·batch_size, the training tokens processed), data_hash (sha256 hex of
  ``X``'s C-contiguous bytes) and a ``training`` block (steps, batch_size, lr, aux_coef,
  b_dec_init, k, options (the resolved architecture options but k, lam and aux_coef, from which
  :func:`dictcheck.empirics.io.sae_folder.load_featurizer` rebuilds the model), T_dead, n_data_tokens,
  world_size).
* **metrics.json** is computed on the TRAINING data (no held-out split; Decision): a seeded subset of
  ``min(N, eval_tokens)`` rows drawn without replacement. It holds
  :func:`dictcheck.empirics.metrics.reconstruction.reconstruction_metrics` of (x, x̂) when the model reconstructs in input
  space, the model's ``extra`` batch means averaged over tokens (e.g. bilinear ``nmse_lifted``,
  with ``eval_batch_size``), its ``firing_metrics`` (e.g. BSF ``dead_blocks``), plus ``l0``, ``dead_frac`` and
  ``n_eval_tokens`` computed streaming over the same rows (same definitions, no (N, d_sae) matrix
  in memory), ``dead_frac_train`` (the tracker at the end), ``eval_split`` = "train",
  ``n_train_tokens`` and ``final_loss``. Non-finite values (e.g. rel_recon_bias = +inf) are
  written as null because the file is strict JSON. ``sparsity.safetensors`` is the log10 firing
  frequency on the same rows (-inf for latents that never fire).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from dictcheck.empirics.architectures import REGISTRY, architecture
from dictcheck.empirics.architectures.linear_sae import sae_default_lr as default_lr
from dictcheck.empirics.training.checkpoints import (
    CHECKPOINT_DIR,
    CKPT_FORMAT,
    check_checkpoint,
    checkpoints,
    latest_checkpoint,
    resume_checkpoint,
    save_checkpoint,
    to_cpu,
    truncate_log,
)
from dictcheck.empirics.training.distributed import World, current_world, rank_seed
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.metrics.reconstruction import reconstruction_metrics
from dictcheck.empirics.io.safe_files import check_free_space, check_memory, folder_lock
from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae
from dictcheck.solvers.medians import geometric_median, huber_median
from dictcheck.solvers.devices import resolve_device
from dictcheck.theory.scaling import MAX_ENTRY

__all__ = [
    "ARCHS",
    "B_DEC_INITS",
    "LOG_FILE",
    "CHECKPOINT_DIR",
    "TrainConfig",
    "TrainResult",
    "BestRun",
    "best_of_runs",
    "default_lr",
    "lr_schedule",
    "t_dead",
    "data_hash",
    "torch_threads",
    "train",
    "latest_checkpoint",
    "training_memory_bytes",
    "check_training_memory",
]

#: Architectures trained here: every registered one, in registration order.
ARCHS: tuple[str, ...] = tuple(REGISTRY)
#: Every centring rule; each architecture allows a subset (``Architecture.b_dec_inits``).
B_DEC_INITS: tuple[str, ...] = ("geometric_median", "huber_median", "mean", "zero", "keep", "none")
LOG_FILE = "train_log.jsonl"
_MEDIAN_SAMPLE = 4096
_T_DEAD_MAX = 10_000_000
#: TrainConfig fields that change the trained weights; a resume must match them exactly (with the model's).
_RESULT_FIELDS = ("steps", "batch_size", "lr", "seed", "b_dec_init", "clip_grad_norm")
_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


def lr_schedule(step: int, steps: int) -> float:
    """Learning-rate multiplier of (0-based) step ``step`` of ``steps`` (spec §3 Decision).

    With W = min(1000, ⌊steps/20⌋) warm-up steps and T = ⌊steps/5⌋ decay steps:

    * warm-up: step < W  →  (step + 1)/W, so the first update already moves (no wasted step)
      and step W − 1 reaches 1;
    * constant 1 in between;
    * decay: step ≥ steps − T  →  (steps − step)/T, which is 1 at the first decay step and falls
      linearly to 1/T at the last step (it would be 0 at step = steps, after training).

    Edge cases: W = 0 (steps < 20) means no warm-up and T = 0 (steps < 5) no decay, so
    ``lr_schedule(0, 1) == 1``. Since W ≤ steps/20 < steps − T, warm-up and decay never overlap
    (the minimum of both factors is taken anyway). ``steps`` < 1 or step outside [0, steps)
    raises ValueError.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= step < steps:
        raise ValueError(f"step must be an int in [0, steps={steps}), got {step!r}")
    warm = min(1000, steps // 20)
    decay = steps // 5
    f = 1.0
    if warm > 0 and step < warm:
        f = min(f, (step + 1) / warm)
    if decay > 0 and step >= steps - decay:
        f = min(f, (steps - step) / decay)
    return f


def t_dead(steps: int, batch_size: int) -> int:
    """T_dead = min(10M, 25% of the training tokens steps·batch_size), at least 1 (spec §2)."""
    return max(1, min(_T_DEAD_MAX, (steps * batch_size) // 4))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads, restoring the previous count afterwards (small
    models on a shared machine train fastest on one thread, without OpenMP spin-waits)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def data_hash(X: np.ndarray) -> str:
    """sha256 hex digest of the C-contiguous bytes of ``X`` (its dtype as given)."""
    return hashlib.sha256(memoryview(np.ascontiguousarray(X)).cast("B")).hexdigest()



def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


#: Largest learning rate accepted: Adam moves every weight by about lr per step, so beyond 10 each step rewrites
#: a unit-norm decoder many times over (and lr 1e300 overflows at the first step).
LR_MAX = 10.0


@dataclass
class TrainConfig:
    """How to train (docs/ecosystem.md §3); what to train is the model itself. :meth:`validate` raises
    ValueError (one line).

    lr: None → the architecture's default lr at the model's width (:meth:`Architecture.default_lr`;
    SAEs: :func:`default_lr` of d_sae). b_dec_init: None → the architecture's default centring rule;
    see :data:`B_DEC_INITS` ("huber_median" needs relu and its λ). seed: the batch order and any
    randomness inside ``forward`` (the model's init has its own seed). checkpoint_every: 0 → only the
    final checkpoint (with ``out``). device: "auto" → CUDA when available, else CPU. eval_tokens: rows
    of X used for the metrics. keep_checkpoints: how many of the newest checkpoints to keep (≥ 1).
    """

    steps: int = 1000
    batch_size: int = 4096
    lr: float | None = None
    seed: int = 0
    checkpoint_every: int = 1000
    log_every: int = 100
    device: str = "auto"
    b_dec_init: str | None = None
    clip_grad_norm: float = 1.0
    eval_tokens: int = 32768
    keep_checkpoints: int = 2
    wandb_project: str | None = None

    def validate(self) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"TrainConfig: {msg}")

        for name in ("steps", "batch_size", "log_every", "eval_tokens", "keep_checkpoints"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise bad(f"{name} must be an int >= 1, got {v!r}")
        if not _is_int(self.checkpoint_every) or self.checkpoint_every < 0:
            raise bad(f"checkpoint_every must be an int >= 0 (0 = final checkpoint only), got {self.checkpoint_every!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise bad(f"seed must be an int >= 0, got {self.seed!r}")
        if self.lr is not None and (not _is_real(self.lr) or not 0 < self.lr <= LR_MAX):
            raise bad(f"lr must be a number in (0, {LR_MAX:g}], got {self.lr!r}")
        if not _is_real(self.clip_grad_norm) or not 0 < self.clip_grad_norm <= MAX_ENTRY:
            raise bad(f"clip_grad_norm must be a number in (0, {MAX_ENTRY:g}], got {self.clip_grad_norm!r}")
        if self.b_dec_init is not None and self.b_dec_init not in B_DEC_INITS:
            raise bad(f"b_dec_init must be one of {list(B_DEC_INITS)}, got {self.b_dec_init!r}")
        try:
            resolve_device(self.device)
        except ValueError as exc:
            raise bad(str(exc)) from None

    def for_model(self, model: Featurizer) -> TrainConfig:
        """This config validated for ``model``, with the architecture's default lr and centring rule filled in."""
        self.validate()
        arch = architecture(model.arch)
        cfg = dataclasses.replace(self, lr=arch.default_lr(int(model.d_sae)) if self.lr is None else float(self.lr),
                                  b_dec_init=arch.b_dec_inits[0] if self.b_dec_init is None else self.b_dec_init)
        if cfg.b_dec_init not in arch.b_dec_inits:
            raise ValueError(f"TrainConfig: b_dec_init must be one of {list(arch.b_dec_inits)} for arch "
                             f"{model.arch!r}, got {cfg.b_dec_init!r}")
        lam = getattr(model.arch_options, "lam", None)
        if cfg.b_dec_init == "huber_median" and not lam:  # the Huber median at λ: objective (1)'s, λ > 0
            raise ValueError(f"TrainConfig: b_dec_init 'huber_median' needs lam > 0, got arch {model.arch!r} "
                             f"lam={lam!r}")
        return cfg

    def resolved_device(self) -> torch.device:
        return resolve_device(self.device)


def model_fields(model: Featurizer) -> dict[str, Any]:
    """What identifies a model's architecture for a resume: arch, d_sae, its options and dtype."""
    options = model.arch_options.to_dict() if model.arch_options is not None else {}
    return {"arch": model.arch, "d_sae": int(model.d_sae), "options": json.loads(json.dumps(options)),
            "dtype": _DTYPE_NAMES.get(_model_dtype(model), str(_model_dtype(model)))}


def _model_dtype(model: Featurizer) -> torch.dtype:
    for t in (*model.parameters(), *model.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


@dataclass
class TrainResult:
    """What :func:`train` returns. ``weights`` are CPU tensors with SAELens names; ``model`` is the
    trained featurizer itself (eval mode, on the training device); ``log`` holds the log records of
    this call (one per ``log_every`` steps). ``out_dir``, ``log_path`` and ``checkpoint_path`` are
    None when nothing was written (``out`` not given)."""

    model: Featurizer
    weights: dict[str, torch.Tensor]
    metrics: dict[str, Any]
    steps: int
    n_tokens: int
    resumed_from: int | None
    final_loss: float
    dead_frac_train: float
    log: list[dict[str, Any]]
    out_dir: Path | None = None
    log_path: Path | None = None
    checkpoint_path: Path | None = None


def _wandb_run(cfg: TrainConfig, model: Featurizer, out: Path | None) -> Any:
    """A W&B run when ``cfg.wandb_project`` asks for one (docs/ecosystem.md §3: only if installed and asked)."""
    if cfg.wandb_project is None:
        return None
    try:
        import wandb
    except ImportError:
        raise ValueError(f"W&B logging was asked for (project {cfg.wandb_project!r}) but the wandb package is "
                         "not installed: pip install wandb") from None
    return wandb.init(project=cfg.wandb_project, dir=None if out is None else str(out),
                      config={**dataclasses.asdict(cfg), **model_fields(model)}, resume="allow")



def _b_dec_init(cfg: TrainConfig, model: Featurizer, Xt: _Rows) -> torch.Tensor | None:
    """b_dec from (up to 4096 rows of) the first batch: the rows step 0 will draw (None for "none" and "keep":
    the model's b_dec stays as it is)."""
    if cfg.b_dec_init in ("none", "keep"):
        return None
    if cfg.b_dec_init == "zero":
        return torch.zeros(Xt.shape[1], dtype=Xt.dtype)
    g = torch.Generator(device="cpu")
    g.manual_seed(cfg.seed)
    idx = torch.randint(Xt.shape[0], (cfg.batch_size,), generator=g)[:_MEDIAN_SAMPLE]
    sample = Xt[idx].to(torch.float64).numpy()
    if cfg.b_dec_init == "mean":
        b = sample.mean(axis=0)
    elif cfg.b_dec_init == "geometric_median":
        b = geometric_median(sample.T).b  # solvers layout: points as columns
    else:  # huber_median, relu with its λ
        b = huber_median(sample.T, float(model.arch_options.lam)).b
    return torch.as_tensor(np.asarray(b, dtype=np.float64)).to(Xt.dtype)


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class _Progress:
    """tqdm bar (terminal) or a log line every ``log_every`` steps to stderr."""

    def __init__(self, enabled: bool | None, total_tokens: int, initial_tokens: int) -> None:
        if enabled is None:
            enabled = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_tokens, initial=initial_tokens, unit="tok", unit_scale=True,
                            dynamic_ncols=True, desc="train")

    def update(self, tokens: int) -> None:
        if self.bar is not None:
            self.bar.update(tokens)

    def report(self, rec: dict[str, Any], steps: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{rec['loss']:.4g}", mse=f"{rec['mse']:.4g}", l0=f"{rec['l0']:.1f}",
                                 dead=f"{100 * rec['dead_frac_train']:.1f}%", refresh=False)
        else:
            print(
                f"[dictcheck.train] step {rec['step']}/{steps} tokens {rec['tokens']} lr {rec['lr']:.3g} "
                f"loss {rec['loss']:.5g} mse {rec['mse']:.5g} l0 {rec['l0']:.2f} "
                f"dead {100 * rec['dead_frac_train']:.1f}%",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


_LOGGED_MEANS = ("loss", "mse", "sparsity_loss", "aux_loss", "l0")


def _batch_means(res: Any, world: World) -> dict[str, float]:
    """The logged batch means of one step, averaged over the ranks (each rank's batch has B/P rows)."""
    if world.size == 1:
        return {name: float(getattr(res, name).detach()) for name in _LOGGED_MEANS}
    local = torch.stack([getattr(res, name).detach().to(torch.float64) for name in _LOGGED_MEANS])
    return dict(zip(_LOGGED_MEANS, world.mean(local).tolist()))


class _Rows:
    """The training rows: an in-memory array (one tensor) or a row store gathered batch by batch.

    A row store (e.g. :class:`empirics.data.activation_store.ActivationStore`, memory-mapped shards) has
    ``shape`` (N, d_in), ``dtype``, ``__getitem__(int array) -> (len, d_in) array`` and
    ``content_hash()``; its rows are checked for NaN/inf as they are read. A store's ``manifest``
    (model name, hook, context) is copied into the saved config.
    """

    def __init__(self, X: Any, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.store: Any = None
        self.tensor: torch.Tensor | None = None
        if isinstance(X, np.ndarray):
            _check_shape(X.shape, X.dtype)
            if not np.isfinite(X).all():
                raise ValueError("X contains NaN or inf")
            self._check_range(X, "X")
            self.hash = data_hash(X)
            self.tensor = torch.from_numpy(np.ascontiguousarray(X)).to(dtype)
        elif all(hasattr(X, name) for name in ("shape", "dtype", "__getitem__", "content_hash")):
            _check_shape(tuple(X.shape), np.dtype(X.dtype))
            self.store = X
            self.hash = str(X.content_hash())
        else:
            raise ValueError(f"X must be a numpy array of shape (N, d_in), tokens as rows, or an activation store; "
                             f"got {type(X).__name__}")
        self.shape = (int(X.shape[0]), int(X.shape[1]))

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        if self.tensor is not None:
            return self.tensor[idx]
        rows = np.asarray(self.store[idx.numpy()])
        if not np.isfinite(rows).all():
            raise ValueError("the activation store holds NaN or inf")
        self._check_range(rows, "the activation store")
        return torch.from_numpy(np.ascontiguousarray(rows)).to(self.dtype)

    def _check_range(self, X: np.ndarray, what: str) -> None:
        """ValueError when a row's squared norm could overflow the training dtype: entries beyond
        √(max / (4·d_in)) (float32: 4.6e18 at d_in = 4), or beyond float32's range altogether."""
        limit = math.sqrt(float(torch.finfo(self.dtype).max) / (4 * max(int(X.shape[1]), 1)))
        biggest = float(np.max(np.abs(X), initial=0.0))
        if biggest > limit:
            raise ValueError(f"{what} has entries up to {biggest:.3g} in magnitude: training in {self.dtype} squares "
                             f"them, which overflows beyond {limit:.3g} at d_in = {X.shape[1]}; rescale the data "
                             "(objective (1) is homogeneous: λ scales with it) or train in float64")


def _source_fields(X: Any) -> dict[str, Any]:
    """SaeConfig fields naming where the rows came from: an activation store's model and hook."""
    manifest = getattr(X, "manifest", None)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("hook"), dict):
        return {}
    return {"hook": manifest["hook"], "model_name": manifest.get("model_name"),
            "hook_name": manifest["hook"].get("hook_name"), "context_size": manifest.get("context")}


def _check_shape(shape: tuple[int, ...], dtype: np.dtype) -> None:
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"X must have shape (N, d_in) with N, d_in >= 1 (tokens as rows), got {shape}")
    if not np.issubdtype(dtype, np.floating):
        raise ValueError(f"X must be a floating-point array, got dtype {dtype}")


class _Checkpoints:
    """The checkpoints of a run in ``out/checkpoints`` (rank 0 writes; every rank takes part in the
    RNG-state gather), or nothing when there is no ``out``."""

    def __init__(self, out: Path | None, world: World, keep: int) -> None:
        self.dir = None if out is None else out / CHECKPOINT_DIR
        self.world, self.keep = world, keep
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            if world.is_main:
                for stale in self.dir.glob(".ckpt_*.tmp"):  # left by a kill during a checkpoint write
                    with contextlib.suppress(OSError):
                        stale.unlink()

    def path(self, step: int) -> Path | None:
        return None if self.dir is None else self.dir / f"ckpt_{step:08d}.pt"

    def existing(self) -> bool:
        return self.dir is not None and bool(checkpoints(self.dir))

    def resume(self) -> tuple[Path, dict[str, Any]] | None:
        return None if self.dir is None else resume_checkpoint(self.dir, self.world)

    def write(self, step: int, state: dict[str, Any], device: torch.device) -> Path | None:
        """Write ``state`` (+ every rank's RNG states) as the checkpoint of ``step``; keep the newest ``keep``."""
        rank_rng = self.world.gather(torch.get_rng_state())  # a collective: every rank takes part
        rank_cuda_rng = self.world.gather(torch.cuda.get_rng_state(device)) if device.type == "cuda" else None
        path = self.path(step)
        if path is None or not self.world.is_main:
            return path
        save_checkpoint({**state, "format": CKPT_FORMAT, "step": step, "torch_rng": rank_rng[0],
                         "cuda_rng": rank_cuda_rng[0] if rank_cuda_rng is not None else None,
                         "world_size": self.world.size, "rank_rng": rank_rng, "rank_cuda_rng": rank_cuda_rng}, path)
        for _, old in checkpoints(self.dir)[: -self.keep]:
            with contextlib.suppress(OSError):
                old.unlink()
        return path


def _check_resumable(ck: dict[str, Any], out: Path, world: World, fields: dict[str, Any], dhash: str,
                     d_in: int) -> None:
    """ValueError when the checkpoint was written by another number of ranks, model, config or data."""
    if ck.get("world_size", 1) != world.size:
        raise ValueError(f"cannot resume {out}: its checkpoint was written by {ck.get('world_size', 1)} "
                         f"rank(s), this run has {world.size}; resume with the same number of ranks")
    if ck["config"] != fields:
        diff = {k: (ck["config"].get(k), v) for k, v in fields.items() if ck["config"].get(k) != v}
        raise ValueError(f"cannot resume {out}: config differs from the checkpoint's (checkpoint, now): {diff}")
    if ck["data_hash"] != dhash or ck["d_in"] != d_in:
        raise ValueError(f"cannot resume {out}: the data differ from the checkpoint's (sha256 {ck['data_hash'][:12]}… "
                         f"vs {dhash[:12]}…)")


def train(
    model: Featurizer,
    X: Any,
    config: TrainConfig | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    resume: bool = False,
    progress: bool | None = None,
    world: World | None = None,
    on_step: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train ``model`` (built by its architecture) on ``X`` under ``config``; write to ``out`` if given.

    ``X`` is an (N, d_in) float array, tokens as rows, or a row store such as
    :func:`dictcheck.empirics.data.activation_store.open_activations` returns (memory-mapped shards, read
    batch by batch; its ``content_hash()`` stands in for the data hash). See the module docstring for
    the full behaviour. ``resume`` (needs ``out``) continues from the newest readable checkpoint, which
    is validated and loaded into ``model``. ``on_step(step)`` is called after every completed step (1-based; after
    any checkpoint of that step). ``world`` (default: :func:`dictcheck.empirics.training.distributed.current_world`,
    i.e. the torchrun process group when one is initialised) makes this one of ``world.size``
    data-parallel ranks: ``batch_size`` is the global batch, each rank trains on its 1/size of it, and
    only rank 0 writes files. Every rank returns the same result.
    Before anything is allocated or written: the memory the run needs
    (:func:`training_memory_bytes`) and, with ``out``, the free disk its checkpoints and folder need
    are checked (:class:`dictcheck.empirics.io.safe_files.ResourceError`), and ``out`` is locked for the
    run (:class:`dictcheck.empirics.io.safe_files.FolderInUseError` while another process trains into it).
    A checkpoint to resume from is validated field by field first
    (:func:`dictcheck.empirics.training.checkpoints.check_checkpoint`); unreadable checkpoints are never
    skipped silently (:class:`dictcheck.empirics.training.checkpoints.CheckpointError`).
    Raises ValueError for a bad config, model or data (also a batch_size not divisible by the number of
    ranks, or resuming a checkpoint written by another number of ranks), FileExistsError when
    ``resume`` is False and ``out`` already holds checkpoints, FloatingPointError on a non-finite loss.
    """
    if not isinstance(model, Featurizer) or model.arch_options is None:
        raise ValueError("train() needs a model built by its architecture (architecture(name).build(...)), "
                         f"got {type(model).__name__}")
    cfg = (config or TrainConfig()).for_model(model)
    if resume and out is None:
        raise ValueError("resume=True needs the output folder out that holds the checkpoints")
    world = current_world() if world is None else world
    Xt = _Rows(X, _model_dtype(model))
    d_in = Xt.shape[1]
    if d_in != model.d_in:
        raise ValueError(f"X has {d_in} columns but the model was built for d_in = {model.d_in}")
    d_sae = int(model.d_sae)
    device = cfg.resolved_device()
    if world.size > 1 and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
    B = int(cfg.batch_size)
    if B % world.size:
        raise ValueError(f"TrainConfig: batch_size {B} must be divisible by the number of ranks {world.size} "
                         "(batch_size is the global batch)")
    fields = {**model_fields(model), **{name: getattr(cfg, name) for name in _RESULT_FIELDS}}

    out_dir = None if out is None else Path(out)
    check_memory(training_memory_bytes(model, B), f"training {model.arch} with d_sae {d_sae} (batch {B})")
    if out_dir is not None and world.is_main:
        check_free_space(out_dir, _output_bytes(model, cfg), "the run's checkpoints, log and folder")
    writes = out_dir is not None and world.is_main
    fresh = writes and not (out_dir / CHECKPOINT_DIR).exists()
    with folder_lock(out_dir, "dictcheck train") if writes else contextlib.nullcontext():
        try:
            return _train_into(model, X, Xt, cfg, out_dir, world, device, fields, resume=resume, progress=progress,
                               on_step=on_step)
        except BaseException:
            if fresh:
                _remove_unfinished(out_dir)
            raise


def _remove_unfinished(out_dir: Path) -> None:
    """After a run that had no checkpoint to start from failed (an error, Ctrl-C, SIGTERM): if it wrote no
    checkpoint either, remove what it created (its checkpoints folder and log), so nothing half-made stays
    behind; the folder lock then removes the folders it created if that left them empty. Any other file in
    the folder is left alone."""
    ckpt_dir = out_dir / CHECKPOINT_DIR
    if ckpt_dir.is_dir() and any(ckpt_dir.glob("ckpt_*.pt")):
        return
    with contextlib.suppress(OSError):
        for stale in ckpt_dir.glob(".ckpt_*.tmp"):
            stale.unlink()
        ckpt_dir.rmdir()
    with contextlib.suppress(OSError):
        (out_dir / LOG_FILE).unlink()


#: Bytes per log record (a JSON line of a dozen numbers), and for cfg.json and metrics.json together.
_LOG_RECORD_BYTES = 512
_FOLDER_JSON_BYTES = 64 << 10


def _output_bytes(model: Featurizer, cfg: TrainConfig) -> int:
    """Disk a run writes: ``keep_checkpoints`` + 1 checkpoints alive at once (the new one is written
    before the oldest goes), each the weights and Adam's two moments; the saved weights and sparsity;
    the log and the folder's JSON files."""
    n = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    records = cfg.steps // cfg.log_every + 1
    return ((3 * (cfg.keep_checkpoints + 1) + 2) * n * _model_dtype(model).itemsize
            + records * _LOG_RECORD_BYTES + _FOLDER_JSON_BYTES)


def training_memory_bytes(model: Featurizer, batch_size: int, n_rows: int = 0) -> int:
    """An estimate of what training ``model`` allocates beyond the model itself: gradients and Adam's
    two moments (3 × its parameters and buffers), one step's activations
    (:meth:`Architecture.step_bytes`) and a copy of ``n_rows`` in-memory training rows at the model's
    dtype. ``model`` may live on the meta device (shapes only, nothing allocated)."""
    elem = _model_dtype(model).itemsize
    n = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    step = architecture(model.arch).step_bytes(int(model.d_in), int(model.d_sae), model.arch_options, batch_size, elem)
    return 3 * n * elem + step + n_rows * int(model.d_in) * elem


def check_training_memory(arch: str, d_in: int, d_sae: int, options: Any = None, *, batch_size: int, n_rows: int = 0,
                          dtype: torch.dtype = torch.float32) -> None:
    """:class:`dictcheck.empirics.io.safe_files.ResourceError` (one line) when training would need more memory
    than is available, decided before the model is built: first the d_sae × d_in matrix every
    architecture holds (4 copies: weights, gradients, Adam's moments), then the model built on the meta
    device (shapes only) with :func:`training_memory_bytes`. ValueError for invalid options."""
    elem = dtype.itemsize
    what = f"training {arch} with d_in {d_in}, d_sae {d_sae} (batch {batch_size})"
    check_memory(4 * d_in * d_sae * elem, what)
    with torch.device("meta"):
        model = architecture(arch).build(d_in, d_sae, options, dtype=dtype)
    weights = sum(t.numel() for t in (*model.parameters(), *model.buffers())) * elem
    check_memory(weights + training_memory_bytes(model, batch_size, n_rows), what)


def _train_into(model: Featurizer, X: Any, Xt: _Rows, cfg: TrainConfig, out_dir: Path | None, world: World,
                device: torch.device, fields: dict[str, Any], *, resume: bool, progress: bool | None,
                on_step: Callable[[int], None] | None) -> TrainResult:
    """The body of :func:`train` once everything is validated (and ``out_dir`` locked)."""
    arch = architecture(model.arch)
    N, d_in = Xt.shape
    d_sae = int(model.d_sae)
    B, steps = int(cfg.batch_size), int(cfg.steps)
    T_dead = t_dead(steps, B)
    store = _Checkpoints(out_dir, world, cfg.keep_checkpoints)
    log_path = None if out_dir is None else out_dir / LOG_FILE
    found = store.resume() if resume else None
    ck = None if found is None else found[1]
    if found is not None:
        check_checkpoint(ck, found[0], model=model, steps=steps, d_sae=d_sae)
        _check_resumable(ck, out_dir, world, fields, Xt.hash, d_in)
    elif not resume and store.existing():
        raise FileExistsError(f"{store.dir} already holds checkpoints; pass resume=True or use an empty out_dir")

    if ck is None:
        model.set_centring_(_b_dec_init(cfg, model, Xt))
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=float(cfg.lr))
    gen = torch.Generator(device="cpu")
    gen.manual_seed(cfg.seed)
    since_fired = torch.zeros(d_sae, dtype=torch.int64, device=device)
    start = 0
    records: list[dict[str, Any]] = []

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if ck is None:
            with torch.no_grad():
                model.project_parameters_()
            torch.manual_seed(rank_seed(cfg.seed, world.rank))  # any randomness inside forward()
            if world.is_main and log_path is not None and log_path.exists():
                log_path.unlink()
        else:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            gen.set_state(ck["batch_rng"])
            torch.set_rng_state(ck["rank_rng"][world.rank] if world.size > 1 else ck["torch_rng"])
            cuda_rng = ck.get("rank_cuda_rng" if world.size > 1 else "cuda_rng")
            if device.type == "cuda" and cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng[world.rank] if world.size > 1 else cuda_rng, device)
            since_fired = ck["since_fired"].to(device)
            start = int(ck["step"])
            if world.is_main:
                truncate_log(log_path, start)
        resumed_from = start if ck is not None else None
        net = world.wrap(model)
        note = arch.ddp_inexactness(model.arch_options) if world.size > 1 else None
        if note is not None and world.is_main:
            print(f"[dictcheck.train] note: {world.size} ranks are not exactly one process with batch {B}: {note}",
                  file=sys.stderr, flush=True)

        def checkpoint(step: int) -> Path | None:
            return store.write(step, {
                "tokens": step * B,
                "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                "optimizer": to_cpu(opt.state_dict()),
                "batch_rng": gen.get_state(),
                "since_fired": since_fired.detach().cpu().clone(),
                "config": fields,
                "data_hash": Xt.hash,
                "d_in": d_in,
            }, device)

        bar = _Progress(progress if world.is_main else False, steps * B, start * B)
        wandb_run = _wandb_run(cfg, model, out_dir) if world.is_main else None
        t0 = time.perf_counter()
        final_loss = float("nan")
        last_ckpt = store.path(start)
        wants_dead = model.wants_dead_mask()
        try:
            writes_log = world.is_main and log_path is not None
            with log_path.open("a", encoding="utf-8") if writes_log else contextlib.nullcontext() as log:
                for step in range(start, steps):
                    idx = torch.randint(N, (B,), generator=gen)
                    xb = Xt[world.shard(idx)].to(device, non_blocking=False)
                    lr_t = float(cfg.lr) * lr_schedule(step, steps)
                    for group in opt.param_groups:
                        group["lr"] = lr_t
                    dead = since_fired >= T_dead
                    model.set_step(step)
                    res = net(xb, dead_mask=dead if wants_dead else None)
                    opt.zero_grad(set_to_none=True)
                    res.loss.backward()
                    model.project_gradients_()
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(cfg.clip_grad_norm))
                    opt.step()
                    with torch.no_grad():
                        model.project_parameters_()
                    with torch.no_grad():
                        fired = world.any(res.fired(d_sae))
                        since_fired = torch.where(fired, torch.zeros_like(since_fired), since_fired + B)
                    done = step + 1
                    bar.update(B)
                    if done % cfg.log_every == 0 or done == steps:
                        means = _batch_means(res, world)
                        loss_v = means["loss"]
                        if not math.isfinite(loss_v):
                            raise FloatingPointError(f"non-finite loss {loss_v} at step {done}")
                        final_loss = loss_v
                        rec = {
                            "step": done,
                            "tokens": done * B,
                            "lr": lr_t,
                            **means,
                            "dead_frac_train": float((since_fired >= T_dead).double().mean()),
                            "grad_norm": float(grad_norm),
                            "elapsed_s": round(time.perf_counter() - t0, 3),
                        }
                        records.append(rec)
                        if world.is_main:
                            bar.report(rec, steps)
                        if log is not None:
                            log.write(json.dumps({k: _finite_or_none(v) for k, v in rec.items()}) + "\n")
                            log.flush()
                        if wandb_run is not None:
                            wandb_run.log(rec, step=done)
                    if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == steps:
                        if log is not None:
                            log.flush()
                            os.fsync(log.fileno())
                        last_ckpt = checkpoint(done)
                    if on_step is not None:
                        on_step(done)
        finally:
            bar.close()
            if wandb_run is not None:
                wandb_run.finish()
        if start == steps:  # resumed from the final checkpoint: only the save was missing
            last_ckpt = store.path(steps)
            if world.is_main:
                with contextlib.suppress(OSError, json.JSONDecodeError, IndexError):
                    lines = log_path.read_text(encoding="utf-8").splitlines()
                    final_loss = float(json.loads(lines[-1])["loss"])

        dead_frac_train = float((since_fired >= T_dead).double().mean())
        model.eval()
        # Evaluation and the save are rank 0's; the broadcast also keeps the others until it is done.
        metrics, sparsity = _evaluate(model, Xt, cfg, device) if world.is_main else ({}, None)
    metrics, final_loss = world.broadcast((metrics, final_loss) if world.is_main else None)
    metrics.update(
        dead_frac_train=dead_frac_train,
        eval_split="train",
        n_train_tokens=steps * B,
        n_data_tokens=N,
        final_loss=final_loss,
    )
    metrics = {k: _finite_or_none(v) for k, v in metrics.items()}
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_weights().items()}
    if out_dir is not None:
        if world.is_main:
            _save_folder(out_dir, model, weights, cfg, X, Xt.hash, T_dead, N, world.size, sparsity, metrics)
        world.broadcast(None)  # no rank returns before the folder is complete
    return TrainResult(
        model=model,
        weights=weights,
        metrics=metrics,
        steps=steps,
        n_tokens=steps * B,
        resumed_from=resumed_from,
        final_loss=final_loss,
        dead_frac_train=dead_frac_train,
        log=records,
        out_dir=out_dir,
        log_path=log_path,
        checkpoint_path=last_ckpt,
    )


def _save_folder(out: Path, model: Featurizer, weights: dict[str, torch.Tensor], cfg: TrainConfig, X: Any,
                 dhash: str, T_dead: int, N: int, world_size: int, sparsity: torch.Tensor | None,
                 metrics: dict[str, Any]) -> None:
    """The SAELens-layout folder of a trained model (module docstring, "Output")."""
    arch = architecture(model.arch)
    top, others = arch.saved_options(model.arch_options)
    steps, B = int(cfg.steps), int(cfg.batch_size)
    sae_cfg = new_sae_config(
        model.arch,
        int(model.d_in),
        int(model.d_sae),
        k=top.get("k"),
        lam=top.get("lam"),
        seed=cfg.seed,
        n_tokens=steps * B,
        data_hash=dhash,
        arch_fields=model.arch_fields(),
        dtype=_DTYPE_NAMES[_model_dtype(model)],
        device="cpu",
        **_source_fields(X),
    )
    sae_cfg.metadata["dictcheck"]["training"] = {
        "steps": steps,
        "batch_size": B,
        "lr": float(cfg.lr),
        "lr_schedule": "warmup_min(1000,5%)_constant_lineardecay_last20%",
        "aux_coef": float(top.get("aux_coef", 0.0)),
        "b_dec_init": cfg.b_dec_init,
        "k": top.get("k"),
        "options": others,
        "clip_grad_norm": float(cfg.clip_grad_norm),
        "T_dead": T_dead,
        "n_data_tokens": N,
        "data_hash_kind": "sha256 of X bytes",
        "world_size": world_size,
    }
    save_sae(out, weights, sae_cfg, sparsity=sparsity, metrics=metrics)


T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class BestRun(Generic[T, R]):
    """The run :func:`best_of_runs` kept (its candidate, result and index), and every run's result and
    objective in candidate order."""

    candidate: T
    result: R
    chosen: int
    objectives: list[float]
    results: list[R]


def best_of_runs(candidates: Sequence[T], run: Callable[[T], R], objective: Callable[[R], float]) -> BestRun[T, R]:
    """Run every candidate (e.g. a (seed, lr) pair) in order and keep the run with the lowest training
    ``objective`` (the first on ties). The choice looks only at what ``objective`` reads (the training
    objective), never at a verdict; every run's objective is returned."""
    if not candidates:
        raise ValueError("best_of_runs needs at least one candidate")
    results = [run(c) for c in candidates]
    objectives = [float(objective(r)) for r in results]
    chosen = min(range(len(results)), key=lambda i: objectives[i])
    return BestRun(candidate=candidates[chosen], result=results[chosen], chosen=chosen, objectives=objectives,
                   results=results)


@torch.no_grad()
def _evaluate(model: Featurizer, Xt: _Rows, cfg: TrainConfig, device: torch.device) -> tuple[dict[str, Any], torch.Tensor]:
    """metrics.json contents and log10 firing frequency on a seeded subset of the training rows.

    Input-space reconstruction metrics when the model has an input-space ``x_hat``; the model's
    ``extra`` batch means averaged over tokens (e.g. ``nmse_lifted``); its ``firing_metrics``.
    """
    N = Xt.shape[0]
    n_eval = min(N, cfg.eval_tokens)
    if n_eval < N:
        g = torch.Generator(device="cpu")
        g.manual_seed(cfg.seed + 1)
        rows = torch.randperm(N, generator=g)[:n_eval].sort().values
    else:
        rows = torch.arange(N)
    x_parts, xh_parts = [], []
    extra_sums: dict[str, float] = {}
    extra_weight = 0
    fire = torch.zeros(model.d_sae, dtype=torch.int64)
    nnz = 0
    chunk = max(1, min(cfg.batch_size, 8192))
    for i in range(0, n_eval, chunk):
        xb = Xt[rows[i : i + chunk]]
        res = model(xb.to(device))
        active = (res.codes.detach().reshape(xb.shape[0], model.d_sae) != 0).cpu()
        fire += active.sum(dim=0)
        nnz += int(active.sum())
        weight = xb.shape[0] if res.extra_tokens is None else res.extra_tokens
        extra_weight += weight
        for name, value in res.extra.items():
            extra_sums[name] = extra_sums.get(name, 0.0) + float(value) * weight
        if res.x_hat is not None:
            x_parts.append(xb.to(torch.float64).numpy())
            xh_parts.append(res.x_hat.detach().cpu().to(torch.float64).reshape(xb.shape).numpy())
    metrics: dict[str, Any] = {}
    if x_parts:
        try:
            metrics.update(reconstruction_metrics(np.concatenate(x_parts), np.concatenate(xh_parts)))
        except ValueError as exc:  # e.g. zero-variance data: keep training results, say why
            metrics["metrics_error"] = str(exc)
    metrics.update({name: total / extra_weight for name, total in extra_sums.items()})
    if extra_sums:
        metrics["eval_batch_size"] = int(min(chunk, n_eval))
    metrics.update(model.firing_metrics(fire, n_eval))
    metrics["l0"] = nnz / n_eval
    metrics["dead_frac"] = float((fire == 0).double().mean())
    metrics["n_eval_tokens"] = int(n_eval)
    freq = fire.to(torch.float64) / n_eval
    sparsity = torch.log10(freq).to(Xt.dtype)  # -inf where a latent never fired
    return metrics, sparsity
