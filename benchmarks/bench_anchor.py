"""Benchmark: the VASAE anchor loss per step, gathered/chunked (dictcheck) against the naive full max.

docs/vasae.md §3. Reproduce (one thread):

    .venv/bin/python benchmarks/bench_anchor.py            # d_z = 256, 1024, 2048 (about a minute)
    .venv/bin/python benchmarks/bench_anchor.py --quick    # d_z = 256 only

One "step" is the anchor loss forward + backward for the decoder W (d_z × D), float32, against a
frozen embedding E (V × D) with SmolLM2-135M's sizes V = 49152, D = 576 (random Gaussian rows: the
cost does not depend on the values).

* naive: the full (d_z × V) cosine matrix with autograd, L = −mean_d max_v C_dv (the authors' max
  without chunking; its backward multiplies the dense (d_z × V) gradient by Ê: 2·d_z·V·D FLOPs more);
* chunked: :func:`empirics.architectures.vasae.anchor_loss`, argmax chunk-wise under no-grad (chunk =
  the ≤ 256 MB default) and the gathered cosine, backward O(d_z·D).

Time: wall, the minimum of ``--repeats`` steps after one warm-up step (the minimum, because the
machine is shared and contention only adds time). Peak memory: each variant runs in
a fresh child process; the figure is the child's peak RSS (``ru_maxrss``) minus its RSS after the
inputs were built (the extra memory the step needs). Results go to stdout as a markdown table.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

V, D = 49152, 576


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _naive(W: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    C = (W / W.norm(dim=1, keepdim=True).clamp_min(1e-8)) @ (E / E.norm(dim=1, keepdim=True).clamp_min(1e-8)).T
    return -C.max(dim=1).values.mean()


def _child(variant: str, d_z: int, repeats: int) -> dict:
    from dictcheck.empirics.architectures.vasae import anchor_loss

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    E = torch.randn(V, D, generator=g)
    W = torch.randn(d_z, D, generator=g).requires_grad_(True)
    fn = _naive if variant == "naive" else anchor_loss
    base = _rss_mib()
    times = []
    for i in range(repeats + 1):
        W.grad = None
        t0 = time.perf_counter()
        fn(W, E).backward()
        if i:
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": variant, "d_z": d_z, "time_s": min(times), "extra_mib": max(peak - base, 0.0),
            "grad_sum": float(W.grad.abs().sum())}


def _run(variant: str, d_z: int, repeats: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", variant, str(d_z), str(repeats)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", help="d_z values (default 256 1024 2048 4096)")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    sizes = args.sizes or ((256,) if args.quick else (256, 1024, 2048, 4096))
    print(f"Anchor loss per step (forward + backward), V = {V}, D = {D}, float32, 1 thread\n")
    print("| d_z | naive time (s) | chunked time (s) | time ratio naive/chunked | naive extra MiB | chunked extra MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    for d_z in sizes:
        naive, chunked = _run("naive", d_z, args.repeats), _run("chunked", d_z, args.repeats)
        if abs(naive["grad_sum"] - chunked["grad_sum"]) > 1e-3 * naive["grad_sum"]:
            raise SystemExit(f"gradients differ at d_z={d_z}: {naive['grad_sum']} vs {chunked['grad_sum']}")
        mem_ratio = naive["extra_mib"] / chunked["extra_mib"] if chunked["extra_mib"] > 0 else float("inf")
        print(f"| {d_z} | {naive['time_s']:.3f} | {chunked['time_s']:.3f} | {naive['time_s'] / chunked['time_s']:.2f} "
              f"| {naive['extra_mib']:.0f} | {chunked['extra_mib']:.0f} | {mem_ratio:.1f} |", flush=True)


if __name__ == "__main__":
    main()
