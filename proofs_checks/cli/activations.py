"""``dictcheck activations``: extract a real LM's residual-stream activations into a sharded store.

    dictcheck activations --model {smollm2,tinycoder,PATH} --layer L --tokens T --out DIR
                          [--context C] [--batch-size B] [--shard-tokens S] [--seed S] [--json]

Runs the model offline on the shipped text corpus and writes h^(L), the output of decoder layer L
(docs/ecosystem.md §5, docs/vasae.md §1), as float32 shards plus ``manifest.json`` to DIR; see
``empirics.data.activation_store`` for the windows (position 0 of each window is dropped). A killed run
resumes when rerun with the same arguments; a finished one is just reopened. ``dictcheck train
--data DIR`` trains on the result.
"""

from __future__ import annotations

import argparse
import json
import time

from dictcheck.proofs_checks.cli.inputs import output_dir
from dictcheck.proofs_checks.errors import UserError


def run_activations(args: argparse.Namespace) -> int:
    """Handler of ``dictcheck activations``: the flags, the output folder and (from the model's config,
    before its weights load) the layer, context, memory and free disk are checked first."""
    from dictcheck.empirics.data.activation_store import check_extraction, extract_activations
    from dictcheck.empirics.data.lm_models import load_lm

    for flag, value in (("--tokens", args.tokens), ("--context", args.context), ("--batch-size", args.batch_size),
                        ("--shard-tokens", args.shard_tokens)):
        if value < (2 if flag == "--context" else 1):
            raise UserError(f"{flag} must be at least {2 if flag == '--context' else 1}, got {value}")
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    out = output_dir(args.out)
    try:
        lm = load_lm(args.model, check=lambda shape: check_extraction(
            shape, args.layer, args.tokens, out, context=args.context, batch_size=args.batch_size,
            shard_tokens=args.shard_tokens))
        t0 = time.perf_counter()
        store = extract_activations(lm, args.layer, args.tokens, out, context=args.context,
                                    batch_size=args.batch_size, shard_tokens=args.shard_tokens, seed=args.seed,
                                    progress=False if args.json else None)
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    seconds = time.perf_counter() - t0
    m = store.manifest
    summary = {"out": str(store.path), "model": args.model, "layer": args.layer, "hook": m["hook"],
               "n_tokens": store.shape[0], "d": store.shape[1], "context": m["context"],
               "shards": len(m["shards"]), "content_hash": store.content_hash(), "seconds": seconds}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{store.shape[0]} tokens x {store.shape[1]} of {args.model} layer {args.layer} "
              f"({m['hook']['module']} output) in {len(m['shards'])} shard(s), {seconds:.1f} s")
        print(f"  saved to {store.path} (manifest.json + shard_*.npy); train with: dictcheck train --data {store.path} ...")
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck activations``."""
    p = commands.add_parser("activations", help="extract a language model's residual-stream activations to sharded .npy files")
    p.add_argument("--model", required=True, metavar="MODEL", help="a built-in model (smollm2, tinycoder), a .gguf "
                   "file or a local Hugging Face model directory")
    p.add_argument("--layer", required=True, type=int, help="decoder layer L; its output h^(L) is stored")
    p.add_argument("--tokens", required=True, type=int, help="number of activation rows (tokens) to store")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--context", type=int, default=128, help="tokens per window (position 0 is dropped)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--shard-tokens", type=int, default=65536, help="rows per shard file")
    p.add_argument("--seed", type=int, default=0, help="seed of the document order")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(handler=run_activations)
