"""Checks of block-sparse featurizers on the synthetic manifold benchmark (docs/bsf.md §5–§9).

* ``bsf.circle_half_variance`` (quick): the §6/§9 single-direction ceiling, exact (sympy) against
  sampled and against evenly spaced angles.
* ``bsf.recovery`` (full suite): the §6 recovery table of the three BSF variants and the TopK SAE on
  the §5 benchmark, trained with the project loop (sizes and training in
  :data:`dictcheck.empirics.manifold_bench.DEFAULT`, except that the slow q = 1 baseline is left to
  ``dictcheck bench-manifolds``).
* ``bsf.mdl_block_dim`` (full suite): §7 MDL of Vanilla BSFs over block sizes on benchmarks with a
  single planted linear dimension n ∈ {2, 3, 4}. Every (n, q) model is the best of
  :data:`MDL_RESTARTS` model seeds × :data:`MDL_LRS` by training objective (one protocol for every q).

Training settings are fixed once (stated in the details), never tuned until a prediction holds: when
a prediction fails, ``passed`` is False and ``finding`` says what was seen.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import sympy as sp

from dictcheck.empirics.manifold_metrics import (
    best_direction_fraction,
    nonnegative_atom_r2,
    normalised_cov_eigenvalues,
    orthonormal_codes,
    recovery,
)
from dictcheck.empirics.manifold_toy import ManifoldBenchmark, make_manifold_benchmark, planted_config, sample_manifold
from dictcheck.empirics.manifold_bench import (
    DEFAULT,
    MDL_BLOCK_SIZES,
    BenchSettings,
    ModelCache,
    TrainedBlocks,
    mdl_row,
    prepare,
    recovery_table,
)
from dictcheck.proofs_checks.figures_bsf import plot_mdl_curve, plot_recovered_circle
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check
from dictcheck.proofs_checks.sources import BSF_PAPER
from dictcheck.theory.symbolic import analytic_best_direction_fraction, analytic_nonnegative_circle_r2

HALF_VARIANCE_N = 100_000
HALF_VARIANCE_TOL = 0.01
EVEN_ANGLES = (3, 4, 5, 7, 12, 100)
RECOVERY_BSF_MIN = 0.9
RECOVERY_SAE_MAX = 0.65
RECOVERY_MODELS = ("bsf-vanilla", "bsf-grassmann", "bsf-grouplasso", "sae-topk")
#: bsf.mdl_block_dim: planted type per linear dimension, and the reduced benchmark it runs on.
PLANTED = {2: "circle", 3: "sphere", 4: "torus"}
MDL_N_MANIFOLDS = 6
#: Training protocol of bsf.mdl_block_dim, the same for every n and q (decided on training loss alone,
#: data seed 0): with one run per model, the q = n models (q = 3 spheres, q = 4 tori) stalled in minima
#: that mix manifolds across blocks in 3 of 6 and 4 of 6 model seeds; 3000 steps did not free a stalled
#: run, other seeds did, and lr 1e-3 was slower everywhere. q = 1 converged slowly at lr 3e-3 (training
#: MSE still falling 3–10× between 800 and 3000 steps) and much faster at lr 1e-2. So each model is
#: trained for every (seed, lr) of MDL_RESTARTS seeds × MDL_LRS and the run with the lowest training
#: objective (clean MSE on the training split) is kept. Known limits, from the time budget (~3 min; 36
#: runs per n): 800 steps is not yet q = 1's plateau for the tori (MSE 0.0013–0.0027, 0.0011 at 2400
#: steps), and 3 seeds do not always contain a run that escapes the mixed minima (details list every run).
MDL_RESTARTS = 3
MDL_LRS = (3e-3, 1e-2)
MDL_SETTINGS = BenchSettings(data=planted_config("circle", MDL_N_MANIFOLDS, D=32, n_train=8000, n_eval=2000),
                             steps=800, batch_size=512, restarts=MDL_RESTARTS, lrs=MDL_LRS)
MDL_WIDTH = 48  # n_b·q, divisible by every q of MDL_BLOCK_SIZES


def _rel(path: Path, ctx: CheckContext) -> str:
    return str(path.relative_to(ctx.out_dir))


# --------------------------------------------------------------------------------------------------
# bsf.circle_half_variance


@check(
    "bsf.circle_half_variance",
    "The best single direction explains exactly 1/2 of a uniform circle's variance (1/3 sphere, 1/4 torus)",
    "docs/bsf.md §6 (ceiling for one direction), §9 (half variance of a circle)",
    predicted="λ_max(Cov φ)/tr(Cov φ) = 1/2 (circle), 1/3 (S²), 1/4 (Clifford torus) exactly (sympy integrals); "
    f"sampled with N = {HALF_VARIANCE_N} uniform draws within {HALF_VARIANCE_TOL}; evenly spaced angles "
    f"(n ∈ {list(EVEN_ANGLES)}) give normalised eigenvalues [1/2, 1/2] to rounding; a non-negative atom "
    "(wᵀm)_+·w on the circle has R² = 1/4.",
    kind="theorem",
    source=f"{BSF_PAPER}: one direction cannot capture a circle; derived in docs/bsf.md §6",
    regime="sympy integrals and sampled uniform circle, sphere and torus; no training",
)
def circle_half_variance(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("bsf.circle_half_variance")
    expected = {"circle": 1 / 2, "sphere": 1 / 3, "torus": 1 / 4}
    analytic = {k: analytic_best_direction_fraction(k) for k in expected}
    sampled = {k: best_direction_fraction(sample_manifold(rng, k, HALF_VARIANCE_N)[0]) for k in expected}
    circle = sample_manifold(rng, "circle", HALF_VARIANCE_N)[0]
    w = rng.normal(size=2)
    w /= np.linalg.norm(w)
    nonneg = {"analytic": analytic_nonnegative_circle_r2(), "sampled": nonnegative_atom_r2(circle, w)}
    even_err = 0.0
    for n in EVEN_ANGLES:
        t = 2 * np.pi * np.arange(n) / n + rng.uniform(0, 2 * np.pi)
        even_err = max(even_err, float(np.abs(normalised_cov_eigenvalues(np.column_stack([np.cos(t), np.sin(t)]))
                                              - 0.5).max()))
    exact = {"circle": sp.Rational(1, 2), "sphere": sp.Rational(1, 3), "torus": sp.Rational(1, 4)}
    analytic_ok = all(analytic[k] == exact[k] for k in exact)
    sampled_err = max(abs(sampled[k] - expected[k]) for k in expected)
    nonneg_err = abs(nonneg["sampled"] - float(nonneg["analytic"]))
    passed = (analytic_ok and nonneg["analytic"] == sp.Rational(1, 4) and sampled_err <= HALF_VARIANCE_TOL
              and nonneg_err <= HALF_VARIANCE_TOL and even_err <= 1e-12)
    return Outcome(
        measured={"analytic": {k: str(v) for k, v in analytic.items()},
                  "sampled": sampled, "max_sampled_error": sampled_err,
                  "nonnegative_atom_circle": {"analytic": str(nonneg["analytic"]), "sampled": nonneg["sampled"]},
                  "even_angles_max_error": even_err},
        tolerance={"sampled": HALF_VARIANCE_TOL, "even_angles": 1e-12, "analytic": "exact (rational)"},
        tolerance_reason=f"A sampled eigenvalue ratio has standard error ~0.5/√N ≈ 0.002 at N = {HALF_VARIANCE_N}, "
        "so 0.01 is ~5 standard errors (the spec's bound); evenly spaced angles are exact up to float64 rounding.",
        passed=passed,
        details={"N": HALF_VARIANCE_N, "even_angle_counts": list(EVEN_ANGLES),
                 "atom_direction": [float(v) for v in w]},
    )


# --------------------------------------------------------------------------------------------------
# bsf.recovery


def _circle_figure(ctx: CheckContext, bench: ManifoldBenchmark, trained: TrainedBlocks) -> str:
    """Figure of the best-recovered circle of a trained model: codes vs θ, and the block in the true plane."""
    res = recovery(bench.eval, bench.types, trained.Z, trained.W)
    circles = [j for j, t in enumerate(bench.types) if t == "circle"]
    j = max(circles, key=lambda c: res.best[c])
    g = int(res.best_block[j])
    on = bench.eval.support[:, j]
    Zc, Q = orthonormal_codes(trained.Z, trained.W)
    contrib = Zc[on, g, :] @ Q[g].T
    plane = contrib @ bench.eval.frame(j)
    path = plot_recovered_circle(ctx.figure_path("bsf_recovered_circle.png"), bench.eval.coords[j][on, 0],
                                 Zc[on, g, :], plane,
                                 f"bsf-vanilla: circle {j} by block {g} (R² = {res.best[j]:.3f}); codes in the "
                                 "block's orthonormal frame")
    return _rel(path, ctx)


@check(
    "bsf.recovery",
    "On the manifold benchmark every BSF variant recovers the manifolds (R² ≥ 0.9); a TopK SAE cannot (≤ 0.65)",
    "docs/bsf.md §5, §6, §9",
    predicted=f"docs/bsf.md §5 benchmark (D = 128, 8 circles + 8 spheres + 8 tori, k_true = 3, σ = 0.01), models of §5 "
    f"(n_b = 48, q = 4, k = 3; TopK SAE with 192 latents, 12 active): mean best-block recovery R² ≥ "
    f"{RECOVERY_BSF_MIN} for bsf-vanilla, bsf-grassmann and bsf-grouplasso, and ≤ {RECOVERY_SAE_MAX} for the "
    "TopK SAE (a single atom's ceiling is ≈ 0.36 on this mix, §6).",
    quick=False,
    kind="replication",
    source=f"{BSF_PAPER}: every BSF variant recovers planted manifolds (synthetic benchmark); an SAE cannot",
    regime="docs/bsf.md §5 benchmark (D = 128, 24 manifolds, oracle k = 3), our lr and CPU training budget",
)
def bsf_recovery(ctx: CheckContext) -> Outcome:
    s = DEFAULT
    bench = make_manifold_benchmark(s.data, seed=ctx.seed)
    cache = ModelCache(prepare(bench), s, ctx.seed)
    rows = recovery_table(bench, cache, names=RECOVERY_MODELS)
    table = {r["model"]: {"mean_best": round(r["mean_best"], 4), "mean_hungarian": round(r["mean_hungarian"], 4),
                          **{t: round(v, 4) for t, v in r["per_type_best"].items()},
                          "train_ve": r["train_ve"], "train_l0": r["train_l0"]} for r in rows}
    fails = []
    for r in rows:
        ok = r["mean_best"] <= RECOVERY_SAE_MAX if r["arch"] == "topk" else r["mean_best"] >= RECOVERY_BSF_MIN
        if not ok:
            fails.append(r)
    vanilla = cache.get("bsf-vanilla", 2 * bench.n_m * s.q, bench.config.k_true, {"block_size": s.q})
    figure = _circle_figure(ctx, bench, vanilla)
    finding = None
    if fails:
        finding = "Prediction fails for " + "; ".join(
            f"{r['model']}: mean best-block R² {r['mean_best']:.3f} (circle {r['per_type_best']['circle']:.3f}, "
            f"sphere {r['per_type_best']['sphere']:.3f}, torus {r['per_type_best']['torus']:.3f})" for r in fails) + (
            ". Per-manifold R² in details; a torus split over two blocks (one circle each) scores ≈ 0.5.")
    return Outcome(
        measured={"table": table},
        tolerance={"bsf_min": RECOVERY_BSF_MIN, "sae_max": RECOVERY_SAE_MAX},
        tolerance_reason="The thresholds are the issue's: the paper reports BSF R² 0.93–0.97 and SAE ≈ 0.53; "
        "one direction can reach at most ≈ 0.36 on this mix (§6), a non-negative atom half of that.",
        passed=not fails, finding=finding,
        details={"rows": rows, "benchmark": {"D": s.data.D, "counts": [list(c) for c in s.data.counts],
                                             "n_train": s.data.n_train, "n_eval": s.data.n_eval, "seed": ctx.seed},
                 "training": {"steps": s.steps, "batch_size": s.batch_size, "lr": s.lr, "dtype": "float32",
                              "data_prep": "centre by the training mean, rescale to E‖x‖² = D (docs/bsf.md §4)",
                              "grouplasso": "paper version sh_θ, c_gl = 1e-2 (docs/bsf.md §3.3)"}},
        figures=[figure],
    )


# --------------------------------------------------------------------------------------------------
# bsf.mdl_block_dim


@check(
    "bsf.mdl_block_dim",
    "With manifolds of one planted linear dimension n, the MDL-minimising block size is n",
    "docs/bsf.md §7 (prediction to test)",
    predicted=f"For {MDL_N_MANIFOLDS} planted circles (n = 2), spheres (n = 3) or tori (n = 4) in D = "
    f"{MDL_SETTINGS.data.D} (k_true = 3, σ = 0.01), Vanilla BSFs at total width {MDL_WIDTH} with q ∈ "
    f"{list(MDL_BLOCK_SIZES)} and k = 3·⌈n/q⌉: the total MDL (support + code + residual + dictionary, docs/bsf.md §7 "
    "defaults) is smallest at q = n, for each n.",
    quick=False,
    kind="replication",
    source=f"{BSF_PAPER}: MDL selects the block size of the planted manifolds; docs/bsf.md §7",
    regime="planted circles, spheres or tori in docs/bsf.md §7's sizes, Vanilla BSF, our CPU training budget",
)
def bsf_mdl_block_dim(ctx: CheckContext) -> Outcome:
    s = MDL_SETTINGS
    curves, argmins, rows_by_n = {}, {}, {}
    for n, kind in PLANTED.items():
        cfg = replace(s.data, counts=((kind, MDL_N_MANIFOLDS),))
        bench = make_manifold_benchmark(cfg, seed=ctx.seed)
        cache = ModelCache(prepare(bench), replace(s, data=cfg), ctx.seed)
        rows = []
        for q in MDL_BLOCK_SIZES:
            k = bench.config.k_true * math.ceil(n / q)
            t = cache.get("bsf-vanilla", MDL_WIDTH, k, {"block_size": q})
            rows.append({**mdl_row(bench, t, q, k), "train_objective": t.metrics["train_objective"],
                         "candidates": t.metrics["candidates"], "chosen": t.metrics["chosen"]})
        rows_by_n[n] = rows
        curves[f"{kind} (n = {n})"] = rows
        argmins[n] = min(rows, key=lambda r: r["total"])["q"]
    fig = plot_mdl_curve(ctx.figure_path("bsf_mdl_block_size.png"), curves,
                         f"Vanilla BSF, width {MDL_WIDTH}, planted manifolds: MDL against block size (ringed: minimum)")
    table = {n: {r["q"]: {"total": round(r["total"], 1), "support": round(r["L_support"], 1),
                          "code": round(r["L_code"], 1), "resid": round(r["L_resid"], 1), "dict": round(r["L_dict"], 1),
                          "recovery": round(r["recovery_mean_best"], 3), "train_mse": float(f"{r['train_objective']:.3g}")}
                 for r in rows}
             for n, rows in rows_by_n.items()}
    wrong = {n: q for n, q in argmins.items() if q != n}
    prec = rows_by_n[2][0]["precisions"]
    # Residual bits of a reconstruction exact up to the noise: every coordinate at σ̂_r² = σ².
    sigma = s.data.sigma
    floor = {n: s.data.D * max(0.0, 0.5 * math.log2(2 * math.pi * math.e * sigma**2)
                               - math.log2(rows[0]["precisions"]["delta_x"])) for n, rows in rows_by_n.items()}
    finding = None
    if wrong:
        finding = "MDL minimiser differs from the planted dimension for " + "; ".join(
            _mdl_miss(n, q, rows_by_n[n], floor[n]) for n, q in wrong.items()) + "."
    return Outcome(
        measured={"argmin_q": argmins, "table": table},
        tolerance="exact argmin",
        tolerance_reason="The prediction is which block size is best, a discrete outcome; bits are compared as "
        "computed (no margin), and every term is in the details so a near tie is visible.",
        passed=not wrong, finding=finding,
        details={"rows": {str(n): rows for n, rows in rows_by_n.items()}, "precisions_circles": prec,
                 "resid_bits_at_noise_floor": floor,
                 "benchmark": {"D": s.data.D, "n_manifolds": MDL_N_MANIFOLDS, "k_true": 3, "n_train": s.data.n_train,
                               "n_eval": s.data.n_eval, "seed": ctx.seed},
                 "training": {"arch": "bsf-vanilla", "width": MDL_WIDTH, "steps": s.steps, "batch_size": s.batch_size,
                              "protocol": f"every (model seed, lr) of {s.restarts} seeds (seed·{s.restarts} + r) × lr "
                                          f"{list(s.lrs)}; keep the run of lowest training objective (clean MSE on "
                                          "the training split, eval mode); each row lists every run ('candidates') "
                                          "and the kept one ('chosen')",
                              "k_rule": "k = k_true·⌈n/q⌉ (smallest k that represents every sample)",
                              "codes": "the model's codes z (docs/bsf.md §7); rows also give total_orthonormal_codes, the "
                                       "total with codes in orthonormal block frames",
                              "argmin_q_orthonormal_codes": {n: min(rows, key=lambda r: r["total_orthonormal_codes"])["q"]
                                                             for n, rows in rows_by_n.items()}}},
        figures=[_rel(fig, ctx)],
    )


def _mdl_miss(n: int, q_star: int, rows: list[dict], floor: float) -> str:
    """One clause of the finding: the winner against q = n, term by term, and how well q = n trained."""
    best = next(r for r in rows if r["q"] == q_star)
    at_n = next(r for r in rows if r["q"] == n)
    terms = ", ".join(f"{name} {best[key] - at_n[key]:+.1f}" for name, key in
                      (("support", "L_support"), ("code", "L_code"), ("resid", "L_resid"), ("dict", "L_dict")))
    recovered = "recovers" if at_n["recovery_mean_best"] >= RECOVERY_BSF_MIN else "does not recover"
    return (f"n = {n}: q* = {q_star} ({best['total']:.1f} bits vs {at_n['total']:.1f} at q = n; q* − n by term: "
            f"{terms}); the q = n model (best of {len(at_n['candidates'])} runs) {recovered} the manifolds "
            f"(R² {at_n['recovery_mean_best']:.3f}) at training MSE {at_n['train_objective']:.3g} against "
            f"{best['train_objective']:.3g} for q* (residual {at_n['L_resid']:.1f} vs {best['L_resid']:.1f} bits; "
            f"{floor:.1f} at the noise floor)")
