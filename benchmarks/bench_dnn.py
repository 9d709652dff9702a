"""Benchmark: the DNN relaxation (solvers.dnn) against the closed form + certificate (solvers.wide_limit).

docs/theory.md §2.3 (the DNN relaxation of (3), tight for every N) and §4 (its value in closed form).
Reproduce (one thread per process):

    .venv/bin/python benchmarks/bench_dnn.py            # about 5 min
    .venv/bin/python benchmarks/bench_dnn.py --quick    # seconds

Part 1, DNN solve time against N: D = 5, Gaussian data (seed 0), learned bias, λ = 0.5 × the median
distance to the mean; N = 5, 10, 20, 30, 40, 60, 80, 100, … until one solve takes more than 60 s
(each solve runs in a forked child, killed after ``--dnn-timeout`` s) or fails. Next to it, at the
same data, ``solve_wide_limit`` (Huber median + closed form + ray clustering + certificate), and the
agreement of the two: J_DNN − H(b*) and ‖b_DNN − b*‖.

Part 2, the largest N certified within 60 s by the closed form + certificate: D = 64, the data of
``bench_medians`` (heavy-tailed, asymmetric; λ = 0.5 × median distance to the mean), N = 1000·2^k,
doubling until a run exceeds 60 s; each run in a forked child (data generated there, not timed).
A run is not started when its predicted memory (twice the previous run's peak, +20 %) exceeds 60 %
of the machine's available memory; the table then says the sweep stopped on memory.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_medians import fmt_e, fmt_s, machine_line, make_data, print_table, run_isolated  # noqa: E402

from dictcheck.solvers.dnn import solve_dnn  # noqa: E402
from dictcheck.solvers.wide_limit import solve_wide_limit  # noqa: E402

DNN_SIZES = (5, 10, 20, 30, 40, 60, 80, 100, 120, 150, 200, 250, 300)
DNN_DIM = 5
LIMIT_S = 60.0
DNN_TIMEOUT_S = 90.0
WIDE_DIM = 64
WIDE_START = 1_000
WIDE_TIMEOUT_S = 180.0
MEMORY_FRACTION = 0.6


def gaussian_data(N: int, D: int = DNN_DIM, seed: int = 0) -> tuple[np.ndarray, float]:
    X = np.random.default_rng(seed).standard_normal((D, N))
    lam = 0.5 * float(np.median(np.linalg.norm(X - X.mean(axis=1, keepdims=True), axis=0)))
    return X, lam


def available_mib() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) / 1024.0
    return float("inf")


def dnn_versus_closed_form(sizes: Sequence[int], timeout: float) -> list[list[str]]:
    rows = []
    for N in sizes:
        X, lam = gaussian_data(N)

        def dnn() -> tuple[float, list[float], float, str]:
            s = solve_dnn(X, lam)
            return s.objective, s.b.tolist(), s.seconds, s.solver

        out = run_isolated(dnn, timeout=timeout)
        wide = min((solve_wide_limit(X, lam) for _ in range(3)), key=lambda w: w.seconds)
        if out.status != "ok":
            rows.append([f"{N}", f"{out.status} ({out.message})", "—", fmt_s(wide.seconds), "—", "—", "—",
                         fmt_e(wide.certified_gap), f"{wide.n_rays}"])
            print(f"N = {N}: DNN {out.status}: {out.message}; stopping", flush=True)
            break
        objective, b, seconds, solver = out.value
        rows.append([f"{N}", fmt_s(seconds), f"{out.peak_extra_mib:.0f}", fmt_s(wide.seconds),
                     f"{seconds / wide.seconds:.3g}×", f"{objective - wide.objective:.1e}",
                     fmt_e(float(np.linalg.norm(np.asarray(b) - wide.b))), fmt_e(wide.certified_gap), f"{wide.n_rays}"])
        print(f"N = {N}: DNN {seconds:.3g} s ({solver}), closed form {wide.seconds:.3g} s", flush=True)
        if seconds > LIMIT_S:
            break
    return rows


def _wide_run(N: int) -> tuple[float, float, float, int, float]:
    X, lam = make_data(N, WIDE_DIM)
    w = solve_wide_limit(X, lam)
    inside = float(np.mean(np.linalg.norm(X - w.b[:, None], axis=0) <= lam))
    return w.seconds, w.certified_gap, w.objective, w.n_rays, inside


def largest_certified(start: int, timeout: float, max_n: int | None) -> tuple[list[list[str]], str]:
    rows, N, last_peak, best = [], start, None, None
    verdict = ""
    while max_n is None or N <= max_n:
        avail = available_mib()
        if last_peak is not None and 2.4 * last_peak > MEMORY_FRACTION * avail:
            verdict = (f"stopped on memory before N = {N:,}: predicted {2.4 * last_peak:,.0f} MiB > "
                       f"{MEMORY_FRACTION:.0%} of the {avail:,.0f} MiB available")
            break
        out = run_isolated(_wide_run, N, timeout=timeout)
        if out.status != "ok":
            rows.append([f"{N:,}", f"{out.status} ({out.message})", "—", "—", "—", "—", "—"])
            verdict = f"N = {N:,}: {out.status} ({out.message})"
            break
        seconds, gap, objective, n_rays, inside = out.value
        rows.append([f"{N:,}", fmt_s(seconds), f"{out.peak_extra_mib:,.0f}", fmt_e(gap), fmt_e(gap / objective),
                     f"{n_rays:,}", f"{inside:.0%}"])
        print(f"N = {N:,}: {seconds:.3g} s, certified gap {gap:.1e}, peak +{out.peak_extra_mib:.0f} MiB", flush=True)
        last_peak = out.peak_extra_mib
        if seconds > LIMIT_S:
            verdict = f"N = {N:,} took {seconds:.0f} s > {LIMIT_S:.0f} s"
            break
        best = N
        N *= 2
    else:
        verdict = f"stopped at the cap N ≤ {max_n:,}"
    summary = (f"Largest N certified within {LIMIT_S:.0f} s: {best:,} ({verdict})." if best is not None
               else f"No N certified within {LIMIT_S:.0f} s ({verdict}).")
    return rows, summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="DNN up to N = 20, doubling up to N = 8000")
    parser.add_argument("--dnn-timeout", type=float, default=DNN_TIMEOUT_S)
    parser.add_argument("--wide-timeout", type=float, default=WIDE_TIMEOUT_S)
    parser.add_argument("--max-n", type=int, default=None, help="cap for the doubling sweep")
    args = parser.parse_args(argv)
    print("## DNN relaxation versus closed form + certificate (benchmarks/bench_dnn.py)\n")
    print(machine_line() + "\n")
    start = time.perf_counter()
    sizes = [n for n in DNN_SIZES if n <= 20] if args.quick else DNN_SIZES
    rows = dnn_versus_closed_form(sizes, args.dnn_timeout)
    print(f"\n### DNN solve time against N (D = {DNN_DIM}, Gaussian, learned bias; Clarabel)\n")
    print_table(["N", "DNN (s)", "DNN peak +MiB", "closed form + cert. (s)", "ratio", "J_DNN − H(b*)",
                 "‖b_DNN − b*‖", "certified gap", "n_rays"], rows)
    max_n = 8_000 if args.quick else args.max_n
    rows, summary = largest_certified(WIDE_START, args.wide_timeout, max_n)
    print(f"\n### Closed form + certificate, D = {WIDE_DIM}, N doubling from {WIDE_START:,}\n")
    print_table(["N", "seconds", "peak +MiB", "certified gap", "gap / objective", "n_rays", "within λ"], rows)
    print(summary)
    print(f"\n(bench_dnn total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
