"""Is "the sparse TopK step within 1.2× of the encoder GEMM" reachable here? The step's parts, each alone.

Issue 17 item 2 asks for the sparse TopK training step within 1.2× of the one dense product it cannot
avoid, the encoder GEMM x̃ W_enc (RESULTS.md §4, "floor"). That leaves 0.2 × GEMM for everything
else. This script measures, in one run, at the §4 setup (d_in = 512, d_sae = 4096, batch 4096,
k = 32, float32, random Gaussian batches, two threads), the GEMM and each other part of the step
*alone*, each at its best (minimum over ``--repeats`` after a warm-up), on the indices and gradients
of a real step of ``make_sae("topk", …)``:

* forward: the row top-k of the pre-activations as the step runs it (``encoder_topk`` selects each
  ≤ 8 MiB row block of the GEMM's output while it is in cache: here ``row_topk`` on one such block,
  in cache, times the number of blocks), the decode ``embedding_bag``, and the loss ‖x − x̂‖²/B with
  its gradient;
* backward: the grouping by latent (``by_latent`` with the model's tile), the decode's fused pass
  (∂z and ∂W_dec, ``scatter_rows_and_dots``), the encoder's ∂W_enc in W_enc's layout
  (``scatter_rows(…, transposed=True)``) with ∂b_enc and ∂b_dec;
* after it: ``remove_parallel_grad_``, ``clip_grad_norm_``, Adam (torch's default and, as a lower
  bound, ``fused=True``, which would change the numbers at rounding level), ``normalise_decoder_``
  and the dead-latent counter.

Their sum with the fused Adam is a lower bound of the step's time besides the GEMM *for this design*
(every part at its best at once, with the caches to itself, none of the in-step slow-down): if it
exceeds 0.2 × GEMM, 1.2× is out of reach without another design. The whole step (the loop body of
``empirics.training.loop.train``, ``bench_training.make_ours``) is timed in the same run for comparison.

Usage (from the repository root):

    .venv/bin/python benchmarks/step_budget.py            # ~1 min
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_training import add_setup_arguments, encoder_gemm, make_ours, time_steps  # noqa: E402  (first: it sets OpenMP's spin before torch loads)

import torch  # noqa: E402
from dictcheck.empirics.architectures.linear_sae import make_sae  # noqa: E402
from dictcheck.empirics.kernels.sparse_products import scatter_rows, scatter_rows_and_dots  # noqa: E402
from dictcheck.empirics.kernels.topk_select import row_blocks, row_topk  # noqa: E402


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """Minimum wall time of ``fn()`` over ``repeats`` calls after one warm-up call, in ms."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def part_times(d_in: int, d_sae: int, batch: int, k: int, repeats: int) -> dict[str, float]:
    """ms of each part of the sparse TopK step alone (module docstring), keyed by name; "GEMM" is the
    floor, "Adam (torch default)" the one the step runs (not part of the lower bound)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, d_in, generator=gen)
    model = make_sae("topk", d_in, d_sae, k=k, seed=0)
    res = model(x)
    res.loss.backward()  # a real step's gradients, for the parts after the backward
    xe = model._encoder_input(x).detach()  # x̃ = x − b_dec
    with torch.no_grad():  # the forward's ActiveLatents (its cache: the grouping both backward passes share)
        act = model.encoding(x).active  # encoding centres x itself, as forward calls it
    W_enc, W_dec, b_enc = model.W_enc.detach(), model.W_dec.detach(), model.b_enc.detach()
    cuts = row_blocks(batch, d_sae, xe.element_size())
    block = xe[: cuts[1]] @ W_enc + b_enc  # one row block of the pre-activation, as encoder_topk makes it
    g = (2.0 / batch) * (res.x_hat - x).detach()  # ∂L/∂x̂
    groups = act.by_latent(d_sae, g)
    val_sorted = act.vals.detach().reshape(-1)[groups.order]
    dots = scatter_rows_and_dots(groups, val_sorted, W_dec, g)[1]
    g_pre_sorted = dots[groups.order]  # ∂L/∂a at the selected entries (all positive here: ReLU passes)
    flat_idx = act.idx.reshape(-1)
    x_hat = res.x_hat.detach().requires_grad_(True)

    def loss_and_grad() -> None:
        loss = (x - x_hat).pow(2).sum() / batch
        torch.autograd.grad(loss, x_hat)

    def encoder_backward() -> None:
        scatter_rows(groups, g_pre_sorted, xe, transposed=True)
        grad_b = torch.zeros_like(b_enc).index_add_(0, flat_idx, dots)
        W_enc @ grad_b

    def grouping() -> None:
        act.cache.clear()
        act.by_latent(d_sae, g)

    params = list(model.parameters())
    adams = {"Adam (torch default)": torch.optim.Adam(params, lr=1e-6),
             "Adam fused=True (lower bound)": torch.optim.Adam(params, lr=1e-6, fused=True)}
    since = torch.zeros(d_sae, dtype=torch.int64)

    def dead_counter() -> None:
        fired = res.fired(d_sae)
        torch.where(fired, torch.zeros_like(since), since + batch)

    parts: dict[str, Callable[[], object]] = {
        "GEMM": encoder_gemm(xe, W_enc),
        "row top-k (blocks in cache)": lambda: row_topk(block, k),
        "decode embedding_bag": lambda: act.decode(W_dec),
        "loss ‖x − x̂‖²/B and its gradient": loss_and_grad,
        "grouping by latent": grouping,
        "decode backward (∂z, ∂W_dec; one pass)": lambda: scatter_rows_and_dots(groups, val_sorted, W_dec, g),
        "encoder backward (∂W_enc in its layout, ∂b)": encoder_backward,
        "remove_parallel_grad_": model.remove_parallel_grad_,
        "clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_(params, 1.0),
        **{name: opt.step for name, opt in adams.items()},
        "normalise_decoder_": model.normalise_decoder_,
        "dead-latent counter": dead_counter,
    }
    times = {name: best_ms(fn, repeats) for name, fn in parts.items()}
    times["row top-k (blocks in cache)"] *= len(cuts) - 1
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_setup_arguments(ap)
    ap.add_argument("--repeats", type=int, default=15, help="calls per part (minimum reported)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of parts and whole steps (median)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(a.batch, a.d_in, generator=gen) for _ in range(4)]
    rounds: list[dict[str, float]] = []
    for r in range(a.rounds):
        times = part_times(a.d_in, a.d_sae, a.batch, a.k, a.repeats)
        step = make_ours("topk", "sparse", a.d_in, a.d_sae, a.k, 1e-4)
        times["whole step (as trained)"] = time_steps(step, batches, 2, 8) / 8 * 1e3
        rounds.append(times)
        print(f"# round {r + 1}: GEMM {times['GEMM']:.1f} ms, whole step {times['whole step (as trained)']:.1f} ms",
              flush=True)
    med = {name: statistics.median(t[name] for t in rounds) for name in rounds[0]}
    gemm = med["GEMM"]
    rest = [n for n in med if n not in ("GEMM", "Adam (torch default)", "whole step (as trained)")]
    total = sum(med[n] for n in rest)
    print(f"\nSparse TopK step, d_in={a.d_in} d_sae={a.d_sae} batch={a.batch} k={a.k} float32, "
          f"{torch.get_num_threads()} threads; each part alone, best of {a.repeats}, median of {a.rounds} rounds\n")
    print("| part | ms | ÷ GEMM |")
    print("|---|---:|---:|")
    for name in ["GEMM", *rest, "Adam (torch default)"]:
        print(f"| {name} | {med[name]:.2f} | {med[name] / gemm:.3f} |")
    print(f"| **sum of the parts besides the GEMM (fused Adam)** | **{total:.2f}** | **{total / gemm:.3f}** |")
    print(f"| budget at 1.2× (0.2 × GEMM) | {0.2 * gemm:.2f} | 0.200 |")
    print(f"| whole step as trained (2 + 8 steps) | {med['whole step (as trained)']:.2f} | "
          f"{med['whole step (as trained)'] / gemm:.3f} |")
    verdict = "out of reach for this design" if total > 0.2 * gemm else "reachable in principle"
    print(f"\nlower bound of step ÷ GEMM with every part at its best: {1 + total / gemm:.2f} "
          f"(aim 1.2: {verdict})")


if __name__ == "__main__":
    main()
