"""``dictcheck train``: train a featurizer on an .npy file or a built-in toy and save it (SAELens layout).

    dictcheck train --arch ARCH (--data X.npy | --toy NAME) --d-sae M
                    [--k K] [--lam L] [--steps S] [--batch-size B] [--lr LR] [--seed S]
                    [--aux-coef A] [--checkpoint-every C] --out DIR [--resume] [--wandb PROJECT] [--json]
                    [BSF: --block-size Q [--denoise SNR] [--c-gl C] [--gate shrink|ste]]
                    [bilinear: --hoyer-coef A [--decoder symmetric|asymmetric] [--n-atoms N] [--k-c K] [--c-l1 C] [--tile T]]

ARCH is a linear SAE (relu, topk, batchtopk, jumprelu, abs), a block-sparse featurizer (bsf-vanilla,
bsf-grassmann, bsf-grouplasso; d_sae = n_b·q, k = active blocks) or a bilinear autoencoder
(bilinear-quadratic, bilinear-atomic, bilinear-compound; d_sae = number of latents).
The λ of ``relu``/``abs`` is the λ of theory objective (1) (penalty 2λ‖z‖₁, mean over tokens);
``jumprelu`` uses it for its L0 penalty. A run killed at any moment resumes with ``--resume``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


from empirics.toy_data import TOYS, make_toy
from empirics.training import ARCHS, TrainConfig, train
from proofs_checks.errors import UserError
from proofs_checks.inputs import load_points


#: argparse destinations that are architecture options (TrainConfig.options), same names.
_ARCH_OPTIONS = ("block_size", "denoise", "c_gl", "gate", "hoyer_coef", "decoder", "n_atoms", "k_c", "c_l1", "tile")


def _data(args: argparse.Namespace) -> Any:
    """The training rows: an .npy file, an activation directory (memory-mapped), or a toy."""
    if (args.data is None) == (args.toy is None):
        raise UserError("give exactly one of --data X.npy and --toy NAME")
    if args.data is not None:
        if Path(args.data).is_dir():
            from empirics.activation_store import open_activations

            try:
                return open_activations(args.data)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        return load_points(args.data)
    if args.toy not in TOYS:
        raise UserError(f"unknown toy {args.toy!r}; choose one of {', '.join(sorted(TOYS))}")
    return make_toy(args.toy, seed=args.seed).X.T


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck train``."""
    X = _data(args)
    options: dict[str, Any] = {"arch": args.arch, "d_sae": args.d_sae, "k": args.k, "lam": args.lam,
                               "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
                               "aux_coef": args.aux_coef, "wandb_project": args.wandb}
    if args.checkpoint_every is not None:
        options["checkpoint_every"] = args.checkpoint_every
    arch_options = {name: getattr(args, name) for name in _ARCH_OPTIONS if getattr(args, name) is not None}
    if arch_options:
        options["options"] = arch_options
    try:
        cfg = TrainConfig(**options)
        cfg.validate()
        result = train(X, cfg, args.out, resume=args.resume)
    except (ValueError, FileExistsError) as exc:  # bad config, W&B asked for but missing, or --out in use
        raise UserError(str(exc).splitlines()[0]) from None
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


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck train``."""
    p = commands.add_parser("train", help="train an SAE, BSF or bilinear autoencoder and save it in the SAELens layout")
    p.add_argument("--arch", required=True, choices=list(ARCHS))
    p.add_argument("--data", metavar="X.npy|DIR", help="training data (N, D), one token per row, or a directory "
                   "written by `dictcheck activations`")
    p.add_argument("--toy", metavar="NAME", help="a built-in toy data set instead of --data")
    p.add_argument("--d-sae", required=True, type=int, help="number of latents")
    p.add_argument("--k", type=int, help="active latents per token (topk, batchtopk)")
    p.add_argument("--lam", type=float, help="λ of objective (1) (relu, abs) or the L0 coefficient (jumprelu)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--lr", type=float, help="Adam learning rate (default 2e-4/sqrt(d_sae/2^14))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--aux-coef", type=float, default=0.0, help="AuxK coefficient for the TopK family (0: off)")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints")
    bsf = p.add_argument_group("block-sparse featurizers (bsf-*)")
    bsf.add_argument("--block-size", type=int, help="block size q (d_sae = n_b·q); --k is the number of active blocks")
    bsf.add_argument("--denoise", type=float, help="input-noise level snr of the denoising objective (default 0.1)")
    bsf.add_argument("--c-gl", type=float, help="group-lasso coefficient c (bsf-grouplasso, default 1e-2)")
    bsf.add_argument("--gate", choices=("shrink", "ste"), help="bsf-grouplasso gate (default shrink, the paper's)")
    bil = p.add_argument_group("bilinear autoencoders (bilinear-*)")
    bil.add_argument("--hoyer-coef", type=float, help="Hoyer density coefficient α_H (default 0.1)")
    bil.add_argument("--decoder", choices=("symmetric", "asymmetric"), help="GLU decoder (bilinear-quadratic)")
    bil.add_argument("--n-atoms", type=int, help="rank-1 atoms of the compound prior (default 2·d_sae)")
    bil.add_argument("--k-c", type=int, help="non-zeros per row of C, compound prior (default 8)")
    bil.add_argument("--c-l1", type=float, help="L1 coefficient on C, compound prior (default 0)")
    bil.add_argument("--tile", type=int, help="latent tile size of the kernel term (default 0: untiled)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--wandb", metavar="PROJECT", help="also log to Weights & Biases (needs the wandb package)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(handler=run_train)
