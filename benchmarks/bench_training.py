"""Benchmark: SAE training throughput (tokens/s) of ours against SAELens, same CPU, same process.

Reproduce (SAELens lives in its own venv, never in ``.venv``; ``.venv-bench/`` is git-ignored):

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -c constraints.txt sae-lens      # torch 2.13.0 CPU from disk
    .venv-bench/bin/python benchmarks/bench_training.py          # ~4 min quiet, ~9 min on a loaded 2-core VM
    .venv-bench/bin/python benchmarks/bench_training.py --quick  # seconds (small shapes)

Ours is imported from this checkout (the repository root is put on ``sys.path``; only
``empirics.architectures.linear_sae`` and torch are needed), so both libraries run on the same torch build, the
same CPU and in the same process. Without ``sae_lens`` importable (e.g. under ``.venv``) only ours
is timed and the reason is printed.

Setup (issue: d_in = 512, d_sae = 4096, batch 4096, float32, torch threads = 2):

* **ours relu**: ``make_sae("relu", d_in, d_sae, lam=LAM)``; **ours topk** / **ours batchtopk**:
  ``make_sae("topk" | "batchtopk", ..., k=32)`` (aux_coef = 0, the option's default), each in two
  variants: ``sparse`` (the default: gathered decode and sparse encoder backward,
  ``empirics.kernels.active_latents.ActiveLatents``, the rows' top k read from the encoder product block by
  block, ``empirics.kernels.topk_select``, no dense codes) and ``dense`` (``sparse_decode = False``: z @ W_dec and
  autograd through the dense pre-activation; same numbers). One step is exactly the loop body of
  ``empirics.training.loop.train`` minus the batch gather: set the lr, ``forward``, ``zero_grad``,
  ``backward``, ``remove_parallel_grad_()``, ``clip_grad_norm_(…, 1.0)``, Adam ``step``,
  ``normalise_decoder_()``, and the dead-latent counter update (``res.fired``).
* **SAELens standard**: ``StandardTrainingSAE(StandardTrainingSAEConfig(d_in, d_sae,
  l1_coefficient=LAM))``; **SAELens topk**: ``TopKTrainingSAE(TopKTrainingSAEConfig(d_in, d_sae,
  k=32))`` (its defaults otherwise: decoder_init_norm 0.1, rescale_acts_by_decoder_norm True,
  dense activations, aux_loss_coefficient 1), and the same with ``use_sparse_activations=True``
  (its COO sparse decode, variant ``sparse``); **SAELens batchtopk**:
  ``BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(d_in, d_sae, k=32))``. One step is the body of SAELens's
  ``SAETrainer._train_step``: ``training_forward_pass(TrainStepInput(...))`` with the trainer's
  dead-neuron mask, its firing statistics, ``backward``, ``clip_grad_norm_(…, 1.0)``,
  ``torch.optim.Adam`` step, ``zero_grad`` (the lr-scheduler step, a scalar update, is omitted;
  no autocast, as on CPU float32). SAELens does not constrain decoder norms during training (its
  L1 term and TopK selection multiply by ‖W_dec row‖ instead), so it has no counterpart of our
  remove_parallel_grad_/normalise_decoder_.

* **floor**: the encoder GEMM (batch × d_in)·(d_in × d_sae), the one dense product the sparse
  TopK step cannot avoid, timed in the same rounds (best of 5 per round) into one preallocated
  output (``encoder_gemm``: the product alone; a fresh 64 MiB output each time adds its page faults,
  61–66 against 49–52 ms on the benchmark VM); the dense step does 6 of these products (encoder,
  decoder, and their backward products), so its floor is 6× this.

OpenMP: the script shortens libgomp's idle spin before torch loads, as the ``dictcheck`` command
does (``empirics/kernels/openmp_spin.py``; SAELens, in the same process, runs under it too); the header
prints the value. ``GOMP_SPINCOUNT=300000`` in the environment restores libgomp's default.

Data: random Gaussian activations, a pool of 4 fixed batches (same for both), cycled; no data
loading is timed. Timing: per contender, ``--warmup`` untimed steps then ``--steps`` timed steps
(wall clock, ``time.perf_counter``), tokens/s = steps·batch / time. The contenders are interleaved
in ``--rounds`` rounds (fresh model + Adam each round) and the median round is reported, because
the benchmark machine is shared. Ratio = ours tokens/s / SAELens tokens/s (> 1: ours faster).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dictcheck.empirics.kernels.openmp_spin import SPIN_ENV, shorten_openmp_spin  # noqa: E402

shorten_openmp_spin()  # before torch loads, as the dictcheck command does (both libraries run under it)

import torch  # noqa: E402

from dictcheck.empirics.architectures.linear_sae import make_sae  # noqa: E402

LAM = 5.0  # sparsity coefficient (our λ, SAELens l1_coefficient); no effect on the work per step

try:  # optional competitor
    import sae_lens  # noqa: F401
    from sae_lens.saes.sae import TrainStepInput
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig

    SAELENS_ERROR: str | None = None
except Exception as exc:  # noqa: BLE001 - report any import failure and carry on with ours
    SAELENS_ERROR = f"{type(exc).__name__}: {exc}"


def _version(pkg: str) -> str:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return "not installed"


# --------------------------------------------------------------------------- ours
def make_ours(arch: str, variant: str, d_in: int, d_sae: int, k: int, lr: float,
              factory: Callable[..., torch.nn.Module] = make_sae):
    """One training step of ours as a function of the batch (``factory``: the ``make_sae`` to build
    the model with; benchmarks/paired_training.py passes an earlier commit's)."""
    kw = {"k": k} if arch in ("topk", "batchtopk") else {"lam": LAM}
    model = factory(arch, d_in, d_sae, seed=0, **kw)
    model.sparse_decode = variant == "sparse"
    with torch.no_grad():
        model.normalise_decoder_()  # as train() does at init
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    state = {"since_fired": torch.zeros(d_sae, dtype=torch.int64)}

    def step(xb: torch.Tensor) -> float:
        # == the loop body of empirics.training.loop.train (minus the batch gather), aux_coef = 0
        for group in opt.param_groups:
            group["lr"] = lr
        res = model(xb, dead_mask=None)
        opt.zero_grad(set_to_none=True)
        res.loss.backward()
        model.remove_parallel_grad_()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            model.normalise_decoder_()
            fired = res.fired(d_sae)
            sf = state["since_fired"]
            state["since_fired"] = torch.where(fired, torch.zeros_like(sf), sf + xb.shape[0])
        return float(res.loss.detach())

    return step


# --------------------------------------------------------------------------- SAELens
def make_saelens(arch: str, variant: str, d_in: int, d_sae: int, k: int, lr: float):
    if arch == "topk":
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(
            d_in=d_in, d_sae=d_sae, k=k, dtype="float32", device="cpu",
            use_sparse_activations=variant == "sparse",
        ))
        coeffs: dict[str, float] = {}
    elif arch == "batchtopk":
        sae = BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=k, dtype="float32", device="cpu"))
        coeffs = {}
    else:
        sae = StandardTrainingSAE(
            StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae, l1_coefficient=LAM, dtype="float32", device="cpu")
        )
        coeffs = {"l1": LAM}
    opt = torch.optim.Adam(sae.parameters(), lr=lr, betas=(0.9, 0.999))
    dead_feature_window = 1000  # SAELens default
    st = {
        "since_fired": torch.zeros(d_sae),
        "act_freq": torch.zeros(d_sae),
        "n_frac": 0,
        "n_steps": 0,
    }

    def step(xb: torch.Tensor) -> float:
        # == the body of sae_lens.training.sae_trainer.SAETrainer._train_step
        sae.train()
        out = sae.training_forward_pass(
            step_input=TrainStepInput(
                sae_in=xb,
                dead_neuron_mask=(st["since_fired"] > dead_feature_window).bool(),
                coefficients=coeffs,
                n_training_steps=st["n_steps"],
                is_logging_step=False,
            )
        )
        with torch.no_grad():
            firing = out.feature_acts.bool().float()
            did_fire = firing.sum(-2).bool()
            if did_fire.is_sparse:
                did_fire = did_fire.to_dense()
            st["since_fired"] += 1
            st["since_fired"][did_fire] = 0
            st["act_freq"] += firing.sum(0)
            st["n_frac"] += xb.shape[0]
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        st["n_steps"] += 1
        return float(out.loss.detach())

    return step


# --------------------------------------------------------------------------- timing
def encoder_gemm(x: torch.Tensor, w: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The floor: x @ w into one output allocated here, so that a call times the product alone."""
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype)
    return lambda: torch.mm(x, w, out=out)


def time_steps(step, batches: list[torch.Tensor], warmup: int, steps: int) -> float:
    """Seconds for ``steps`` timed steps after ``warmup`` untimed ones."""
    for i in range(warmup):
        step(batches[i % len(batches)])
    t0 = time.perf_counter()
    last = 0.0
    for i in range(steps):
        last = step(batches[(warmup + i) % len(batches)])
    dt = time.perf_counter() - t0
    if last != last:  # NaN loss would mean a broken step
        raise FloatingPointError("non-finite loss")
    return dt


def add_setup_arguments(p: argparse.ArgumentParser) -> None:
    """The setup's options (module docstring), shared with benchmarks/step_budget.py."""
    p.add_argument("--d-in", type=int, default=512)
    p.add_argument("--d-sae", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_setup_arguments(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--archs", default="relu,topk,batchtopk", help="comma-separated subset to time")
    p.add_argument("--profile", default=None, metavar="ARCH",
                   help="instead: torch.profiler table of two ours-sparse steps of ARCH on one thread")
    p.add_argument("--quick", action="store_true", help="small shapes, 1 round (smoke run)")
    a = p.parse_args(argv)
    if a.quick:
        a.d_in, a.d_sae, a.batch, a.steps, a.warmup, a.rounds = 64, 512, 512, 3, 1, 1

    torch.set_num_threads(1 if a.profile else a.threads)
    torch.manual_seed(0)
    lr = 2e-4 / (a.d_sae / 2**14) ** 0.5  # default_lr; same for both (the lr does not change the cost)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(a.batch, a.d_in, generator=gen, dtype=torch.float32) for _ in range(4)]

    print(f"# SAE training throughput: d_in={a.d_in} d_sae={a.d_sae} batch={a.batch} k={a.k} float32, "
          f"torch threads={torch.get_num_threads()}, {a.warmup} warm-up + {a.steps} timed steps, "
          f"{a.rounds} interleaved rounds (median), {SPIN_ENV}={os.environ.get(SPIN_ENV, 'unset')}")
    print(f"# python {platform.python_version()}, torch {torch.__version__}, sae-lens {_version('sae-lens')}, "
          f"{platform.machine()} {os.cpu_count()} CPUs, {platform.processor() or platform.platform()}")

    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        step = make_ours(a.profile, "sparse", a.d_in, a.d_sae, a.k, lr)
        time_steps(step, batches, a.warmup, 1)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            time_steps(step, batches, 0, 2)
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=30))
        return

    contenders: list[tuple[str, str, str, object]] = [
        ("ours", "relu", "dense", make_ours),
        ("ours", "topk", "dense", make_ours),
        ("ours", "topk", "sparse", make_ours),
        ("ours", "batchtopk", "dense", make_ours),
        ("ours", "batchtopk", "sparse", make_ours),
    ]
    if SAELENS_ERROR is None:
        contenders += [
            ("SAELens", "relu", "dense", make_saelens),
            ("SAELens", "topk", "dense", make_saelens),
            ("SAELens", "topk", "sparse", make_saelens),
            ("SAELens", "batchtopk", "dense", make_saelens),
        ]
    else:
        print(f"# SAELens skipped: {SAELENS_ERROR}")
    archs = a.archs.split(",")
    contenders = [c for c in contenders if c[1] in archs]

    xg = batches[0]
    w_enc = torch.randn(a.d_in, a.d_sae, generator=gen, dtype=torch.float32)

    gemm = encoder_gemm(xg, w_enc)

    def gemm_seconds() -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            gemm()
            best = min(best, time.perf_counter() - t0)
        return best

    keys = [(lib, arch, var) for lib, arch, var, _ in contenders] + [("floor", "GEMM", "")]
    rates: dict[tuple[str, str, str], list[float]] = {key: [] for key in keys}
    failed: dict[tuple[str, str, str], str] = {}
    for r in range(a.rounds):
        for lib, arch, var, factory in contenders:
            if (lib, arch, var) in failed:
                continue
            try:
                step = factory(arch, var, a.d_in, a.d_sae, a.k, lr)
                dt = time_steps(step, batches, a.warmup, a.steps)
            except Exception as exc:  # noqa: BLE001 - a competitor's failure is a result
                failed[(lib, arch, var)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                print(f"#   {lib} {arch} {var} failed: {failed[(lib, arch, var)]}", flush=True)
                continue
            rate = a.steps * a.batch / dt
            rates[(lib, arch, var)].append(rate)
            print(f"#   round {r + 1}: {lib:8s} {arch:9s} {var:6s} {dt / a.steps * 1e3:8.1f} ms/step  "
                  f"{rate:10.0f} tokens/s", flush=True)
            del step
        g = gemm_seconds()
        rates[("floor", "GEMM", "")].append(a.batch / g)
        print(f"#   round {r + 1}: encoder GEMM {g * 1e3:8.1f} ms  {a.batch / g:10.0f} tokens/s", flush=True)

    keys = [key for key in keys if rates[key]]
    names = {"relu": "ReLU/L1 (SAELens: standard)", "topk": f"TopK k={a.k}", "batchtopk": f"BatchTopK k={a.k}",
             "GEMM": "encoder GEMM alone (floor of the sparse step)"}
    med = {key: statistics.median(v) for key, v in rates.items() if v}
    print()
    print("| architecture | library | variant | ms/step (median) | tokens/s (median) | tokens/s (min–max over rounds) |")
    print("|---|---|---|---|---|---|")
    for key in keys:
        lib, arch, var = key
        rs = rates[key]
        print(f"| {names[arch]} | {lib} | {var} | {a.batch / med[key] * 1e3:.1f} | {med[key]:,.0f} | "
              f"{min(rs):,.0f}–{max(rs):,.0f} |")
    for (lib, arch, var), msg in failed.items():
        print(f"\n{lib} {arch} ({var}) failed in every round: {msg}")
    floor = rates[("floor", "GEMM", "")]
    print()
    print("| architecture | ours variant | vs SAELens default (median, per round) | vs fastest SAELens variant | "
          "ours step ÷ floor (floor: 1 encoder GEMM sparse, 6 GEMMs dense; per round) |")
    print("|---|---|---|---|---|")
    for arch in ("relu", "topk", "batchtopk"):
        for var in ("dense", "sparse"):
            o = rates.get(("ours", arch, var))
            if not o:
                continue
            n_gemm = 1 if var == "sparse" else 6
            fl = ", ".join(f"{f / n_gemm / x:.2f}" for x, f in zip(o, floor))
            cells = ["–", "–"]
            if SAELENS_ERROR is None:
                s_def = rates[("SAELens", arch, "dense")]
                per = ", ".join(f"{x / y:.2f}" for x, y in zip(o, s_def))
                cells[0] = f"{statistics.median(o) / statistics.median(s_def):.2f}× ({per})"
                best = max(statistics.median(v) for (lib, ar, _), v in rates.items() if lib == "SAELens" and ar == arch and v)
                cells[1] = f"{statistics.median(o) / best:.2f}×"
            ratio_floor = statistics.median(floor) / n_gemm / statistics.median(o)
            print(f"| {names[arch]} | {var} | {cells[0]} | {cells[1]} | {ratio_floor:.2f} ({fl}) |")


if __name__ == "__main__":
    main()
