"""``dictcheck check-sae`` at the widths people publish: wall time, peak memory, per-stage times and the floor.

    python benchmarks/bench_check_sae.py --case wide        # 131 072 latents, D = 2304, 20 000 tokens
    python benchmarks/bench_check_sae.py --case widest      # 1 048 576 latents, D = 2304, 2 000 tokens
    python benchmarks/bench_check_sae.py --case long        # 16 384 latents, D = 768, 100 000 tokens
    python benchmarks/bench_check_sae.py --case polish      # 16 384 latents, D = 768, 20 000 tokens, --polish 50 sweeps
    python benchmarks/bench_check_sae.py --d-sae 4096 --d-in 768 --tokens 20000   # any other size

Data (seeded, written block by block, never held whole): a TopK SAE (k active) whose decoder rows are unit
vectors, encoder = decoderᵀ, biases 0, saved in the SAELens layout (the safetensors file written in place, so
a million-latent SAE never sits in memory); tokens x = Σ_{d∈S} a_d w_d + 0.05·ε with |S| = k atoms drawn
uniformly, amplitudes a_d ~ Exp(1), float32 ``.npy``. check-sae runs with every default diagnostic (λ auto,
no hull) in a fresh process; peak memory is that process's maximum resident set size (file pages of the
weights included). The floor, in the same run: one float32 encoder pass X̃·W_enc over the same tokens, a
batch of tokens at a time into one preallocated output (the product alone), summed.
"""

from __future__ import annotations

import argparse
import json
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dictcheck.empirics.io.saelens import CFG_FILE
from dictcheck.empirics.io.sae_folder import new_sae_config

CASES = {  # name: (d_sae, d_in, tokens, extra check-sae arguments)
    "wide": (131072, 2304, 20000, []),
    "widest": (1048576, 2304, 2000, []),
    "long": (16384, 768, 100000, []),
    "polish": (16384, 768, 20000, ["--polish", "--polish-iters", "50"]),
}


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> dict[str, np.memmap]:
    """An F32 safetensors file with the given (dtype, shape) tensors, left to fill through the returned memory
    maps (the header first, then each tensor's bytes in order)."""
    offsets, header, pos = {}, {}, 0
    for name, (dtype, shape) in tensors.items():
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        offsets[name] = (pos, shape)
        pos += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        fh.truncate(8 + len(blob) + pos)
    base = 8 + len(blob)
    return {name: np.memmap(path, dtype=np.float32, mode="r+", offset=base + off, shape=shape)
            for name, (off, shape) in offsets.items()}


def make_case(out: Path, d_sae: int, d_in: int, tokens: int, k: int, seed: int = 0, block: int = 16384
              ) -> tuple[Path, Path]:
    """The data file and the SAE folder of the module docstring."""
    rng = np.random.default_rng(seed)
    folder = out / "sae"
    folder.mkdir()
    cfg = new_sae_config("topk", d_in, d_sae, k=k)
    (folder / CFG_FILE).write_text(json.dumps(cfg.to_dict()))
    mm = _write_safetensors(folder / "sae_weights.safetensors", {
        "W_enc": ("F32", (d_in, d_sae)), "W_dec": ("F32", (d_sae, d_in)), "b_enc": ("F32", (d_sae,)),
        "b_dec": ("F32", (d_in,))})
    for lo in range(0, d_sae, block):
        hi = min(d_sae, lo + block)
        G = rng.normal(size=(hi - lo, d_in)).astype(np.float32)
        G /= np.linalg.norm(G, axis=1, keepdims=True)
        mm["W_dec"][lo:hi] = G
        mm["W_enc"][:, lo:hi] = G.T
    mm["b_enc"][:] = 0.0
    mm["b_dec"][:] = 0.0
    for m in mm.values():
        m.flush()
    W_dec = mm["W_dec"]
    X = np.lib.format.open_memmap(out / "X.npy", mode="w+", dtype=np.float32, shape=(tokens, d_in))
    for lo in range(0, tokens, 2048):
        n = min(2048, tokens - lo)
        atoms = rng.integers(0, d_sae, (n, k))
        amp = rng.exponential(1.0, (n, k)).astype(np.float32)
        X[lo:lo + n] = np.einsum("nk,nkd->nd", amp, W_dec[atoms]) + 0.05 * rng.normal(size=(n, d_in))
    X.flush()
    return out / "X.npy", folder


def floor_seconds(data: Path, folder: Path, batch: int = 1024) -> float:
    """One float32 encoder pass X̃·W_enc over every token, ``batch`` tokens at a time into one preallocated
    output: the product alone (module docstring)."""
    from safetensors import safe_open

    with safe_open(str(folder / "sae_weights.safetensors"), framework="pt") as fh:
        W_enc, b_dec = fh.get_tensor("W_enc"), fh.get_tensor("b_dec")
    X = np.load(data, mmap_mode="r")
    out = torch.empty(batch, W_enc.shape[1])
    total = 0.0
    for lo in range(0, X.shape[0], batch):
        xb = torch.from_numpy(np.array(X[lo:lo + batch])) - b_dec
        o = out[:xb.shape[0]]
        t = time.perf_counter()
        torch.mm(xb, W_enc, out=o)
        total += time.perf_counter() - t
    return total


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
    p.add_argument("--case", choices=sorted(CASES), help="one of the issue's budget cases")
    p.add_argument("--d-sae", type=int, default=16384)
    p.add_argument("--d-in", type=int, default=768)
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--workdir", type=Path, default=None, help="where the case is written (default: a temporary "
                   "folder; a million-latent SAE takes 19 GB of disk)")
    p.add_argument("--out", type=Path, default=None, help="JSON summary (default: print only)")
    args = p.parse_args()
    d_sae, d_in, tokens, extra = CASES[args.case] if args.case else (args.d_sae, args.d_in, args.tokens, [])
    with tempfile.TemporaryDirectory(prefix="bench_check_sae_", dir=args.workdir) as tmp:
        t = time.perf_counter()
        data, folder = make_case(Path(tmp), d_sae, d_in, tokens, args.k)
        made = time.perf_counter() - t
        floor = floor_seconds(data, folder)
        result = run(data, folder, extra)
    r = result["report"]
    summary = {"case": args.case, "d_sae": d_sae, "d_in": d_in, "tokens": tokens, "k": args.k, "extra": extra,
               "data_s": round(made, 1), "wall_s": round(result["wall_s"], 1),
               "peak_rss_gib": round(result["peak_rss_gib"], 2), "floor_s": round(floor, 2),
               "wall_over_floor": round(result["wall_s"] / floor, 1), "stages_s": r["timings_s"], "lam": r["lam"],
               "lam_source": r["lam_source"], "l0_sae": r["l0_sae"], "l0_exact": r["l0_exact"],
               "kkt_violation": r["kkt_violation"], "stationarity_violation": r["stationarity_violation"],
               "amortisation_gap": r["amortisation_gap"], "polish": {k: r["polish"][k] for k in
                                                                   ("sweeps", "converged", "objective_change_pct")}
               if "polish" in r else None}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
