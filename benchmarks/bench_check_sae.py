"""``dictcheck check-sae`` at real sizes: wall time, peak memory and the per-stage breakdown.

    python benchmarks/bench_check_sae.py                      # the budget case: 16 384 latents, D = 768, 10⁵ tokens
    python benchmarks/bench_check_sae.py --d-sae 4096 --tokens 20000   # a smaller case

Data (seeded): tokens x = Σ_{d∈S} a_d g_d + 0.05·ε, with |S| = ``k`` atoms drawn uniformly from ``d_sae`` unit
ground-truth atoms g_d, amplitudes a_d ~ Exp(1); float32 ``.npy``. The SAE: a TopK SAE (k active) whose
decoder is the ground truth plus noise (0.1·N(0, I/D) per atom, renormalised), encoder = decoderᵀ, biases 0,
saved in the SAELens layout. check-sae runs with every default diagnostic (λ auto, no hull, no polish) in a
fresh process; peak memory is that process's maximum resident set size. Budget (issue 13): ≤ 10 min and
≤ 8 GiB on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae


def make_case(out: Path, d_sae: int, d_in: int, tokens: int, k: int, seed: int = 0) -> tuple[Path, Path]:
    """The data file and the SAE folder of the module docstring."""
    rng = np.random.default_rng(seed)
    G = rng.normal(size=(d_sae, d_in))
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    X = np.lib.format.open_memmap(out / "X.npy", mode="w+", dtype=np.float32, shape=(tokens, d_in))
    for lo in range(0, tokens, 4096):
        n = min(4096, tokens - lo)
        atoms = np.argsort(rng.random((n, d_sae)), axis=1)[:, :k] if d_sae <= 4096 else rng.integers(0, d_sae, (n, k))
        amp = rng.exponential(1.0, (n, k))
        block = np.einsum("nk,nkd->nd", amp, G[atoms]) + 0.05 * rng.normal(size=(n, d_in))
        X[lo:lo + n] = block.astype(np.float32)
    X.flush()
    W_dec = G + 0.1 * rng.normal(size=G.shape) / np.sqrt(d_in)
    W_dec /= np.linalg.norm(W_dec, axis=1, keepdims=True)
    W = torch.as_tensor(W_dec, dtype=torch.float32)
    weights = {"W_dec": W, "W_enc": W.T.contiguous(), "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)}
    folder = save_sae(out / "sae", weights, new_sae_config("topk", d_in, d_sae, k=k))
    return out / "X.npy", folder


def run(data: Path, folder: Path, extra: list[str]) -> dict:
    """check-sae --json in a fresh process: the report, wall seconds and peak RSS (GiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "check-sae", str(folder), "--data",
                           str(data), "--json", *extra], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"check-sae failed: {proc.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"report": json.loads(proc.stdout), "wall_s": wall, "peak_rss_gib": max(peak, before) / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-sae", type=int, default=16384)
    p.add_argument("--d-in", type=int, default=768)
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results_check_sae.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_check_sae_") as tmp:
        t = time.perf_counter()
        data, folder = make_case(Path(tmp), args.d_sae, args.d_in, args.tokens, args.k)
        made = time.perf_counter() - t
        result = run(data, folder, [])
    r = result["report"]
    summary = {"d_sae": args.d_sae, "d_in": args.d_in, "tokens": args.tokens, "k": args.k, "data_s": round(made, 1),
               "wall_s": round(result["wall_s"], 1), "peak_rss_gib": round(result["peak_rss_gib"], 2),
               "stages_s": r["timings_s"], "lam": r["lam"], "lam_source": r["lam_source"], "l0_sae": r["l0_sae"],
               "l0_exact": r["l0_exact"], "kkt_violation": r["kkt_violation"],
               "stationarity_violation": r["stationarity_violation"], "amortisation_gap": r["amortisation_gap"]}
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
