"""Benchmark: data-parallel training throughput (samples/s) of ``dictcheck train`` with 1 and 2 ranks.

Reproduce:

    .venv/bin/python benchmarks/bench_ddp.py            # CPU: 1 rank (1 and 2 threads), 2 gloo ranks; ~3 min
    .venv/bin/python benchmarks/bench_ddp.py --quick    # small shapes, seconds
    .venv/bin/python benchmarks/bench_ddp.py --gpu      # 1 CUDA rank (nccl path needs >= 2 GPUs: --gpu --nproc 2)

Setup: a synthetic activation store on disk (Gaussian rows, float32, ``--rows`` × ``--d-in``, shards
of 16384 rows, memory-mapped as ``dictcheck activations`` writes them); a ``topk`` SAE (d_sae,
k = 32, float32, aux_coef 0), global batch ``--batch`` (each of P ranks trains on batch/P rows),
``--steps`` steps, checkpoint only at the end. Each configuration runs the real command
``python -m dictcheck.proofs_checks.cli train --data STORE ... [--nproc P]`` in a fresh process with
OMP_NUM_THREADS = threads per rank.

Timing: from the run's own ``train_log.jsonl`` (one record every ``--log-every`` steps, with
``elapsed_s`` since the loop started): samples/s = (last step − first logged step)·batch /
(elapsed_last − elapsed_first), so process start-up, the geometric-median init, the first
``log_every`` warm-up steps, evaluation and saving are excluded; the batch gather from the store
is included. ``--rounds`` interleaved rounds, median reported (the machine is shared).

Scaling efficiency of P ranks = samples/s(P ranks × 1 thread) / (P · samples/s(1 rank × 1 thread)).
"1 rank × 2 threads" is the alternative use of the same two cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def write_store(out: Path, rows: int, d_in: int, shard_rows: int = 16384, seed: int = 0) -> Path:
    """A synthetic activation store (manifest + float32 shards), written shard by shard."""
    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    shards = []
    for i, start in enumerate(range(0, rows, shard_rows)):
        n = min(shard_rows, rows - start)
        path = out / f"shard_{i:05d}.npy"
        np.save(path, rng.standard_normal((n, d_in), dtype=np.float32))
        shards.append({"file": path.name, "rows": n, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    manifest = {"format": "dictcheck-activations", "d": d_in, "shards": shards}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def samples_per_s(log_path: Path, batch: int) -> float:
    recs = [json.loads(line) for line in log_path.read_text().splitlines()]
    first, last = recs[0], recs[-1]
    return (last["step"] - first["step"]) * batch / (last["elapsed_s"] - first["elapsed_s"])


def run_once(store: Path, out: Path, nproc: int, threads: int, args: argparse.Namespace) -> float:
    cmd = [sys.executable, "-m", "dictcheck.proofs_checks.cli", "train", "--arch", "topk", "--k", "32",
           "--d-sae", str(args.d_sae), "--data", str(store), "--steps", str(args.steps),
           "--batch-size", str(args.batch), "--log-every", str(args.log_every), "--checkpoint-every", "0",
           "--device", args.device, "--out", str(out)]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_ddp: {' '.join(cmd[3:])} failed:\n{proc.stderr[-2000:]}")
    return samples_per_s(out / "train_log.jsonl", args.batch)


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes (smoke test)")
    p.add_argument("--gpu", action="store_true", help="time CUDA ranks instead of CPU ranks")
    p.add_argument("--nproc", type=int, default=1, help="with --gpu: ranks (one GPU each)")
    p.add_argument("--rows", type=int, default=131072)
    p.add_argument("--d-in", type=int, default=256)
    p.add_argument("--d-sae", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.d_in, args.d_sae, args.batch, args.steps, args.log_every, args.rounds = (
            8192, 64, 256, 256, 40, 10, 1)
    if args.gpu and not args.quick:
        args.rows, args.d_in, args.d_sae, args.batch, args.steps = 1 << 20, 768, 24576, 4096, 300
    args.device = "cuda" if args.gpu else "cpu"
    configs = [(args.nproc, 1)] if args.gpu else [(1, 1), (1, 2), (2, 1)]
    tmp = Path(tempfile.mkdtemp(prefix="bench_ddp_"))
    try:
        store = write_store(tmp / "store", args.rows, args.d_in)
        results: dict[tuple[int, int], list[float]] = {c: [] for c in configs}
        for r in range(args.rounds):
            for nproc, threads in configs:
                out = tmp / f"run_{nproc}x{threads}_{r}"
                results[(nproc, threads)].append(run_once(store, out, nproc, threads, args))
                shutil.rmtree(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {c: statistics.median(v) for c, v in results.items()}
    print(f"# bench_ddp: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, device {args.device}; "
          f"topk d_in {args.d_in} d_sae {args.d_sae} k 32, global batch {args.batch}, {args.steps} steps, "
          f"{args.rows} rows in the store, median of {args.rounds}")
    print("| ranks × threads | samples/s | scaling efficiency |")
    print("|---|---|---|")
    base = med.get((1, 1))
    out_table = {}
    for (nproc, threads), v in med.items():
        eff = f"{v / (nproc * base):.2f}" if base and threads == 1 and nproc > 1 else "—"
        print(f"| {nproc} × {threads} | {v:,.0f} | {eff} |")
        out_table[f"{nproc}x{threads}"] = v
    return out_table


if __name__ == "__main__":
    main()
