"""Checks of block-sparse featurizers on the synthetic manifold benchmark (docs/bsf.md §5–§9).

* ``bsf.circle_half_variance`` (quick): the §6/§9 single-direction ceiling, exact (sympy) against
  sampled and against evenly spaced angles.
* ``bsf.recovery`` (full suite, replication): Vanilla and Grassmannian BSF at the paper's bar R² ≥ 0.93 on the
  §5 benchmark (sizes and training in :data:`dictcheck.empirics.metrics.manifold_bench.DEFAULT`) at lr 3e-3 and 4e-4
  (the lr of lower training objective decides; both reported), Vanilla also at the k of the elbow rule;
  controls: oracle blocks (positive), a TopK SAE under the exact single-atom ceiling (negative); three
  readings of the SAE's R² against the paper's 0.53.
* ``bsf.grouplasso_recovery`` (full suite, replication): the paper's Group-Lasso BSF at c_gl matched to block
  L0 = k_true, with the √r-per-unit mechanism (docs/bsf.md §3.3); the contribution penalty (positive control),
  shuffled ground truth (negative), L0 matched (precondition); both penalties at the authors' c_gl and the
  STE gate beside.
* ``bsf.mdl_block_dim`` (full suite, replication): §7 MDL of Vanilla BSFs over block sizes on benchmarks with a
  single planted linear dimension n ∈ {2, 3, 4}, with parametrisation-invariant code lengths and a 1-bit
  margin, and the q = n BSF against a TopK SAE family at equal distortion. Every (n, q) model is the best of
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

from dictcheck.empirics.metrics.manifold import (
    best_direction_fraction,
    nonnegative_atom_r2,
    normalised_cov_eigenvalues,
    orthonormal_codes,
    recovery,
)
from dictcheck.empirics.data.manifold_toy import ManifoldBenchmark, make_manifold_benchmark, planted_config, sample_manifold
from dictcheck.empirics.metrics.manifold_bench import (
    DEFAULT,
    MDL_BLOCK_SIZES,
    BenchSettings,
    ModelCache,
    TrainedBlocks,
    block_mechanism,
    elbow_k,
    match_block_l0,
    mdl_row,
    oracle_blocks,
    prepare,
    rate_at_distortion,
    reparametrise,
    sae_readings,
    single_atom_ceilings,
    train_blocks,
)
from dictcheck.proofs_checks.figures_bsf import plot_mdl_curve, plot_recovered_circle
from dictcheck.proofs_checks.registry import CheckContext, Control, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import BSF_PAPER
from dictcheck.theory.symbolic import (
    analytic_best_direction_fraction,
    analytic_l21_unit_costs,
    analytic_nonnegative_circle_r2,
)

HALF_VARIANCE_N = 100_000
HALF_VARIANCE_TOL = 0.01
EVEN_ANGLES = (3, 4, 5, 7, 12, 100)
#: bsf.recovery: the paper's figures (BSF R² 0.93–0.97, SAE 0.53), the two learning rates (ours, the
#: authors'), the k of the elbow rule, and the oracle's floor.
PAPER_BAR = 0.93
PAPER_SAE = 0.53
#: The Π_k BSFs of bsf.recovery (the Group-Lasso BSF has its own check, bsf.grouplasso_recovery).
RECOVERY_ARCHS = ("bsf-vanilla", "bsf-grassmann")
RECOVERY_LRS = (3e-3, 4e-4)
ELBOW_KS = (1, 2, 3, 4, 5)
ORACLE_MIN = 0.99
#: bsf.grouplasso_recovery: the c search (bracket, trainings), restarts at the chosen c, the controls'
#: thresholds, and the STE gate's coefficient (the authors' default c = 1e-2).
#: The bracket's lower end is the authors' c_gl; at 1e-1 both penalties collapse to L0 = 0 (measured on seed 0:
#: L0 0 at c ≥ 0.05 for the code penalty, ≥ 0.1 for the contribution penalty). Three bisection steps keep
#: the check near its CPU budget.
GL_BRACKET = (1e-2, 1e-1)
GL_EVALS = 3
GL_RESTARTS = 2
GL_POSITIVE_MIN = 0.9
GL_SHUFFLED_MAX = 0.0
GL_L0_TOL = 0.5
STE_C = 1e-2
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
#: bsf.mdl_block_dim decision margin (bits per sample), invariance tolerance (bits), noise-floor factor, and the
#: TopK SAE's k grid for the comparison at equal distortion (3 samples' manifolds × 1 … 8 atoms each).
MDL_MARGIN = 1.0
MDL_INVARIANCE_TOL = 1e-6
MDL_FLOOR_FACTOR = 2.0
MDL_SAE_KS = (3, 6, 9, 12, 18, 24)


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
    # An ellipse (axes 2 and 1, evenly spaced angles) is where the half breaks: its best direction explains 4/5.
    t = 2 * np.pi * np.arange(360) / 360
    ellipse = best_direction_fraction(np.column_stack([2.0 * np.cos(t), np.sin(t)]))
    controls = [negative_control("best_direction_of_an_ellipse", measured=ellipse - 0.5, threshold=0.1,
                                 what="λ_max/tr − 1/2 for an ellipse with axes 2 and 1", reference=0.8 - 0.5,
                                 rtol=1e-9)]
    return Outcome(controls=controls,
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


def _recovery_row(bench: ManifoldBenchmark, t: TrainedBlocks) -> dict:
    """Mean best-block / Hungarian R², per type, and the training objective of one trained model."""
    r = recovery(bench.eval, bench.types, t.Z, t.W).summary()
    return {"mean_best": round(r["mean_best"], 4), "mean_hungarian": round(r["mean_hungarian"], 4),
            **{k: round(v, 4) for k, v in r["per_type_best"].items()},
            "train_objective": float(f"{t.metrics['train_objective']:.4g}"),
            "train_block_l0": t.metrics.get("block_l0", t.metrics.get("l0"))}


@check(
    "bsf.recovery",
    "Vanilla and Grassmannian BSF recover the benchmark's manifolds at the paper's bar (R² ≥ 0.93), also with k "
    "chosen by a rule",
    "docs/bsf.md §5, §6, §9",
    predicted=f"docs/bsf.md §5 benchmark (D = 128, 8 circles + 8 spheres + 8 tori, k_true = 3, σ = 0.01), n_b = 48, "
    f"q = 4: mean best-block recovery R² ≥ {PAPER_BAR} (the paper's lower figure) for bsf-vanilla and bsf-grassmann "
    f"at k = 3, each at the lr of lower training objective of {list(RECOVERY_LRS)} (ours, the authors'; both "
    f"reported), and for bsf-vanilla at the k of the elbow rule over k ∈ {list(ELBOW_KS)} (no oracle). Controls: "
    f"the planted frames scored as blocks reach ≥ {ORACLE_MIN} (positive); a TopK SAE's single atoms stay at or "
    "below the exact single-direction ceiling of each manifold (negative). Reported beside: three readings of the "
    f"SAE's R² against the paper's {PAPER_SAE}.",
    quick=False,
    kind="replication",
    source=f"{BSF_PAPER}: BSF recovers planted manifolds (R² ≈ 0.93–0.97), an SAE does not (≈ 0.53)",
    regime="ours: the docs/bsf.md §5 benchmark (the paper's toy is not published: sizes, manifold mix and R² "
    "matching rule are Decisions), 1500 Adam steps at batch 1024 with the loop's warm-up/decay, lr 3e-3 and 4e-4; "
    "the authors: batch 2048 for 40–60 epochs at lr 4e-4 (≈ 1000–1500 steps at twice our batch), R² on the "
    "training data (ours held out)",
)
def bsf_recovery(ctx: CheckContext) -> Outcome:
    s = DEFAULT
    bench = make_manifold_benchmark(s.data, seed=ctx.seed)
    prep = prepare(bench)
    q, k_true = s.q, bench.config.k_true
    d_sae = 2 * bench.n_m * q
    caches = {lr: ModelCache(prep, replace(s, lr=lr), ctx.seed) for lr in RECOVERY_LRS}
    by_lr: dict[str, dict[str, dict]] = {}
    chosen: dict[str, float] = {}
    for arch in RECOVERY_ARCHS:
        runs = {lr: caches[lr].get(arch, d_sae, k_true, {"block_size": q}) for lr in RECOVERY_LRS}
        by_lr[arch] = {str(lr): _recovery_row(bench, t) for lr, t in runs.items()}
        chosen[arch] = min(RECOVERY_LRS, key=lambda lr: runs[lr].metrics["train_objective"])
    elbow_cache = caches[chosen["bsf-vanilla"]]
    elbow_runs = {k: elbow_cache.get("bsf-vanilla", d_sae, k, {"block_size": q}) for k in ELBOW_KS}
    mse = {k: t.metrics["train_objective"] for k, t in elbow_runs.items()}
    k_star = elbow_k(mse, float(np.mean(prep.train**2)))
    elbow = _recovery_row(bench, elbow_runs[k_star])
    sae = caches[RECOVERY_LRS[0]].get("topk", d_sae, k_true * q, {})
    readings = sae_readings(bench.eval, sae.Z, sae.W)
    ceilings = single_atom_ceilings(bench.eval)
    Zo, Wo = oracle_blocks(bench.eval, q)
    oracle = recovery(bench.eval, bench.types, Zo, Wo).summary()["mean_best"]
    headline = {arch: by_lr[arch][str(chosen[arch])]["mean_best"] for arch in chosen}
    headline["bsf-vanilla@elbow"] = elbow["mean_best"]
    claim = all(v >= PAPER_BAR for v in headline.values())
    over = [j for j, (r, c) in enumerate(zip(readings["single_atom"]["per_manifold"], ceilings)) if r > c + 1e-9]
    controls = [
        Control("oracle blocks", "positive", f"the planted frames with oracle codes E_jᵀx score ≥ {ORACLE_MIN}",
                f"mean best-block R² {oracle:.4f}", oracle >= ORACLE_MIN),
        Control("SAE single atoms under the ceiling", "negative",
                "every manifold's best single-atom R² of the TopK SAE ≤ its exact single-direction ceiling "
                "(≈ 1/n_j; docs/bsf.md §6)",
                f"mean {readings['single_atom']['mean']:.4f} against mean ceiling {float(ceilings.mean()):.4f}; "
                f"{len(over)} manifolds above", not over),
    ]
    nearest = min(readings, key=lambda r: abs(readings[r]["mean"] - PAPER_SAE))
    lr_text = "; ".join(f"{a}: " + ", ".join(f"lr {lr} R² {row['mean_best']:.3f} (objective {row['train_objective']:.3g})"
                                             for lr, row in by_lr[a].items()) + f", kept lr {chosen[a]}"
                        for a in by_lr)
    finding = (f"{'Replicated' if claim else 'Not replicated'} at the bar {PAPER_BAR}: {lr_text}; elbow rule k* = "
               f"{k_star} (training MSE by k: " + ", ".join(f"{k}: {v:.3g}" for k, v in mse.items())
               + f"), R² {elbow['mean_best']:.3f}. SAE readings: " + ", ".join(
                   f"{r} {v['mean']:.3f}" for r, v in readings.items())
               + f"; nearest the paper's {PAPER_SAE}: {nearest}.")
    return Outcome.for_replication(
        claim_holds=claim, controls=controls,
        measured={"headline": headline, "by_lr": by_lr, "chosen_lr": chosen,
                  "elbow": {"k_star": k_star, "train_mse": {str(k): v for k, v in mse.items()}, **elbow},
                  "sae": {"single_atom": round(readings["single_atom"]["mean"], 4),
                          "best_n_atoms": round(readings["best_n_atoms"]["mean"], 4),
                          "assigned_atoms": round(readings["assigned_atoms"]["mean"], 4),
                          "single_atom_ceiling": round(float(ceilings.mean()), 4), "nearest_to_paper": nearest,
                          **{f"recovery_{k}": v for k, v in _recovery_row(bench, sae).items()}},
                  "oracle_mean_best": round(oracle, 4)},
        tolerance={"bsf_min": PAPER_BAR, "oracle_min": ORACLE_MIN, "ceiling_slack": 1e-9},
        tolerance_reason=f"{PAPER_BAR} is the paper's lower BSF figure (0.93–0.97); the oracle's only loss is the "
        "noise inside each frame (n_jσ² against unit variance, ~1e-4), so 0.99 leaves room for sampling only; the "
        "single-atom ceiling is exact on the evaluation split, so it holds to rounding.",
        finding=finding,
        details={"sae_readings": readings, "single_atom_ceilings": [float(c) for c in ceilings],
                 "benchmark": {"D": s.data.D, "counts": [list(c) for c in s.data.counts], "n_train": s.data.n_train,
                               "n_eval": s.data.n_eval, "seed": ctx.seed},
                 "training": {"steps": s.steps, "batch_size": s.batch_size, "lrs": list(RECOVERY_LRS),
                              "lr_rule": "per architecture, the lr of lower training objective (clean MSE on the "
                                         "training split); both rows reported",
                              "elbow_rule": "k* = argmax_k MSE(k−1)/MSE(k) over the trained k, MSE(0) = the data's "
                                            "mean square (1 after preparation); bsf-vanilla at its kept lr",
                              "sae": f"topk, {d_sae} latents, {k_true * q} active, lr {RECOVERY_LRS[0]}",
                              "dtype": "float32",
                              "data_prep": "centre by the training mean, rescale to E‖x‖² = D (docs/bsf.md §4)"},
                 "sae_readings_defined": "single_atom: best single atom (spec §6); best_n_atoms: greedy best n_j "
                                         "atoms summed; assigned_atoms: every atom whose direction lies mostly in "
                                         "span E_j, summed (empirics.metrics.manifold_bench.sae_readings)"},
        figures=[_circle_figure(ctx, bench, caches[RECOVERY_LRS[0]].get("bsf-vanilla", d_sae, k_true,
                                                                        {"block_size": q}))],
    )


# --------------------------------------------------------------------------------------------------
# bsf.grouplasso_recovery


def _mechanism_row(bench: ManifoldBenchmark, t: TrainedBlocks) -> dict:
    """Recovery and how the ℓ₂,₁ budget is spent (:func:`block_mechanism`) of a trained Group-Lasso model."""
    return {**_recovery_row(bench, t),
            **{k: round(v, 4) if isinstance(v, float) else v
               for k, v in block_mechanism(bench.eval, t.Z, t.W).items()}}


@check(
    "bsf.grouplasso_recovery",
    "Group-Lasso BSF (the paper's sh_θ with ℓ₂,₁ on the codes) recovers the manifolds at the paper's bar when its "
    "coefficient gives the true number of active manifolds",
    "docs/bsf.md §3.3 (mechanism, Decision 'contribution penalty'), §5, §6",
    predicted=f"On the docs/bsf.md §5 benchmark (n_b = 48, q = 4), c_gl chosen by matching the training block L0 to "
    f"k_true = 3 (geometric bisection of {list(GL_BRACKET)}, {GL_EVALS} trainings; never looking at R²), best of "
    f"{GL_RESTARTS} model seeds by training objective: mean best-block R² ≥ {PAPER_BAR}. Expected from the mechanism "
    "(docs/bsf.md §3.3): NOT reached, because a unit-Frobenius rank-r isotropic block pays √r per unit of "
    "contribution, so splitting a manifold over rank-1 blocks is cheaper (circle 4/π ≈ 1.273 < √2 ≈ 1.414, "
    "S² 3/2 < √3, torus 4√2/π ≈ 1.801 < 2). Controls: the contribution-penalty variant (ℓ₂,₁ on ‖W_g z_g‖, "
    f"same protocol) recovers, R² ≥ {GL_POSITIVE_MIN} (positive); its codes scored against row-shuffled ground "
    f"truth give R² ≤ {GL_SHUFFLED_MAX} (negative); both block L0 within ±{GL_L0_TOL} of 3 (precondition). "
    f"Reported beside: both penalties at the authors' c_gl = {STE_C} and the authors' STE gate (c = {STE_C}, "
    "k_target = 3).",
    quick=False,
    kind="replication",
    source=f"{BSF_PAPER}: the Group-Lasso variant recovers planted manifolds like the other BSFs",
    regime="ours: docs/bsf.md §5 benchmark, 1500 Adam steps at batch 1024, lr 3e-3 (the authors' 4e-4 not run "
    "here: see bsf.recovery for the lr effect), c_gl matched to block L0 = 3; the authors: c_gl = 1e-2 fixed, "
    "lr 4e-4, batch 2048, 40–60 epochs; their post-paper default is the STE gate",
)
def bsf_grouplasso_recovery(ctx: CheckContext) -> Outcome:
    s = replace(DEFAULT, restarts=GL_RESTARTS)
    bench = make_manifold_benchmark(s.data, seed=ctx.seed)
    prep = prepare(bench)
    q, k_true = s.q, bench.config.k_true
    d_sae = 2 * bench.n_m * q
    matched = {pen: match_block_l0(prep, "bsf-grouplasso", d_sae, {"block_size": q, "penalty": pen}, k_true, s,
                                   ctx.seed, bracket=GL_BRACKET, evals=GL_EVALS)
               for pen in ("code", "contribution")}
    beside = {name: train_blocks(prep, "bsf-grouplasso", d_sae, None, {"block_size": q, "c_gl": STE_C, **opts},
                                 steps=s.steps, batch_size=s.batch_size, lr=s.lr, seed=ctx.seed * s.restarts)
              for name, opts in (("ste", {"gate": "ste", "k_target": k_true}), ("code@authors_c", {"penalty": "code"}),
                                 ("contribution@authors_c", {"penalty": "contribution"}))}
    rows = {pen: {"c_gl": float(f"{m.c:.4g}"), **_mechanism_row(bench, m.model)} for pen, m in matched.items()}
    rows.update({name: {"c_gl": STE_C, **_mechanism_row(bench, t)} for name, t in beside.items()})
    costs = {kind: [float(v) for v in analytic_l21_unit_costs(kind)] for kind in ("circle", "sphere", "torus")}
    contrib = matched["contribution"].model
    perm = ctx.rng("bsf.grouplasso_recovery").permutation(bench.eval.N)
    shuffled = recovery(bench.eval, bench.types, contrib.Z[perm], contrib.W).summary()["mean_best"]
    l0s = {pen: float(m.model.metrics["block_l0"]) for pen, m in matched.items()}
    paper, fix = rows["code"], rows["contribution"]
    controls = [
        Control("contribution penalty recovers", "positive",
                f"ℓ₂,₁ on ‖W_g z_g‖, same protocol: mean best-block R² ≥ {GL_POSITIVE_MIN}",
                f"R² {fix['mean_best']:.4f} at c = {fix['c_gl']:.3g}", fix["mean_best"] >= GL_POSITIVE_MIN),
        Control("shuffled ground truth", "negative",
                f"the contribution model's codes against row-permuted manifolds: R² ≤ {GL_SHUFFLED_MAX}",
                f"R² {shuffled:.4f}", shuffled <= GL_SHUFFLED_MAX),
        Control("block L0 matched", "precondition", f"training block L0 within ±{GL_L0_TOL} of {k_true} for both "
                "penalties", ", ".join(f"{pen}: {v:.2f}" for pen, v in l0s.items()),
                all(abs(v - k_true) <= GL_L0_TOL for v in l0s.values())),
    ]
    claim = paper["mean_best"] >= PAPER_BAR
    mech = (f"mechanism: a unit-Frobenius rank-r isotropic block pays √r per unit of contribution, rank-1 splitting "
            f"pays circle {costs['circle'][1]:.3f} vs {costs['circle'][0]:.3f}, sphere {costs['sphere'][1]:.3f} vs "
            f"{costs['sphere'][0]:.3f}, torus {costs['torus'][1]:.3f} vs {costs['torus'][0]:.3f}; measured, code "
            f"penalty: ‖z‖/‖Wz‖ = {paper['code_per_contribution']:.3f}, {paper['blocks_per_manifold']:.2f} live "
            f"blocks per manifold, contribution stable rank {paper['contribution_stable_rank']:.2f}; contribution "
            f"penalty: {fix['code_per_contribution']:.3f}, {fix['blocks_per_manifold']:.2f} blocks per manifold, "
            f"stable rank {fix['contribution_stable_rank']:.2f}")
    finding = (f"Paper's Group-Lasso (ℓ₂,₁ on codes) at c_gl = {paper['c_gl']:.3g} (block L0 {l0s['code']:.2f}): R² "
               f"{paper['mean_best']:.3f} (circle {paper['circle']:.3f}, sphere {paper['sphere']:.3f}, torus "
               f"{paper['torus']:.3f}); contribution penalty at c = {fix['c_gl']:.3g} (L0 {l0s['contribution']:.2f}): "
               f"R² {fix['mean_best']:.3f}. Beside, at the authors' c = {STE_C} (L0 not matched): code penalty R² "
               f"{rows['code@authors_c']['mean_best']:.3f} (L0 {rows['code@authors_c']['train_block_l0']:.2f}), "
               f"contribution penalty R² {rows['contribution@authors_c']['mean_best']:.3f} (L0 "
               f"{rows['contribution@authors_c']['train_block_l0']:.2f}); STE gate (k_target = {k_true}): R² "
               f"{rows['ste']['mean_best']:.3f} at L0 {rows['ste']['train_block_l0']:.2f}. {mech}.")
    return Outcome.for_replication(
        claim_holds=claim, controls=controls,
        measured={"rows": rows, "shuffled_r2": round(shuffled, 4),
                  "l21_unit_costs": {k: {"one_block": v[0], "rank1_split": v[1]} for k, v in costs.items()}},
        tolerance={"bar": PAPER_BAR, "positive_min": GL_POSITIVE_MIN, "shuffled_max": GL_SHUFFLED_MAX,
                   "l0_tol": GL_L0_TOL},
        tolerance_reason=f"{PAPER_BAR} is the paper's lower BSF figure; {GL_POSITIVE_MIN} for the positive control "
        "is the bar below which a model 'does not recover' in this suite's earlier checks (a torus split over two "
        "blocks scores ≈ 0.5); uncorrelated contributions give R² ≈ −1, so 0 is far from both; ±0.5 blocks is "
        "half a manifold per sample.",
        finding=finding,
        details={"search": {pen: [{**row, "mean_best_r2 (reported, not used)": _recovery_row(bench, t)["mean_best"],
                                   "train_ve": t.metrics.get("ve")}
                                  for row, t in zip(m.trail, m.runs)] for pen, m in matched.items()},
                 "restarts": {pen: m.model.metrics["candidates"] for pen, m in matched.items()},
                 "protocol": f"c by geometric bisection of {list(GL_BRACKET)} on training block L0 (target {k_true}), "
                             f"{GL_EVALS} trainings at model seed seed·{GL_RESTARTS}, c of nearest L0 in log ratio, "
                             f"then {GL_RESTARTS} model seeds at that c, lowest training objective kept",
                 "training": {"steps": s.steps, "batch_size": s.batch_size, "lr": s.lr, "dtype": "float32",
                              "gate": "shrink (sh_θ, paper) for both penalties; ste row: the authors' post-paper gate"}},
    )


# --------------------------------------------------------------------------------------------------
# bsf.mdl_block_dim


@check(
    "bsf.mdl_block_dim",
    "With manifolds of one planted linear dimension n, the MDL-minimising block size is n, and a BSF's description "
    "length is below a TopK SAE's at equal distortion",
    "docs/bsf.md §7 (prediction to test, Decision 'invariant code length')",
    predicted=f"For {MDL_N_MANIFOLDS} planted circles (n = 2), spheres (n = 3) or tori (n = 4) in D = "
    f"{MDL_SETTINGS.data.D} (k_true = 3, σ = 0.01), Vanilla BSFs at total width {MDL_WIDTH} with q ∈ "
    f"{list(MDL_BLOCK_SIZES)} and k = 3·⌈n/q⌉: (a) the total MDL (support + code + residual + dictionary, "
    "docs/bsf.md §7 defaults, codes in each block's principal frame so the bits do not depend on the block's "
    f"parametrisation) is smallest at q = n by at least {MDL_MARGIN} bit per sample, for each n; (b) the q = n "
    f"BSF's total is below a TopK SAE's (width {MDL_WIDTH}, k ∈ {list(MDL_SAE_KS)}) interpolated at the BSF's "
    f"distortion. Controls: q = n beats q = 1 by ≥ {MDL_MARGIN} bit (positive); the q = n models re-parametrised "
    f"(W_g T, T⁻¹z) keep their total to {MDL_INVARIANCE_TOL} bits (negative: no difference where there is "
    f"none); the q = n model's residual variance ≤ {MDL_FLOOR_FACTOR:g}σ² (precondition: it reaches the noise "
    "floor); every n decided by the margin or a clear loss (precondition).",
    quick=False,
    kind="replication",
    source=f"{BSF_PAPER}: MDL selects block sizes of 2–4; BSF codes are shorter than an SAE's at a fixed distortion "
    "floor; docs/bsf.md §7",
    regime="ours: single-type planted benchmarks (D = 32, 6 manifolds, 8000 training samples), 800 Adam steps "
    "per run, best of 3 seeds × lr {3e-3, 1e-2} (SAE: 1 seed × the same lrs); the authors: DINOv3 and SDXL "
    "activations with their MDL accounting (precisions and support coding not published)",
)
def bsf_mdl_block_dim(ctx: CheckContext) -> Outcome:
    s = MDL_SETTINGS
    rng = ctx.rng("bsf.mdl_block_dim")
    curves, argmins, rows_by_n, sae_by_n, invariance, outcome = {}, {}, {}, {}, {}, {}
    for n, kind in PLANTED.items():
        cfg = replace(s.data, counts=((kind, MDL_N_MANIFOLDS),))
        bench = make_manifold_benchmark(cfg, seed=ctx.seed)
        prep = prepare(bench)
        cache = ModelCache(prep, replace(s, data=cfg), ctx.seed)
        rows = []
        for q in MDL_BLOCK_SIZES:
            k = bench.config.k_true * math.ceil(n / q)
            t = cache.get("bsf-vanilla", MDL_WIDTH, k, {"block_size": q})
            rows.append({**mdl_row(bench, t, q, k), "train_objective": t.metrics["train_objective"],
                         "candidates": t.metrics["candidates"], "chosen": t.metrics["chosen"]})
            if q == n:
                Zr, Wr = reparametrise(t.Z, t.W, rng)
                moved = mdl_row(bench, replace(t, Z=Zr, W=Wr), q, k)
                invariance[n] = {"invariant": abs(moved["total_invariant"] - rows[-1]["total_invariant"]),
                                 "model_codes": abs(moved["total"] - rows[-1]["total"])}
        sae_cache = ModelCache(prep, replace(s, data=cfg, restarts=1), ctx.seed)
        sae_by_n[n] = [{"k": k, **{key: mdl_row(bench, sae_cache.get("topk", MDL_WIDTH, k, {}), 1, k)[key]
                                   for key in ("total_invariant", "mean_sigma_r2", "recovery_mean_best")}}
                       for k in MDL_SAE_KS]
        rows_by_n[n] = rows
        curves[f"{kind} (n = {n})"] = rows
        outcome[n] = _mdl_outcome(n, rows, sae_by_n[n])
        argmins[n] = outcome[n]["argmin_q"]
    fig = plot_mdl_curve(ctx.figure_path("bsf_mdl_block_size.png"), curves,
                         f"Vanilla BSF, width {MDL_WIDTH}, planted manifolds: MDL against block size (ringed: minimum)")
    sigma2 = s.data.sigma**2
    floor = {n: s.data.D * max(0.0, 0.5 * math.log2(2 * math.pi * math.e * sigma2)
                               - math.log2(rows[0]["precisions"]["delta_x"])) for n, rows in rows_by_n.items()}
    at_n = {n: next(r for r in rows if r["q"] == n) for n, rows in rows_by_n.items()}
    block_dim_ok = all(o["decision"] == "n wins" for o in outcome.values())
    vs_sae_ok = all(o["below_sae"] for o in outcome.values())
    clear_loss = any(o["decision"] == "other wins" for o in outcome.values())
    controls = [
        Control("q = n beats q = 1", "positive", f"total(q = 1) − total(q = n) ≥ {MDL_MARGIN} bit for every n",
                ", ".join(f"n = {n}: {o['gain_over_q1']:+.1f}" for n, o in outcome.items()),
                all(o["gain_over_q1"] >= MDL_MARGIN for o in outcome.values())),
        Control("re-parametrised blocks", "negative", f"|Δ total| ≤ {MDL_INVARIANCE_TOL} bits under W_g → W_g T, "
                "z → T⁻¹z (the model's own codes move)",
                ", ".join(f"n = {n}: {v['invariant']:.2g} (model codes {v['model_codes']:.2f})"
                          for n, v in invariance.items()),
                all(v["invariant"] <= MDL_INVARIANCE_TOL for v in invariance.values())),
        Control("q = n at the noise floor", "precondition", f"residual variance of the q = n model ≤ "
                f"{MDL_FLOOR_FACTOR:g}σ² = {MDL_FLOOR_FACTOR * sigma2:.3g}",
                ", ".join(f"n = {n}: {r['mean_sigma_r2']:.3g}" for n, r in at_n.items()),
                all(r["mean_sigma_r2"] <= MDL_FLOOR_FACTOR * sigma2 for r in at_n.values())),
        Control("decided by the margin", "precondition", f"every n: q = n wins by ≥ {MDL_MARGIN} bit, or another q "
                f"wins by ≥ {MDL_MARGIN} bit somewhere", ", ".join(f"n = {n}: {o['decision']} ({o['margin']:+.2f})"
                                                                   for n, o in outcome.items()),
                clear_loss or all(o["decision"] != "tie" for o in outcome.values())),
    ]
    table = {n: {r["q"]: {"total": round(r["total_invariant"], 1), "support": round(r["L_support"], 1),
                          "code": round(r["L_code_invariant"], 1), "resid": round(r["L_resid"], 1),
                          "dict": round(r["L_dict"], 1), "total_model_codes": round(r["total"], 1),
                          "recovery": round(r["recovery_mean_best"], 3), "train_mse": float(f"{r['train_objective']:.3g}")}
                 for r in rows}
             for n, rows in rows_by_n.items()}
    finding = "; ".join(_mdl_clause(n, outcome[n], at_n[n], floor[n]) for n in outcome) + "."
    return Outcome.for_replication(
        claim_holds=block_dim_ok and vs_sae_ok, controls=controls,
        measured={"argmin_q": argmins, "block_dim_claim": block_dim_ok, "below_sae_claim": vs_sae_ok,
                  "outcome": {n: {k: v for k, v in o.items() if k != "argmin_q"} for n, o in outcome.items()},
                  "table": table},
        tolerance={"margin_bits": MDL_MARGIN, "invariance_bits": MDL_INVARIANCE_TOL, "floor_factor": MDL_FLOOR_FACTOR},
        tolerance_reason=f"{MDL_MARGIN} bit per sample ≈ the dictionary bits of one 4 × {MDL_SETTINGS.data.D} block "
        f"at 16 bits over {MDL_SETTINGS.data.n_eval} samples: a smaller difference is below the accounting's own "
        f"granularity; the invariance is exact up to float rounding; {MDL_FLOOR_FACTOR:g}σ² is half a bit per "
        "coordinate above the floor.",
        finding=finding,
        details={"rows": {str(n): rows for n, rows in rows_by_n.items()}, "sae": {str(n): v for n, v in sae_by_n.items()},
                 "invariance": {str(n): v for n, v in invariance.items()},
                 "precisions_circles": rows_by_n[2][0]["precisions"], "resid_bits_at_noise_floor": floor,
                 "benchmark": {"D": s.data.D, "n_manifolds": MDL_N_MANIFOLDS, "k_true": 3, "n_train": s.data.n_train,
                               "n_eval": s.data.n_eval, "seed": ctx.seed},
                 "training": {"arch": "bsf-vanilla", "width": MDL_WIDTH, "steps": s.steps, "batch_size": s.batch_size,
                              "protocol": f"every (model seed, lr) of {s.restarts} seeds (seed·{s.restarts} + r) × lr "
                                          f"{list(s.lrs)}; keep the run of lowest training objective (clean MSE on "
                                          "the training split, eval mode); each row lists every run ('candidates') "
                                          "and the kept one ('chosen'); SAE: 1 seed × the same lrs",
                              "k_rule": "k = k_true·⌈n/q⌉ (smallest k that represents every sample)",
                              "codes": "decision on total_invariant (codes in each block's principal frame, "
                                       "empirics.metrics.manifold_bench.principal_codes); 'total' is the model's own codes "
                                       "(docs/bsf.md §7), which moves with the parametrisation",
                              "sae_at_equal_distortion": "TopK SAE totals interpolated linearly in log distortion "
                                                         "(mean squared residual per coordinate) at the BSF's"}},
        figures=[_rel(fig, ctx)],
    )


def _mdl_outcome(n: int, rows: list[dict], sae: list[dict]) -> dict:
    """Per n: the argmin q of the invariant total, the decision with its margin (q = n against the best other q),
    the gain of q = n over q = 1, and the comparison with the SAE family at the q = n model's distortion."""
    total = {r["q"]: r["total_invariant"] for r in rows}
    at_n = next(r for r in rows if r["q"] == n)
    margin = min(v for q, v in total.items() if q != n) - total[n]
    decision = "n wins" if margin >= MDL_MARGIN else "other wins" if margin <= -MDL_MARGIN else "tie"
    d = at_n["mean_sigma_r2"]
    sae_pts = [(r["mean_sigma_r2"], r["total_invariant"]) for r in sae]
    sae_bits = rate_at_distortion(sae_pts, d)
    if sae_bits is not None:
        below, how = at_n["total_invariant"] < sae_bits, "interpolated"
    elif d < min(p[0] for p in sae_pts):
        below, how = True, "no SAE of the grid reaches the BSF's distortion"
    else:
        below, how = at_n["total_invariant"] < min(p[1] for p in sae_pts), "every SAE is more accurate: BSF below all"
    return {"argmin_q": min(total, key=total.get), "margin": margin, "decision": decision,
            "gain_over_q1": total[1] - total[n], "bsf_bits": at_n["total_invariant"], "bsf_distortion": d,
            "sae_bits_at_distortion": sae_bits, "sae_comparison": how, "below_sae": bool(below)}


def _mdl_clause(n: int, o: dict, at_n: dict, floor: float) -> str:
    """One clause of the finding: the block-size decision and the SAE comparison for one n."""
    sae = "n/a" if o["sae_bits_at_distortion"] is None else f"{o['sae_bits_at_distortion']:.1f}"
    return (f"n = {n}: argmin q = {o['argmin_q']} ({o['decision']}, margin {o['margin']:+.2f} bits; q = n total "
            f"{o['bsf_bits']:.1f}, residual {at_n['L_resid']:.1f} bits vs {floor:.1f} at the noise floor, R² "
            f"{at_n['recovery_mean_best']:.3f}); BSF {o['bsf_bits']:.1f} vs SAE {sae} bits at distortion "
            f"{o['bsf_distortion']:.3g} ({o['sae_comparison']})")
