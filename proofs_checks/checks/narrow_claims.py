"""Checks of claims of the theory paper that the other narrow checks leave out (docs/theory.md §8b):
no spurious local minima at wide width, feature splitting as width grows, one atom per mutually
exclusive category, and the second-order status of narrow stationary points."""

from __future__ import annotations

import numpy as np

from dictcheck.empirics.toy_data import Toy, make_toy
from dictcheck.proofs_checks.checks.narrow import _fit
from dictcheck.proofs_checks.registry import CheckContext, Control, Outcome, check
from dictcheck.proofs_checks.sources import REFERENCE_LEARNER, THEORY_PAPER
from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.solvers.revival import RevivalFit, fit_with_revival
from dictcheck.solvers.second_order import exact_code_hessian_fd, restricted_hessian
from dictcheck.solvers.wide_limit import solve_wide_limit
from dictcheck.theory.second_order import bisector_curvature

#: Objective (1) within this of the Huber bound counts as the global optimum (learner precision ~1e-13).
GLOBAL_TOL = 1e-8
GLOBAL_STARTS = 20
GLOBAL_DATA = {"D": 3, "N": 8, "lam": 0.5}


def _random_start(rng: np.random.Generator, D: int, d_z: int, N: int) -> tuple[np.ndarray, np.ndarray]:
    """A random start: Gaussian atoms and Exp(1) codes (strictly positive)."""
    return rng.normal(size=(D, d_z)), rng.exponential(size=(d_z, N))


def _runs(X: np.ndarray, lam: float, b: np.ndarray | None, d_z: int, starts: int,
          rng: np.random.Generator) -> list[RevivalFit]:
    D, N = X.shape
    b0 = np.zeros(D) if b is None else b
    return [fit_with_revival(X, lam, *_random_start(rng, D, d_z, N), b0=b0, learn_bias=b is None)
            for _ in range(starts)]


@check(
    "narrow.global_at_wide_width",
    "At d_z ≥ #rays every local minimum is global: random starts end at the Huber bound or at a reducible saddle",
    "docs/theory.md §2.2 (convexity), §2.3, §4.4, §8b.1",
    predicted=f"Gaussian data (D = 3, N = 8, λ = 0.5), b = 0 and learned b, d_z = N ≥ #rays, {GLOBAL_STARTS} random "
    "starts each: every stopping point of the reference learner is either at the Huber bound (7) to "
    f"{GLOBAL_TOL:g} or reducible (a dead or duplicated latent) with max‖r_i‖ > λ, i.e. not a local minimum; "
    "reviving the spare latent at the best new atom and refitting reaches the bound from every start. At "
    "d_z = #rays − 1 (premise fails) no start reaches it and the learner ends at irreducible stationary points.",
    kind="replication",
    source=f"{THEORY_PAPER}: in the wide limit the problem is convex and every local minimum is global; "
    "docs/theory.md §2.2, §8b.1",
    regime=f"{REFERENCE_LEARNER}; {GLOBAL_STARTS} random starts per setting (Gaussian atoms, Exp(1) codes), "
    "revival of reducible stopping points by the S6 best new atom",
    quick=False,
)
def narrow_global_at_wide_width(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("narrow.global_at_wide_width")
    D, N, lam = GLOBAL_DATA["D"], GLOBAL_DATA["N"], GLOBAL_DATA["lam"]
    X = rng.normal(size=(D, N))
    settings, wide_ok, narrow_ok, positive_ok, stationary = [], True, True, True, 0.0
    for label, b in (("b = 0", np.zeros(D)), ("learned b", None)):
        wl = solve_wide_limit(X, lam, b=b)
        bound, n_rays = wl.objective, wl.n_rays
        wide = _runs(X, lam, b, max(N, n_rays), GLOBAL_STARTS, rng)
        narrow = _runs(X, lam, b, n_rays - 1, GLOBAL_STARTS // 2, rng)
        # positive control: started at the closed-form optimum (one atom per ray), the learner stays at the bound
        atoms = wl.rays.atoms
        pos = fit_with_revival(X, lam, atoms, wl.rays.codes().toarray(), b0=wl.b, learn_bias=b is None)
        gaps = [r.fit.objective - bound for r in wide]
        first_gaps = [r.first_objective - bound for r in wide]
        non_global_first = [r for r, g in zip(wide, first_gaps) if g > GLOBAL_TOL]
        narrow_gaps = [r.fit.objective - bound for r in narrow]
        stationary = max(stationary, *(r.fit.projected_gradient for r in wide + narrow))
        row = {"setting": label, "bound": bound, "n_rays": n_rays, "d_z_wide": max(N, n_rays),
               "wide_max_gap_after_revival": max(gaps), "wide_reached_directly": sum(g <= GLOBAL_TOL for g in first_gaps),
               "wide_non_global_stops": len(non_global_first),
               "wide_non_global_stops_reducible_and_uncertified": sum(r.first_reducible and r.first_cert_ratio > 1
                                                                       for r in non_global_first),
               "wide_non_global_stops_with_dead_latent": sum(r.first_dead for r in non_global_first),
               "wide_max_revivals": max(r.revivals for r in wide),
               "wide_irreducible_uncertified": sum(r.irreducible_uncertified for r in wide),
               "narrow_d_z": n_rays - 1, "narrow_min_gap": min(narrow_gaps),
               "narrow_irreducible_uncertified": sum(r.irreducible_uncertified for r in narrow),
               "narrow_distinct_local_optima": len({round(g, 9) for g in narrow_gaps}),
               "positive_control_gap": pos.fit.objective - bound, "starts": GLOBAL_STARTS}
        settings.append(row)
        wide_ok &= (row["wide_max_gap_after_revival"] <= GLOBAL_TOL and row["wide_irreducible_uncertified"] == 0
                    and row["wide_non_global_stops_reducible_and_uncertified"] == row["wide_non_global_stops"])
        narrow_ok &= row["narrow_min_gap"] > GLOBAL_TOL and row["narrow_irreducible_uncertified"] == len(narrow)
        positive_ok &= abs(row["positive_control_gap"]) <= GLOBAL_TOL
    controls = [
        Control("closed-form start", "positive", f"the learner started at the one-atom-per-ray optimum ends within "
                f"{GLOBAL_TOL:g} of the bound", "; ".join(f"{r['setting']}: gap {r['positive_control_gap']:.1e}"
                                                          for r in settings), positive_ok),
        Control("d_z = #rays − 1", "negative", "below the width the bound needs (§4.4) no start reaches the bound and "
                "every stopping point is irreducible and uncertified (a non-global local minimum is visible)",
                "; ".join(f"{r['setting']}: min gap {r['narrow_min_gap']:.2e}, irreducible "
                          f"{r['narrow_irreducible_uncertified']}/{GLOBAL_STARTS // 2}" for r in settings), narrow_ok),
        Control("stationary stops", "precondition", "every fit ends with projected gradient ≤ 1e-8",
                f"max projected gradient {stationary:.1e}", stationary <= 1e-8),
    ]
    reached = sum(r["wide_reached_directly"] for r in settings)
    return Outcome.for_replication(
        claim_holds=wide_ok, controls=controls,
        measured={"max_gap_after_revival": max(r["wide_max_gap_after_revival"] for r in settings),
                  "reached_directly": reached, "wide_starts": 2 * GLOBAL_STARTS,
                  "non_global_stops_all_reducible": all(
                      r["wide_non_global_stops_reducible_and_uncertified"] == r["wide_non_global_stops"] for r in settings),
                  "narrow_min_gap": min(r["narrow_min_gap"] for r in settings)},
        tolerance={"gap": GLOBAL_TOL, "cert": 1e-8},
        tolerance_reason="The learner (L-BFGS-B + Newton polish) reaches stationarity ~1e-13, so a stop at the "
        "optimum matches the closed form to ~1e-12; 1e-8 separates it from the smallest non-global stop seen "
        "(~1e-5).",
        details={"settings": settings},
        finding=(f"Only {reached}/{2 * GLOBAL_STARTS} random starts stop at the bound directly; the others stop at "
                 "stationary points with a dead or duplicated latent (the zero-row trap), which are saddles, not "
                 "local minima: reviving the spare latent reaches the bound."),
    )


#: The symmetric two-ray data of §8b.4: rays at ±α from b = 0, these radii on each, λ.
SADDLE_RADII = (1.0, 1.5, 2.0)
SADDLE_LAM = 0.1
SADDLE_ALPHA, MINIMUM_ALPHA = 0.8, 0.2
#: The learner optima whose second-order status is measured (toy, seed, spare latent), as in narrow.py.
SECOND_ORDER_FITS = (("independent_features", None, False), ("parent_child", None, False),
                     ("dense_feature", 1, False), ("dense_feature", 1, True))
HESSIAN_TOL = 1e-8


def _two_rays(alpha: float) -> Toy:
    return make_toy("rays", centre=(0.0, 0.0), angles=(-alpha, alpha), radii=(SADDLE_RADII, SADDLE_RADII),
                    near_points=None, lam=SADDLE_LAM)


def _bisector_status(alpha: float) -> dict[str, float]:
    """Closed form, autograd and finite-difference curvature of (1) along the atom's angle at the bisector."""
    toy = _two_rays(alpha)
    W, b = np.array([[1.0], [0.0]]), np.zeros(2)
    Z = exact_codes(W, toy.X, b, toy.lam).Z
    h = restricted_hessian(W, Z, b, toy.X, toy.lam, learn_bias=False)
    return {"alpha": alpha, "closed_form": bisector_curvature(toy.ground_truth["radius"], alpha, toy.lam),
            "autograd_reduced": float(h.reduced[0, 0]), "min_eig_joint": h.min_eig,
            "finite_difference": float(exact_code_hessian_fd(W, b, toy.X, toy.lam, learn_bias=False)[0, 0]),
            "gradient_norm": h.gradient_norm}


@check(
    "narrow.second_order",
    "Second-order status: the restricted Hessian is PD at the learner's optima and has negative curvature at a "
    "symmetric saddle",
    "docs/theory.md §8b.4",
    predicted=f"At the reference optima of independent features, parent/child and the dense feature (d_z = 3, 4) the "
    "Hessian of (1) on the constraint face (sphere tangents, active codes, learned b), computed by torch autograd, "
    f"has min eigenvalue ≥ −{HESSIAN_TOL:g}·max|eig| (PSD; strict complementarity holds). At the bisector of two rays "
    f"at ±{SADDLE_ALPHA} (radii {SADDLE_RADII}, λ = {SADDLE_LAM}, one atom, b = 0) the gradient is 0 and the curvature "
    "along the angle is the closed form (2/N)Σρ_i(ρ_i cos 2α − λ cos α) < 0 (autograd to 1e-9, finite differences "
    f"of (1) at exact codes to 1e-5); at ±{MINIMUM_ALPHA} the same closed form is > 0.",
    kind="theorem",
    source=f"{THEORY_PAPER}: narrow stationary points (local conditions) — second-order status derived here; "
    "docs/theory.md §8b.4",
    regime=f"{REFERENCE_LEARNER}; the symmetric two-ray point is constructed, not learned",
)
def narrow_second_order(ctx: CheckContext) -> Outcome:
    optima = []
    for name, seed, spare in SECOND_ORDER_FITS:
        toy, fit = _fit(name, ctx.seed if seed is None else seed, spare)
        h = restricted_hessian(fit.W, fit.Z, fit.b, toy.X, toy.lam, learn_bias=toy.learn_bias)
        optima.append({"toy": name + (" + spare" if spare else ""), "variables": int(h.hessian.shape[0]),
                       "min_eig": h.min_eig, "max_abs_eig": h.max_abs_eig, "min_eig_exact_code": h.min_eig_reduced,
                       "min_eig_codes": h.min_eig_codes, "gradient_norm": h.gradient_norm,
                       "complementarity_margin": h.complementarity_margin})
    saddle, minimum = _bisector_status(SADDLE_ALPHA), _bisector_status(MINIMUM_ALPHA)
    worst_relative = min(r["min_eig"] / r["max_abs_eig"] for r in optima)
    agree = max(abs(s["autograd_reduced"] - s["closed_form"]) / abs(s["closed_form"]) for s in (saddle, minimum))
    fd = max(abs(s["finite_difference"] - s["closed_form"]) / abs(s["closed_form"]) for s in (saddle, minimum))
    measured = {"min_relative_eig_at_optima": worst_relative,
                "min_complementarity_margin": min(r["complementarity_margin"] for r in optima),
                "saddle_curvature": saddle["closed_form"], "saddle_curvature_autograd": saddle["autograd_reduced"],
                "minimum_curvature": minimum["closed_form"], "max_rel_autograd_vs_closed_form": agree,
                "max_rel_fd_vs_closed_form": fd,
                "max_gradient": max(max(r["gradient_norm"] for r in optima), saddle["gradient_norm"])}
    tol = {"relative_eig": -HESSIAN_TOL, "autograd": 1e-9, "finite_difference": 1e-5, "gradient": 1e-8}
    passed = (worst_relative >= tol["relative_eig"] and measured["min_complementarity_margin"] > 0
              and saddle["closed_form"] < 0 < minimum["closed_form"] and saddle["min_eig_joint"] < 0
              and agree <= tol["autograd"] and fd <= tol["finite_difference"]
              and measured["max_gradient"] <= tol["gradient"])
    return Outcome(measured=measured, tolerance=tol, passed=passed,
                   tolerance_reason="The optima are stationary to ~1e-15 and their Hessians are PD with relative "
                   "min eigenvalue ~1e-4, far above −1e-8 (float64 rounding of a ~300-variable Hessian is ~1e-14); "
                   "autograd and the closed form are both exact (rounding ~1e-15); central differences with step "
                   "1e-4 on exact codes (KKT 1e-12) carry O(1e-8) truncation and rounding error.",
                   details={"optima": optima, "saddle": saddle, "minimum": minimum})
