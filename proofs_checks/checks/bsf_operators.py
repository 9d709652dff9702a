"""Checks of the block-sparse operators and the block wide limit (docs/bsf.md §1, §2, §3.2, §9).

* ``bsf.prox_exact`` — sh_θ equals the numeric prox of θ‖·‖_{2,1} (cvxpy).
* ``bsf.block_wide_limit`` — the ℓ_{2,1} problem with ‖W_g‖₂ ≤ 1 is ≥ h_λ(‖x̃‖), attained by an
  orthonormal block containing x̃ (group soft-threshold code); blocks of operator norm ≤ σ obey
  the stronger bound h_{λ/σ}, so unit-Frobenius blocks of rank ≥ 2 (σ < 1) cannot attain h_λ.
* ``bsf.grassmann_orthonormal`` — a trained Grassmannian BSF keeps W_gᵀW_g = I to 1e-6 at every step.

The numeric references (:mod:`solvers.block_lasso`) are second-order-cone programs solved by
Clarabel through cvxpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dictcheck.empirics.architectures import architecture, build_model
from dictcheck.empirics.training.loop import TrainConfig, torch_threads, train
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import BSF_PAPER, THEORY_PAPER
from dictcheck.solvers.block_lasso import numeric_l21_prox, solve_block_lasso
from dictcheck.theory.block_sparse import (
    block_soft_threshold,
    block_wide_bound,
    block_wide_objective,
    l21_norm,
    orthonormal_block_code,
)

PROX_TOL = 1e-6
WIDE_TOL = 1e-6
ORTHO_TOL = 1e-6
_SOLVER_REASON = ("The reference (Clarabel at gap/feasibility tolerances 1e-9, then 1e-10 when that ends "
                  "'optimal'; solvers.block_lasso) returned z within 1.6e-8 of sh_θ over 400 random prox instances, "
                  "and 1e-9 alone up to 1.1e-6 (blocks at zero sit at the cone's apex, where interior-point "
                  "iterates converge slowly); 1e-6 keeps that margin, while a wrong formula errs by O(θ) ≥ 0.05.")



# --------------------------------------------------------------------------------------------------
# bsf.prox_exact


def _prox_instance(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Random blocks a (n_b, q) and θ, with about half the blocks below the threshold."""
    n_b, q = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    theta = float(rng.uniform(0.05, 2.0))
    a = rng.normal(size=(n_b, q))
    a *= (theta * rng.uniform(0.1, 3.0, size=(n_b, 1))) / np.linalg.norm(a, axis=1, keepdims=True)
    return a, theta


@check(
    "bsf.prox_exact",
    "sh_θ is the proximal operator of θ‖·‖₂,₁ (against a numeric prox by cvxpy)",
    "docs/bsf.md §2, §9",
    predicted="For 40 random block vectors (n_b ≤ 5, q ≤ 4, half the blocks below θ): "
    f"max |sh_θ(a) − prox_cvxpy(a)| ≤ {PROX_TOL:.0e}, and the prox objective at sh_θ(a) is never above "
    f"the solver's by more than {PROX_TOL:.0e}.",
    kind="theorem",
    source=f"{BSF_PAPER}: the group-lasso activation sh_θ; derived in docs/bsf.md §2",
    regime="40 random block vectors against cvxpy's numeric prox; no training",
)
def prox_exact(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("bsf.prox_exact")
    diffs, value_excess, zero_blocks, wrong_threshold = [], [], 0, []
    for _ in range(40):
        a, theta = _prox_instance(rng)
        exact, numeric = block_soft_threshold(a, theta), numeric_l21_prox(a, theta)
        wrong_threshold.append(float(np.max(np.abs(block_soft_threshold(a, 0.9 * theta) - numeric))))

        def value(z: np.ndarray) -> float:
            return float(0.5 * np.sum((z - a) ** 2) + theta * l21_norm(z))

        diffs.append(float(np.max(np.abs(exact - numeric))))
        value_excess.append(value(exact) - value(numeric))
        zero_blocks += int(np.sum(np.linalg.norm(a, axis=1) <= theta))
    measured = {"max_abs_diff": max(diffs), "max_value_excess": max(value_excess), "instances": 40,
                "blocks_thresholded_to_zero": zero_blocks}
    passed = measured["max_abs_diff"] <= PROX_TOL and measured["max_value_excess"] <= PROX_TOL
    controls = [negative_control("prox_at_nine_tenths_of_theta", measured=max(wrong_threshold), threshold=1e-3,
                                 what="max |sh_0.9θ(a) − prox_cvxpy(a)| (a threshold 10% off)")]
    return Outcome(measured=measured, tolerance={"abs_diff": PROX_TOL, "value_excess": PROX_TOL},
                   tolerance_reason=_SOLVER_REASON, passed=passed, controls=controls)


# --------------------------------------------------------------------------------------------------
# bsf.block_wide_limit


def _op_norm_blocks(rng: np.random.Generator, n_b: int, D: int, q: int) -> np.ndarray:
    """Gaussian blocks rescaled to operator norms drawn from U[0.3, 1]."""
    W = rng.normal(size=(n_b, D, q))
    return W * (rng.uniform(0.3, 1.0, size=(n_b, 1, 1)) / np.linalg.norm(W, ord=2, axis=(1, 2))[:, None, None])


def _wide_instance(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    D = int(rng.integers(2, 6))
    x = rng.normal(size=D)
    return x * rng.uniform(0.2, 3.0) / np.linalg.norm(x), float(rng.uniform(0.1, 1.0))


def wide_limit_sweep(rng: np.random.Generator, n: int) -> dict[str, Any]:
    """The three families of bsf.block_wide_limit on ``n`` random instances each (see the check)."""
    gaps, sharp_gaps, attain, frob = [], [], [], []
    for _ in range(n):
        x, lam = _wide_instance(rng)
        D = x.shape[0]
        q = int(rng.integers(1, D + 1))
        W = _op_norm_blocks(rng, int(rng.integers(1, 5)), D, q)
        value = solve_block_lasso(x, W, lam)[1]
        sigma = float(np.max(np.linalg.norm(W, ord=2, axis=(1, 2))))
        gaps.append(value - block_wide_bound(x, lam))
        sharp_gaps.append(value - block_wide_bound(x, lam, op_norm=sigma))

        # An orthonormal block whose span contains x, next to random blocks.
        frame = np.linalg.qr(np.column_stack([x, rng.normal(size=(D, q - 1))]))[0]
        W_span = np.concatenate([frame[None], _op_norm_blocks(rng, int(rng.integers(0, 3)), D, q)])
        z_closed = np.zeros((W_span.shape[0], q))
        z_closed[0] = orthonormal_block_code(frame, x, lam)
        h = block_wide_bound(x, lam)
        attain.append({"closed_form": abs(block_wide_objective(x, W_span, z_closed, lam) - h),
                       "solver": abs(solve_block_lasso(x, W_span, lam)[1] - h)})

        # Unit-Frobenius blocks of rank ≥ 2 (q ≥ 2): operator norm < 1.
        q2 = max(q, 2)
        W_f = rng.normal(size=(int(rng.integers(1, 4)), D, q2))
        W_f /= np.linalg.norm(W_f, axis=(1, 2))[:, None, None]
        if np.linalg.norm(x) > lam:
            sigma_f = float(np.max(np.linalg.norm(W_f, ord=2, axis=(1, 2))))
            value_f = solve_block_lasso(x, W_f, lam)[1]
            frob.append({"gap": value_f - h, "sharp_gap": value_f - block_wide_bound(x, lam, op_norm=sigma_f),
                         "bound_gap": block_wide_bound(x, lam, op_norm=sigma_f) - h, "op_norm": sigma_f})
    return {"gaps": gaps, "sharp_gaps": sharp_gaps, "attain": attain, "frobenius": frob}


@check(
    "bsf.block_wide_limit",
    "Block wide limit: ℓ₂,₁ value ≥ h_λ(‖x̃‖), attained by an orthonormal block containing x̃",
    "docs/bsf.md §1 (block wide limit); docs/theory.md §4.1 (6)",
    predicted="Over 25 random (x̃, λ, dictionary) with ‖W_g‖₂ ≤ 1: min_z value − h_λ(‖x̃‖) ≥ −1e-6, and "
    "value − h_{λ/σ}(‖x̃‖) ≥ −1e-6 with σ = max_g ‖W_g‖₂. With an orthonormal block whose span contains x̃ "
    "the group soft-threshold code z = max(0, 1 − λ/‖Wᵀx̃‖)Wᵀx̃ attains h_λ(‖x̃‖) (|diff| ≤ 1e-12) and so "
    "does the solver (≤ 1e-6). Unit-Frobenius blocks of rank ≥ 2 have σ < 1 and a strictly positive gap "
    "(≥ h_{λ/σ} − h_λ > 0) whenever ‖x̃‖ > λ.",
    kind="theorem",
    source=f"docs/bsf.md §1 (the block analogue of the {THEORY_PAPER} wide limit, derived for this project)",
    regime="25 random instances against cvxpy; no training",
)
def block_wide_limit(ctx: CheckContext) -> Outcome:
    sweep = wide_limit_sweep(ctx.rng("bsf.block_wide_limit"), 25)
    frob = sweep["frobenius"]
    measured = {
        "min_gap": min(sweep["gaps"]),
        "min_gap_sharp_bound": min(sweep["sharp_gaps"]),
        "max_closed_form_attain_diff": max(a["closed_form"] for a in sweep["attain"]),
        "max_solver_attain_diff": max(a["solver"] for a in sweep["attain"]),
        "unit_frobenius_min_gap": min(f["gap"] for f in frob),
        "unit_frobenius_min_predicted_gap": min(f["bound_gap"] for f in frob),
        "unit_frobenius_max_op_norm": max(f["op_norm"] for f in frob),
        "unit_frobenius_min_gap_sharp_bound": min(f["sharp_gap"] for f in frob),
        "instances": len(sweep["gaps"]), "unit_frobenius_instances": len(frob),
    }
    tol = {"gap": -WIDE_TOL, "solver_attain": WIDE_TOL, "closed_form_attain": 1e-12}
    passed = (measured["min_gap"] >= -WIDE_TOL and measured["min_gap_sharp_bound"] >= -WIDE_TOL
              and measured["max_closed_form_attain_diff"] <= 1e-12 and measured["max_solver_attain_diff"] <= WIDE_TOL
              and measured["unit_frobenius_min_gap_sharp_bound"] >= -WIDE_TOL
              and measured["unit_frobenius_min_gap"] > 0 and measured["unit_frobenius_max_op_norm"] < 1)
    # A block of operator norm 2 (outside the theorem's ‖W_g‖₂ ≤ 1) beats the bound h_λ: by h_λ − h_{λ/2}.
    rng = ctx.rng("bsf.block_wide_limit:control")
    x = rng.normal(size=3)
    x *= 2.0 / np.linalg.norm(x)
    frame = np.linalg.qr(np.column_stack([x, rng.normal(size=(3, 1))]))[0]
    below = block_wide_bound(x, 0.5) - solve_block_lasso(x, 2.0 * frame[None], 0.5)[1]
    controls = [negative_control("bound_broken_by_a_block_of_norm_2", measured=below, threshold=1e-3,
                                 what="h_λ(‖x̃‖) − min value with one block of operator norm 2 containing x̃",
                                 reference=block_wide_bound(x, 0.5) - block_wide_bound(x, 0.5, op_norm=2.0), rtol=1e-4)]
    return Outcome(
        measured=measured, tolerance=tol, passed=passed, controls=controls,
        tolerance_reason=_SOLVER_REASON + " The closed form is evaluated in float64 (rounding ~1e-15).",
        details={"unit_frobenius": frob},
    )


# --------------------------------------------------------------------------------------------------
# bsf.grassmann_orthonormal

#: The benchmark's model size (docs/bsf.md §5: D = 128, n_b = 2·24, q = 4, k = 3) in the loop's default float32;
#: lr 1e-2 (25× the default 4e-4) so that the raw B_g drift far off the Stiefel manifold and stress the QR.
_GRASSMANN = {"D": 128, "n_circles": 24, "k_true": 3, "n_b": 48, "q": 4, "k": 3, "N": 4096, "steps": 400,
              "batch_size": 256, "lr": 1e-2, "dtype": "float32", "noise": 0.01}


def _sum_of_circles(rng: np.random.Generator, D: int, n_circles: int, k_true: int, N: int, noise: float) -> np.ndarray:
    """N rows, each the sum of k_true unit circles (uniform angle) in mutually orthogonal random planes."""
    frames = np.linalg.qr(rng.normal(size=(D, 2 * n_circles)))[0].reshape(D, n_circles, 2)
    active = np.argsort(rng.random((N, n_circles)), axis=1)[:, :k_true]
    angles = rng.uniform(0.0, 2.0 * np.pi, size=(N, k_true))
    phi = np.stack([np.cos(angles), np.sin(angles)], axis=-1)  # (N, k_true, 2)
    X = np.einsum("ikdc,ikc->id", frames.transpose(1, 0, 2)[active], phi)
    return X + noise * rng.normal(size=X.shape)


def _raw_departure(model: Any) -> float:
    """max_g ‖B_gᵀB_g − I_q‖_F of the raw parameters: how far B itself moved off the Stiefel manifold."""
    with torch.no_grad():
        B = model.B.to(torch.float64)
        return float((B.transpose(1, 2) @ B - torch.eye(B.shape[-1], dtype=torch.float64)).norm(dim=(1, 2)).max())


@check(
    "bsf.grassmann_orthonormal",
    "Grassmannian BSF frames stay orthonormal to 1e-6 through training",
    "docs/bsf.md §3.2, §9",
    predicted=f"Training bsf-grassmann (float32, Adam lr {_GRASSMANN['lr']}, {_GRASSMANN['steps']} steps) on a sum of "
    "circles: max over every step and block of ‖W_gᵀW_g − I‖_F ≤ 1e-6, although the raw parameters B_g drift "
    "off the Stiefel manifold.",
    kind="invariant",
    source=f"{BSF_PAPER}: Grassmannian BSF keeps orthonormal frames; docs/bsf.md §3.2",
    regime="bsf-grassmann, float32, Adam, a short training on circles",
)
def grassmann_orthonormal(ctx: CheckContext) -> Outcome:
    p = _GRASSMANN
    rng = ctx.rng("bsf.grassmann_orthonormal")
    X = _sum_of_circles(rng, p["D"], p["n_circles"], p["k_true"], p["N"], p["noise"])
    model = build_model("bsf-grassmann", X.shape[1], p["n_b"] * p["q"], {"k": p["k"], "block_size": p["q"]},
                        seed=ctx.seed, dtype=getattr(torch, p["dtype"]))
    arch = architecture("bsf-grassmann")
    errors = [arch.decoder_constraint_violation(model)]  # at init (before the first step)
    cfg = TrainConfig(steps=p["steps"], batch_size=p["batch_size"], lr=p["lr"], seed=ctx.seed, device="cpu",
                      checkpoint_every=0, log_every=p["steps"], keep_checkpoints=1)
    with torch_threads(1):
        result = train(model, X, cfg, progress=False, on_step=lambda step: errors.append(arch.decoder_constraint_violation(model)))
    measured = {"max_orthonormality_error": max(errors), "steps_measured": len(errors) - 1,
                "final_raw_B_departure": _raw_departure(model), "final_gamma": float(model.gamma.detach()),
                "final_loss": float(result.final_loss)}
    passed = measured["max_orthonormality_error"] <= ORTHO_TOL and measured["steps_measured"] == p["steps"]
    # The raw parameters are the point where orthonormality breaks: the same measure sees them far off it.
    controls = [negative_control("raw_parameters_off_the_stiefel_manifold", measured=measured["final_raw_B_departure"],
                                 threshold=1e-3, what="max_g ‖B_gᵀB_g − I‖_F of the raw B after training")]
    finding = None
    if not passed:
        finding = (f"‖W_gᵀW_g − I‖_F reached {measured['max_orthonormality_error']:.2e} > {ORTHO_TOL:.0e} "
                   f"(float32 QR of the drifted B, departure {measured['final_raw_B_departure']:.2e}).")
    return Outcome(
        measured=measured, tolerance=ORTHO_TOL, passed=passed, finding=finding, controls=controls,
        tolerance_reason="The spec's invariant (docs/bsf.md §9), unchanged. Householder QR in float32 (unit roundoff "
        "6e-8) leaves ‖QᵀQ − I‖_F of a few 1e-7 per block at D = 128, q = 4 (max ≈ 7e-7 over 48 blocks × 400 "
        "steps in our runs), so the margin to 1e-6 is small but the claim holds; float64 would pass trivially.",
        details={"training": p, "error_by_step_every_50": errors[::50]},
    )
