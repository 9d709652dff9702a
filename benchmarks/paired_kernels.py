"""Paired rounds: the exact-codes kernel of an earlier commit against this checkout's, on the same inputs.

``solvers/active_set.solve_points`` (phase A of ``solvers/lasso_codes``) of commit REV is written to a
temporary directory under its own module name (loading this checkout's file under another name would
mix up numba's on-disk cache) and timed against the checkout's kernel on the RESULTS.md §3 problem
(or the large one): one thread, the points cut into chunks, both kernels run on each chunk back to
back in alternating order, ``--rounds`` times. The median of the per-chunk time ratios (new ÷ old) is
robust to the minute-scale swings of a shared VM that move best-of-N timings by ±30 %. Inputs come
from this checkout's ``_compiled_inputs`` (its candidate count unless ``--old-candidates`` /
``--new-candidates`` say otherwise); the codes of both kernels are compared.

Usage (from the repository root; pin it to one core for stable numbers):

    taskset -c 0 .venv/bin/python benchmarks/paired_kernels.py --old 1a6b02f
    taskset -c 0 .venv/bin/python benchmarks/paired_kernels.py --old 1a6b02f --large --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_lasso_codes import make_data  # noqa: E402
from dictcheck.solvers import active_set, lasso_codes  # noqa: E402


def module_at(rev: str, source: str, workdir: Path, imports: dict[str, str] | None = None):
    """The file ``source`` (e.g. solvers/active_set.py) of commit ``rev``, written to ``workdir`` and
    loaded under a name of its own (never the checkout's file under another name: numba's on-disk
    cache would mix them up); ``imports`` maps a module path it imports to the name of one loaded
    here before (e.g. the same commit's dependency)."""
    stem = Path(source).stem
    name = f"{stem}_{rev.replace('/', '_').replace('~', '_').replace('^', '_')}"
    path = workdir / f"{name}.py"
    src = subprocess.run(["git", "show", f"{rev}:{source}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    for old, new in (imports or {}).items():
        src = src.replace(f"from {old} import", f"from {new} import")
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: The modules of empirics/ before its regroup into sub-packages -> their homes since (for loading a file
#: of an earlier commit against this checkout).
REGROUPED = {
    "dictcheck.empirics.activation_normalisation": "dictcheck.empirics.architectures.activation_normalisation",
    "dictcheck.empirics.featurizer": "dictcheck.empirics.architectures.featurizer",
    "dictcheck.empirics.sae_models": "dictcheck.empirics.architectures.linear_sae",
    "dictcheck.empirics.sparse_products": "dictcheck.empirics.kernels.sparse_products",
    "dictcheck.empirics.topk_select": "dictcheck.empirics.kernels.topk_select",
    "dictcheck.empirics.openmp_spin": "dictcheck.empirics.kernels.openmp_spin",
    "dictcheck.empirics.straight_through": "dictcheck.empirics.kernels.straight_through",
    "dictcheck.empirics.training": "dictcheck.empirics.training.loop",
    "dictcheck.empirics.checkpoints": "dictcheck.empirics.training.checkpoints",
    "dictcheck.empirics.distributed": "dictcheck.empirics.training.distributed",
    "dictcheck.empirics.sae_io": "dictcheck.empirics.io.saelens",
    "dictcheck.empirics.sae_folder": "dictcheck.empirics.io.sae_folder",
    "dictcheck.empirics.sae_formats": "dictcheck.empirics.io.formats",
    "dictcheck.empirics.safe_io": "dictcheck.empirics.io.safe_files",
    "dictcheck.empirics.atomic_files": "dictcheck.empirics.io.atomic_files",
    "dictcheck.empirics.toy_data": "dictcheck.empirics.data.toys",
    "dictcheck.empirics.manifold_toy": "dictcheck.empirics.data.manifold_toy",
    "dictcheck.empirics.quadric_toy": "dictcheck.empirics.data.quadric_toy",
    "dictcheck.empirics.corpus": "dictcheck.empirics.data.corpus",
    "dictcheck.empirics.lm_models": "dictcheck.empirics.data.lm_models",
    "dictcheck.empirics.activation_store": "dictcheck.empirics.data.activation_store",
    "dictcheck.empirics.row_source": "dictcheck.empirics.data.row_source",
    "dictcheck.empirics.metrics": "dictcheck.empirics.metrics.reconstruction",
    "dictcheck.empirics.lm_metrics": "dictcheck.empirics.metrics.lm",
    "dictcheck.empirics.manifold_metrics": "dictcheck.empirics.metrics.manifold",
    "dictcheck.empirics.manifold_bench": "dictcheck.empirics.metrics.manifold_bench",
    "dictcheck.empirics.bsf_models": "dictcheck.empirics.architectures.bsf",
    "dictcheck.empirics.bilinear_models": "dictcheck.empirics.architectures.bilinear",
    "dictcheck.empirics.vasae_models": "dictcheck.empirics.architectures.vasae",
    "dictcheck.empirics.ground_truth": "dictcheck.empirics.metrics.ground_truth",
    "dictcheck.empirics.synthetic": "dictcheck.empirics.data.synthetic",
}


def path_at(rev: str, *paths: str) -> str:
    """The first of ``paths`` that exists in commit ``rev`` (a file's current path, then its earlier ones)."""
    for path in paths:
        if subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT, capture_output=True).returncode == 0:
            return path
    raise FileNotFoundError(f"none of {paths} in commit {rev}")


def kernel_at(rev: str, workdir: Path):
    """The module solvers/active_set.py of commit ``rev``, loaded under a name of its own."""
    return module_at(rev, "solvers/active_set.py", workdir)


def chunk_inputs(ctx, Xc: np.ndarray, size: int, candidates: int | None) -> list[tuple]:
    """solve_points' arguments for each chunk of ``size`` points (top-``candidates`` start)."""
    keep = lasso_codes._CANDIDATES
    if candidates is not None:
        lasso_codes._CANDIDATES = candidates
    try:
        return [lasso_codes._compiled_inputs(ctx, torch.as_tensor(Xc[s:s + size]),
                                             torch.full((min(size, len(Xc) - s), 1), ctx.d_z), 30)
                for s in range(0, len(Xc), size)]
    finally:
        lasso_codes._CANDIDATES = keep


def dense_codes(out, d_z: int) -> np.ndarray:
    idx, val = out[0], out[1]
    Z = np.zeros((idx.shape[0], d_z + 1))
    np.put_along_axis(Z, idx, val, axis=1)
    return Z[:, :d_z]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="commit whose solvers/active_set.py is the baseline")
    ap.add_argument("--large", action="store_true", help="the large problem (D=768, d_z=16384) instead of §3's")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--chunk", type=int, default=None, help="points per chunk (default 500; large: 60)")
    ap.add_argument("--old-candidates", type=int, default=None)
    ap.add_argument("--new-candidates", type=int, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.large:
        D, d_z, N, k, lam, chunk = 768, 16384, 300, 64, 0.45, args.chunk or 60
    else:
        D, d_z, N, k, lam, chunk = 256, 1024, 4000, 30, 0.3, args.chunk or 500
    W, X, b, _ = make_data(D, d_z, N, k, 0.1, 0)
    ctx = lasso_codes._make_ctx(W, lam, 1e-8, torch.device("cpu"), torch.float64)
    Xc = np.ascontiguousarray((X - b[:, None]).T)
    with tempfile.TemporaryDirectory() as tmp:
        sides = [(kernel_at(args.old, Path(tmp)), chunk_inputs(ctx, Xc, chunk, args.old_candidates)),
                 (active_set, chunk_inputs(ctx, Xc, chunk, args.new_candidates))]
        outs = [[m.solve_points(*a) for a in inputs] for m, inputs in sides]  # compile, then compare
        dz = max(np.abs(dense_codes(o, d_z) - dense_codes(n, d_z)).max() for o, n in zip(*outs))
        times = np.zeros((2, args.rounds, len(sides[0][1])))
        for r in range(args.rounds):
            for c in range(times.shape[2]):
                for s in ((0, 1) if (r + c) % 2 == 0 else (1, 0)):
                    module, inputs = sides[s]
                    t0 = time.perf_counter()
                    module.solve_points(*inputs[c])
                    times[s, r, c] = time.perf_counter() - t0
    ratio = (times[1] / times[0]).ravel()
    per_point = times.sum(axis=2) / N * 1e6
    print(f"{'large' if args.large else 'RESULTS §3'} problem, {N} points in chunks of {chunk}, {args.rounds} rounds; "
          f"max |ΔZ| = {dz:.1e}")
    print(f"old ({args.old}): median {np.median(per_point[0]):.1f} µs per point; "
          f"new (checkout): median {np.median(per_point[1]):.1f}")
    print(f"paired ratio new ÷ old: median {np.median(ratio):.3f} "
          f"(IQR {np.percentile(ratio, 25):.3f}–{np.percentile(ratio, 75):.3f})")


if __name__ == "__main__":
    main()
