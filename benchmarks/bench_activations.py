"""Benchmark: residual-stream extraction throughput of ``empirics.data.activation_store`` on SmolLM2-135M.

docs/ecosystem.md §5; issue 7 item 6. Reproduce:

    .venv/bin/python benchmarks/bench_activations.py            # 1024 rows per measurement
    .venv/bin/python benchmarks/bench_activations.py --quick    # 256 rows, fewer settings

Contenders, all on the same token windows (``token_windows``, seed 0) and giving the same rows
(h^(L) at positions 1.. of each window, checked to 1e-4 against the naive rows):

* **naive**: one window at a time, ``model(ids, output_hidden_states=True)``, slice
  ``hidden_states[L+1]`` (all 30 blocks and the 49152-way LM head run for every window);
* **batched full**: the same with ``batch`` windows per forward (isolates the batching gain);
* **dictcheck**: ``extract_activations`` end to end (tokenisation, forward stopped after block L by
  ``residual_at``, float32 shards written atomically with SHA-256, manifest), ``batch`` windows
  per forward.

Throughput is rows (tokens) per second of wall time; the table gives it and the ratio to naive at
the same context and layer. One thread (``torch.set_num_threads(1)``): the benchmark machine has
2 cores shared with other jobs. The model load time is printed separately.
"""

from __future__ import annotations

import argparse
import math
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from dictcheck.empirics.data.activation_store import extract_activations, token_windows
from dictcheck.empirics.data.lm_models import LoadedLM, load_lm


def _naive(lm: LoadedLM, layer: int, windows: np.ndarray, batch: int) -> np.ndarray:
    rows = []
    with torch.no_grad():
        for b in range(0, len(windows), batch):
            ids = torch.from_numpy(windows[b:b + batch])
            hs = lm.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[layer + 1]
            rows.append(hs[:, 1:].reshape(-1, lm.d_model).numpy())
    return np.concatenate(rows)


def _timed(fn) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tokens", type=int, help="rows per measurement (default 1024, --quick 256)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n_rows = args.tokens or (256 if args.quick else 1024)
    settings = [(5, 64, 8), (5, 128, 8)] if args.quick else [(5, 64, 1), (5, 64, 8), (5, 128, 8), (5, 128, 16),
                                                             (20, 128, 8)]
    t_load, lm = _timed(lambda: load_lm("smollm2"))
    print(f"# Activation extraction, SmolLM2-135M-Instruct Q4_1 (fp32), {n_rows} rows per run, 1 thread, "
          f"{platform.processor() or platform.machine()}; model load {t_load:.1f} s\n")
    print("| layer | context | batch | naive tok/s | batched full tok/s (×) | dictcheck tok/s (×) |")
    print("|---:|---:|---:|---:|---:|---:|")
    naive: dict[tuple[int, int], tuple[float, np.ndarray]] = {}  # (layer, context) -> (tok/s, rows)
    for layer, context, batch in settings:
        windows = token_windows(lm, math.ceil(n_rows / (context - 1)), context=context)
        if (layer, context) not in naive:
            dt, ref = _timed(lambda: _naive(lm, layer, windows, 1))
            naive[(layer, context)] = (len(ref) / dt, ref)
        base, ref = naive[(layer, context)]
        full_cell = "—"
        if batch > 1:
            dt_full, full = _timed(lambda: _naive(lm, layer, windows, batch))
            np.testing.assert_allclose(full, ref, rtol=1e-4, atol=1e-4)
            full_cell = f"{len(full) / dt_full:.0f} ({len(full) / dt_full / base:.2f}×)"
        with tempfile.TemporaryDirectory(prefix="bench_acts_") as tmp:
            dt_ours, store = _timed(lambda: extract_activations(lm, layer, n_rows, Path(tmp) / "a", context=context,
                                                                batch_size=batch, progress=False))
            np.testing.assert_allclose(store.to_array(), ref[:n_rows], rtol=1e-4, atol=1e-4)
        rate = n_rows / dt_ours
        print(f"| {layer} | {context} | {batch} | {base:.0f} | {full_cell} | {rate:.0f} ({rate / base:.2f}×) |",
              flush=True)


if __name__ == "__main__":
    main()
