"""``dictcheck train``: train a featurizer on an .npy file or a built-in toy and save it (SAELens layout).

    dictcheck train --arch ARCH (--data X.npy | --toy NAME) --d-sae M
                    [--k K] [--lam L] [--steps S] [--batch-size B] [--lr LR] [--seed S]
                    [--aux-coef A] [--checkpoint-every C] [--log-every L] [--dtype float32|float64]
                    [--device auto|cpu|cuda] [--nproc P] --out DIR [--resume] [--wandb PROJECT] [--json]
                    [BSF: --block-size Q [--denoise SNR] [--c-gl C] [--gate shrink|ste]]
                    [bilinear: --hoyer-coef A [--decoder symmetric|asymmetric] [--n-atoms N] [--k-c K] [--c-l1 C] [--tile T]]
                    [vasae: --k K --anchor-coef A --anchor-source SRC [--anchor-every M] [--tie none|hard]]

ARCH is a linear SAE (relu, topk, batchtopk, jumprelu, abs), a block-sparse featurizer (bsf-vanilla,
bsf-grassmann, bsf-grouplasso; d_sae = n_b·q, k = active blocks) or a bilinear autoencoder
(bilinear-quadratic, bilinear-atomic, bilinear-compound; d_sae = number of latents), or a
vocabulary-anchored TopK SAE (vasae).
The λ of ``relu``/``abs`` is the λ of theory objective (1) (penalty 2λ‖z‖₁, mean over tokens);
``jumprelu`` uses it for its L0 penalty. A run killed at any moment resumes with ``--resume``.

**Several processes** (:mod:`empirics.training.distributed`). ``--nproc P`` starts P data-parallel ranks
through PyTorch's elastic launcher (what ``torchrun --standalone --nproc-per-node P`` runs) with
the same arguments minus ``--nproc``; ``torchrun --nproc-per-node P -m dictcheck.proofs_checks.cli train ...``
works as well. ``--batch-size`` is the global batch (divisible by P). A failed rank ends the job
with one line naming the rank and what happened (exit code 2 for a user error, else 1) and, when
a checkpoint exists, how to ``--resume``; each worker records its one-line error in torchrun's
error file (``TORCHELASTIC_ERROR_FILE``). Workers default to OMP_NUM_THREADS = cores // P.
Fault injection for tests: ``DICTCHECK_FAULT_INJECT=RANK:STEP`` makes rank RANK kill itself
(SIGKILL) after completing step STEP.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dictcheck.empirics.architectures import REGISTRY, architecture, names
from dictcheck.empirics.data.toys import TOYS, make_toy
from dictcheck.proofs_checks.cli.inputs import load_points, output_dir, positive_lambda
from dictcheck.proofs_checks.cli.ranks import (
    failed_rank_line,
    launch_ranks,
    record_worker_crash,
    report_worker_error,
    user_error_line,
)
from dictcheck.proofs_checks.errors import UserError

if TYPE_CHECKING:  # torch and the training loop load when a run starts, not when the parser is built
    from dictcheck.empirics.architectures.featurizer import Featurizer
    from dictcheck.empirics.training.distributed import World
    from dictcheck.empirics.training.loop import TrainConfig

_FAULT_ENV = "DICTCHECK_FAULT_INJECT"


def _data(args: argparse.Namespace) -> Any:
    """The training rows: an .npy file, an activation directory (memory-mapped), or a toy."""
    if (args.data is None) == (args.toy is None):
        raise UserError("give exactly one of --data X.npy and --toy NAME")
    if args.data is not None:
        if Path(args.data).is_dir():
            from dictcheck.empirics.data.activation_store import open_activations

            try:
                return open_activations(args.data)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        return load_points(args.data)
    if args.toy not in TOYS:
        raise UserError(f"unknown toy {args.toy!r}; choose one of {', '.join(sorted(TOYS))}")
    return make_toy(args.toy, seed=args.seed).X.T


def _option_fields() -> dict[str, list[tuple[str, Any]]]:
    """Every command-line option of the registered architectures: name -> [(arch, dataclass field)]."""
    found: dict[str, list[tuple[str, Any]]] = {}
    for arch in REGISTRY.values():
        for f in dataclasses.fields(arch.Options):
            if f.metadata.get("cli", True):
                found.setdefault(f.name, []).append((arch.name, f))
    return found


def _config(args: argparse.Namespace) -> TrainConfig:
    from dictcheck.empirics.training.loop import TrainConfig

    settings: dict[str, Any] = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
                                "wandb_project": args.wandb, "device": args.device}
    for name in ("checkpoint_every", "log_every"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    cfg = TrainConfig(**settings)
    cfg.validate()
    return cfg


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The architecture options given on the command line."""
    return {name: getattr(args, name) for name in _option_fields() if getattr(args, name, None) is not None}


def _model(args: argparse.Namespace, d_in: int) -> Featurizer:
    """The architecture's fresh model with the options given on the command line (seed ``--seed``)."""
    import torch

    return architecture(args.arch).build(d_in, args.d_sae, _options(args), seed=args.seed,
                                         dtype=getattr(torch, args.dtype))


def _fault_injection(rank: int) -> Callable[[int], None] | None:
    """The ``on_step`` hook of ``DICTCHECK_FAULT_INJECT=RANK:STEP`` (tests: a rank killed mid-run)."""
    spec = os.environ.get(_FAULT_ENV)
    if not spec:
        return None
    try:
        target_rank, target_step = (int(v) for v in spec.split(":"))
    except ValueError:
        raise UserError(f"{_FAULT_ENV} must be RANK:STEP, got {spec!r}") from None

    def on_step(step: int) -> None:
        if step == target_step:
            os.kill(os.getpid(), signal.SIGKILL)

    return on_step if rank == target_rank else None


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck train``: here, as one rank under torchrun, or launching ``--nproc`` ranks."""
    from dictcheck.empirics.training.distributed import SINGLE, env_world_size, process_group

    if args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}")
    try:
        world_size = env_world_size()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.nproc > 1:
        if world_size > 1:
            raise UserError("--nproc starts torchrun itself; under torchrun leave --nproc out")
        return _launch(args)
    if world_size == 1:
        return _train_here(args, SINGLE)
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = _config(args)
        with process_group(cuda=cfg.resolved_device().type == "cuda") as world:
            return _train_here(args, world, cfg)
    except UserError as exc:
        return report_worker_error(world_size, rank, str(exc))
    except (ValueError, FileExistsError) as exc:
        return report_worker_error(world_size, rank, str(exc).splitlines()[0])
    except Exception as exc:  # a crash, or a peer lost: the launcher reports it, not a traceback per rank
        return record_worker_crash(exc)


def _train_here(args: argparse.Namespace, world: World, cfg: TrainConfig | None = None) -> int:
    """Train in this process (rank ``world.rank`` of ``world.size``); rank 0 prints the summary. The
    output folder, λ, the anchor source, the data, the config and the memory the run needs are
    checked before the model is built (the folder by rank 0 only: it alone writes, and locks it)."""
    import torch

    from dictcheck.empirics.training.loop import check_training_memory, train

    if world.is_main:
        output_dir(args.out)
    if getattr(args, "lam", None) is not None:
        positive_lambda(args.lam)
    if getattr(args, "anchor_source", None) is not None:
        from dictcheck.empirics.architectures.vasae import load_embedding

        try:
            load_embedding(args.anchor_source)  # cached: the model's first forward reuses it
        except ValueError as exc:
            raise UserError(f"--anchor-source: {str(exc).splitlines()[0]}") from None
    X = _data(args)
    try:
        cfg = _config(args) if cfg is None else cfg
        check_training_memory(args.arch, int(X.shape[1]), args.d_sae, _options(args), batch_size=cfg.batch_size,
                              n_rows=int(X.shape[0]) if isinstance(X, np.ndarray) else 0,
                              dtype=getattr(torch, args.dtype))
        model = _model(args, int(X.shape[1]))
        result = train(model, X, cfg, args.out, resume=args.resume, world=world, on_step=_fault_injection(world.rank))
    except (ValueError, FileExistsError, FloatingPointError) as exc:  # bad config, W&B missing, --out in use, NaN
        raise UserError(str(exc).splitlines()[0]) from None
    if not world.is_main:
        return 0
    summary = {"out": str(result.out_dir), "steps": result.steps, "n_tokens": result.n_tokens,
               "resumed_from": result.resumed_from, "final_loss": result.final_loss,
               "dead_frac_train": result.dead_frac_train, "metrics": result.metrics}
    if args.json:
        print(json.dumps(summary))
    else:
        m = result.metrics
        print(f"trained {args.arch} (d_sae {args.d_sae}) for {result.steps} steps, {result.n_tokens} tokens"
              + (f", resumed from step {result.resumed_from}" if result.resumed_from else ""))
        shown = [name for name in ("fvu", "ve", "nmse_lifted", "hoyer_density", "l0", "block_l0", "dead_frac")
                 if isinstance(m.get(name), (int, float))]
        print("  " + "  ".join(f"{name} {m[name]:.4g}" for name in shown))
        print(f"  saved to {result.out_dir} (cfg.json + sae_weights.safetensors, train_log.jsonl, checkpoints/)")
    return 0


def _launch(args: argparse.Namespace) -> int:
    """Run ``dictcheck train`` (minus ``--nproc``) in ``args.nproc`` ranks under torch's elastic launcher."""
    return launch_ranks("train", args, lambda rank, failure: _failure_line(rank, failure, args.out))


def _failure_line(rank: int, failure: Any, out: str) -> tuple[str, int]:
    """(one-line message, exit code) for the root failure of a launched job (a torch
    ``ProcessFailure``: ``exitcode``, ``signal_name()``, ``error_file_data``). A recorded traceback
    is saved as ``out/rank<r>_traceback.txt``."""
    user = user_error_line(rank, failure)
    if user is not None:
        return user
    what = failed_rank_line(rank, failure, Path(out))
    from dictcheck.empirics.training.loop import latest_checkpoint

    ckpt = latest_checkpoint(out)
    hint = (f"; the newest checkpoint is {ckpt.name}: rerun the same command with --resume to continue"
            if ckpt is not None else "; no checkpoint was written yet")
    return f"distributed training failed: {what}{hint}", 1


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck train``."""
    p = commands.add_parser("train", help="train an SAE, BSF or bilinear autoencoder and save it in the SAELens layout",
                            epilog="The options of the architectures (--k, --lam, --block-size, ...) are listed by "
                            "`dictcheck train --arch ARCH --help`.")
    p.add_argument("--arch", required=True, choices=names(), help="the architecture; its options load when it is named")
    p.add_argument("--data", metavar="X.npy|DIR", help="training data (N, D), one token per row, or a directory "
                   "written by `dictcheck activations`")
    p.add_argument("--toy", metavar="NAME", help="a built-in toy data set instead of --data")
    p.add_argument("--d-sae", required=True, type=int, help="number of latents")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--lr", type=float, help="Adam learning rate (default: the architecture's; SAEs "
                   "2e-4/sqrt(d_sae/2^14))")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisation and of the batch order")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    p.add_argument("--log-every", type=int, help="steps between log records (default 100)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N; with several "
                   "ranks on CUDA each rank uses GPU LOCAL_RANK")
    p.add_argument("--nproc", type=int, default=1, metavar="P",
                   help="train with P data-parallel processes (DDP; gloo on CPU, nccl on CUDA); "
                   "--batch-size is the global batch")
    p.before_parsing(_add_option_groups)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--wandb", metavar="PROJECT", help="also log to Weights & Biases (needs the wandb package)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(handler=run_train)


def _add_option_groups(p: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """When ``argv`` names an architecture (``--arch``): one argument group per architecture family, built from
    the options dataclasses (which loads the architectures' modules, and torch): each option once, in the group
    of the first family that declares it, its help naming the architectures that take it. Every architecture's
    options are added, so an option of another one is refused by the architecture with its allowed list."""
    if not any(a == "--arch" or a.startswith("--arch=") for a in argv):
        return
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, uses in _option_fields().items():
        first = architecture(uses[0][0])
        group = groups.get(first.family) or groups.setdefault(first.family, p.add_argument_group(first.family_title))
        helps: dict[str, list[str]] = {}
        for arch_name, f in uses:
            helps.setdefault(f.metadata["help"], []).append(arch_name)
        text = helps.popitem()[0] if len(helps) == 1 else "; ".join(f"{', '.join(a)}: {h}" for h, a in helps.items())
        f = uses[0][1]
        flag = "--" + name.replace("_", "-")
        if isinstance(f.default, bool):  # --name / --no-name; unset (None) leaves the architecture's default
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            group.add_argument(flag, type=f.metadata["type"], choices=f.metadata["choices"], help=text)
