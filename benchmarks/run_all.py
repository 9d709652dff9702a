"""Run every benchmark (``make bench``): medians, DNN relaxation vs closed form, exact lasso codes,
the bilinear kernel-trick loss vs the naive lifted loss, LM activation extraction throughput, the
VASAE anchor loss (chunked vs naive), data-parallel training (1 vs 2 gloo ranks).

    .venv/bin/python benchmarks/run_all.py [--quick]

Results and how to read them: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy is imported; see bench_medians.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_activations  # noqa: E402
import bench_anchor  # noqa: E402
import bench_bilinear  # noqa: E402
import bench_ddp  # noqa: E402
import bench_dnn  # noqa: E402
import bench_lasso_codes  # noqa: E402
import bench_medians  # noqa: E402

if __name__ == "__main__":
    quick = ["--quick"] if "--quick" in sys.argv[1:] else []
    bench_medians.main(quick)
    bench_dnn.main(quick)
    bench_lasso_codes.main(["--n", "2000", "--skip-large"] if quick else [])
    bench_bilinear.main(quick)
    bench_activations.main(quick)
    bench_anchor.main(quick)
    bench_ddp.main(quick)
