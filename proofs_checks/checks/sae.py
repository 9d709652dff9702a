"""Checks of the theory against TRAINED sparse autoencoders (docs/theory.md §4, §5, §7, §8 Q2–Q3).

Every check trains small SAEs of :mod:`empirics.architectures.linear_sae` with the project's training loop
(:func:`empirics.training.loop.train`) on a toy of :mod:`empirics.data.toys` and compares what the SAE
learned with the theory's prediction. Hyper-parameters are chosen once (stated in ``_TRAIN``
and in each check's details), never tuned until a prediction holds: where a prediction fails,
``passed`` is False and ``finding`` says what was observed.

Layouts: toys are (D, N) with points as columns (theory layout); the training loop takes tokens as
rows, so it gets ``X.T``. The theory's dictionary is W = W_decᵀ (unit columns), b = b_dec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictcheck.empirics.metrics.reconstruction import amortisation_gap, unit_atom_objective
from dictcheck.empirics.architectures import architecture, build_model
from dictcheck.empirics.data.toys import make_toy
from dictcheck.empirics.training.loop import TrainConfig, torch_threads, train
from dictcheck.proofs_checks.figures import plot_antipodal_against_p
from dictcheck.proofs_checks.registry import CheckContext, Control, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import THEORY_PAPER
from dictcheck.solvers.l0_scalar import l0_optimum
from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.solvers.polish import exact_code_objective, polish_dictionary
from dictcheck.solvers.reference_learner import fit_reference
from dictcheck.solvers.wide_limit import solve_wide_limit
from dictcheck.theory.dense_scalar import l0_uniform_threshold
from dictcheck.theory.diagnostics import most_antipodal_pair, nested_pairs
from dictcheck.theory.objective import sae_objective

#: Fixed training settings (chosen once, not tuned): Adam with the loop's warm-up/decay schedule,
#: float64 (tiny toys; removes float32 noise from objective comparisons), batches as large as the toy.
_LR = 2e-2
_JUMPRELU = {"jumprelu_bandwidth": 0.05, "init_threshold": 0.05}  # data are O(1): ε = 1e-3 would never move θ
ANTIPODAL_P = (0.2, 0.3, 0.4, 0.6, 0.7, 0.8)
#: jumprelu: both sides of the L0 threshold p* = 0.826 of docs/theory.md §5.5 (c = 0.1, U[1, 3]).
JUMPRELU_P = (0.2, 0.4, 0.6, 0.7, 0.9, 0.95)
ANTIPODAL_U = (0.6, 0.8)
ANTIPODAL_AMPS = (1.0, 3.0)  # the toy's U[1, 3] active values
ANTIPODAL_N = 2000
ANTIPODAL_LAM = 0.1
ANTIPODAL_D_SAE = 4
ANTIPODAL_STEPS = 1000
PAIR_COS = -0.9
PAIR_JACCARD = 0.1  # an S6 pair has disjoint supports; a duplicated line has Jaccard ≈ 1
FLIP_SHARE = 0.9
OBJECTIVE_MARGIN = 0.05
LIVE_FRACTION = 0.01  # a latent is live when it fires on at least 1% of the points
ABSORPTION_WIDTHS = (2, 3, 4, 6)
ABSORPTION_STEPS = 2000
ABSORPTION_TILT = 0.1
ABSORPTION_MARGIN = 0.05
#: The checks' training options per architecture beyond λ (which every architecture taking ``lam`` gets).
TRAINING_OPTIONS: dict[str, dict[str, Any]] = {"jumprelu": _JUMPRELU}
#: sae.amortisation_gap's runs: architecture -> its options beyond λ (the regime of its prediction).
GAP_RUNS: dict[str, dict[str, Any]] = {"relu": {}, "topk": {"k": 2}, "batchtopk": {"k": 2}, "jumprelu": _JUMPRELU,
                                       "abs": {}}
GAP_TOL = -1e-9
WIDE_REL_TOL = 0.02
WIDE_COS = 0.99
WIDE_BIAS_TOL = 0.05
WIDE_N = 12
WIDE_LAM = 0.3
WIDE_GENERAL_D = 16
WIDE_D_SAE = 24
WIDE_STEPS = 3000
WIDE_GAP_MIN = 0.005  # the predicted encoder gap on interior-point data must exceed this (relative)
WIDE_POLISH_ITERS = 2000


@dataclass
class _Trained:
    model: Any
    W: np.ndarray  # (D, d_sae) unit columns
    b: np.ndarray  # (D,)
    Z: np.ndarray  # (d_sae, N) encoder codes (signed for 'abs')
    final_loss: float


def _train(X: np.ndarray, arch: str, d_sae: int, *, seed: int, steps: int, lam: float | None = None,
           options: dict[str, Any] | None = None, batch_size: int | None = None, b_dec_init: str = "geometric_median",
           freeze_b_dec: bool = False) -> _Trained:
    """Train one SAE on X (D, N) with the project's loop (nothing written) and encode X: λ for an architecture
    that takes one, then ``options`` (default: its :data:`TRAINING_OPTIONS`)."""
    takes_lam = "lam" in architecture(arch).Options.field_names()
    options = {**({"lam": lam} if takes_lam else {}), **(TRAINING_OPTIONS.get(arch, {}) if options is None else options),
               "freeze_b_dec": freeze_b_dec}
    model = build_model(arch, X.shape[0], d_sae, options, seed=int(seed), dtype=torch.float64)
    cfg = TrainConfig(steps=steps, batch_size=batch_size or X.shape[1], lr=_LR, seed=int(seed), device="cpu",
                      checkpoint_every=0, log_every=max(steps, 1), b_dec_init=b_dec_init, keep_checkpoints=1)
    rows = np.ascontiguousarray(X.T)
    with torch_threads(1):
        result = train(model, rows, cfg, progress=False)
    with torch.no_grad():
        Z = model.encode(torch.from_numpy(rows)).numpy().T.copy()
    W = result.weights["W_dec"].numpy().T.astype(np.float64)
    return _Trained(model=model, W=W, b=result.weights["b_dec"].numpy().astype(np.float64), Z=Z,
                    final_loss=float(result.final_loss))


def _live(Z: np.ndarray, min_fraction: float = 0.0) -> np.ndarray:
    frac = np.mean(Z != 0, axis=1)
    return frac > min_fraction


def support_jaccard(fires_a: np.ndarray, fires_b: np.ndarray) -> float | None:
    """Jaccard overlap |A ∩ B| / |A ∪ B| of two latents' firing sets (boolean masks over the same points),
    None when neither fires: 0 for an S6 pair (each member serves one side of b), 1 for a duplicated line
    (signed codes: the same points, opposite signs)."""
    union = np.sum(fires_a | fires_b)
    return float(np.sum(fires_a & fires_b) / union) if union else None


def _rel(path: Path, ctx: CheckContext) -> str:
    return str(path.relative_to(ctx.out_dir))


# --------------------------------------------------------------------------------------------------
# sae.antipodal_threshold (relu, abs: the L1 50% rule, §5.1) and sae.antipodal_threshold_jumprelu (§5.5)


def pair_summary(W: np.ndarray, Z: np.ndarray) -> dict[str, Any]:
    """Live latents (firing on ≥ LIVE_FRACTION of the points), their most negative decoder cosine, and the
    S6 pairs: two live latents with cosine < PAIR_COS AND disjoint supports (Jaccard ≤ PAIR_JACCARD). A cosine
    alone does not make a pair: signed codes on a duplicated line give cosine −1 with Jaccard ≈ 1 (§4.5)."""
    live = _live(Z, LIVE_FRACTION)
    idx = np.flatnonzero(live)
    candidates = []
    for a, d in enumerate(idx):
        for j in idx[a + 1:]:
            cos = float(W[:, d] @ W[:, j] / (np.linalg.norm(W[:, d]) * np.linalg.norm(W[:, j])))
            if cos < PAIR_COS:
                candidates.append({"latents": [int(d), int(j)], "cosine": cos,
                                   "jaccard": support_jaccard(Z[d] != 0, Z[j] != 0)})
    most = most_antipodal_pair(W / np.maximum(np.linalg.norm(W, axis=0), 1e-300), live)
    firing = np.mean(Z != 0, axis=1)
    return {"n_live": int(live.sum()), "min_live_pair_cosine": None if most is None else most[2],
            "antiparallel": candidates,
            "pair": any(c["jaccard"] is not None and c["jaccard"] <= PAIR_JACCARD for c in candidates),
            "max_live_firing": float(firing[live].max()) if live.any() else 0.0,
            "firing_fraction": [round(float(f), 4) for f in firing]}


def dense_scalar_toy(ctx: CheckContext, p: float, lam: float):
    """The dense-scalar toy of sae.antipodal_threshold in D = 2 (docs/theory.md §5.1) at activity p."""
    return make_toy("dense_scalar", seed=ctx.seed, amplitude="uniform", p=float(p), N=ANTIPODAL_N, D=2,
                    u=ANTIPODAL_U, amp_range=ANTIPODAL_AMPS, lam=lam)


def _objective(arch: str, W: np.ndarray, Z: np.ndarray, b: np.ndarray, X: np.ndarray, lam: float) -> float:
    """The objective the arch trains, at the given codes: (1) for an architecture trained on it (signed codes:
    Σ|z|, §4.5); otherwise (jumprelu) the L0 objective of §5.5, (1/N) Σ_i ‖x_i − W z_i − b‖² + λ‖z_i‖₀."""
    a = architecture(arch)
    if a.trains_objective_1:
        return (sae_objective if a.signed_codes else unit_atom_objective)(W, Z, b, X, lam)
    R = X - b[:, None] - W @ Z
    return float((np.sum(R * R) + lam * np.count_nonzero(Z)) / X.shape[1])


def _reference(arch: str, toy) -> float:
    """The toy's optimum of the arch's objective: the Huber bound (7) (objective (1): relu; abs by §4.5) or the
    exact L0 optimum of §5.5 on the toy's own amplitudes (jumprelu)."""
    if architecture(arch).trains_objective_1:
        return solve_wide_limit(toy.X, toy.lam).objective
    return l0_optimum(toy.ground_truth["s"], toy.lam).best.objective


def antipodal_table(ctx: CheckContext, p_grid: tuple[float, ...], archs: tuple[str, ...], steps: int = ANTIPODAL_STEPS,
                    ) -> list[dict]:
    """One row per (arch, p): the trained SAE's pairs (:func:`pair_summary`), b·u, the firing share of a latent
    pointing along −u on the zero points, and its objective against the toy's optimum (relative excess)."""
    rows = []
    for arch in archs:
        for p in p_grid:
            toy = dense_scalar_toy(ctx, p, ANTIPODAL_LAM)
            t = _train(toy.X, arch, ANTIPODAL_D_SAE, seed=ctx.seed, steps=steps, lam=toy.lam)
            objective, reference = _objective(arch, t.W, t.Z, t.b, toy.X, toy.lam), _reference(arch, toy)
            rows.append({"arch": arch, "p": float(p), "p_hat": toy.ground_truth["p_hat"],
                         **pair_summary(t.W, t.Z), **_flip_summary(t.W, t.Z, t.b, toy),
                         "objective": objective, "reference": reference,
                         "rel_excess": (objective - reference) / reference, "final_loss": t.final_loss})
    return rows


def _flip_summary(W: np.ndarray, Z: np.ndarray, b: np.ndarray, toy) -> dict[str, Any]:
    """b·u, and the largest share of the zero points (s = 0) on which a latent with atom cosine < PAIR_COS to u
    fires (a flipped latent −u serving the zeros, §5.5)."""
    u, zeros = toy.ground_truth["u"], toy.ground_truth["s"] == 0
    flipped = [float(np.mean(Z[d, zeros] != 0)) for d in range(W.shape[1])
               if W[:, d] @ u / np.linalg.norm(W[:, d]) < PAIR_COS and zeros.any()]
    return {"b_dot_u": float(b @ u), "flip_on_zeros": max(flipped, default=0.0)}


def _l1_optimum_summary(ctx: CheckContext, p: float) -> dict[str, Any]:
    """:func:`pair_summary` of the exact wide-limit (L1) optimum of the toy: ray atoms, exact codes (§4.2–§4.4)."""
    toy = dense_scalar_toy(ctx, p, ANTIPODAL_LAM)
    sol = solve_wide_limit(toy.X, toy.lam)
    Z = exact_codes(sol.rays.atoms, toy.X, sol.b, toy.lam).Z
    return {**pair_summary(sol.rays.atoms, Z), **_flip_summary(sol.rays.atoms, Z, sol.b, toy)}


def _l0_optimum_summary(ctx: CheckContext, p: float) -> dict[str, Any]:
    """The same measurements on the exact L0 optimum of the toy (§5.5): atoms ±u, bias b*·u, exact L0 codes
    (code |r| on the atom of r's sign when r² > c)."""
    toy = dense_scalar_toy(ctx, p, ANTIPODAL_LAM)
    u, s, c = toy.ground_truth["u"], toy.ground_truth["s"], toy.lam
    best = l0_optimum(s, c).best
    r = s - best.b
    W = np.stack([u, -u], axis=1)
    Z = np.stack([np.where(("+u" in best.atoms) & (r * r > c) & (r > 0), r, 0.0),
                  np.where(("-u" in best.atoms) & (r * r > c) & (r < 0), -r, 0.0)])
    return {"l0_atoms": best.atoms, **pair_summary(W, Z), **_flip_summary(W, Z, best.b * u, toy)}


def _duplicated_line_summary(ctx: CheckContext, p: float) -> dict[str, Any]:
    """A duplicated line (the audit's abs case): atoms u and −u sharing the signed codes of the L1 optimum's
    residual along u, half each: cosine −1, Jaccard 1. :func:`pair_summary` must not count it."""
    toy = dense_scalar_toy(ctx, p, ANTIPODAL_LAM)
    u, s = toy.ground_truth["u"], toy.ground_truth["s"]
    r = s - float(solve_wide_limit(toy.X, toy.lam).b @ u)
    code = np.where(np.abs(r) > toy.lam, r, 0.0) / 2
    return pair_summary(np.stack([u, -u], axis=1), np.stack([code, -code]))


def _precondition(rows: list[dict], what: str) -> Control:
    worst = max(rows, key=lambda r: r["rel_excess"])
    return Control(
        "trained objective near the toy's optimum", "precondition",
        f"every trained SAE's objective within {OBJECTIVE_MARGIN:.0%} of {what}",
        f"worst {worst['arch']} at p = {worst['p']}: +{100 * worst['rel_excess']:.3g}% "
        f"({worst['objective']:.5f} vs {worst['reference']:.5f}); "
        + ", ".join(f"{r['arch']} p={r['p']}: +{100 * r['rel_excess']:.3g}%" for r in rows),
        all(r["rel_excess"] <= OBJECTIVE_MARGIN for r in rows))


_PAIR_TOLERANCE_REASON = (
    "An exact antipodal pair has cosine −1 and disjoint supports (each member serves one side of b, §3 S6); −0.9 "
    "separates a pair from unrelated atoms in 2-D rank-1 data, and Jaccard ≤ 0.1 separates an S6 pair from a "
    "duplicated line (Jaccard ≈ 1, the audit's abs case). Latents firing on < 1% of the points are dead. The "
    "objective margin: 5% is below the gap between the competing optima away from the threshold (e.g. L0 at "
    "p = 0.9: +u costs 11% more than the optimum), so a row that meets it sits at the right optimum.")


def _table(rows: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    keys = ("pair", "min_live_pair_cosine", "n_live", "max_live_firing", "b_dot_u", "flip_on_zeros", "rel_excess")
    return {arch: {f"{r['p']:g}": {k: r[k] for k in keys} | {"jaccards": [c["jaccard"] for c in r["antiparallel"]]}
                   for r in rows if r["arch"] == arch} for arch in dict.fromkeys(r["arch"] for r in rows)}


@check(
    "sae.antipodal_threshold",
    "Trained relu SAEs on the dense scalar: an antipodal pair iff p > 1/2 (the L1 50% rule); never with abs",
    "docs/theory.md §5.1, §4.5, §3 S6, §8 Q2",
    predicted=f"Dense-scalar toy in D = 2 (u = {ANTIPODAL_U}, active values U[1, 3], N = {ANTIPODAL_N}, "
    f"λ = {ANTIPODAL_LAM}), d_sae = {ANTIPODAL_D_SAE}, p ∈ {list(ANTIPODAL_P)}: relu has a PAIR (two live latents, "
    f"decoder cosine < {PAIR_COS}, support Jaccard ≤ {PAIR_JACCARD}) iff p > 1/2; abs (signed codes) never has one. "
    f"Valid only where the trained objective (1) is within {OBJECTIVE_MARGIN:.0%} of the Huber bound (7).",
    quick=False,
    kind="replication",
    source=f"{THEORY_PAPER}: the 50% rule for a dense variable (one neuron below 50%, an antipodal pair above) and "
    "no antipodal latents with absolute-value activations; docs/theory.md §5.1, §4.5",
    regime=f"dense-scalar toy in D = 2, d_sae = {ANTIPODAL_D_SAE}, Adam ({ANTIPODAL_STEPS} full-batch steps, float64) "
    "of relu and abs SAEs; the paper studies wide dictionaries at their optimum, not SGD-trained SAEs",
)
def sae_antipodal_threshold(ctx: CheckContext) -> Outcome:
    rows = antipodal_table(ctx, ANTIPODAL_P, ("relu", "abs"))
    mismatches = [{"arch": r["arch"], "p": r["p"], "pair": r["pair"]} for r in rows
                  if r["pair"] != (not architecture(r["arch"]).signed_codes and r["p"] > 0.5)]
    positive, negative, duplicated = _l1_optimum_summary(ctx, 0.8), _l1_optimum_summary(ctx, 0.2), \
        _duplicated_line_summary(ctx, 0.8)
    controls = [
        Control("pair on the exact L1 optimum", "positive", "the pair measure finds a pair on the wide-limit optimum "
                "at p = 0.8 (ray atoms ±u, exact codes)",
                f"pair {positive['pair']} (cosines/Jaccard {[(round(c['cosine'], 3), c['jaccard']) for c in positive['antiparallel']]})",
                positive["pair"]),
        Control("no pair below 1/2 or on a duplicated line", "negative", "no pair on the wide-limit optimum at "
                "p = 0.2, none on a duplicated line (u, −u sharing signed codes)",
                f"p = 0.2: pair {negative['pair']} ({negative['n_live']} live); duplicated line: pair "
                f"{duplicated['pair']} (Jaccard {[c['jaccard'] for c in duplicated['antiparallel']]})",
                not negative["pair"] and not duplicated["pair"]),
        _precondition(rows, "the Huber bound (7) of the toy"),
    ]
    fig = plot_antipodal_against_p(ctx.figure_path("sae_antipodal_threshold.png"), rows, PAIR_COS)
    finding = None if not mismatches else "Pair presence differs from the prediction for " + "; ".join(
        f"{m['arch']} at p = {m['p']} (pair {'present' if m['pair'] else 'absent'})" for m in mismatches) + "."
    return Outcome.for_replication(
        claim_holds=not mismatches, controls=controls,
        measured={"table": _table(rows), "mismatches": mismatches},
        tolerance={"pair_cosine": PAIR_COS, "pair_jaccard": PAIR_JACCARD, "live_fraction": LIVE_FRACTION,
                   "objective_margin": OBJECTIVE_MARGIN},
        tolerance_reason=_PAIR_TOLERANCE_REASON, finding=finding, figures=[_rel(fig, ctx)],
        details={"rows": rows, "training": _antipodal_training()},
    )


@check(
    "sae.antipodal_threshold_jumprelu",
    "Trained JumpReLU SAEs on the dense scalar: b jumps into the active range at the L0 threshold p*, not at 1/2",
    "docs/theory.md §5.5, §5.1, §3 S6, §8 Q2",
    predicted=f"Same toy (λ = c = {ANTIPODAL_LAM}, the L0 price), jumprelu, p ∈ {list(JUMPRELU_P)}: the L0 optimum "
    f"(§5.5) switches at p* = 1/(1 + (2/3)√c) = {l0_uniform_threshold(ANTIPODAL_LAM, *ANTIPODAL_AMPS):.4f}. For "
    f"p < p*: no PAIR (cosine < {PAIR_COS}, Jaccard ≤ {PAIR_JACCARD}) and b·u < {ANTIPODAL_AMPS[0]:g}; for p > p*: "
    f"b·u in [{ANTIPODAL_AMPS[0]:g}, {ANTIPODAL_AMPS[1]:g}] and a latent along −u fires on ≥ {FLIP_SHARE:.0%} of the "
    f"zeros (a pair is optional: one flipped latent ties it). Valid only where the trained L0 objective is within "
    f"{OBJECTIVE_MARGIN:.0%} of the toy's exact L0 optimum.",
    quick=False,
    kind="replication",
    source=f"{THEORY_PAPER}: dense antipodal latents in JumpReLU SAEs; the threshold is derived for this project's "
    "L0 toy in docs/theory.md §5.5 (the paper's 50% rule is an L1 result)",
    regime=f"dense-scalar toy in D = 2, d_sae = {ANTIPODAL_D_SAE}, Adam ({ANTIPODAL_STEPS} full-batch steps, float64, "
    f"straight-through bandwidth {_JUMPRELU['jumprelu_bandwidth']}); the paper trains JumpReLU SAEs on LLM "
    "activations",
)
def sae_antipodal_threshold_jumprelu(ctx: CheckContext) -> Outcome:
    p_star = l0_uniform_threshold(ANTIPODAL_LAM, *ANTIPODAL_AMPS)
    rows = antipodal_table(ctx, JUMPRELU_P, ("jumprelu",))
    for r in rows:
        r["as_predicted"] = _l0_side_holds(r, r["p"] > p_star)
    mismatches = [{"p": r["p"], "pair": r["pair"], "b_dot_u": r["b_dot_u"], "flip_on_zeros": r["flip_on_zeros"]}
                  for r in rows if not r["as_predicted"]]
    above, below = _l0_optimum_summary(ctx, 0.95), _l0_optimum_summary(ctx, 0.7)
    controls = [
        Control("jump seen on the exact L0 optimum above p*", "positive", "on the toy's exact L0 optimum at p = 0.95 "
                "(W = [u, −u], exact L0 codes) the measurement reports b·u in the active range and a flipped latent on "
                "the zeros", f"atoms {above['l0_atoms']}, b·u = {above['b_dot_u']:.3f}, flip on "
                f"{100 * above['flip_on_zeros']:.0f}% of the zeros", _l0_side_holds(above, True)),
        Control("no jump on the exact L0 optimum between 1/2 and p*", "negative", "at p = 0.7 (where the L1 optimum "
                "already has a pair) the exact L0 optimum shows no pair and b·u < lo",
                f"atoms {below['l0_atoms']}, b·u = {below['b_dot_u']:.3f}, pair {below['pair']}",
                _l0_side_holds(below, False)),
        _precondition(rows, "the exact L0 optimum of the toy (§5.5)"),
    ]
    finding = None if not mismatches else "Differs from the L0 prediction at " + "; ".join(
        f"p = {m['p']} (pair {m['pair']}, b·u = {m['b_dot_u']:.3f}, flip on {100 * m['flip_on_zeros']:.0f}% of "
        "zeros)" for m in mismatches) + "."
    return Outcome.for_replication(
        claim_holds=not mismatches, controls=controls,
        measured={"p_star": p_star, "table": _table(rows), "mismatches": mismatches},
        tolerance={"pair_cosine": PAIR_COS, "pair_jaccard": PAIR_JACCARD, "flip_share": FLIP_SHARE,
                   "objective_margin": OBJECTIVE_MARGIN},
        tolerance_reason=_PAIR_TOLERANCE_REASON + f" At the L0 optimum above p* the flipped latent fires on every zero; "
        f"{FLIP_SHARE:.0%} allows a few stragglers.",
        finding=finding, details={"rows": rows, "training": _antipodal_training()},
    )


def _l0_side_holds(r: dict[str, Any], above: bool) -> bool:
    """The §5.5 prediction for one row: above p*, b·u in the active range and a flipped latent on the zeros;
    below, no pair and b·u below the active range."""
    lo, hi = ANTIPODAL_AMPS
    if above:
        return lo <= r["b_dot_u"] <= hi and r["flip_on_zeros"] >= FLIP_SHARE
    return not r["pair"] and r["b_dot_u"] < lo


def _antipodal_training() -> dict[str, Any]:
    return {"steps": ANTIPODAL_STEPS, "batch_size": ANTIPODAL_N, "lr": _LR, "d_sae": ANTIPODAL_D_SAE,
            "lam": ANTIPODAL_LAM, "b_dec_init": "geometric_median", "jumprelu": _JUMPRELU,
            "note": "jumprelu's λ is its L0 price c (§5.5)"}


# --------------------------------------------------------------------------------------------------
# sae.wide_limit


def _wide_toys(seed: int) -> dict[str, Any]:
    """The three data sets of sae.wide_limit (12 points each, λ = 0.3, learned bias): 'circle' (one point per
    ray at 30° steps, equal radii 1.5: every point a hull vertex), 'general' (12 Gaussian points in D = 16:
    general position, every point a vertex) and 'interior' (the old toy: radii U[1, 2], some points inside the
    hull)."""
    angles = np.linspace(0.0, 2.0 * np.pi, WIDE_N, endpoint=False)
    general = np.random.default_rng(seed).standard_normal((WIDE_GENERAL_D, WIDE_N))
    return {
        "circle": make_toy("rays", seed=seed, angles=angles, radii=[[1.5]] * WIDE_N, near_points=None, lam=WIDE_LAM,
                           learn_bias=True),
        "general": make_toy("rays", seed=seed, centre=np.zeros(WIDE_GENERAL_D), angles=None, directions=general,
                            radii=[[float(r)] for r in np.linalg.norm(general, axis=0)], near_points=None,
                            lam=WIDE_LAM, learn_bias=True),
        "interior": make_toy("rays", seed=seed, angles=angles, radii=None, n_per_ray=1, radius_range=(1.0, 2.0),
                             near_points=None, lam=WIDE_LAM, learn_bias=True),
    }


def _hull_vertices(X: np.ndarray) -> int:
    """How many points are vertices of the convex hull of X (D, N): a point is one iff it is not a convex
    combination of the others (an LP feasibility problem per point; works in any D)."""
    from scipy.optimize import linprog

    n = X.shape[1]
    count = 0
    for i in range(n):
        others = np.delete(X, i, axis=1)
        res = linprog(np.zeros(n - 1), A_eq=np.vstack([others, np.ones(n - 1)]), b_eq=np.r_[X[:, i], 1.0],
                      bounds=(0, None), method="highs")
        count += res.status != 0  # infeasible: not in the hull of the others
    return int(count)


def _wide_row(name: str, toy, seed: int) -> dict[str, Any]:
    """Train a relu SAE of width 2N on the toy; encoder, exact-code and polished objectives against the Huber
    bound (7), atom alignment with the rays and the bias distance to the Huber median."""
    X, lam = toy.X, toy.lam
    sol = solve_wide_limit(X, lam)
    t = _train(X, "relu", WIDE_D_SAE, seed=seed, steps=WIDE_STEPS, lam=lam)
    o_enc = unit_atom_objective(t.W, t.Z, t.b, X, lam)
    o_exact = exact_code_objective(t.W, t.b, X, lam)
    pol = polish_dictionary(t.W, t.b, X, lam, max_iter=WIDE_POLISH_ITERS)
    live = _live(t.Z)
    best = (t.W[:, live].T @ sol.rays.atoms).max(axis=1) if live.any() else np.zeros(0)
    bound = sol.objective
    return {"data": name, "hull_vertices": _hull_vertices(X), "n_points": X.shape[1], "huber_bound": bound,
            "objective_encoder": o_enc, "objective_exact": o_exact, "objective_polished": pol.objective_after,
            "rel_excess_encoder": (o_enc - bound) / bound, "rel_excess_exact": (o_exact - bound) / bound,
            "rel_excess_polished": (pol.objective_after - bound) / bound, "polish_sweeps": pol.iterations,
            "polish_converged": pol.converged, "n_live": int(live.sum()), "n_rays": sol.n_rays,
            "min_best_ray_cosine": float(best.min()) if best.size else None,
            "bias_distance_to_huber_median": float(np.linalg.norm(t.b - sol.b))}


def _short_dictionary_excess(toy) -> float:
    """Relative excess over the Huber bound of the wide-limit dictionary with its first ray atom removed, at the
    optimal bias and exact codes (a dictionary that cannot be optimal: one point loses its own ray)."""
    sol = solve_wide_limit(toy.X, toy.lam)
    return (exact_code_objective(sol.rays.atoms[:, 1:], sol.b, toy.X, toy.lam) - sol.objective) / sol.objective


@check(
    "sae.wide_limit",
    "A wide relu SAE reaches the Huber bound where a ReLU encoder can (all points hull vertices); with interior "
    "points the encoder cannot, and the decoder reaches it after polishing",
    "docs/theory.md §4.2–§4.4, §7",
    predicted=f"{WIDE_N} points, λ = {WIDE_LAM}, learned bias, relu SAE with d_sae = {WIDE_D_SAE}. Data whose points "
    f"are all hull vertices ('circle': equal radii at 30° steps in 2-D; 'general': Gaussian points in D = "
    f"{WIDE_GENERAL_D}): objective (1) at the ENCODER codes within {WIDE_REL_TOL:.0%} of the Huber bound H(b*), "
    f"every live atom within cosine {WIDE_COS} of a ray atom, ‖b_dec − b*‖ ≤ {WIDE_BIAS_TOL}. Data with interior "
    f"points ('interior': radii U[1, 2]): a positive encoder gap (> {WIDE_GAP_MIN:.1%}: a ReLU half-space cannot "
    f"fire on one interior point alone), and the decoder polished (solvers.polish, exact codes) within "
    f"{WIDE_REL_TOL:.0%} of the bound.",
    quick=False,
    kind="replication",
    source=f"{THEORY_PAPER}: the wide-limit optimum (Huber median, ray clustering) reached by a trained SAE; "
    "docs/theory.md §4.2–§4.4",
    regime=f"{WIDE_N} points in 2-D and in D = {WIDE_GENERAL_D}, relu SAE with d_sae = {WIDE_D_SAE}, Adam "
    f"({WIDE_STEPS} full-batch steps, float64); the paper's wide limit has exact codes, not an amortised encoder",
)
def sae_wide_limit(ctx: CheckContext) -> Outcome:
    rows = {name: _wide_row(name, toy, ctx.seed) for name, toy in _wide_toys(ctx.seed).items()}
    vertex_rows = [rows["circle"], rows["general"]]
    inner = rows["interior"]
    reached = {r["data"]: {"encoder_within": r["rel_excess_encoder"] <= WIDE_REL_TOL,
                           "atoms_align": r["min_best_ray_cosine"] is not None and r["min_best_ray_cosine"] > WIDE_COS,
                           "bias_near_median": r["bias_distance_to_huber_median"] <= WIDE_BIAS_TOL}
               for r in vertex_rows}
    polished_ok = inner["rel_excess_polished"] <= WIDE_REL_TOL
    short = _short_dictionary_excess(_wide_toys(ctx.seed)["circle"])
    claim = all(all(v.values()) for v in reached.values()) and polished_ok
    controls = [
        Control("all points are hull vertices", "precondition", f"{WIDE_N}/{WIDE_N} hull vertices on 'circle' and "
                "'general'", ", ".join(f"{r['data']}: {r['hull_vertices']}/{r['n_points']}" for r in vertex_rows),
                all(r["hull_vertices"] == r["n_points"] for r in vertex_rows)),
        Control("encoder gap where a ReLU encoder cannot isolate a point", "negative",
                f"'interior' has interior points and an encoder objective more than {WIDE_GAP_MIN:.1%} above the "
                "bound; the wide-limit dictionary of 'circle' with one ray atom removed is more than "
                f"{WIDE_GAP_MIN:.1%} above it (the measurement does not call a short dictionary optimal)",
                f"{inner['hull_vertices']}/{inner['n_points']} hull vertices; encoder +"
                f"{100 * inner['rel_excess_encoder']:.2f}%; one atom removed +{100 * short:.2f}%",
                inner["hull_vertices"] < inner["n_points"] and inner["rel_excess_encoder"] > WIDE_GAP_MIN
                and short > WIDE_GAP_MIN),
        Control("a decoder at the optimum is recognised", "positive",
                f"the trained decoders polished (exact codes, block coordinate descent) are within {WIDE_REL_TOL:.0%} "
                "of the bound on the vertex data, and bound ≤ exact-code objective ≤ encoder objective everywhere",
                "; ".join(f"{r['data']}: polished {100 * r['rel_excess_polished']:+.3g}%, {r['huber_bound']:.5f} ≤ "
                          f"{r['objective_exact']:.5f} ≤ {r['objective_encoder']:.5f}" for r in rows.values()),
                all(r["rel_excess_polished"] <= WIDE_REL_TOL for r in vertex_rows)
                and all(r["huber_bound"] <= r["objective_exact"] + 1e-9 and r["objective_exact"]
                        <= r["objective_encoder"] + 1e-9 for r in rows.values())),
    ]
    failed = [f"{name}: {k}" for name, v in reached.items() for k, ok in v.items() if not ok]
    if not polished_ok:
        failed.append(f"interior: polished decoder +{100 * inner['rel_excess_polished']:.2f}% above the bound")
    finding = None if not failed else "Misses: " + "; ".join(failed) + ". " + "; ".join(
        f"{r['data']}: encoder {100 * r['rel_excess_encoder']:+.2f}%, exact {100 * r['rel_excess_exact']:+.2f}%, "
        f"polished {100 * r['rel_excess_polished']:+.2g}%, min ray cosine {r['min_best_ray_cosine']:.4f}, "
        f"‖b − b*‖ = {r['bias_distance_to_huber_median']:.4f}" for r in rows.values()) + "."
    return Outcome.for_replication(
        claim_holds=claim, controls=controls,
        measured={name: {k: r[k] for k in ("rel_excess_encoder", "rel_excess_exact", "rel_excess_polished",
                                           "min_best_ray_cosine", "bias_distance_to_huber_median", "hull_vertices",
                                           "n_live", "n_rays", "huber_bound")} for name, r in rows.items()},
        tolerance={"rel_objective": WIDE_REL_TOL, "ray_cosine": WIDE_COS, "bias_distance": WIDE_BIAS_TOL,
                   "interior_gap_min": WIDE_GAP_MIN},
        tolerance_reason="2% is the issue's bar for an Adam-trained SAE (float64) against a closed form; 0.99 "
        "cosine = 8° allows the small tilt of atoms when b_dec ≠ b*; the Huber objective is flat near its minimum, "
        "so an O(√(2%)·λ) bias error is invisible in the objective: 0.05 (≈ λ/6). The interior gap must exceed "
        "0.5%, well above the vertex data's optimisation noise, to count as the predicted encoder gap.",
        finding=finding,
        details={"rows": rows, "training": {"d_sae": WIDE_D_SAE, "steps": WIDE_STEPS, "batch_size": WIDE_N,
                                            "lr": _LR, "b_dec_init": "geometric_median",
                                            "polish_max_sweeps": WIDE_POLISH_ITERS}},
    )


# --------------------------------------------------------------------------------------------------
# sae.absorption_vs_width


def absorption_measures(W: np.ndarray, Z: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """The two absorption measures of docs/theory.md §5.2 for a dictionary W (3, d) with codes Z (d, N) on the
    parent/child toy: the parent latent (largest cosine with e₁ among live latents) is off on child points in
    excess of its off-rate on parent-only points, and the child latents' (largest cosine with e₂, e₃) cosine with
    the parent atom (a tilt). ``absorbed``: excess > 0 or a tilt > ABSORPTION_TILT."""
    live = np.flatnonzero(_live(Z))
    if live.size == 0:
        return {"absorbed": False, "n_live": 0}
    Wn = W[:, live] / np.linalg.norm(W[:, live], axis=0)
    parent = int(live[np.argmax(Wn[0])])
    kids = [int(live[np.argmax(Wn[c])]) for c in (1, 2)]
    child = labels > 0
    off_child, off_parent = float(np.mean(Z[parent, child] <= 0)), float(np.mean(Z[parent, ~child] <= 0))
    tilts = [float(W[:, parent] @ W[:, d] / (np.linalg.norm(W[:, parent]) * np.linalg.norm(W[:, d])))
             for d in kids if d != parent]
    return {"n_live": int(live.size), "parent_latent": parent, "child_latents": kids,
            "parent_off_on_child_points": off_child, "parent_off_on_parent_only_points": off_parent,
            "parent_off_excess": off_child - off_parent, "child_parent_cosines": tilts,
            "absorbed": bool(off_child - off_parent > 0 or (tilts and max(tilts) > ABSORPTION_TILT))}


def absorption_rows(ctx: CheckContext, widths: tuple[int, ...] = ABSORPTION_WIDTHS,
                    steps: int = ABSORPTION_STEPS) -> list[dict]:
    """Per width: a relu SAE trained with b_dec frozen at 0 (the toy's b = 0), its absorption measures at encoder
    and exact codes, and the reference learner (b = 0 fixed) polished from the trained decoder."""
    toy = make_toy("parent_child", seed=ctx.seed)
    X, lam, labels = toy.X, toy.lam, toy.ground_truth["labels"]
    rows = []
    for width in widths:
        t = _train(X, "relu", width, seed=ctx.seed, steps=steps, lam=lam, b_dec_init="zero", freeze_b_dec=True)
        Zx = exact_codes(t.W, X, t.b, lam).Z
        ref = fit_reference(X, lam, W0=t.W, b0=np.zeros(3), learn_bias=False)
        rows.append({"width": width, "b_dec_norm": float(np.linalg.norm(t.b)),
                     "objective_encoder": unit_atom_objective(t.W, t.Z, t.b, X, lam),
                     "objective_exact": unit_atom_objective(t.W, Zx, t.b, X, lam),
                     "objective_reference_polished": ref.objective,
                     "encoder": absorption_measures(t.W, t.Z, labels), "exact": absorption_measures(t.W, Zx, labels),
                     "reference_polished": absorption_measures(ref.W, ref.Z, labels),
                     "reference_atom_cosines": [float(c) for c in np.sum(ref.W * t.W, axis=0)],
                     "nested_pairs_encoder": [list(pr) for pr in nested_pairs((t.Z != 0)[_live(t.Z)])]})
    return rows


@check(
    "sae.absorption_vs_width",
    "Parent/child toy with b fixed at 0: absorption in trained relu SAEs, against the reference learner",
    "docs/theory.md §5.2, §3 S4, §8 Q3",
    predicted=f"Parent/child toy (λ = 0.1, b = 0 as in §5.2), relu SAEs of widths {list(ABSORPTION_WIDTHS)} trained "
    "with b_dec FROZEN at 0: at width 3 the encoder codes absorb — the parent latent is off on a larger share of "
    f"child points than of parent-only points, or a child atom has cosine > {ABSORPTION_TILT} with the parent atom — "
    "as the reference learner polished from the trained decoder does. Other widths are measured.",
    quick=False,
    kind="replication",
    source=f"{THEORY_PAPER}: absorption in hierarchies appears in trained SAEs; docs/theory.md §5.2",
    regime=f"parent/child toy (N = 120, D = 3), relu SAEs of widths {list(ABSORPTION_WIDTHS)} with b_dec frozen at 0, "
    f"Adam ({ABSORPTION_STEPS} full-batch steps, float64); the paper's claim concerns LLM SAEs",
)
def sae_absorption_vs_width(ctx: CheckContext) -> Outcome:
    rows = absorption_rows(ctx)
    r3 = next(r for r in rows if r["width"] == 3)
    toy = make_toy("parent_child", seed=ctx.seed)
    X, lam, labels = toy.X, toy.lam, toy.ground_truth["labels"]
    W_true, Z_true = toy.ground_truth["W_true"], toy.ground_truth["Z_true"]
    gt = absorption_measures(W_true, exact_codes(W_true, X, np.zeros(3), lam).Z, labels)
    spec_opt = fit_reference(X, lam, W0=W_true, Z0=np.maximum(Z_true - lam, 0.0), b0=np.zeros(3), learn_bias=False)
    rel = (r3["objective_encoder"] - spec_opt.objective) / spec_opt.objective
    controls = [
        Control("the reference learner absorbs from the trained decoder", "positive",
                "the reference learner (b = 0) polished from the width-3 decoder absorbs by the same measures",
                _absorption_words(r3["reference_polished"]), r3["reference_polished"]["absorbed"]),
        Control("no absorption at the ground truth", "negative", "the ground-truth dictionary I₃ with its exact codes "
                "(parent on every point, no tilt) is reported as not absorbing", _absorption_words(gt),
                not gt["absorbed"]),
        Control("b = 0 and a near-optimal width-3 SAE", "precondition",
                f"b_dec stays 0, and the width-3 encoder objective is within {ABSORPTION_MARGIN:.0%} of the §5.2 "
                "stationary point (reference learner from the ground truth)",
                f"‖b_dec‖ = {r3['b_dec_norm']:.3g}; encoder {r3['objective_encoder']:.5f} vs reference "
                f"{spec_opt.objective:.5f} (+{100 * rel:.2f}%)", r3["b_dec_norm"] == 0.0 and rel <= ABSORPTION_MARGIN),
    ]
    trend = "; ".join(f"width {r['width']}: encoder {_absorption_words(r['encoder'])}, O_enc "
                      f"{r['objective_encoder']:.4f}, reference polished {r['objective_reference_polished']:.4f} "
                      f"({_absorption_words(r['reference_polished'])})" for r in rows)
    return Outcome.for_replication(
        claim_holds=r3["encoder"]["absorbed"], controls=controls,
        measured={"width_3_absorbed": r3["encoder"]["absorbed"], "spec_optimum_objective": spec_opt.objective,
                  "per_width": {str(r["width"]): {"encoder": r["encoder"], "exact": r["exact"],
                                                  "reference_polished": r["reference_polished"],
                                                  "objective_encoder": r["objective_encoder"],
                                                  "objective_reference_polished": r["objective_reference_polished"]}
                                for r in rows}},
        tolerance={"tilt_cos": ABSORPTION_TILT, "parent_off_excess": 0.0, "objective_margin": ABSORPTION_MARGIN},
        tolerance_reason="The spec's robust assertion (§5.2): at least one absorption measure non-zero; a tilt is "
        "measured against 0.1 (the reference optimum has 0.61–0.63); the parent-off measure counts only the excess "
        "over parent-only points. 5%: the §5.2 optimum (0.36 per point) sits 3% above the wide-limit bound, so a "
        "width-3 SAE within 5% of it is near a narrow optimum.",
        finding="Trend: " + trend + ".", details={"rows": rows, "training": {
            "steps": ABSORPTION_STEPS, "batch_size": 120, "lr": _LR, "lam": 0.1, "b_dec_init": "zero",
            "freeze_b_dec": True}},
    )


def _absorption_words(m: dict[str, Any]) -> str:
    if not m.get("n_live"):
        return "no live latent"
    return (f"parent off on {100 * m['parent_off_on_child_points']:.0f}% of child points vs "
            f"{100 * m['parent_off_on_parent_only_points']:.0f}% of parent-only points, child–parent cosines "
            f"{[round(c, 3) for c in m['child_parent_cosines']]}, absorbed {m['absorbed']}")


# --------------------------------------------------------------------------------------------------
# sae.amortisation_gap


def amortisation_rows(ctx: CheckContext, runs: dict[str, dict[str, Any]] = GAP_RUNS, steps: int = 1000) -> list[dict]:
    toy = make_toy("independent_features", seed=ctx.seed)
    X, lam = toy.X, toy.lam
    rows = []
    for arch, options in runs.items():
        k = options.get("k")
        t = _train(X, arch, 6, seed=ctx.seed, steps=steps, lam=lam, options=options)
        if architecture(arch).signed_codes:
            # Signed codes with |z| penalty = non-negative codes on the doubled dictionary [W, −W] (§4.5).
            W2 = np.hstack([t.W, -t.W])
            Z2 = np.vstack([np.maximum(t.Z, 0), np.maximum(-t.Z, 0)])
            gap = amortisation_gap(W2, Z2, None, t.b, X, lam)
            o_enc = sae_objective(t.W, t.Z, t.b, X, lam)  # Σ|z|: the signed objective (§4.5)
            note = "signed codes: gap on the doubled dictionary [W, −W] with codes (z₊, z₋) (identical objective)"
        else:
            gap = amortisation_gap(t.W, t.Z, None, t.b, X, lam)
            o_enc = unit_atom_objective(t.W, t.Z, t.b, X, lam)
            note = "loss = objective (1)" if architecture(arch).trains_objective_1 else "λ is descriptive for this arch (§7)"
        rows.append({"arch": arch, "k": k, "gap": float(gap), "objective_encoder": o_enc,
                     "objective_exact": o_enc - gap, "relative_gap": float(gap / o_enc) if o_enc else None,
                     "l0_encoder": float(np.mean(np.sum(t.Z != 0, axis=0))), "note": note})
    return rows


@check(
    "sae.amortisation_gap",
    "Amortisation gap of trained SAEs: exact codes never do worse than the encoder",
    "docs/theory.md §6 amortisation_gap, §7, §8 Q3",
    predicted=f"Independent-features toy (λ = 0.1), d_sae = 6, every arch (relu, topk k=2, batchtopk k=2, jumprelu, "
    f"abs via [W, −W]): O(W, Z_encoder, b) − O(W, Z_exact, b) ≥ {GAP_TOL:g} at λ = toy.lam, W = W_decᵀ, b = b_dec.",
    kind="invariant",
    source="docs/theory.md §6 (amortisation_gap): exact codes minimise (1) for a fixed decoder, so no encoder "
    "does better",
    regime="independent-features toy, every SAE architecture, a short SGD training",
)
def sae_amortisation_gap(ctx: CheckContext) -> Outcome:
    rows = amortisation_rows(ctx)
    gaps = {r["arch"]: r["gap"] for r in rows}
    passed = all(g >= GAP_TOL for g in gaps.values())
    # Codes off the exact ones (the exact codes of a trained-free dictionary times 1.1): the gap must see them.
    toy = make_toy("independent_features", seed=ctx.seed)
    W, b = toy.ground_truth["W_true"], np.zeros(toy.X.shape[0])
    Z_exact = exact_codes(W, toy.X, b, toy.lam).Z
    controls = [negative_control(
        "gap_of_codes_off_the_exact_ones", measured=amortisation_gap(W, 1.1 * Z_exact, None, b, toy.X, toy.lam),
        threshold=1e-6, what="the gap of 1.1 × the exact codes of the ground-truth atoms",
        reference=sae_objective(W, 1.1 * Z_exact, b, toy.X, toy.lam) - sae_objective(W, Z_exact, b, toy.X, toy.lam),
        rtol=1e-6)]
    finding = "Gap per arch (mean objective units): " + ", ".join(
        f"{r['arch']} {r['gap']:.4g} ({100 * (r['relative_gap'] or 0):.1f}% of O_enc)" for r in rows) + "."
    return Outcome(
        measured={"gaps": gaps, "min_gap": min(gaps.values())}, tolerance=GAP_TOL,
        tolerance_reason="Exact codes minimise (1) for fixed (W, b), so the gap is ≥ 0; the lasso solver's KKT "
        "tolerance (1e-8 relative) allows a negative value only at rounding level; −1e-9 is the issue's bar.",
        passed=passed, finding=finding, controls=controls,
        details={"rows": rows, "training": {"d_sae": 6, "steps": 1000, "batch_size": 150, "lr": _LR,
                                            "jumprelu": _JUMPRELU}},
    )
