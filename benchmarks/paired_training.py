"""Paired rounds: the sparse training step of an earlier commit's SAE against this checkout's.

``empirics/kernels/sparse_products.py`` and ``empirics/architectures/linear_sae.py`` of commit REV (or
``empirics/sparse_products.py`` and ``empirics/sae_models.py``, their paths before the regroup of
empirics/) are loaded under names of their own (``paired_kernels.module_at``; the old linear SAE
module imports the old sparse_products, every
other module is the checkout's, so REV must share their interfaces). Both models are built with the
same seed and trained by the loop body of ``empirics.training.loop.train``
(``bench_training.make_ours``) on the same fixed random batches, at the RESULTS.md §4 setup
(d_in = 512, d_sae = 4096, batch 4096, k = 32, float32). Each round runs 2 warm-up and ``--steps``
timed steps of each side back to back, alternating which goes first; quoted is the median of the
per-round time ratios (new ÷ old), robust to the minute-scale swings of a shared VM. The two sides
take identical step sequences, so their losses are compared step by step: equal bits for a change
that keeps the numbers.

Usage (from the repository root):

    .venv/bin/python benchmarks/paired_training.py --old ac43765 --arch topk --rounds 15
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_training import make_ours  # noqa: E402  (first: it sets OpenMP's spin before torch loads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from paired_kernels import REGROUPED, module_at, path_at  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="commit whose linear SAE module and sparse_products are the baseline")
    ap.add_argument("--arch", default="topk", choices=["topk", "batchtopk"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per side per round")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(4096, 512, generator=gen) for _ in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        sp_path = path_at(args.old, "empirics/kernels/sparse_products.py", "empirics/sparse_products.py")
        sm_path = path_at(args.old, "empirics/architectures/linear_sae.py", "empirics/sae_models.py")
        sp_old = module_at(args.old, sp_path, Path(tmp), REGROUPED)
        sm_old = module_at(args.old, sm_path, Path(tmp),
                           {**REGROUPED, "dictcheck.empirics.sparse_products": sp_old.__name__,
                            "dictcheck.empirics.kernels.sparse_products": sp_old.__name__})
        sides = {"old": make_ours(args.arch, "sparse", 512, 4096, 32, 1e-4, factory=sm_old.make_sae),
                 "new": make_ours(args.arch, "sparse", 512, 4096, 32, 1e-4)}
        times = {"old": [], "new": []}
        losses = {"old": [], "new": []}
        for r in range(args.rounds):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                step = sides[name]
                for i in range(2):
                    losses[name].append(step(batches[i % 4]))
                t0 = time.perf_counter()
                for i in range(args.steps):
                    losses[name].append(step(batches[(2 + i) % 4]))
                times[name].append((time.perf_counter() - t0) / args.steps)
    old, new = np.array(times["old"]), np.array(times["new"])
    ratio = new / old
    same = losses["old"] == losses["new"]
    worst = max(abs(a - b) for a, b in zip(losses["old"], losses["new"]))
    print(f"{args.arch}, {args.threads} threads, {args.rounds} rounds of 2 + {args.steps} steps per side")
    print(f"old ({args.old}): median {np.median(old) * 1e3:.1f} ms/step; new (checkout): {np.median(new) * 1e3:.1f}")
    print(f"paired ratio new ÷ old: median {np.median(ratio):.3f} "
          f"(IQR {np.percentile(ratio, 25):.3f}–{np.percentile(ratio, 75):.3f})")
    print(f"losses at all {len(losses['new'])} steps: {'bit-identical' if same else f'differ, max |Δ| = {worst:.3g}'}")


if __name__ == "__main__":
    main()
