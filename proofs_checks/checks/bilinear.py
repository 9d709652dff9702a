"""Checks of the bilinear autoencoders (docs/bilinear.md §1–§8, §12; issue 5 item 8, issue 16 items 2 and 4).

Quick invariants (no training): ``bilinear.kernel_exact`` (the kernel-trick loss and its gradient equal
the naive lifted loss for every prior, GLU-atom compound included), ``bilinear.hoyer_scale_invariant`` and
``bilinear.prior_warm_start`` (equal-width embeddings of the priors are exact and descent from them never
rises). Full-suite replications, each with a verdict, controls and a regime that says where it still
differs from the authors': ``bilinear.geometry_recovery`` (span fraction of each planted form against its
lifted-PCA ceiling), ``bilinear.prior_ordering`` (a D ≫ k toy with superposition),
``bilinear.prior_ordering_real`` (SmolLM2 activations) and ``bilinear.subspace_stability``. The bilinear
models of these train in the authors' regime (the workshop's mixed model, Muon; :func:`_train_muon`, one run
each); the linear TopK baseline trains with the project's Adam loop, the best of one restart per learning
rate by its final training objective (:func:`_train`). Nothing was tuned until a prediction held: where one
fails, the verdict and ``finding`` say what was seen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.architectures import architecture, build_model
from dictcheck.empirics.architectures.bilinear import MuonConfig, hoyer_mean, train_muon
from dictcheck.empirics.data.quadric_toy import QuadricToy, make_quadric_toy
from dictcheck.empirics.training.loop import TrainConfig, best_of_runs, torch_threads, train
from dictcheck.proofs_checks.real_protocol import real_data
from dictcheck.proofs_checks.figures_bilinear import ProjectionPanel, plot_latent_projections
from dictcheck.proofs_checks.registry import CheckContext, Control, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import BILINEAR_PAPER
from dictcheck.solvers.form_matching import match_forms
from dictcheck.theory.bilinear_lifted import (
    BilinearDictionary,
    hoyer_density,
    kernel_lifted_loss,
    lifted_loss_gradients,
    lifted_principal_forms,
    naive_lifted_loss,
    lifted_spectrum,
    normalise_tokens,
    span_fraction,
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
_PROTOCOL = {"steps": _STEPS, "batch_size": _BATCH, "optimiser": "Adam, clip 1.0, loop lr schedule",
             "lr_candidates": list(_LRS), "restarts_per_lr": _RESTARTS, "dtype": "float32",
             "selection": "lowest final training objective on all N tokens (eval mode): bilinear nmse_lifted "
                          "+ α_H·η̄ (η̄ over chunks of batch_size tokens), TopK SAE mse"}

KERNEL_TOL = 1e-10
HOYER_TOL = 1e-12
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
                k: int | None, steps: int = _STEPS) -> tuple[Any, dict[str, Any], list[float]]:
    """One run of the project's loop (nothing written): (model, metrics, batch loss every 10%)."""
    opts = dict(options) if k is None else {**options, "k": k}
    model = build_model(arch, rows.shape[1], d_sae, opts, seed=int(seed), dtype=torch.float32)
    cfg = TrainConfig(steps=steps, batch_size=_BATCH, lr=lr, seed=int(seed), device="cpu", checkpoint_every=0,
                      log_every=max(1, steps // 10), keep_checkpoints=1)
    result = train(model, np.ascontiguousarray(rows), cfg, progress=False)
    return result.model, result.metrics, [round(float(rec["loss"]), 4) for rec in result.log]


def _train(rows: np.ndarray, arch: str, d_sae: int, *, seed: int, options: dict[str, Any] | None = None,
           k: int | None = None, restarts: int = _RESTARTS, steps: int = _STEPS) -> _Trained:
    """The protocol: ``restarts`` seeds (seed·_RESTARTS + r, distinct across base seeds) × _LRS; keep the
    run with the lowest :func:`_training_objective` (the first on a tie; :func:`best_of_runs`)."""
    candidates = [(lr, int(seed) * _RESTARTS + r) for lr in _LRS for r in range(restarts)]
    with torch_threads(1):
        best = best_of_runs(
            candidates,
            lambda c: _train_once(rows, arch, d_sae, seed=c[1], lr=c[0], options=dict(options or {}), k=k,
                                  steps=steps),
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
            takes = architecture(arch).Options.field_names()
            if "decoder" in takes:
                options["decoder"] = decoder
            if "n_atoms" in takes:  # compound: k_c = n_a (dense C) is drawn too
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


def _kernel_controls(rng: np.random.Generator) -> list[Control]:
    """For each prior: the kernel loss of a dictionary whose forms are perturbed by 10% against the naive loss of the
    unperturbed one (the comparison must see the difference), and equal to the naive loss of the perturbed one."""
    controls = []
    N, D, d = 9, 4, 3
    Xn, _ = normalise_tokens(rng.normal(size=(N, D)))
    for prior in ("atomic", "quadratic", "compound"):
        parts = {"U": rng.normal(size=(d, D)), "V": rng.normal(size=(d, D)) if prior == "quadratic" else None,
                 "C": rng.normal(size=(d, d)) if prior == "compound" else None}
        dic = BilinearDictionary(prior, **parts)
        moved = BilinearDictionary(prior, **{k: None if v is None else v * (1 + 0.1 * rng.normal(size=v.shape))
                                             for k, v in parts.items()})
        base = naive_lifted_loss(Xn, dic.forms())
        controls.append(negative_control(
            f"kernel_loss_of_perturbed_{prior}_forms", measured=abs(kernel_lifted_loss(Xn, moved) - base) / base,
            threshold=1e-3, what="|kernel loss of forms moved by 10% − naive loss of the originals| / naive",
            reference=abs(naive_lifted_loss(Xn, moved.forms()) - base) / base, rtol=1e-8))
    return controls


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
        controls=_kernel_controls(ctx.rng("bilinear.kernel_exact:control")),
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
    # Rescaling one token's activations (not a latent's) is where the invariance breaks; η from its definition.
    B = A.copy()
    B[1:4] *= 10.0
    a1, a2 = np.abs(B).sum(axis=0), np.sqrt((B * B).sum(axis=0))
    direct = (a1 / a2 - 1.0) / (np.sqrt(N) - 1.0)
    controls = [negative_control("rescaling_three_tokens", measured=float(np.max(np.abs(hoyer_density(B).eta
                                                                                         - hoyer_density(A).eta))),
                                 threshold=1e-3, what="max_j |η_j change| when three tokens are multiplied by 10",
                                 reference=float(np.max(np.abs(direct - hoyer_density(A).eta))), rtol=1e-9)]
    return Outcome(controls=controls,
        measured={"max_abs_err": errors, "dead_latent_handled": dead_ok, "torch_dead_count": torch_dead},
        tolerance=HOYER_TOL,
        tolerance_reason="the identities are exact; float64 rounding of ‖a‖₁/‖a‖₂ over 64 tokens is ~1e-15.",
        passed=passed, details={"N": N, "scales": s.tolist()},
        finding=None if passed else f"Hoyer identities violated: {errors}, dead handled {dead_ok}, torch dead {torch_dead}",
    )


# ------------------------------------------------------------------------------------------------
# The authors' regime (issue 16 item 2; docs/bilinear.md §8, §12): the workshop's "mixed" model with
# 16·D GLU atoms u_j v_jᵀ, 2·D composites, a dense C, Hoyer on the atom activations and the asymmetric
# (authors') decoder, trained with Muon (lr 0.01, momentum 0.95, no Nesterov, no weight decay, constant
# then linear cooldown over the last half) for 1024 steps. One run per (model, seed): Muon is the
# authors' optimiser and its steps are scale-free, so no lr grid (Decision; CPU budget).

ATOMS_PER_D = 16
COMPOSITES_PER_D = 2
_MUON = MuonConfig(steps=1024, batch_size=512, lr=0.01, momentum=0.95, cooldown=0.5)
_AUTHORS = {"optimiser": "torch.optim.Muon (no Nesterov, no weight decay, no clipping)", **asdict(_MUON),
            "atoms_per_D": ATOMS_PER_D, "composites_per_D": COMPOSITES_PER_D, "hoyer_coef": _HOYER,
            "dtype": "float32"}
_REGIME_GAP = ("Still differs from the authors' (Qwen residual streams, D = 1024): "
               "batches of at most 512 tokens instead of 32 × 256; float32 instead of bf16; our Hoyer term is added to the "
               "loss (§5) where the authors' mixed model multiplies the loss terms by 1 − α·hoyer(f); orthogonal "
               "unit-row init instead of Xavier.")


def authors_mixed(D: int, *, hoyer_coef: float = _HOYER) -> tuple[str, int, dict[str, Any]]:
    """(arch, d_sae, options) of the authors' mixed model at input dimension D."""
    n_a = ATOMS_PER_D * D
    return "bilinear-compound", COMPOSITES_PER_D * D, {
        "n_atoms": n_a, "k_c": n_a, "atoms": "glu", "hoyer_on": "atoms", "decoder": "asymmetric",
        "hoyer_coef": hoyer_coef}


def decoder_rank_bound(d_sae: int, options: dict[str, Any]) -> int:
    """rank 𝒲ᵀ𝒲 ≤ d_sae, and ≤ n_atoms for compound (its composites lie in the span of the atom forms)."""
    return min(d_sae, options.get("n_atoms", d_sae))


def _train_muon(rows: np.ndarray, arch: str, d_sae: int, options: dict[str, Any], seed: int,
                cfg: MuonConfig = _MUON) -> tuple[Any, dict[str, Any]]:
    """One Muon run (the authors' regime unless ``cfg`` says otherwise) of a bilinear model; (model, record)."""
    cfg = replace(cfg, seed=int(seed))
    with torch_threads(1):
        model = build_model(arch, rows.shape[1], d_sae, options, seed=int(seed), dtype=torch.float32)
        log = train_muon(model, rows, cfg)
    return model, {"seed": int(seed), "batch_loss_every_10pct": [round(v, 4) for v in log]}


def _symmetric_gaussian_forms(rng: np.random.Generator, d: int, D: int) -> np.ndarray:
    G = rng.normal(size=(d, D, D))
    return 0.5 * (G + G.transpose(0, 2, 1))


# ------------------------------------------------------------------------------------------------
# bilinear.geometry_recovery

SPAN_FRACTION = 0.9
_GEO_TOY = {"N": 4000, "D": 10}  # circle, ellipsoid, hyperboloid in R^10 (docs/bilinear.md §6a: the ceilings)


def _largest_angle_deg(S: np.ndarray, E: np.ndarray) -> float:
    """Largest principal angle between span(S) and span(E) (orthonormal columns, same count)."""
    if E.shape[1] < S.shape[1]:
        return 90.0
    sv = np.linalg.svd(S.T @ E[:, : S.shape[1]], compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(sv.min(), -1.0, 1.0))))


def geometry_table(toy: QuadricToy, forms: FactoredForms, geo: list[LatentGeometry]) -> list[dict[str, Any]]:
    """The latent-level readout (details only): per planted component, the latent whose top-m |μ| eigenspace
    is closest to S_c, its largest principal angle and its §6 label."""
    rows = []
    for c in range(len(toy.shapes)):
        S = toy.bases[c]
        angles = [_largest_angle_deg(S, g.eigenvectors) for g in geo]
        best = int(np.argmin(angles))
        rows.append({"component": c, "shape": toy.shapes[c], "planted_label": toy.expected_label(c),
                     "best_latent": best, "best_angle_deg": angles[best], "best_label": geo[best].label})
    return rows


def _fractions(W: np.ndarray, planted: list[np.ndarray]) -> list[float]:
    return [span_fraction(W, H) for H in planted]


@check(
    "bilinear.geometry_recovery",
    "Quadric toy: every planted form that an optimal model of this size can hold lies in the learned span",
    "docs/bilinear.md §6, §6a (span fraction, lifted-PCA ceiling); issue 16 item 2",
    predicted=f"The authors' mixed model (16·D GLU atoms, 2·D = 20 composites, dense C, Hoyer α_H = {_HOYER} on the "
    f"atoms, Muon) trained on the quadric toy in R^{_GEO_TOY['D']}: for every planted form H_c whose lifted-PCA "
    f"ceiling (the fraction of H_c inside the top-20 principal forms of the token lifts, what an optimal 20-form "
    f"model holds) is ≥ {SPAN_FRACTION}, the fraction of H_c inside the span of the 20 learned forms is ≥ "
    f"{SPAN_FRACTION}. A form whose ceiling is below {SPAN_FRACTION} is reported, not decided (no model of this "
    f"size holds it).",
    quick=False,
    kind="replication",
    source=f"{BILINEAR_PAPER}: quadratic latents recover the planted ellipsoids and hyperboloids from the weights",
    regime=f"quadric toy (D = {_GEO_TOY['D']}, N = {_GEO_TOY['N']}: circle, ellipsoid, hyperboloid sheet + linear "
    f"filler), the authors' mixed model and Muon (1024 steps, one run). {_REGIME_GAP}",
)
def bilinear_geometry_recovery(ctx: CheckContext) -> Outcome:
    toy = make_quadric_toy(seed=ctx.seed, **_GEO_TOY)
    planted = [toy.planted_form(c) for c in range(len(toy.shapes))]
    arch, d, options = authors_mixed(toy.D)
    rank = decoder_rank_bound(d, options)
    principal, evals = lifted_principal_forms(toy.rows, rank)
    ceiling = _fractions(principal, planted)
    model, record = _train_muon(toy.rows, arch, d, options, ctx.seed)
    learned = _fractions(model.forms(), planted)
    decidable = [c for c, g in enumerate(ceiling) if g >= SPAN_FRACTION]
    fails = [c for c in decidable if learned[c] < SPAN_FRACTION]
    rng = ctx.rng("bilinear.geometry_recovery")
    random_frac = _fractions(_symmetric_gaussian_forms(rng, d, toy.D), planted)
    other = make_quadric_toy(seed=ctx.seed + 1000, **_GEO_TOY)  # other random subspaces: a shuffled truth
    shuffled = _fractions(model.forms(), [other.planted_form(c) for c in range(len(other.shapes))])
    given = _fractions(np.concatenate([np.stack(planted), principal[: d - len(planted)]]), planted)
    chance = d / (toy.D * (toy.D + 1) / 2)
    names = toy.shapes
    controls = [
        Control("ceiling", "precondition", f"at least one planted form has a lifted-PCA ceiling ≥ {SPAN_FRACTION}",
                "ceilings " + ", ".join(f"{n} {g:.3f}" for n, g in zip(names, ceiling)), bool(decidable)),
        Control("given the planted forms", "positive", f"a {d}-form dictionary holding the planted forms (filled up "
                f"with principal forms) scores ≥ {SPAN_FRACTION} on every form",
                ", ".join(f"{n} {f:.3f}" for n, f in zip(names, given)), min(given) >= SPAN_FRACTION),
        Control("random forms", "negative", f"{d} Gaussian symmetric forms score < {SPAN_FRACTION} on every form "
                f"(chance d/(D(D+1)/2) = {chance:.2f})", ", ".join(f"{n} {f:.3f}" for n, f in zip(names, random_frac)),
                max(random_frac) < SPAN_FRACTION),
        Control("shuffled truth", "negative", f"the learned span scores < {SPAN_FRACTION} on the planted forms of a "
                f"toy drawn with seed + 1000 (other subspaces)", ", ".join(f"{n} {f:.3f}" for n, f in zip(names, shuffled)),
                max(shuffled) < SPAN_FRACTION),
    ]
    forms = FactoredForms.from_dictionary(model.dictionary())
    geo = readout(forms)
    table = geometry_table(toy, forms, geo)
    fig = plot_latent_projections(
        ctx.figure_path("bilinear_geometry_recovery.png"), toy.rows,
        [ProjectionPanel(geo[r["best_latent"]].eigenvectors, f"{r['shape']}: latent {r['best_latent']} "
                         f"({r['best_label']}, {r['best_angle_deg']:.1f}°)") for r in table],
        labels=toy.component, label_names=dict(enumerate(toy.shapes)) | {-1: "linear only"},
        title="Normalised tokens on the top-3 |μ| eigenvectors of the latent closest to each planted subspace")
    undecided = [names[c] for c in range(len(names)) if c not in decidable]
    nmse = kernel_lifted_loss(toy.rows, model.dictionary())
    floor = float(1.0 - np.sum(evals[:rank]))
    finding = None
    if fails or undecided:
        finding = "; ".join(
            [f"{names[c]}: {learned[c]:.3f} of the planted form in the learned span against a ceiling of "
             f"{ceiling[c]:.3f}" for c in fails]
            + [f"{n}: not decidable here, its ceiling is {ceiling[names.index(n)]:.3f} (the planted form is a "
               f"low-variance direction of the lift; the learned span holds {learned[names.index(n)]:.3f})"
               for n in undecided])
    return Outcome.for_replication(
        claim_holds=bool(decidable) and not fails, controls=controls,
        measured={n: {"span_fraction": round(f, 4), "ceiling": round(g, 4)} for n, f, g in zip(names, learned, ceiling)},
        tolerance={"span_fraction_at_least": SPAN_FRACTION, "decided_when_ceiling_at_least": SPAN_FRACTION},
        tolerance_reason="0.9 of the form's Frobenius mass: the issue's span-level bar; a form that no optimal "
        "model of this size holds to 0.9 cannot be asked of a trained one.",
        finding=finding, figures=[_rel(fig, ctx)],
        details={"span_fraction": dict(zip(names, learned)), "ceiling": dict(zip(names, ceiling)),
                 "decidable": [names[c] for c in decidable], "nmse_lifted": nmse, "lifted_pca_floor_same_rank": floor,
                 "random_forms": dict(zip(names, random_frac)), "shuffled_truth": dict(zip(names, shuffled)),
                 "chance_fraction": chance, "latent_readout": table, "model": {"arch": arch, "d_sae": d, **options},
                 "training": record, "toy": toy.params, "regime": _AUTHORS},
    )


# ------------------------------------------------------------------------------------------------
# bilinear.prior_warm_start (invariant) and bilinear.prior_ordering (replication)

WARM_STEPS = 200
WARM_TOL = 1e-12
ARMIJO = 1e-4  # sufficient-decrease constant of the backtracking line search
MAX_HALVINGS = 50


def _embed(poor: BilinearDictionary, richer: str) -> BilinearDictionary:
    """The poorer prior's dictionary written in the richer one at equal width (same forms exactly):
    atomic → quadratic (V = U); atomic → compound (C = I); rank-1 compound → GLU compound (V = U);
    quadratic → GLU compound (C = I)."""
    U, V, C = poor.U, poor.V, poor.C
    if richer == "quadratic":
        return BilinearDictionary("quadratic", U, U, decoder="symmetric")
    if richer == "compound-glu":
        return BilinearDictionary("compound", U, U if V is None else V,
                                  np.eye(U.shape[0]) if C is None else C, decoder=poor.decoder)
    return BilinearDictionary("compound", U, C=np.eye(U.shape[0]))


def _descend(X: np.ndarray, dictionary: BilinearDictionary, *, sign: float = 1.0,
             steps: int = WARM_STEPS) -> tuple[list[float], BilinearDictionary, int]:
    """Full-batch gradient descent on the kernel loss (closed-form gradients, C dense, float64) with an Armijo
    backtracking line search (step 1 halved until L(θ − t g) ≤ L(θ) − ARMIJO·t‖g‖², at most MAX_HALVINGS
    times), ``steps`` steps; (the loss before each step and after the last, the final dictionary, the number
    of steps where no decrease was found although ‖g‖ > 1e-8: a wrong gradient). ``sign`` −1 steps along +∇,
    the negative control: no decrease can be found there."""
    d = dictionary
    losses = [kernel_lifted_loss(X, d)]
    no_descent = 0
    for _ in range(steps):
        g = {n: sign * v for n, v in lifted_loss_gradients(X, d).items()}
        gg = float(sum(np.sum(v * v) for v in g.values()))
        t, accepted = 1.0, None
        for _ in range(MAX_HALVINGS):
            trial = BilinearDictionary(d.prior, decoder=d.decoder, **{
                n: getattr(d, n) - t * g[n] if n in g else getattr(d, n) for n in ("U", "V", "C")})
            loss = kernel_lifted_loss(X, trial)
            if loss <= losses[-1] - ARMIJO * t * gg:
                accepted = (trial, loss)
                break
            t *= 0.5
        if accepted is None:
            no_descent += int(gg > 1e-16)
            losses.append(losses[-1])
            continue
        d = accepted[0]
        losses.append(accepted[1])
    return losses, d, no_descent


_WARM_PATHS = (("atomic", "quadratic"), ("atomic", "compound"), ("compound", "compound-glu"),
               ("quadratic", "compound-glu"))
WARM_SHAPE = {"N": 96, "D": 5, "d": 6}


def warm_start_rows(rng: np.random.Generator) -> list[dict[str, Any]]:
    """For each path poorer → richer: descend the poorer prior from random weights, embed its solution in the
    richer prior at equal width (:func:`_embed`), descend that; the losses at the embedding and after."""
    N, D, d = WARM_SHAPE["N"], WARM_SHAPE["D"], WARM_SHAPE["d"]
    X = normalise_tokens(rng.normal(size=(N, D)) * np.exp(rng.normal(size=D)))[0]  # anisotropic tokens
    out = []
    for poor, rich in _WARM_PATHS:
        U = 0.5 * rng.normal(size=(d, D))
        start = {"atomic": BilinearDictionary("atomic", U),
                 "quadratic": BilinearDictionary("quadratic", U, 0.5 * rng.normal(size=(d, D))),
                 "compound": BilinearDictionary("compound", U, C=0.5 * rng.normal(size=(d, d)))}[poor]
        p, solved, _ = _descend(X, start)
        r, _, no_descent = _descend(X, _embed(solved, rich))
        out.append({"poorer": poor, "richer": rich, "poorer_loss": p[-1], "embedding_gap": abs(r[0] - p[-1]),
                    "richer_after": r[-1], "max_step_rise": max(b - a for a, b in zip(r, r[1:])),
                    "steps_without_descent": no_descent,
                    "ascent_without_descent": _descend(X, _embed(start, rich), sign=-1.0, steps=1)[2]})
    return out


@check(
    "bilinear.prior_warm_start",
    "At equal width the richer prior warm-started from the poorer prior's solution does not raise the loss",
    "docs/bilinear.md §2 (priors), §12 (nesting); issue 16 item 2",
    predicted=f"For atomic → quadratic (V = U), atomic → compound (C = I), rank-1 compound → GLU-atom compound "
    f"(V = U) and quadratic → GLU-atom compound (C = I), at equal width: the embedded dictionary has exactly the "
    f"poorer prior's lifted loss (gap < {WARM_TOL:g}), and {WARM_STEPS} full-batch gradient steps on the richer "
    f"prior (closed-form gradients, Armijo backtracking, float64) never raise it: every step finds a decrease "
    f"wherever the gradient is nonzero (a wrong gradient would not) and the richer prior ends at or below the "
    f"poorer prior's loss.",
    kind="invariant",
    source="docs/bilinear.md §2: each richer prior contains the poorer at equal width",
    regime=f"random anisotropic unit tokens (N = {WARM_SHAPE['N']}, D = {WARM_SHAPE['D']}), width "
    f"{WARM_SHAPE['d']}, α_H = 0, no training loop",
)
def bilinear_prior_warm_start(ctx: CheckContext) -> Outcome:
    rows = warm_start_rows(ctx.rng("bilinear.prior_warm_start"))
    gap = max(r["embedding_gap"] for r in rows)
    rise = max(r["max_step_rise"] for r in rows)
    stuck = sum(r["steps_without_descent"] for r in rows)
    passed = gap < WARM_TOL and rise < WARM_TOL and stuck == 0
    controls = [negative_control("steps_along_the_ascent_direction", measured=float(sum(r["ascent_without_descent"]
                                                                                        for r in rows)),
                                 threshold=len(rows) - 0.5,
                                 what="steps (one per path, from the random start embedded in the richer prior) "
                                 "that find no decrease along +∇ instead of −∇")]
    return Outcome(controls=controls,
        measured={"max_embedding_gap": gap, "max_step_rise": rise, "steps_without_descent": stuck,
                  "loss": {f"{r['poorer']}→{r['richer']}": [round(r["poorer_loss"], 6), round(r["richer_after"], 6)]
                           for r in rows}},
        tolerance=WARM_TOL, tolerance_reason="the embedding is exact (same forms); along a correct gradient a "
        "sufficient decrease exists for a small enough step, so 'no descent found' means a wrong gradient.",
        passed=passed, details={"paths": rows, "steps": WARM_STEPS, "armijo": ARMIJO, "max_halvings": MAX_HALVINGS},
        finding=None if passed else f"embedding gap {gap:.3g}, largest step rise {rise:.3g}, {stuck} steps without "
        "descent",
    )


#: D ≫ k with heavy superposition: each token is a quadric point (≤ 3 of 24 directions) plus 2 of 64 linear
#: features packed into the 16-dim complement (4× superposition); 8 tokens in 10 carry a quadric.
_ORDER_TOY = {"N": 4000, "D": 24, "n_linear": 64, "k_linear": 2}
ORDER_TRAINING_GAIN = 0.05


def _order_models(D: int) -> dict[str, tuple[str, int, dict[str, Any]]]:
    """Equal width 2·D for every prior: the authors' mixed model (compound), GLU (quadratic, the authors'
    asymmetric decoder) and atomic, each with Hoyer α_H = _HOYER."""
    d = COMPOSITES_PER_D * D
    return {"compound": authors_mixed(D), "quadratic": ("bilinear-quadratic", d, {"decoder": "asymmetric",
                                                                                   "hoyer_coef": _HOYER}),
            "atomic": ("bilinear-atomic", d, {"hoyer_coef": _HOYER})}


def matched_topk_k(eta: float, d_sae: int) -> int:
    """k of a TopK SAE of width d_sae at the per-latent Hoyer density η of a bilinear model: a latent active on a
    fraction p of the tokens with equal magnitudes has η = (√(pN) − 1)/(√N − 1) ≈ √p, so k = round(η²·d_sae)
    clipped to [1, d_sae] (docs/bilinear.md §12)."""
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"a Hoyer density lies in [0, 1], got {eta}")
    return int(min(d_sae, max(1, round(eta * eta * d_sae))))


def lifted_nmse_of_reconstruction(rows: np.ndarray, x_hat: np.ndarray) -> float:
    """mean ‖xxᵀ − x̂x̂ᵀ‖²_F = mean[1 − 2(x·x̂)² + ‖x̂‖⁴] for unit x.

    Sign-free: x̂ and −x̂ have the same lift, so no sign rule is needed (§8)."""
    return float(np.mean(1.0 - 2.0 * np.sum(rows * x_hat, axis=1) ** 2 + np.sum(x_hat * x_hat, axis=1) ** 2))


def _topk_lifted_nmse(rows: np.ndarray, d_sae: int, k: int, seed: int, eval_rows: np.ndarray | None = None,
                      steps: int = _STEPS) -> tuple[float, dict[str, Any]]:
    """Train a linear TopK SAE on the unit tokens (the Adam protocol, one restart per lr, ``steps`` steps); (its
    lifted NMSE on ``eval_rows`` (default the training rows), training record)."""
    t = _train(rows, "topk", d_sae, seed=seed, k=k, restarts=1, steps=steps)
    ev = rows if eval_rows is None else eval_rows
    with torch.no_grad():
        x_hat = t.model(torch.from_numpy(ev).to(torch.float32)).x_hat.double().numpy()
    return lifted_nmse_of_reconstruction(ev, x_hat), t.record()


def lifted_pca_floor(rows: np.ndarray, d: int) -> float:
    """The lowest lifted NMSE any d forms can reach on ``rows``: 1 − (top-d eigenvalues of the lifts' second
    moment), docs/bilinear.md §6a."""
    return float(1.0 - np.sum(lifted_spectrum(rows)[:d]))


def _chunk_hoyer(Z: np.ndarray, chunk: int) -> float:
    """Mean over chunks of ``chunk`` tokens of η̄ (the training N, §5: compare densities at equal N)."""
    return float(np.mean([hoyer_density(Z[i:i + chunk]).mean for i in range(0, Z.shape[0] - chunk + 1, chunk)]))


HOYER_SAMPLE = 4096  # tokens on which a model's latent Hoyer density is measured (chunks of the batch size)


def _ordering_table(train_rows: np.ndarray, eval_rows: np.ndarray, models: dict[str, tuple[str, int, dict[str, Any]]],
                    cfg: MuonConfig, seed: int, topk_steps: int) -> dict[str, dict[str, Any]]:
    """Train every prior (Muon) and the TopK SAE at matched density (k from the compound model's η̄) and at the
    sparsest prior's density (a diagnostic; the same run when k coincides); lifted NMSE on ``eval_rows``, init
    NMSE, floor at the rank bound."""
    table: dict[str, dict[str, Any]] = {}
    D = train_rows.shape[1]
    for name, (arch, d, options) in models.items():
        init = build_model(arch, D, d, options, seed=seed, dtype=torch.float64).dictionary()
        model, record = _train_muon(train_rows, arch, d, options, seed, cfg)
        dic = model.dictionary()
        rank = decoder_rank_bound(d, options)
        table[name] = {"arch": arch, "d_sae": d, **options, "nmse_lifted": kernel_lifted_loss(eval_rows, dic),
                       "nmse_lifted_init": kernel_lifted_loss(eval_rows, init), "decoder_rank_bound": rank,
                       "lifted_pca_floor": lifted_pca_floor(eval_rows, rank),
                       "hoyer_density_latents": _chunk_hoyer(dic.latents(train_rows[:HOYER_SAMPLE]), cfg.batch_size),
                       "training": record}
    d = models["compound"][1]
    etas = {name: table[name]["hoyer_density_latents"] for name in models}
    for key, eta in (("topk", etas["compound"]), ("topk_sparsest_density", min(etas.values()))):
        k = matched_topk_k(eta, d)
        if key != "topk" and k == table["topk"]["k"]:
            table[key] = {**table["topk"], "matched_hoyer_density": eta}
            continue
        nmse, record = _topk_lifted_nmse(train_rows, d, k, seed, eval_rows, topk_steps)
        table[key] = {"arch": "topk", "d_sae": d, "k": k, "matched_hoyer_density": eta, "nmse_lifted": nmse,
                      "training": record, "steps": topk_steps}
    return table


def _ordering_outcome(table: dict[str, dict[str, Any]], **details: Any) -> Outcome:
    """The verdict of an ordering table (:func:`_ordering_table`): the claim, feasibility, controls."""
    n = {key: v["nmse_lifted"] for key, v in table.items()}
    order = {"compound < atomic": n["compound"] < n["atomic"], "quadratic < atomic": n["quadratic"] < n["atomic"],
             "atomic < topk": n["atomic"] < n["topk"]}
    bilinear = [key for key, v in table.items() if v["arch"] != "topk"]
    floor = min(table[key]["lifted_pca_floor"] for key in bilinear)
    d, k = table["topk"]["d_sae"], table["topk"]["k"]
    gains = {key: table[key]["nmse_lifted_init"] - n[key] for key in bilinear}
    inits = {key: table[key]["nmse_lifted_init"] for key in bilinear}
    controls = [
        Control("feasible", "precondition", f"the lifted-PCA floor at width {d} (the best any {d} forms reach) is "
                "below the matched TopK SAE's NMSE", f"floor {floor:.4f}, TopK (k = {k}) {n['topk']:.4f}",
                floor < n["topk"]),
        Control("training moves every prior", "positive", f"each bilinear model's NMSE falls by ≥ "
                f"{ORDER_TRAINING_GAIN} from its init", ", ".join(f"{key} {v:.3f}" for key, v in gains.items()),
                min(gains.values()) >= ORDER_TRAINING_GAIN),
        Control("untrained models", "negative", "no untrained bilinear model beats the trained TopK SAE (the metric "
                "does not hand the bilinear models the order)", ", ".join(f"{key} {v:.3f}" for key, v in inits.items())
                + f" vs TopK {n['topk']:.3f}", min(inits.values()) > n["topk"]),
    ]
    claim = all(order.values())
    sparse = table["topk_sparsest_density"]
    return Outcome.for_replication(
        claim_holds=claim, controls=controls,
        measured={"nmse_lifted": {key: round(v, 4) for key, v in n.items()}, "order_holds": order, "topk_k": k,
                  "lifted_pca_floor": round(floor, 4)},
        tolerance="strict order of the measured NMSEs",
        tolerance_reason="the claim is an ordering; the table (floors, init NMSEs, densities) shows how near a tie is.",
        finding=None if claim else "Ordering fails: " + ", ".join(key for key, v in order.items() if not v)
        + f" (NMSE {', '.join(f'{key} {v:.4f}' for key, v in n.items())}; lifted-PCA floor at width {d}: {floor:.4f}; "
        f"TopK k = {k} from the mixed model's latent Hoyer density {table['topk']['matched_hoyer_density']:.3f}; at "
        f"the sparsest prior's density {sparse['matched_hoyer_density']:.3f} the TopK SAE (k = {sparse['k']}) "
        f"reaches {sparse['nmse_lifted']:.4f}).",
        details={"table": table, "topk_protocol": _PROTOCOL,
                 "topk_lift": "x̂x̂ᵀ of the SAE reconstruction of the unit token (sign-free)", **details},
    )


@check(
    "bilinear.prior_ordering",
    "D ≫ k with superposition, equal width: lifted NMSE compound, quadratic < atomic < TopK SAE at matched density",
    "docs/bilinear.md §2, §8 (nmse_lifted, seed-summary claim), §12 (feasibility, matched density)",
    predicted=f"On the quadric toy with D = {_ORDER_TOY['D']}, {_ORDER_TOY['n_linear']} linear features in the "
    f"16-dim complement and {_ORDER_TOY['k_linear']} per token, at equal width 2·D = {2 * _ORDER_TOY['D']}: the "
    f"authors' mixed model (compound, 16·D GLU atoms, dense C) and the GLU (quadratic) prior reach a lower lifted "
    f"NMSE than the atomic prior, and the atomic prior lower than a linear TopK SAE of the same width at matched "
    f"density (k = round(η̄²·d) from the mixed model's Hoyer density η̄), its reconstruction lifted to x̂x̂ᵀ. "
    f"Decided only if the lifted-PCA floor at that width is below the TopK SAE's NMSE (else the toy's size decides).",
    quick=False,
    kind="replication",
    source=f"{BILINEAR_PAPER}: richer priors (compound, quadratic) reconstruct better than atomic and linear SAEs",
    regime=f"quadric toy with superposition (D = {_ORDER_TOY['D']}, N = {_ORDER_TOY['N']}), width 2·D, bilinear "
    f"models in the authors' regime (Muon, 1024 steps, one run each), TopK SAE with the Adam protocol (best of 2 "
    f"lrs). {_REGIME_GAP} The authors compare at their own sizes on LLM activations, not at equal width on a toy.",
)
def bilinear_prior_ordering(ctx: CheckContext) -> Outcome:
    toy = make_quadric_toy(seed=ctx.seed, **_ORDER_TOY)
    table = _ordering_table(toy.rows, toy.rows, _order_models(toy.D), _MUON, ctx.seed, _STEPS)
    return _ordering_outcome(table, toy=toy.params, regime=_AUTHORS)


#: SmolLM2 (real_protocol: layer 10, D = 576): the widest sizes our CPU budget allows (Decision): width 256 for
#: every prior, the mixed model with 4 GLU atoms per composite (the authors have 8), 400 Muon steps of 256 tokens.
REAL_WIDTH = 256
REAL_ATOMS_PER_COMPOSITE = 4
_REAL_MUON = replace(_MUON, steps=400, batch_size=256)
REAL_TOPK_STEPS = 1000  # Adam steps of 512 tokens, 5× the bilinear models' tokens (CPU budget, Decision; a 4000-step
#: run at k = 169 went from batch loss 0.041 at step 1600 to 0.038 at the end)


def _real_models(width: int) -> dict[str, tuple[str, int, dict[str, Any]]]:
    n_a = REAL_ATOMS_PER_COMPOSITE * width
    return {"compound": ("bilinear-compound", width, {"n_atoms": n_a, "k_c": n_a, "atoms": "glu", "hoyer_on": "atoms",
                                                      "decoder": "asymmetric", "hoyer_coef": _HOYER}),
            "quadratic": ("bilinear-quadratic", width, {"decoder": "asymmetric", "hoyer_coef": _HOYER}),
            "atomic": ("bilinear-atomic", width, {"hoyer_coef": _HOYER})}


@check(
    "bilinear.prior_ordering_real",
    "SmolLM2 activations, equal width: lifted NMSE compound, quadratic < atomic < TopK SAE at matched density",
    "docs/bilinear.md §8, §12; issue 16 item 2",
    predicted=f"On held-out SmolLM2-135M layer-10 tokens (normalised), at equal width {REAL_WIDTH}: the mixed model "
    f"(compound, {REAL_ATOMS_PER_COMPOSITE * REAL_WIDTH} GLU atoms, dense C) and the GLU prior reach a lower lifted "
    f"NMSE than the atomic prior, and the atomic prior lower than a TopK SAE of width {REAL_WIDTH} at matched "
    f"density; decided only if the lifted-PCA floor at width {REAL_WIDTH} on those tokens is below the TopK SAE's.",
    quick=False,
    kind="replication",
    source=f"{BILINEAR_PAPER}: compound and quadratic latents reach lower NMSE than atomic ones and linear baselines",
    regime=f"SmolLM2-135M layer 10 (cached, D = 576; 14336 training, 2048 held-out tokens), width {REAL_WIDTH}, "
    f"mixed model with {REAL_ATOMS_PER_COMPOSITE} atoms per composite, Muon {_REAL_MUON.steps} steps × "
    f"{_REAL_MUON.batch_size} tokens, one run each, TopK SAE {REAL_TOPK_STEPS} Adam steps × {_BATCH} per lr; the authors: Qwen 0.6B–1B, 16·D atoms, 2·D composites, 1024 "
    f"steps × 8192 tokens, bf16. {_REGIME_GAP}",
)
def bilinear_prior_ordering_real(ctx: CheckContext) -> Outcome:
    data = real_data()
    train_rows = normalise_tokens(data.X_train.astype(np.float64))[0]
    eval_rows = normalise_tokens(data.X_eval.astype(np.float64))[0]
    table = _ordering_table(train_rows, eval_rows, _real_models(REAL_WIDTH), _REAL_MUON, ctx.seed, REAL_TOPK_STEPS)
    return _ordering_outcome(table, data={"n_train": int(train_rows.shape[0]), "n_eval": int(eval_rows.shape[0]),
                                          "D": int(train_rows.shape[1]), "manifest": data.manifest},
                             regime={**_AUTHORS, **asdict(_REAL_MUON), "width": REAL_WIDTH,
                                     "atoms_per_composite": REAL_ATOMS_PER_COMPOSITE})


# ------------------------------------------------------------------------------------------------
# bilinear.subspace_stability

_STABILITY_TOY = {"N": 4000, "D": 10}


def _rotated(forms: FactoredForms, rng: np.random.Generator) -> FactoredForms:
    """The same span mixed by a random orthogonal R: forms R·B (sim = 1 exactly, atoms differ)."""
    Q, Rr = np.linalg.qr(rng.normal(size=(forms.d, forms.d)))
    Q = Q * np.sign(np.diag(Rr))
    mix = np.eye(forms.left.shape[0]) if forms.mix is None else forms.mix
    return FactoredForms(forms.left, right=forms.right, mix=Q @ mix)


def _random_like(forms: FactoredForms, rng: np.random.Generator) -> FactoredForms:
    """Gaussian factors of the same shapes, scaled to the same total Frobenius energy Σ_k‖B_k‖²."""
    shape = forms.left.shape
    rand = FactoredForms(rng.normal(size=shape), right=None if forms.right is None else rng.normal(size=shape),
                         mix=None if forms.mix is None else rng.normal(size=forms.mix.shape))
    scale = np.sqrt(np.sum(forms.frobenius_sq()) / np.sum(rand.frobenius_sq()))
    return FactoredForms(rand.left * np.sqrt(scale), right=None if rand.right is None else rand.right * np.sqrt(scale),
                         mix=rand.mix)


@check(
    "bilinear.subspace_stability",
    "Across 3 seeds: subspace similarity > 0.9 while one-to-one atom matching is lower",
    "docs/bilinear.md §7",
    predicted=f"For the authors' mixed model (compound, 16·D GLU atoms, dense C), the GLU (quadratic) and the atomic "
    f"prior (2·D = 20 latents each) trained with {STABILITY_SEEDS} seeds on the same quadric toy (D = 10), every pair "
    f"of seeds has subspace similarity > {STABILITY_SIM} and a Hungarian mean matched cosine (unit-Frobenius forms) "
    f"below that similarity.",
    quick=False,
    kind="replication",
    source=f"{BILINEAR_PAPER}: learned subspaces are stable across seeds while single atoms are not",
    regime=f"quadric toy (D = {_STABILITY_TOY['D']}), {STABILITY_SEEDS} seeds, 2·D latents per prior, the authors' "
    f"regime (Muon, 1024 steps, one run per seed). {_REGIME_GAP} The metric behind the paper's '>90%' is open (§7).",
)
def bilinear_subspace_stability(ctx: CheckContext) -> Outcome:
    toy = make_quadric_toy(seed=ctx.seed, **_STABILITY_TOY)
    seeds = [ctx.seed + i for i in range(STABILITY_SEEDS)]
    forms: dict[str, list[FactoredForms]] = {}
    training: dict[str, list[dict[str, Any]]] = {}
    models = _order_models(toy.D)
    for name, (arch, d, options) in models.items():
        runs = [_train_muon(toy.rows, arch, d, options, s) for s in seeds]
        forms[name] = [FactoredForms.from_dictionary(m.dictionary()) for m, _ in runs]
        training[name] = [r for _, r in runs]
    pairs: dict[str, list[dict[str, Any]]] = {}
    for name, fs in forms.items():
        pairs[name] = []
        for i, j in combinations(range(len(seeds)), 2):
            m = match_forms(fs[i], fs[j])
            pairs[name].append({"seeds": [seeds[i], seeds[j]], "similarity": subspace_similarity(fs[i], fs[j]),
                                "mean_matched_cosine": m.mean_cosine, "workshop_ratio": m.workshop_ratio})
    rng = ctx.rng("bilinear.subspace_stability")
    rotated, random = {}, {}
    for name, fs in forms.items():
        rot = _rotated(fs[0], rng)
        rotated[name] = {"similarity": subspace_similarity(fs[0], rot),
                         "mean_matched_cosine": match_forms(fs[0], rot).mean_cosine}
        random[name] = subspace_similarity(fs[0], _random_like(fs[0], rng))
    cross = {f"{a}~{b}": subspace_similarity(forms[a][0], forms[b][0]) for a, b in combinations(forms, 2)}
    fails = [(name, p) for name, ps in pairs.items() for p in ps
             if not (p["similarity"] > STABILITY_SIM and p["mean_matched_cosine"] < p["similarity"])]
    summary = {name: {"min_similarity": round(min(p["similarity"] for p in ps), 4),
                      "max_mean_matched_cosine": round(max(p["mean_matched_cosine"] for p in ps), 4),
                      "max_workshop_ratio": round(max(p["workshop_ratio"] for p in ps), 4)}
               for name, ps in pairs.items()}
    controls = [
        Control("rotated copy", "positive", f"seed {seeds[0]}'s forms mixed by a random orthogonal matrix: similarity "
                f"> {STABILITY_SIM} and matched cosine below it", ", ".join(
                    f"{k} {v['similarity']:.4f} / {v['mean_matched_cosine']:.3f}" for k, v in rotated.items()),
                all(v["similarity"] > STABILITY_SIM and v["mean_matched_cosine"] < v["similarity"]
                    for v in rotated.values())),
        Control("random forms", "negative", f"Gaussian factors of the same shapes and energy: similarity ≤ "
                f"{STABILITY_SIM}", ", ".join(f"{k} {v:.3f}" for k, v in random.items()),
                max(random.values()) <= STABILITY_SIM),
    ]
    return Outcome.for_replication(
        claim_holds=not fails, controls=controls,
        measured=summary, tolerance={"similarity_above": STABILITY_SIM, "matching": "below the similarity"},
        tolerance_reason="0.9 is the seed summary's '>90% similarity'; the matching claim is only 'lower'.",
        finding=None if not fails else "Not as predicted for " + "; ".join(
            f"{name} seeds {p['seeds']}: similarity {p['similarity']:.3f}, matched cosine {p['mean_matched_cosine']:.3f}"
            for name, p in fails),
        details={"pairs": pairs, "cross_prior_similarity_seed0": cross, "rotated_copy": rotated,
                 "random_forms_similarity": random,
                 "models": {k: {"arch": a, "d_sae": d, **o} for k, (a, d, o) in models.items()},
                 "toy": toy.params, "regime": _AUTHORS, "training_per_seed": training},
    )
