"""Benchmark: the bilinear kernel-trick loss against the naive lifted loss (docs/bilinear.md §3).

    .venv/bin/python benchmarks/bench_bilinear.py            # d ∈ {64, 128, 256, 512}; minutes
    .venv/bin/python benchmarks/bench_bilinear.py --quick    # d ∈ {16, 32}, seconds (smoke run)

Setup (issue 5 item 9): ``bilinear-quadratic`` (symmetric decoder, the default), D = d,
d_sae = 8d latents, a batch of 1024 Gaussian tokens, float32, one torch thread. One step =
forward + backward of the lifted loss (no optimiser step), parameters and batch fixed.

* **kernel**: ``model(x).mse.backward()`` of :class:`empirics.architectures.bilinear.BilinearAutoencoder`
  with ``hoyer_coef = 0``: (1/N)[⟨K, ZᵀZ⟩ − 2‖Z‖² + N], untiled (K is d_z × d_z) and tiled
  (``tile`` = 512 latents, block pairs recomputed in the backward pass, K never held).
* **naive**: the same encoder (``model.normalise``, ``model.latents``), then T̂_i = sym(Uᵀ diag(z_i) V)
  and T_i = x_i x_iᵀ formed explicitly (D × D per token) and (1/N)Σ‖T_i − T̂_i‖²_F. Unchunked it holds
  the (N, D, d_z) product Uᵀ diag(z_i), T̂ and T for the whole batch (and autograd keeps them for the
  backward pass): 10.5 GiB at d = 512. It is therefore run in token chunks of c = min(N, 2²⁶/(D·d_z))
  tokens (≤ 256 MiB for that product), each chunk's forward + backward done before the next
  (gradient accumulation: the same loss and gradient). The chunk count is reported.

Memory: each (route, d) runs in a fresh subprocess, which first runs the route once at a tiny size
(so lazily loaded code is not counted); after the model and batch exist the kernel's
peak-RSS counter is reset (``/proc/self/clear_refs`` ← 5) and "peak" = VmHWM − VmRSS at that point,
i.e. the extra resident memory of the steps. The subprocesses run with
``MALLOC_MMAP_THRESHOLD_=131072``: with glibc's default dynamic threshold, freed 16–32 MiB blocks stay
resident and RSS over-states live memory (tiled route at d = 512: 299 MiB peak RSS by default, 130 MiB
with the fixed threshold, in two runs on the same machine). "analytic" = the bytes of the largest tensors the
route forms (naive: the unchunked (N, D, d_z) product + T̂ + T; kernel untiled: the five d_z × d_z
blocks UUᵀ, VVᵀ, UVᵀ, VUᵀ, ZᵀZ; tiled: the same for one tile pair, plus P_U, P_V, Z (N × d_z)).
Timing: steps until ≥ 10 s or 5 steps after one warm-up step (a first step over 20 s is the
measurement). Ratios are naive / kernel (> 1: the kernel route is cheaper).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dictcheck.empirics.architectures import build_model  # noqa: E402

BATCH = 1024
LATENTS_PER_DIM = 8
TILE = 512
CHUNK_ELEMENTS = 2**26  # naive: at most this many floats in the (chunk, D, d_z) product
F32 = 4
MIB = 2**20
#: glibc malloc: a fixed mmap threshold (which also disables its dynamic raise up to 32 MiB) so that
#: freed large blocks go back to the OS and RSS tracks live memory (module docstring).
MMAP_THRESHOLD = 128 * 1024


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")  # pragma: no cover


def naive_chunk(d: int, d_z: int, n: int) -> int:
    return max(1, min(n, CHUNK_ELEMENTS // (d * d_z)))


def _naive_step(model, x: torch.Tensor, chunk: int) -> float:
    xn, _ = model.normalise(x)
    n, total = xn.shape[0], 0.0
    for s in range(0, n, chunk):
        xc = xn[s:s + chunk]
        z = model.latents(xc)
        t_hat = (model.U.T * z[:, None, :]) @ model.V  # (c, D, D) = Uᵀ diag(z_i) V
        t_hat = 0.5 * (t_hat + t_hat.transpose(1, 2))
        t = xc[:, :, None] * xc[:, None, :]
        loss = ((t - t_hat) ** 2).sum() / n
        loss.backward()
        total += float(loss.detach())
    return total


def _kernel_step(model, x: torch.Tensor) -> float:
    out = model(x)
    out.mse.backward()
    return float(out.mse.detach())


def run_one(route: str, d: int, n_batch: int, min_time: float, max_steps: int) -> dict:
    """One (route, d) measurement in this process (called in a fresh subprocess)."""
    torch.set_num_threads(1)

    def make_step(d: int, n_batch: int, tile: int):
        d_z = LATENTS_PER_DIM * d
        model = build_model("bilinear-quadratic", d, d_z, {"hoyer_coef": 0.0, "tile": tile}, seed=0)
        x = torch.randn(n_batch, d, generator=torch.Generator().manual_seed(1))
        chunk = naive_chunk(d, d_z, n_batch)

        def step() -> float:
            model.zero_grad(set_to_none=True)
            return _naive_step(model, x, chunk) if route == "naive" else _kernel_step(model, x)

        return step, d_z, chunk

    # a tiny run of the same route first, so that lazily loaded code is not counted as peak memory
    make_step(4, 8, 4 if route == "kernel_tiled" else 0)[0]()
    tile = TILE if route == "kernel_tiled" else 0
    step, d_z, chunk = make_step(d, n_batch, tile)
    base_kib = _proc_status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    loss = step()
    first = time.perf_counter() - t0
    times = [first] if first > 20.0 else []
    while not times or (sum(times) < min_time and len(times) < max_steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    peak_kib = _proc_status_kib("VmHWM") - base_kib
    return {"route": route, "d": d, "d_z": d_z, "n": n_batch, "chunk": chunk, "tile": tile,
            "s_per_step": sum(times) / len(times), "steps": len(times), "loss": loss,
            "peak_mib": peak_kib / 1024}


def analytic_mib(route: str, d: int, d_z: int, n: int) -> float:
    if route == "naive":
        return (n * d * d_z + 2 * n * d * d) * F32 / MIB
    if route == "kernel":
        return 5 * d_z * d_z * F32 / MIB
    t = min(TILE, d_z)
    return (5 * t * t + 3 * n * d_z) * F32 / MIB


def _subprocess(route: str, d: int, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--one", route, str(d), "--batch", str(a.batch),
           "--min-time", str(a.min_time), "--max-steps", str(a.max_steps)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256, 512])
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--min-time", type=float, default=10.0)
    p.add_argument("--max-steps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="d ∈ {16, 32}, batch 256 (smoke run)")
    p.add_argument("--one", nargs=2, metavar=("ROUTE", "D"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(run_one(a.one[0], int(a.one[1]), a.batch, a.min_time, a.max_steps)))
        return
    if a.quick:
        a.dims, a.batch, a.min_time, a.max_steps = [16, 32], 256, 0.0, 1

    print(f"# Bilinear kernel loss vs naive lifted loss: bilinear-quadratic (symmetric decoder), d_sae = {LATENTS_PER_DIM}d, "
          f"batch {a.batch}, float32, 1 torch thread, forward+backward")
    print(f"# python {platform.python_version()}, torch {torch.__version__}, {platform.machine()} "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print()
    print("| d | d_z | naive chunks | naive s/step | kernel s/step | tiled s/step | time ratio naive/kernel | "
          "naive/tiled | naive peak MiB (chunked) | naive analytic MiB (unchunked) | kernel peak MiB | tiled peak MiB | "
          "memory ratio: naive unchunked / kernel | / tiled | naive chunked / tiled | rel. loss diff |")
    print("|" + "---:|" * 16)
    for d in a.dims:
        r = {route: _subprocess(route, d, a) for route in ("naive", "kernel", "kernel_tiled")}
        nv, kn, tl = r["naive"], r["kernel"], r["kernel_tiled"]
        d_z, n = nv["d_z"], nv["n"]
        naive_an = analytic_mib("naive", d, d_z, n)
        chunks = -(-n // nv["chunk"])
        diff = max(abs(nv["loss"] - kn["loss"]), abs(tl["loss"] - kn["loss"])) / abs(kn["loss"])
        print(f"| {d} | {d_z} | {chunks} | {nv['s_per_step']:.3g} | {kn['s_per_step']:.3g} | {tl['s_per_step']:.3g} | "
              f"**{nv['s_per_step'] / kn['s_per_step']:.1f}×** | {nv['s_per_step'] / tl['s_per_step']:.1f}× | "
              f"{nv['peak_mib']:.0f} | {naive_an:.0f} | {kn['peak_mib']:.0f} | {tl['peak_mib']:.0f} | "
              f"{naive_an / kn['peak_mib']:.1f}× | **{naive_an / tl['peak_mib']:.1f}×** | "
              f"{nv['peak_mib'] / tl['peak_mib']:.1f}× | {diff:.1e} |", flush=True)
    print()
    print("Analytic bytes of the largest tensors (MiB): " + "; ".join(
        f"d={d}: kernel {analytic_mib('kernel', d, LATENTS_PER_DIM * d, a.batch):.0f}, "
        f"tiled {analytic_mib('kernel_tiled', d, LATENTS_PER_DIM * d, a.batch):.0f}" for d in a.dims))


if __name__ == "__main__":
    main()
