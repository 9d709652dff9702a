"""Checks of the theory on SAEs trained on REAL language-model activations (issue 7 item 5).

Data and training: :mod:`dictcheck.proofs_checks.real_protocol` (SmolLM2 layer 10, held-out rows,
cached extraction, models of width :data:`~dictcheck.proofs_checks.real_protocol.D_SAE`).

* ``real.antipodal_dense`` (docs/theory.md §4.5, §5.1, §8 Q2): relu SAEs at λ, λ/4 and λ/16 (pooled)
  and an abs SAE at λ.
* ``real.stationarity`` (docs/theory.md §6, §7, §8 Q3): the ``check-sae`` diagnostics of the relu SAE.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dictcheck.empirics.training import TrainResult
from dictcheck.proofs_checks.real_protocol import BATCH, D_SAE, LAYER, STEPS, RealData, real_data, train_real
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check
from dictcheck.proofs_checks.sources import THEORY_PAPER
from dictcheck.proofs_checks.sae_report import ANTIPODAL_COSINE, SaeCheckSettings, antipodal_pairs, sae_report

#: λ of objective (1) for relu/abs, in units of the data (Decision, fixed before any run): the
#: standard deviation of a random unit projection of a centred token, median_t ‖x_t − x̄‖/√D.
LAM_UNITS = 1.0
#: real.antipodal_dense also trains relu SAEs at λ/4 and λ/16: dense latents (firing > 50%) exist only
#: at weak enough sparsity, and at λ itself none appeared (first run), so the claim could not be tested
#: there. The grid is fixed (factors of 4), and the verdict pools every λ of it.
RELU_LAM_FACTORS = (1.0, 0.25, 0.0625)
DENSE = 0.5
STATIONARITY_TOKENS = 128
GAP_TOL = -1e-9


def real_lam(data: RealData) -> float:
    """λ = LAM_UNITS · median_t ‖x_t − x̄‖/√D on the training rows (see :data:`LAM_UNITS`)."""
    X = data.X_train.astype(np.float64)
    return float(LAM_UNITS * np.median(np.linalg.norm(X - X.mean(axis=0), axis=1)) / np.sqrt(X.shape[1]))


def _encode(result: TrainResult, X: np.ndarray) -> np.ndarray:
    model = result.model
    with torch.no_grad():
        return model.encode(torch.from_numpy(X).to(next(model.parameters()).dtype)).double().numpy()


def _antipode_table(result: TrainResult, X: np.ndarray) -> dict[str, Any]:
    Z = _encode(result, X)
    firing = np.mean(Z != 0, axis=0)
    pairs = antipodal_pairs(result.weights["W_dec"].double().numpy())
    has = np.zeros(Z.shape[1], dtype=bool)
    for i, j in pairs:
        has[i] = has[j] = True
    dense, alive = firing > DENSE, firing > 0
    other = alive & ~dense
    rate = lambda m: float(has[m].mean()) if m.any() else None  # noqa: E731
    return {"n_pairs": len(pairs), "pairs": pairs[:50], "n_dense": int(dense.sum()), "n_other_alive": int(other.sum()),
            "n_dense_with_antipode": int((has & dense).sum()), "n_other_with_antipode": int((has & other).sum()),
            "antipode_rate_dense": rate(dense), "antipode_rate_other": rate(other),
            "dense_firing": [round(float(f), 4) for f in firing[dense]], "l0": float(np.mean(np.sum(Z != 0, axis=1))),
            "dead": int((~alive).sum())}


@check(
    "real.antipodal_dense",
    "Real activations: dense latents of a relu SAE have decoder antipodes; an abs SAE has no antipodal pairs",
    "docs/theory.md §4.5, §5.1, §8 Q2; issue 7",
    predicted=f"SmolLM2 layer {LAYER}, d_sae = {D_SAE}, λ = {LAM_UNITS}·median‖x − x̄‖/√D: in relu SAEs at λ·"
    f"{list(RELU_LAM_FACTORS)} (pooled), latents firing on > {DENSE:.0%} of held-out tokens have a decoder antipode "
    f"(cos < {ANTIPODAL_COSINE}) more often than the other alive latents; the abs SAE at λ (signed codes) has no "
    "antipodal pair.",
    quick=False,
    kind="replication",
    source=f"{THEORY_PAPER}: dense latents of trained SAEs come in antipodal pairs (the paper ties them to the "
    "50% rule)",
    regime="SmolLM2-135M layer-5 activations (cached), relu and abs SAEs, our CPU training budget",
)
def real_antipodal_dense(ctx: CheckContext) -> Outcome:
    data = real_data()
    lam = real_lam(data)
    tables = {f"relu λ·{f:g}": _antipode_table(train_real(ctx.out_dir, ctx.seed, "relu", "relu", {"lam": lam * f}),
                                              data.X_eval) for f in RELU_LAM_FACTORS}
    relu = {key: sum(t[key] for t in tables.values())
            for key in ("n_pairs", "n_dense", "n_dense_with_antipode", "n_other_alive", "n_other_with_antipode")}
    relu["antipode_rate_dense"] = relu["n_dense_with_antipode"] / relu["n_dense"] if relu["n_dense"] else None
    relu["antipode_rate_other"] = (relu["n_other_with_antipode"] / relu["n_other_alive"]
                                   if relu["n_other_alive"] else None)
    tables["abs"] = ab = _antipode_table(train_real(ctx.out_dir, ctx.seed, "abs", "abs", {"lam": lam}), data.X_eval)
    dense_rate, other_rate = relu["antipode_rate_dense"], relu["antipode_rate_other"]
    relu_ok = dense_rate is not None and other_rate is not None and dense_rate > other_rate
    passed = relu_ok and ab["n_pairs"] == 0
    finding = None
    if not passed:
        parts = []
        if relu["n_dense"] == 0:
            parts.append(f"no relu SAE (λ·{list(RELU_LAM_FACTORS)}) has a latent firing on > {DENSE:.0%} of tokens, "
                         "so the dense-latent claim could not be tested")
        elif not relu_ok:
            parts.append(f"relu (pooled over λ): {relu['n_dense_with_antipode']}/{relu['n_dense']} dense latents have "
                         f"an antipode vs {relu['n_other_with_antipode']}/{relu['n_other_alive']} other alive latents "
                         "(not higher)")
        if ab["n_pairs"]:
            parts.append(f"abs: {ab['n_pairs']} antipodal pairs (predicted 0)")
        finding = "; ".join(parts) + "."
    return Outcome(
        measured={"relu": {k: relu[k] for k in ("n_pairs", "n_dense", "n_dense_with_antipode", "n_other_alive",
                                               "n_other_with_antipode", "antipode_rate_dense", "antipode_rate_other")},
                  "relu_per_lam": {name: {k: t[k] for k in ("n_dense", "n_dense_with_antipode", "n_other_alive",
                                                            "n_other_with_antipode", "l0")}
                                   for name, t in tables.items() if name != "abs"},
                  "abs_pairs": ab["n_pairs"]},
        tolerance={"rate_dense_minus_other": "> 0", "abs_pairs": 0},
        tolerance_reason="Counts, no tolerance: the issue's prediction is an ordering of two rates and a zero count.",
        passed=passed, finding=finding,
        details={"tables": tables, "lam": lam, "relu_lam_factors": list(RELU_LAM_FACTORS), "data": data.describe(),
                 "training": {"d_sae": D_SAE, "steps": STEPS, "batch_size": BATCH, "lr": "arch default"}},
    )


@check(
    "real.stationarity",
    "Real activations: check-sae diagnostics of a relu SAE (amortisation gap, atoms failing each condition)",
    "docs/theory.md §6, §7, §8 Q3; issue 7",
    predicted=f"relu SAE of real.antipodal_dense at its own λ, exact codes on {STATIONARITY_TOKENS} held-out tokens: "
    f"amortisation gap O(W, Z_encoder, b) − O(W, Z_exact, b) ≥ {GAP_TOL:g}; the share of atoms failing S1, the hull "
    "identity (5) and the bias identity (4) is reported (descriptive: §8 Q3 is open).",
    quick=False,
    kind="descriptive",
    source=f"{THEORY_PAPER}: local conditions every optimum satisfies, measured on a trained SAE; docs/theory.md "
    "§6, §8 Q3",
    regime="the relu SAE of real.antipodal_dense on held-out SmolLM2 tokens",
)
def real_stationarity(ctx: CheckContext) -> Outcome:
    data = real_data()
    lam = real_lam(data)
    result = train_real(ctx.out_dir, ctx.seed, "relu", "relu", {"lam": lam})
    X = data.X_eval[:STATIONARITY_TOKENS].astype(np.float64)
    report = sae_report(str(result.out_dir), X, SaeCheckSettings(lam=lam))
    tol = report["tolerances"]
    live = [a for a in report["atoms"] if not a["dead"]]

    def share(key: str, bound: float) -> float | None:
        vals = [a[key] for a in live if a[key] is not None]
        return float(np.mean([v > bound for v in vals])) if vals else None

    bias_fail = [abs(a["bias_off_mean"] - a["bias_target"]) > tol["bias"] for a in live
                 if a["bias_off_mean"] is not None and a["bias_target"] is not None]
    shares = {"S1_stationarity": share("stationarity", tol["stationarity"]), "hull_(5)": share("hull", tol["hull"]),
              "bias_identity_(4)": float(np.mean(bias_fail)) if bias_fail else None}
    medians = {key: float(np.median(vals)) if (vals := [a[key] for a in live if a[key] is not None]) else None
               for key in ("stationarity", "hull")}
    gap = report["amortisation_gap"]
    passed = gap is not None and gap >= GAP_TOL
    measured = {"amortisation_gap": gap, "relative_gap": gap / (report["objective"] + gap) if gap is not None else None,
                "n_live_atoms": len(live), "n_dead_atoms": len(report["dead_atoms"]), "failing_share": shares,
                "median_atom_violation": medians,
                "stationary": report["stationary"], "failed_conditions": report["failed_conditions"]}
    return Outcome(
        measured=measured, tolerance=GAP_TOL,
        tolerance_reason="Exact codes minimise (1) for fixed (W, b), so the gap is ≥ 0 up to the lasso solver's "
        "tolerance; the failing shares use check-sae's own per-condition tolerances (listed in details).",
        passed=passed,
        finding=None if passed else f"amortisation gap {gap} below {GAP_TOL:g} (the exact codes were worse).",
        details={"tolerances": tol, "max_violations": {k: report[k] for k in (
                     "kkt_violation", "stationarity_violation", "hull_violation", "bias_identity_violation")},
                 "objective_exact": report["objective"], "best_new_atom_gain": report["best_new_atom_gain"],
                 "wide_gap": report["wide_gap"], "metrics": report["metrics"], "lam": lam,
                 "atoms_firing_over_half": report["atoms_firing_over_half"], "data": data.describe()},
    )
