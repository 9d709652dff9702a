"""Checks of the bilinear autoencoders (docs/bilinear.md §1–§8; issue 5 item 8).

Quick checks (no training): ``bilinear.kernel_exact`` (the kernel-trick loss and its gradient equal
the naive lifted loss for every prior) and ``bilinear.hoyer_scale_invariant``. Full-suite checks
train small models of :mod:`empirics.bilinear_models` with :func:`empirics.training.train` on the
quadric toy (:mod:`empirics.quadric_toy`): ``bilinear.geometry_recovery``,
``bilinear.prior_ordering`` and ``bilinear.subspace_stability``. Every model of these checks (each
prior, the TopK SAE baseline, every seed, the α_H = 0 ablation) is trained by one protocol: the best
of 2 restarts × 2 learning rates at 4000 steps by the final training objective (see ``_train``). It
was fixed from training losses only, never tuned until a prediction holds: where a prediction
fails, ``passed`` is False and ``finding`` says what was seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.architectures import build_model
from dictcheck.empirics.bilinear_models import hoyer_mean
from dictcheck.empirics.quadric_toy import QuadricToy, make_quadric_toy
from dictcheck.empirics.training import TrainConfig, best_of_runs, torch_threads, train
from dictcheck.proofs_checks.figures_bilinear import ProjectionPanel, plot_latent_projections
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check
from dictcheck.proofs_checks.sources import BILINEAR_PAPER
from dictcheck.solvers.form_matching import match_forms
from dictcheck.theory.bilinear_lifted import (
    BilinearDictionary,
    hoyer_density,
    kernel_lifted_loss,
    lifted_loss_gradients,
    naive_lifted_loss,
    normalise_tokens,
)
from dictcheck.theory.form_similarity import subspace_similarity
from dictcheck.theory.quadric_geometry import FactoredForms, LatentGeometry, readout

# ------------------------------------------------------------------------------------------------
# Training protocol, the same for every model of every training check (each prior, the TopK SAE
# baseline, every seed, the α_H = 0 ablation). It is fixed from the TRAINING objective alone, never
# from a verdict (diagnosis of the three priors on the seed-0 toy at lr 3e-3/1e-2/3e-2, 2000-16000
# steps, 4 seeds): quadratic and atomic plateau by 2000 steps (objective within 0.02 at every setting);
# the compound models vary by restart (0.41–0.46 at one setting) more than by steps beyond 4000
# (8000/16000 steps moved a run by −0.03…+0.06); lr 3e-2 degraded the 48-atom compound model, and
# 3e-3 vs 1e-2 each won for one compound shape. So each model is the best of _RESTARTS seeds × _LRS
# (Adam, the loop's warm-up/decay schedule) by its final training objective on all N tokens
# (:func:`_training_objective`).
# Hoyer α_H = 0.3 (the 2026 front end's composite model, §5) with the §5 warm-up; float32 as in real
# use; evaluation is float64 numpy.
_STEPS = 4000
_BATCH = 512
_LRS = (3e-3, 1e-2)
_RESTARTS = 2
_HOYER = 0.3
_TOY = {"N": 4000, "D": 16}  # shapes: circle (m = 2), ellipsoid (3), hyperboloid (3); see quadric_toy
_PROTOCOL = {"steps": _STEPS, "batch_size": _BATCH, "optimiser": "Adam, clip 1.0, loop lr schedule",
             "lr_candidates": list(_LRS), "restarts_per_lr": _RESTARTS, "dtype": "float32",
             "selection": "lowest final training objective on all N tokens (eval mode): bilinear nmse_lifted "
                          "+ α_H·η̄ (η̄ over chunks of batch_size tokens), TopK SAE mse"}

KERNEL_TOL = 1e-10
HOYER_TOL = 1e-12
ANGLE_TOL_DEG = 10.0
STABILITY_SIM = 0.9
STABILITY_SEEDS = 3


@dataclass
class _Trained:
    """The chosen model, its loop metrics, and the record of every candidate run."""

    model: Any
    metrics: dict[str, Any]
    runs: list[dict[str, Any]]
    chosen: int

    def record(self) -> dict[str, Any]:
        return {"runs": self.runs, "chosen": self.runs[self.chosen]}


def _training_objective(model: Any, metrics: dict[str, Any]) -> float:
    """The loss the optimiser minimised, on all N training tokens with the final weights (s(t) = 1).

    Bilinear: nmse_lifted + α_H·η̄ (the loop evaluates in chunks of batch_size tokens, so η̄ is at the
    training N, §5). TopK SAE: mse (its loss with aux_coef = 0)."""
    if "nmse_lifted" in metrics:
        return float(metrics["nmse_lifted"] + model.hoyer_coef * metrics["hoyer_density"])
    return float(metrics["mse"])


def _train_once(rows: np.ndarray, arch: str, d_sae: int, *, seed: int, lr: float, options: dict[str, Any],
                k: int | None) -> tuple[Any, dict[str, Any], list[float]]:
    """One run of the project's loop (nothing written): (model, metrics, batch loss every 10%)."""
    opts = dict(options) if k is None else {**options, "k": k}
    model = build_model(arch, rows.shape[1], d_sae, opts, seed=int(seed), dtype=torch.float32)
    cfg = TrainConfig(steps=_STEPS, batch_size=_BATCH, lr=lr, seed=int(seed), device="cpu", checkpoint_every=0,
                      log_every=_STEPS // 10, keep_checkpoints=1)
    result = train(model, np.ascontiguousarray(rows), cfg, progress=False)
    return result.model, result.metrics, [round(float(rec["loss"]), 4) for rec in result.log]


def _train(rows: np.ndarray, arch: str, d_sae: int, *, seed: int, options: dict[str, Any] | None = None,
           k: int | None = None) -> _Trained:
    """The protocol: _RESTARTS seeds (seed·_RESTARTS + r, distinct across base seeds) × _LRS; keep the
    run with the lowest :func:`_training_objective` (the first on a tie; :func:`best_of_runs`)."""
    candidates = [(lr, int(seed) * _RESTARTS + r) for lr in _LRS for r in range(_RESTARTS)]
    with torch_threads(1):
        best = best_of_runs(
            candidates,
            lambda c: _train_once(rows, arch, d_sae, seed=c[1], lr=c[0], options=dict(options or {}), k=k),
            lambda fit: _training_objective(fit[0], fit[1]))
    runs = [{"lr": lr, "seed": run_seed, "training_objective": objective, "batch_loss_every_10pct": fit[2]}
            for (lr, run_seed), objective, fit in zip(candidates, best.objectives, best.results)]
    model, metrics, _ = best.result
    return _Trained(model=model, metrics=metrics, runs=runs, chosen=best.chosen)


def _rel(path: Path, ctx: CheckContext) -> str:
    return str(path.relative_to(ctx.out_dir))


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(float).tiny))


def lifted_pca_floor(rows: np.ndarray, d: int) -> float:
    """The lowest lifted NMSE any d forms can reach: 1 − (top-d uncentred eigenvalues of the lifts)/N.

    The tied decoder is a linear autoencoder of the lifts vec(xxᵀ) (§1), whose optimum is their top-d
    principal subspace; a reference for how well training went (D² × D² is tiny here).
    """
    T = np.einsum("ni,nj->nij", rows, rows).reshape(rows.shape[0], -1)
    s = np.linalg.svd(T, compute_uv=False) ** 2 / rows.shape[0]
    return float(1.0 - np.sum(s[:d]) / np.sum(s))


# ------------------------------------------------------------------------------------------------
# bilinear.kernel_exact

#: (architecture, decoder, compound atoms): every prior, both GLU decoders, and the compound prior with GLU atoms
#: (the authors' mixed model, issue 16) under both decoders.
_PRIOR_CASES = (("bilinear-quadratic", "symmetric", None), ("bilinear-quadratic", "asymmetric", None),
                ("bilinear-atomic", "symmetric", None), ("bilinear-compound", "symmetric", "rank1"),
                ("bilinear-compound", "symmetric", "glu"), ("bilinear-compound", "asymmetric", "glu"))


def _naive_torch_loss(model: Any, x: torch.Tensor) -> torch.Tensor:
    """The oracle with autograd: forms W_j built explicitly, T̂ = Σ_j z_j W_j formed (N·D² memory)."""
    xn, _ = model.normalise(x)
    U = model.U
    W = torch.einsum("jd,je->jde", U, U if model.V is None else model.V)
    if model.V is not None and model.decoder == "symmetric":
        W = 0.5 * (W + W.transpose(1, 2))
    if model.prior == "compound":
        W = torch.einsum("kj,jde->kde", model.effective_C(), W)
    z = torch.einsum("nd,jde,ne->nj", xn, W, xn)
    T = torch.einsum("nd,ne->nde", xn, xn)
    return ((T - torch.einsum("nj,jde->nde", z, W)) ** 2).sum() / xn.shape[0]


def _grads(model: Any, loss: torch.Tensor) -> dict[str, np.ndarray]:
    names = [n for n in ("U", "V", "C") if getattr(model, n) is not None]
    grads = torch.autograd.grad(loss, [getattr(model, n) for n in names])
    return {n: g.numpy() for n, g in zip(names, grads)}


def kernel_exact_cases(rng: np.random.Generator, per_prior: int = 4) -> list[dict[str, Any]]:
    """Seeded random shapes for every prior and decoder; one row of errors per case."""
    rows = []
    for arch, decoder, atoms in _PRIOR_CASES:
        for _ in range(per_prior):
            N, D, d = int(rng.integers(2, 13)), int(rng.integers(2, 7)), int(rng.integers(1, 8))
            options: dict[str, Any] = {"hoyer_coef": 0.0, "tile": int(rng.integers(0, d + 1))}
            if arch != "bilinear-atomic":
                options["decoder"] = decoder
            if arch == "bilinear-compound":  # k_c = n_a (dense C) is drawn too
                n_a = int(rng.integers(1, 9))
                options.update(n_atoms=n_a, k_c=int(rng.integers(1, n_a + 1)), tile=int(rng.integers(0, n_a + 1)),
                               atoms=atoms)
            model = build_model(arch, D, d, options, seed=int(rng.integers(2**31)), dtype=torch.float64)
            with torch.no_grad():  # generic (non-orthogonal) weights
                for p in model.parameters():
                    p.copy_(torch.from_numpy(rng.normal(size=tuple(p.shape))))
            X = rng.normal(size=(N, D))
            x = torch.from_numpy(X)
            out = model(x)
            g_kernel = _grads(model, out.mse)
            g_naive = _grads(model, _naive_torch_loss(model, x))
            dic = model.dictionary()
            Xn, _ = normalise_tokens(X)
            naive = naive_lifted_loss(Xn, dic.forms())
            closed = lifted_loss_gradients(Xn, dic)
            rows.append({
                "arch": arch, "decoder": decoder, "atoms": atoms, "N": N, "D": D, "d_sae": d, "options": options,
                "loss_model_vs_naive": abs(float(out.mse.detach()) - naive) / abs(naive),
                "loss_theory_kernel_vs_naive": abs(kernel_lifted_loss(Xn, dic, tile=options["tile"]) - naive) / abs(naive),
                "grad_model_vs_naive": max(_rel_err(g_kernel[n], g_naive[n]) for n in g_naive),
                "grad_closed_form_vs_naive": max(_rel_err(closed[n], g_naive[n]) for n in g_naive),
            })
    return rows


@check(
    "bilinear.kernel_exact",
    "Kernel-trick lifted loss and its gradient equal the naive lifted loss for every prior",
    "docs/bilinear.md §1, §3 (tiling §3, §9 pitfall 1)",
    predicted=f"For quadratic (symmetric and asymmetric decoder), atomic, compound (top-k_c or dense C) and compound "
    f"with GLU atoms (the authors' mixed model; symmetric and asymmetric decoder) models with "
    f"random shapes, random weights, random tiles and unnormalised tokens, in float64: the model's kernel loss, "
    f"the theory kernel loss, the model's autograd gradient and the closed-form gradients all equal the naive "
    f"lifted loss ‖T − Σ z_j W_j‖² (T̂ formed explicitly) and its autograd gradient to relative error < {KERNEL_TOL:g}.",
    kind="invariant",
    source=f"{BILINEAR_PAPER}: the kernel trick K = Cᵀ(LLᵀ ⊙ RRᵀ)C; docs/bilinear.md §3",
    regime="random shapes, weights and tiles, float64, no training",
)
def bilinear_kernel_exact(ctx: CheckContext) -> Outcome:
    rows = kernel_exact_cases(ctx.rng("bilinear.kernel_exact"))
    keys = ("loss_model_vs_naive", "loss_theory_kernel_vs_naive", "grad_model_vs_naive", "grad_closed_form_vs_naive")
    worst = {k: max(r[k] for r in rows) for k in keys}
    bad = [r for r in rows if max(r[k] for k in keys) >= KERNEL_TOL]
    return Outcome(
        measured={"max_rel_err": worst, "n_cases": len(rows)}, tolerance=KERNEL_TOL,
        tolerance_reason="float64 rounding on O(10)-sized sums is ~1e-15 relative; 1e-10 (the issue's bound) "
        "leaves room for cancellation in the '− 2‖Z‖² + N' terms while any algebraic error is O(1).",
        passed=not bad, details={"cases": rows},
        finding=None if not bad else f"{len(bad)} cases exceed {KERNEL_TOL:g}: " + "; ".join(
            f"{r['arch']}/{r['decoder']}/{r['atoms']} N={r['N']} D={r['D']} d={r['d_sae']} {r['options']}" for r in bad[:5]),
    )


# ------------------------------------------------------------------------------------------------
# bilinear.hoyer_scale_invariant


@check(
    "bilinear.hoyer_scale_invariant",
    "Hoyer density: invariant to rescaling a latent, 0 for one active token, 1 for uniform magnitude",
    "docs/bilinear.md §5",
    predicted="η_j = (‖a_j‖₁/‖a_j‖₂ − 1)/(√N − 1) per latent over the batch is unchanged when latent j is "
    "multiplied by any nonzero s (also inside a trained-style model: an atomic row u_j → √s u_j), is exactly 0 "
    "for a latent active on one token and exactly 1 for a latent of equal magnitude (any signs) on every token; "
    "a dead latent is excluded from η̄ and counted (no NaN); the model's torch η̄ equals the numpy reference.",
    kind="invariant",
    source=f"{BILINEAR_PAPER}: Hoyer density as a scale-invariant sparsity; docs/bilinear.md §5",
    regime="random batches and a model forward pass, no training",
)
def bilinear_hoyer_scale_invariant(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("bilinear.hoyer_scale_invariant")
    N, d = 64, 7
    A = rng.normal(size=(N, d)) * (rng.random((N, d)) < 0.4)
    A[0, :] = rng.normal(size=d)  # every latent alive
    s = rng.choice([-1.0, 1.0], d) * np.exp(rng.uniform(-6, 6, d))
    scale_err = float(np.max(np.abs(hoyer_density(A * s).eta - hoyer_density(A).eta)))
    one = np.zeros((N, 3))
    one[[3, 10, 50], [0, 1, 2]] = [2.0, -0.1, 7e5]
    one_token = float(np.max(np.abs(hoyer_density(one).eta)))
    uniform = rng.choice([-1.0, 1.0], (N, 3)) * np.array([1e-3, 1.0, 4e3])
    uniform_err = float(np.max(np.abs(hoyer_density(uniform).eta - 1.0)))
    dead = np.concatenate([A, np.zeros((N, 1))], axis=1)
    hd = hoyer_density(dead)
    dead_ok = bool(hd.n_dead == 1 and np.isfinite(hd.eta).all() and abs(hd.mean - hoyer_density(A).mean) < HOYER_TOL)
    torch_mean, torch_dead = hoyer_mean(torch.from_numpy(dead))
    torch_err = abs(float(torch_mean) - hd.mean)
    # Inside a model: rescale one atomic latent's form by s_j (u_j → √|s_j| u_j scales z_j by |s_j|).
    model = build_model("bilinear-atomic", 6, 5, {"hoyer_coef": 1.0}, seed=ctx.seed, dtype=torch.float64)
    Xn, _ = normalise_tokens(rng.normal(size=(N, 6)))
    U = model.dictionary().U
    z_before = BilinearDictionary("atomic", U).latents(Xn)
    U2 = U * np.sqrt(np.exp(rng.uniform(-4, 4, 5)))[:, None]
    z_after = BilinearDictionary("atomic", U2).latents(Xn)
    model_err = float(np.max(np.abs(hoyer_density(z_after).eta - hoyer_density(z_before).eta)))
    errors = {"rescaling": scale_err, "one_active_token": one_token, "uniform_magnitude": uniform_err,
              "torch_vs_numpy_mean": torch_err, "model_latent_rescaling": model_err}
    passed = max(errors.values()) < HOYER_TOL and dead_ok and torch_dead == 1
    return Outcome(
        measured={"max_abs_err": errors, "dead_latent_handled": dead_ok, "torch_dead_count": torch_dead},
        tolerance=HOYER_TOL,
        tolerance_reason="the identities are exact; float64 rounding of ‖a‖₁/‖a‖₂ over 64 tokens is ~1e-15.",
        passed=passed, details={"N": N, "scales": s.tolist()},
        finding=None if passed else f"Hoyer identities violated: {errors}, dead handled {dead_ok}, torch dead {torch_dead}",
    )


# ------------------------------------------------------------------------------------------------
# bilinear.geometry_recovery

_GEO_MODEL = {"arch": "bilinear-compound", "d_sae": 24,
              "options": {"n_atoms": 48, "k_c": 3, "hoyer_coef": _HOYER}}


def _largest_angle_deg(S: np.ndarray, E: np.ndarray) -> float:
    """Largest principal angle between span(S) and span(E) (orthonormal columns, same count)."""
    if E.shape[1] < S.shape[1]:
        return 90.0
    sv = np.linalg.svd(S.T @ E[:, : S.shape[1]], compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(sv.min(), -1.0, 1.0))))


def geometry_table(toy: QuadricToy, forms: FactoredForms, geo: list[LatentGeometry]) -> list[dict[str, Any]]:
    """Per planted component: the latent whose top-m |μ| eigenspace is closest to S_c (from the weights),
    its label, and diagnostics (the latent most active on the component's tokens)."""
    W = forms.dense()
    Z = np.einsum("ni,kij,nj->kn", toy.rows, W, toy.rows)
    S_all = np.concatenate(toy.bases, axis=1)
    rows = []
    for c in range(len(toy.shapes)):
        S = toy.bases[c]
        angles = [_largest_angle_deg(S, g.eigenvectors) for g in geo]
        # Containment: the fraction of S_c inside a latent's top-3 eigenspace, ‖E₃ᵀS‖²_F/m ∈ [0, 1].
        contained = [float(np.sum((g.eigenvectors[:, :3].T @ S) ** 2) / S.shape[1]) for g in geo]
        best = int(np.argmin(angles))
        active = int(np.argmax(np.mean(Z[:, toy.component == c] ** 2, axis=1)))
        H = toy.planted_form(c)
        rows.append({
            "component": c, "shape": toy.shapes[c], "planted_label": toy.expected_label(c), "m": S.shape[1],
            "best_latent": best, "best_angle_deg": angles[best], "best_label": geo[best].label,
            "best_eigenvalues": [round(float(v), 4) for v in geo[best].eigenvalues[:4]],
            "best_cos_to_planted_form": float(np.sum(W[best] * H) / np.linalg.norm(W[best]) / np.linalg.norm(H)),
            "max_fraction_of_S_in_a_top3_eigenspace": max(contained),
            "best_top3_in_linear_complement": float(1.0 - np.sum((S_all.T @ geo[best].eigenvectors[:, :3]) ** 2)
                                                    / geo[best].eigenvectors[:, :3].shape[1]),
            "most_active_latent": active, "most_active_angle_deg": angles[active],
            "most_active_label": geo[active].label,
            "labels_of_latents_within_10deg": sorted({geo[j].label for j, a in enumerate(angles) if a < ANGLE_TOL_DEG}),
        })
    return rows


def _recovery_fails(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in table if r["best_angle_deg"] >= ANGLE_TOL_DEG or r["best_label"] != r["planted_label"]]


def _geometry_run(toy: QuadricToy, hoyer_coef: float, seed: int) -> dict[str, Any]:
    """Train the geometry model with the protocol at ``hoyer_coef``; its readout, table and record."""
    t = _train(toy.rows, _GEO_MODEL["arch"], _GEO_MODEL["d_sae"], seed=seed,
               options=_GEO_MODEL["options"] | {"hoyer_coef": hoyer_coef})
    forms = FactoredForms.from_dictionary(t.model.dictionary())
    geo = readout(forms)
    return {"geo": geo, "table": geometry_table(toy, forms, geo),
            "label_counts": {lab: sum(g.label == lab for g in geo) for lab in sorted({g.label for g in geo})},
            "nmse_lifted": t.metrics.get("nmse_lifted"), "hoyer_density": t.metrics.get("hoyer_density"),
            "training": t.record()}


def _angles_text(table: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['shape']} {r['best_angle_deg']:.1f}° ({r['best_label']})" for r in table)


@check(
    "bilinear.geometry_recovery",
    "Quadric toy: planted subspaces and shapes are read off the weights",
    "docs/bilinear.md §6; issue 5 item 8",
    predicted=f"A compound model ({_GEO_MODEL['d_sae']} composites, {_GEO_MODEL['options']['n_atoms']} atoms, "
    f"k_c = {_GEO_MODEL['options']['k_c']}, α_H = {_HOYER}) trained on the quadric toy (circle, ellipsoid, "
    f"hyperboloid sheet in orthogonal random subspaces of R^16, plus linear features): for every planted "
    f"component some latent's top-m |μ| eigenspace lies within {ANGLE_TOL_DEG}° (largest principal angle) of the "
    f"planted subspace, and that latent's §6 label equals the planted shape's (ellipsoid, ellipsoid, hyperboloid).",
    quick=False,
    kind="replication",
    source=f"{BILINEAR_PAPER}: quadratic latents recover ellipsoids and hyperboloids from the weights",
    regime="quadric toy (D = 16), compound model, our CPU training budget (not the authors' sizes, optimiser or "
    "GLU atoms; issue 16)",
)
def bilinear_geometry_recovery(ctx: CheckContext) -> Outcome:
    toy = make_quadric_toy(seed=ctx.seed, **_TOY)
    main = _geometry_run(toy, _HOYER, ctx.seed)
    ablation = _geometry_run(toy, 0.0, ctx.seed)  # details only: does the Hoyer term move latents off the forms?
    geo, table, counts = main["geo"], main["table"], main["label_counts"]
    fails = _recovery_fails(table)
    names = dict(enumerate(toy.shapes)) | {-1: "linear only"}
    fig = plot_latent_projections(
        ctx.figure_path("bilinear_geometry_recovery.png"), toy.rows,
        [ProjectionPanel(geo[r["best_latent"]].eigenvectors, f"{r['shape']}: latent {r['best_latent']} "
                         f"({r['best_label']}, {r['best_angle_deg']:.1f}°)") for r in table],
        labels=toy.component, label_names=names,
        title="Normalised tokens on the top-3 |μ| eigenvectors of the latent closest to each planted subspace")
    finding = None
    if fails:
        n_abl = len(_recovery_fails(ablation["table"]))
        finding = (
            "Not recovered as predicted: " + "; ".join(
                f"{r['shape']}: closest latent {r['best_latent']} at {r['best_angle_deg']:.1f}° labelled "
                f"{r['best_label']} (planted {r['planted_label']}, top |μ| {r['best_eigenvalues']}; at most "
                f"{r['max_fraction_of_S_in_a_top3_eigenspace']:.2f} of the planted subspace lies in any latent's "
                f"top-3 eigenspace)" for r in fails)
            + f". Labels of all {len(geo)} latents: {counts}. The top eigenvectors of the closest latents put a "
            "fraction " + ", ".join(f"{r['best_top3_in_linear_complement']:.2f}" for r in table)
            + " of their energy in the linear-feature complement, consistent with fitting the cross terms "
            f"x_S x_linᵀ of the lift. Ablation α_H = 0 (same protocol, not the verdict): {_angles_text(ablation['table'])}"
            f", {n_abl} of {len(table)} components missed, labels {ablation['label_counts']}, lifted NMSE "
            f"{ablation['nmse_lifted']:.4f} vs {main['nmse_lifted']:.4f} at α_H = {_HOYER}"
            + (f" — without the Hoyer term {n_abl} of {len(table)} components are still missed, so the Hoyer term "
               "alone does not explain the miss." if n_abl else
               " — without the Hoyer term every planted form is recovered, so the Hoyer term is what moves the "
               "latents off them.")
        )
    return Outcome(
        measured={r["shape"]: {"angle_deg": round(r["best_angle_deg"], 2), "label": r["best_label"]} for r in table},
        tolerance={"largest_principal_angle_deg": ANGLE_TOL_DEG, "label": "exact"},
        tolerance_reason="10° is the issue's bound; the §6 label uses τ_eig = 1e-6 exactly as specified.",
        passed=not fails, finding=finding, figures=[_rel(fig, ctx)],
        details={"table": table, "nmse_lifted": main["nmse_lifted"], "hoyer_density": main["hoyer_density"],
                 "lifted_pca_floor_same_d": lifted_pca_floor(toy.rows, _GEO_MODEL["d_sae"]),
                 "label_counts": counts, "training": main["training"],
                 "ablation_hoyer_0": {k: v for k, v in ablation.items() if k != "geo"},
                 "toy": toy.params, "model": _GEO_MODEL, "protocol": _PROTOCOL},
    )


# ------------------------------------------------------------------------------------------------
# bilinear.prior_ordering

#: Equal parameter budget P = 512 at D = 16 (§2 parameter counts): GLU 2·d_z·D, atomic d_z·D,
#: compound n_a·D + nnz(C) = n_a·D + k_c·d_z, TopK SAE 2·d_sae·D (+ d_sae + D biases, not counted).
BUDGET = 512
_ORDER_MODELS = {
    "compound": {"arch": "bilinear-compound", "d_sae": 32, "options": {"n_atoms": 24, "k_c": 4, "hoyer_coef": _HOYER}},
    "quadratic": {"arch": "bilinear-quadratic", "d_sae": 16, "options": {"hoyer_coef": _HOYER}},
    "atomic": {"arch": "bilinear-atomic", "d_sae": 32, "options": {"hoyer_coef": _HOYER}},
    "topk": {"arch": "topk", "d_sae": 16, "k": 4},
}
TOPK_DIAGNOSTIC_K = (1, 2)


def _parameter_count(name: str, spec: dict[str, Any], D: int) -> int:
    d = spec["d_sae"]
    if name == "compound":
        return spec["options"]["n_atoms"] * D + spec["options"]["k_c"] * d
    return {"quadratic": 2 * d * D, "atomic": d * D, "topk": 2 * d * D}[name]


def lifted_nmse_of_reconstruction(rows: np.ndarray, x_hat: np.ndarray) -> float:
    """mean ‖xxᵀ − x̂x̂ᵀ‖²_F = mean[1 − 2(x·x̂)² + ‖x̂‖⁴] for unit x.

    Sign-free: x̂ and −x̂ have the same lift, so no sign rule is needed (§8)."""
    return float(np.mean(1.0 - 2.0 * np.sum(rows * x_hat, axis=1) ** 2 + np.sum(x_hat * x_hat, axis=1) ** 2))


def _topk_lifted_nmse(rows: np.ndarray, d_sae: int, k: int, seed: int) -> tuple[float, dict[str, Any]]:
    """Train a linear TopK SAE on the unit tokens (the protocol); (its lifted NMSE, training record)."""
    t = _train(rows, "topk", d_sae, seed=seed, k=k)
    with torch.no_grad():
        x_hat = t.model(torch.from_numpy(rows).to(torch.float32)).x_hat.double().numpy()
    return lifted_nmse_of_reconstruction(rows, x_hat), t.record()


def _decoder_rank_bound(spec: dict[str, Any]) -> int:
    """rank 𝒲ᵀ𝒲 ≤ d_sae, and ≤ n_atoms for compound (its composites lie in the span of the atom lifts)."""
    return min(spec["d_sae"], spec["options"].get("n_atoms", spec["d_sae"]))


@check(
    "bilinear.prior_ordering",
    "Quadric toy at equal parameter budget: lifted NMSE compound, quadratic < atomic < linear TopK SAE",
    "docs/bilinear.md §2 (parameter counts), §8 (nmse_lifted, seed-summary claim)",
    predicted=f"At an equal budget of {BUDGET} parameters on the quadric toy (D = 16): compound (24 atoms, 32 "
    f"composites, k_c = 4) and quadratic/GLU (16 latents) reach a lower lifted NMSE than atomic (32 latents), and "
    f"atomic lower than a linear TopK SAE (16 latents, k = 4) whose reconstruction x̂ is lifted to x̂x̂ᵀ and "
    f"measured the same way on the (unit) tokens.",
    quick=False,
    kind="replication",
    source=f"{BILINEAR_PAPER}: richer priors (compound, quadratic) reconstruct the lift better than atomic and "
    "linear SAEs",
    regime="quadric toy (D = 16, 4-sparse tokens), equal parameter budget, our CPU training budget",
)
def bilinear_prior_ordering(ctx: CheckContext) -> Outcome:
    toy = make_quadric_toy(seed=ctx.seed, **_TOY)
    rows = toy.rows
    table: dict[str, dict[str, Any]] = {}
    for name, spec in _ORDER_MODELS.items():
        row: dict[str, Any] = {"parameters": _parameter_count(name, spec, toy.D), "d_sae": spec["d_sae"]}
        if name == "topk":
            nmse, record = _topk_lifted_nmse(rows, spec["d_sae"], spec["k"], ctx.seed)
            row.update(nmse_lifted=nmse, k=spec["k"], training=record)
        else:  # a bilinear model is a tied linear autoencoder of the lifts: PCA bounds it from below
            t = _train(rows, spec["arch"], spec["d_sae"], seed=ctx.seed, options=spec["options"])
            rank = _decoder_rank_bound(spec)
            row.update(nmse_lifted=kernel_lifted_loss(rows, t.model.dictionary()), **spec["options"],
                       hoyer_density=t.metrics.get("hoyer_density"), decoder_rank_bound=rank,
                       lifted_pca_floor=lifted_pca_floor(rows, rank), training=t.record())
        table[name] = row
    diagnostics, diagnostic_training = {}, {}
    for k in TOPK_DIAGNOSTIC_K:  # not part of the verdict: how sparse must the linear SAE be to lose?
        diagnostics[f"topk_k{k}"], diagnostic_training[f"topk_k{k}"] = _topk_lifted_nmse(
            rows, _ORDER_MODELS["topk"]["d_sae"], k, ctx.seed)
    n = {k: v["nmse_lifted"] for k, v in table.items()}
    order = {"compound < atomic": n["compound"] < n["atomic"], "quadratic < atomic": n["quadratic"] < n["atomic"],
             "atomic < topk": n["atomic"] < n["topk"]}
    passed = all(order.values())
    return Outcome(
        measured={"nmse_lifted": {k: round(v, 4) for k, v in n.items()}, "order_holds": order},
        tolerance="strict order of the measured NMSEs",
        tolerance_reason="the claim is an ordering; the full table (with each bilinear model's lifted-PCA floor at "
        "its decoder-rank bound) is reported so that a near tie is visible.",
        passed=passed, details={"table": table, "budget": BUDGET, "toy": toy.params,
                                "topk_other_k_nmse_lifted": diagnostics,
                                "topk_other_k_training": diagnostic_training, "protocol": _PROTOCOL,
                                "lifted_pca_floor_note": "1 − (top-r uncentred eigenvalues of the lifts)/N at r = "
                                "the decoder-rank bound: the lowest NMSE of ANY r symmetric forms; the priors "
                                "restrict the forms (rank-1 PSD atoms, rank-2 GLU), so they may stay above it "
                                "even when trained to convergence",
                                "topk_lift": "x̂x̂ᵀ of the SAE reconstruction of the unit token (sign-free)"},
        finding=None if passed else "Ordering fails: " + ", ".join(k for k, v in order.items() if not v)
        + f" (NMSE {', '.join(f'{k} {v:.4f}' for k, v in n.items())}; TopK with other k: "
        + ", ".join(f"{k} {v:.4f}" for k, v in diagnostics.items()) + "). Each toy token is a unit vector in at most "
        "4 of 16 fixed directions (a planted subspace of dim ≤ 3 plus one linear feature), so a linear TopK SAE with "
        "d_sae = D = 16 can hold all of them, while the bilinear models' 16-32 forms cover part of the 136-dim lift "
        "space (lifted-PCA floors at the decoder-rank bound: " + ", ".join(
            f"{k} {v['lifted_pca_floor']:.4f}" for k, v in table.items() if "lifted_pca_floor" in v)
        + "; final training objectives of the candidate runs: " + ", ".join(
            f"{k} {min(r['training_objective'] for r in v['training']['runs']):.4f}–"
            f"{max(r['training_objective'] for r in v['training']['runs']):.4f}" for k, v in table.items()) + ").",
    )


# ------------------------------------------------------------------------------------------------
# bilinear.subspace_stability

_STABILITY_MODELS = {
    "compound": {"arch": "bilinear-compound", "d_sae": 24, "options": {"n_atoms": 48, "k_c": 3, "hoyer_coef": _HOYER}},
    "quadratic": {"arch": "bilinear-quadratic", "d_sae": 24, "options": {"hoyer_coef": _HOYER}},
    "atomic": {"arch": "bilinear-atomic", "d_sae": 24, "options": {"hoyer_coef": _HOYER}},
}


@check(
    "bilinear.subspace_stability",
    "Across 3 seeds: subspace similarity > 0.9 while one-to-one atom matching is lower",
    "docs/bilinear.md §7",
    predicted=f"For each prior (compound, quadratic, atomic; 24 latents each) trained with {STABILITY_SEEDS} seeds "
    f"on the same quadric toy, every pair of seeds has subspace similarity > {STABILITY_SIM} and a Hungarian "
    f"mean matched cosine (unit-Frobenius forms) below that similarity.",
    quick=False,
    kind="replication",
    source=f"{BILINEAR_PAPER}: learned subspaces are stable across seeds while single atoms are not",
    regime="quadric toy, 3 seeds, 24 latents per prior, our CPU training budget",
)
def bilinear_subspace_stability(ctx: CheckContext) -> Outcome:
    toy = make_quadric_toy(seed=ctx.seed, **_TOY)
    seeds = [ctx.seed + i for i in range(STABILITY_SEEDS)]
    forms: dict[str, list[FactoredForms]] = {}
    training: dict[str, list[dict[str, Any]]] = {}
    for name, spec in _STABILITY_MODELS.items():
        trained = [_train(toy.rows, spec["arch"], spec["d_sae"], seed=s, options=spec["options"]) for s in seeds]
        forms[name] = [FactoredForms.from_dictionary(t.model.dictionary()) for t in trained]
        training[name] = [t.record() for t in trained]
    pairs: dict[str, list[dict[str, Any]]] = {}
    for name, fs in forms.items():
        pairs[name] = []
        for i, j in combinations(range(len(seeds)), 2):
            m = match_forms(fs[i], fs[j])
            pairs[name].append({"seeds": [seeds[i], seeds[j]], "similarity": subspace_similarity(fs[i], fs[j]),
                                "mean_matched_cosine": m.mean_cosine, "workshop_ratio": m.workshop_ratio})
    cross = {f"{a}~{b}": subspace_similarity(forms[a][0], forms[b][0]) for a, b in combinations(forms, 2)}
    fails = [(name, p) for name, ps in pairs.items() for p in ps
             if not (p["similarity"] > STABILITY_SIM and p["mean_matched_cosine"] < p["similarity"])]
    summary = {name: {"min_similarity": round(min(p["similarity"] for p in ps), 4),
                      "max_mean_matched_cosine": round(max(p["mean_matched_cosine"] for p in ps), 4),
                      "max_workshop_ratio": round(max(p["workshop_ratio"] for p in ps), 4)}
               for name, ps in pairs.items()}
    return Outcome(
        measured=summary, tolerance={"similarity_above": STABILITY_SIM, "matching": "below the similarity"},
        tolerance_reason="0.9 is the seed summary's '>90% similarity'; the matching claim is only 'lower'.",
        passed=not fails,
        finding=None if not fails else "Not as predicted for " + "; ".join(
            f"{name} seeds {p['seeds']}: similarity {p['similarity']:.3f}, matched cosine {p['mean_matched_cosine']:.3f}"
            for name, p in fails),
        details={"pairs": pairs, "cross_prior_similarity_seed0": cross, "models": _STABILITY_MODELS,
                 "toy": toy.params, "protocol": _PROTOCOL, "training_per_seed": training},
    )
