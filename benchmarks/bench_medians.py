"""Benchmark: the specialised medians of ``solvers.medians`` against references, at equal accuracy.

docs/theory.md §4.3. Reproduce (one thread per process, see below):

    .venv/bin/python benchmarks/bench_medians.py            # N = 1e3, 1e4, 1e5 (about 5 min)
    .venv/bin/python benchmarks/bench_medians.py --quick    # N = 1e3 only (seconds)

Contenders, D = 64, points as columns of X (D, N):

* Huber median argmin_b (1/N) Σ h_λ(‖x_i − b‖): ours (``huber_median``, Newton + MM safeguard) at a
  ladder of tolerances; the spec's plain MM/IRLS iteration (written here, the baseline of §4.3);
  the exact conic reference ``solvers.median_references.huber_median_cvxpy`` (Clarabel, tol 1e-8).
  A last table sweeps λ at N = 10⁴ (ours against MM only).
* Geometric median argmin_b (1/N) Σ ‖x_i − b‖: ours (``geometric_median``) at the same ladder; the
  conic reference ``geometric_median_cvxpy`` (Clarabel, tol 1e-10); PyPI ``geom-median`` (``compute_geometric_median``,
  smoothed Weiszfeld, numpy) and PyPI ``hdmedians`` (``geomedian``, Weiszfeld in Cython), each at its
  defaults and, for hdmedians, at a tight setting. Packages that are not installed are skipped.

Accuracy: every run's b is re-evaluated in numpy with the same objective. The best run is the one
with the lowest objective (among runs tied to rounding, 8 ulp, the one with the smallest
stationarity measure); each run reports objective − best and ‖b − b_best‖. Equal accuracy: for each
competitor, ours is timed at the loosest tolerance of its ladder that is at least as accurate in
both measures, and the ratio competitor time / our time is printed.

Data (Decision): a heavy-tailed, asymmetric cloud, so that the mean, the Huber median and the
geometric median differ and λ splits the points: x_i = s_i g_i (g_i standard normal, s_i log-normal
with σ = 0.75), plus a shift of 3√D along e_1 for the first 20 % of the points. λ = 0.5 × the median
distance to the mean.

Timing: wall time, best of up to 5 repeats within about a second for fast runs, one run otherwise.
BLAS is pinned to one thread (OPENBLAS/OMP/MKL_NUM_THREADS=1, unless already set) because the
benchmark machine has 2 cores shared with other jobs and multi-threaded GEMM in the Newton
Hessian then varies by 10× from run to run. The cvxpy solves run in a forked child with a timeout;
a solve predicted (linear extrapolation from the previous N) to exceed the timeout is skipped.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from dictcheck.solvers.median_references import geometric_median_cvxpy, huber_median_cvxpy  # noqa: E402
from dictcheck.solvers.medians import geometric_median, huber_median  # noqa: E402
from dictcheck.theory.huber import geometric_median_objective, huber_objective, huber_objective_gradient  # noqa: E402

D_DEFAULT = 64
SIZES = (1_000, 10_000, 100_000)
OUR_TOLERANCES = (1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12)  # 1e-10 is the library default
CVXPY_TIMEOUT_S = 150.0
# One Clarabel solve per reference (a retry with equilibration off only if it fails), at the tightest
# tolerance that solved at N = 1e4, D = 64: the Huber epigraph form ends in NumericalError at 1e-9
# there; the geometric median solves at 1e-10 (and needs it: at 1e-8 its b is off by ~1e-3).
CVXPY_TOLERANCE = {"huber": 1e-8, "gm": 1e-10}
LAMBDA_SWEEP = (2.0, 1.0, 0.4, 0.1, 0.02)  # multiples of the default λ, at N = 1e4
ROUNDING_ULPS = 8


# --------------------------------------------------------------------------- shared harness


@dataclass
class Isolated:
    """Outcome of a function run in a forked child: status ok / error / timeout / crashed."""

    status: str
    value: Any
    wall_s: float
    peak_extra_mib: float | None
    message: str = ""


def _vm_kib(key: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return float(line.split()[1])
    return float("nan")


def run_isolated(fn: Callable[..., Any], *args: Any, timeout: float) -> Isolated:
    """Run fn(*args) in a forked child (arguments are inherited, not pickled); kill it after timeout.

    peak_extra_mib is the child's peak resident memory (VmHWM) minus its resident memory at start,
    i.e. roughly what the call itself allocated.
    """
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def target() -> None:
        rss0 = _vm_kib("VmRSS")
        try:
            msg: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            msg = ("error", f"{type(exc).__name__}: {exc}")
        send.send((*msg, (_vm_kib("VmHWM") - rss0) / 1024.0))

    start = time.perf_counter()
    proc = ctx.Process(target=target, daemon=True)
    proc.start()
    send.close()
    try:
        if recv.poll(timeout):
            status, value, peak = recv.recv()
            proc.join()
            return Isolated(status, value if status == "ok" else None, time.perf_counter() - start, peak,
                            "" if status == "ok" else str(value))
    except EOFError:
        proc.join()
        return Isolated("crashed", None, time.perf_counter() - start, None, f"child exit code {proc.exitcode}")
    proc.kill()
    proc.join()
    return Isolated("timeout", None, time.perf_counter() - start, None, f"killed after {timeout:.0f} s")


def timed(fn: Callable[[], Any], budget_s: float = 1.0, max_repeats: int = 5) -> tuple[Any, float]:
    """(result of the last call, best wall time) over up to max_repeats calls within about budget_s."""
    best, total, out = float("inf"), 0.0, None
    for _ in range(max_repeats):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best, total = min(best, dt), total + dt
        if total + dt > budget_s:
            break
    return out, best


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A GitHub-markdown table on stdout (so it pastes into RESULTS.md as is)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    print(flush=True)


def machine_line() -> str:
    load = os.getloadavg()
    return (f"{platform.node()} · {os.cpu_count()} cores · {platform.processor() or platform.machine()} · "
            f"Python {platform.python_version()} · numpy {np.__version__} · BLAS threads "
            f"{os.environ.get('OPENBLAS_NUM_THREADS')} · load average {load[0]:.2f} · "
            f"{datetime.datetime.now().isoformat(timespec='minutes')}")


def fmt_s(x: float | None) -> str:
    if x is None or not np.isfinite(x):
        return "—"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def fmt_e(x: float | None) -> str:
    return "—" if x is None else f"{x:.1e}"


# --------------------------------------------------------------------------- data and methods


def make_data(N: int, D: int = D_DEFAULT, seed: int = 0) -> tuple[np.ndarray, float]:
    """The benchmark cloud of the module docstring and its λ."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((D, N)) * np.exp(0.75 * rng.standard_normal(N))
    X[0, : N // 5] += 3.0 * np.sqrt(D)
    lam = 0.5 * float(np.median(np.linalg.norm(X - X.mean(axis=1, keepdims=True), axis=0)))
    return X, lam


def irls_huber(X: np.ndarray, lam: float, tol: float = 1e-10, max_iter: int = 20_000, max_s: float = 60.0) -> tuple[np.ndarray, int]:
    """The spec's MM iteration b ← Σ ω_i x_i / Σ ω_i, ω_i = min(1, λ/ρ_i), stopped at ‖∇H‖ ≤ 2λ·tol."""
    b, start = X.mean(axis=1), time.perf_counter()
    for it in range(1, max_iter + 1):
        diff = X - b[:, None]
        rho = np.sqrt(np.einsum("ij,ij->j", diff, diff))
        w = np.minimum(1.0, lam / np.maximum(rho, np.finfo(float).tiny))
        if np.linalg.norm(diff @ w) * 2.0 / X.shape[1] <= 2.0 * lam * tol or time.perf_counter() - start > max_s:
            return b, it - 1
        b = (X @ w) / w.sum()
    return b, max_iter


def gm_stationarity(X: np.ndarray, b: np.ndarray) -> float:
    """Norm of the minimum-norm subgradient of (1/N)Σ‖x_i − b‖; points within 1e-12·radius of b count as coincident."""
    diff = X - b[:, None]
    rho = np.sqrt(np.einsum("ij,ij->j", diff, diff))
    at = rho <= 1e-12 * max(float(rho.max()), 1e-300)
    g = (diff[:, ~at] / rho[~at]).sum(axis=1)
    return max(0.0, float(np.linalg.norm(g)) - int(at.sum())) / X.shape[1]


@dataclass
class Run:
    problem: str
    method: str
    settings: str
    seconds: float | None
    b: list[float] | None = None
    objective: float | None = None
    stationarity: float | None = None
    note: str = ""
    gap: float | None = field(default=None)
    db: float | None = field(default=None)


def _finish(runs: list[Run], X: np.ndarray, lam: float | None) -> None:
    """Objective, stationarity, and accuracy relative to the best run, all computed here in numpy."""
    for r in runs:
        if r.b is None:
            continue
        b = np.asarray(r.b)
        if lam is None:
            r.objective, r.stationarity = geometric_median_objective(b, X), gm_stationarity(X, b)
        else:
            r.objective = huber_objective(b, X, lam)
            r.stationarity = float(np.linalg.norm(huber_objective_gradient(b, X, lam))) / (2.0 * lam)
    done = [r for r in runs if r.objective is not None]
    f_min = min(r.objective for r in done)
    tied = [r for r in done if r.objective <= f_min + ROUNDING_ULPS * np.spacing(f_min)]
    best = min(tied, key=lambda r: r.stationarity)
    for r in done:
        r.gap = r.objective - f_min
        r.db = float(np.linalg.norm(np.asarray(r.b) - np.asarray(best.b)))


def _cvxpy_run(problem: str, X: np.ndarray, lam: float | None, prev: tuple[int, float] | None, timeout: float) -> Run:
    N = X.shape[1]
    tol = CVXPY_TOLERANCE[problem]
    settings = f"Clarabel, tol {tol:g}"
    if prev is not None and prev[1] * N / prev[0] > timeout:
        return Run(problem, "cvxpy reference", settings, None,
                   note=f"skipped: predicted ≥ {prev[1] * N / prev[0]:.0f} s (linear from N={prev[0]}: {prev[1]:.0f} s) > timeout {timeout:.0f} s")

    def solve() -> tuple[list[float], float, str, int]:
        tols = (tol,)
        ref = huber_median_cvxpy(X, lam, tolerances=tols) if lam is not None else geometric_median_cvxpy(X, tolerances=tols)
        return ref.b.tolist(), ref.seconds, ref.status, ref.solves

    out = run_isolated(solve, timeout=timeout)
    if out.status != "ok":
        return Run(problem, "cvxpy reference", settings, None, note=f"{out.status}: {out.message}")
    b, seconds, status, solves = out.value
    return Run(problem, "cvxpy reference", settings, seconds, b,
               note=f"{status}, {solves} solve{'s' if solves > 1 else ''}, peak +{out.peak_extra_mib:.0f} MiB")


def bench_huber(X: np.ndarray, lam: float, cvxpy_prev: tuple[int, float] | None, cvxpy_timeout: float) -> list[Run]:
    runs = []
    for tol in OUR_TOLERANCES:
        res, sec = timed(lambda tol=tol: huber_median(X, lam, tol=tol))
        runs.append(Run("huber", "ours huber_median", f"tol {tol:g}", sec, res.b.tolist(),
                        note=f"{res.iterations} it" + ("" if res.converged else ", not converged")))
    (b, it), sec = timed(lambda: irls_huber(X, lam))
    runs.append(Run("huber", "MM/IRLS (spec §4.3)", "tol 1e-10", sec, b.tolist(), note=f"{it} it"))
    runs.append(_cvxpy_run("huber", X, lam, cvxpy_prev, cvxpy_timeout))
    _finish(runs, X, lam)
    return runs


def _competitors_gm(X: np.ndarray) -> list[Run]:
    runs: list[Run] = []
    try:
        from geom_median.numpy import compute_geometric_median
    except ImportError as exc:
        runs.append(Run("gm", "geom-median", "defaults", None, note=f"skipped: {exc}"))
    else:
        points = np.ascontiguousarray(X.T)
        res, sec = timed(lambda: compute_geometric_median(points), budget_s=2.0)
        runs.append(Run("gm", "geom-median", "defaults (eps 1e-6, maxiter 100, ftol 1e-20)", sec,
                        np.asarray(res.median).tolist(), note=f"{len(res.logs) - 1} it, {res.termination}"))
    try:
        import hdmedians
    except ImportError as exc:
        runs.append(Run("gm", "hdmedians", "defaults", None,
                        note=f"skipped: {exc} (with numpy 2, install with --no-build-isolation)"))
    else:
        for label, kwargs in (("defaults (eps 1e-8, maxiters 500)", {}), ("eps 1e-12, maxiters 10000", {"eps": 1e-12, "maxiters": 10_000})):
            y, sec = timed(lambda kwargs=kwargs: np.asarray(hdmedians.geomedian(X, axis=1, **kwargs)))
            runs.append(Run("gm", "hdmedians", label, sec, y.tolist()))
    return runs


def bench_gm(X: np.ndarray, cvxpy_prev: tuple[int, float] | None, cvxpy_timeout: float) -> list[Run]:
    runs = []
    for tol in OUR_TOLERANCES:
        res, sec = timed(lambda tol=tol: geometric_median(X, tol=tol))
        runs.append(Run("gm", "ours geometric_median", f"tol {tol:g}", sec, res.b.tolist(),
                        note=f"{res.iterations} it" + ("" if res.converged else ", not converged")))
    runs += _competitors_gm(X)
    runs.append(_cvxpy_run("gm", X, None, cvxpy_prev, cvxpy_timeout))
    _finish(runs, X, None)
    return runs


def matched(runs: list[Run]) -> list[tuple[Run, Run, float]]:
    """For each competitor: our loosest-tolerance run at least as accurate in both measures."""
    ours = [r for r in runs if r.method.startswith("ours") and r.gap is not None]
    ours.sort(key=lambda r: -float(r.settings.split()[-1]))  # loosest first
    pairs = []
    for c in runs:
        if c.method.startswith("ours") or c.gap is None or c.seconds is None:
            continue
        gap_ok = max(c.gap, ROUNDING_ULPS * np.spacing(c.objective))
        db_ok = max(c.db, 1e-14 * (1.0 + float(np.linalg.norm(c.b))))
        match = next((o for o in ours if o.gap <= gap_ok and o.db <= db_ok), ours[-1])
        pairs.append((c, match, c.seconds / match.seconds))
    return pairs


def report(N: int, lam: float, X: np.ndarray, runs: list[Run], title: str) -> None:
    print(f"### {title}, N = {N:,}, D = {X.shape[0]}, λ = {lam:.4g}\n")
    print_table(
        ["method", "settings", "time (s)", "objective − best", "‖b − b_best‖", "stationarity", "note"],
        [[r.method, r.settings, fmt_s(r.seconds), fmt_e(r.gap), fmt_e(r.db), fmt_e(r.stationarity), r.note] for r in runs],
    )
    pairs = matched(runs)
    if pairs:
        print(f"Equal accuracy ({title}, N = {N:,}): competitor time / our time at our loosest tolerance that is at least as accurate\n")
        print_table(
            ["competitor", "settings", "its time (s)", "its gap", "its ‖Δb‖", "ours at", "our time (s)", "ratio"],
            [[c.method, c.settings, fmt_s(c.seconds), fmt_e(c.gap), fmt_e(c.db), o.settings, fmt_s(o.seconds), f"{ratio:.3g}×"]
             for c, o, ratio in pairs],
        )


def lambda_sweep(N: int, D: int) -> None:
    """Ours against the spec's MM/IRLS for λ from 'half the points inside' to 'none inside'."""
    X, lam0 = make_data(N, D)
    rows = []
    for factor in LAMBDA_SWEEP:
        lam = factor * lam0
        ours, t_ours = timed(lambda lam=lam: huber_median(X, lam))
        (b_mm, it_mm), t_mm = timed(lambda lam=lam: irls_huber(X, lam))
        inside = float(np.mean(np.linalg.norm(X - ours.b[:, None], axis=0) <= lam))
        gap = huber_objective(b_mm, X, lam) - ours.objective
        rows.append([f"{factor:g}", f"{lam:.3g}", f"{inside:.1%}", f"{ours.iterations}", fmt_s(t_ours), f"{it_mm}",
                     fmt_s(t_mm), fmt_e(gap), fmt_e(float(np.linalg.norm(b_mm - ours.b))), f"{t_mm / t_ours:.3g}×"])
    print(f"### Huber median: ours (tol 1e-10) against MM/IRLS (tol 1e-10) across λ, N = {N:,}, D = {D}\n")
    print_table(["λ / default", "λ", "within λ of b*", "ours it", "ours (s)", "MM it", "MM (s)",
                 "MM objective − ours", "‖b_MM − b_ours‖", "MM time / ours"], rows)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--dim", type=int, default=D_DEFAULT)
    parser.add_argument("--quick", action="store_true", help="N = 1e3 only")
    parser.add_argument("--cvxpy-timeout", type=float, default=CVXPY_TIMEOUT_S)
    parser.add_argument("--json", help="also write every run to this JSON file")
    args = parser.parse_args(argv)
    sizes = [1_000] if args.quick else args.sizes
    print("## Medians benchmark (benchmarks/bench_medians.py)\n")
    print(machine_line() + "\n")
    prev: dict[str, tuple[int, float] | None] = {"huber": None, "gm": None}
    everything: list[dict] = []
    for N in sizes:
        X, lam = make_data(N, args.dim)
        huber_runs = bench_huber(X, lam, prev["huber"], args.cvxpy_timeout)
        b_star = np.asarray(min(huber_runs, key=lambda r: r.gap if r.gap is not None else np.inf).b)
        inside = float(np.mean(np.linalg.norm(X - b_star[:, None], axis=0) <= lam))
        report(N, lam, X, huber_runs, f"Huber median ({inside:.0%} of the points within λ of b*)")
        gm_runs = bench_gm(X, prev["gm"], args.cvxpy_timeout)
        report(N, lam, X, gm_runs, "Geometric median")
        for key, runs in (("huber", huber_runs), ("gm", gm_runs)):
            ref = next(r for r in runs if r.method == "cvxpy reference")
            if ref.seconds is not None:
                prev[key] = (N, ref.seconds)
            everything += [dict(asdict(r), N=N, lam=lam, b=None) for r in runs]
    lambda_sweep(1_000 if args.quick else 10_000, args.dim)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(everything, fh, indent=1)
    return everything


if __name__ == "__main__":
    main()
