"""Checks of claims of the theory paper that the other narrow checks leave out: no spurious local minima at
wide width (docs/theory.md §2.4), the second-order status of narrow stationary points (§3.1), feature
splitting as width grows (§4.6), and one atom per mutually exclusive category (§4.7)."""

from __future__ import annotations

import numpy as np

from dictcheck.empirics.data.toys import Toy, make_toy
from dictcheck.proofs_checks.checks.narrow import toy_reference_fit
from dictcheck.proofs_checks.registry import CheckContext, Control, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import REFERENCE_LEARNER, THEORY_PAPER
from dictcheck.solvers.lasso_codes import exact_codes
from dictcheck.solvers.revival import RevivalFit, distinct_atoms, fit_with_revival
from dictcheck.solvers.second_order import exact_code_hessian_fd, restricted_hessian
from dictcheck.solvers.wide_limit import solve_wide_limit
from dictcheck.solvers.width_sweep import one_atom_optimum, predict_groups
from dictcheck.theory.huber import huber_objective
from dictcheck.theory.objective import sae_objective
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
    """``starts`` random starts at width d_z, each fitted with revival (b fixed at ``b``, learned if None)."""
    D, N = X.shape
    b0 = np.zeros(D) if b is None else b
    return [fit_with_revival(X, lam, *_random_start(rng, D, d_z, N), b0=b0, learn_bias=b is None)
            for _ in range(starts)]


@check(
    "narrow.global_at_wide_width",
    "At d_z ≥ #rays every local minimum is global: random starts end at the Huber bound or at a reducible saddle",
    "docs/theory.md §2.2 (convexity), §2.3, §4.4, §2.4",
    predicted=f"Gaussian data (D = 3, N = 8, λ = 0.5), b = 0 and learned b, d_z = N ≥ #rays, {GLOBAL_STARTS} random "
    "starts each: every stopping point of the reference learner is either at the Huber bound (7) to "
    f"{GLOBAL_TOL:g} or reducible (a dead or duplicated latent) with max‖r_i‖ > λ, i.e. not a local minimum (not a "
    "strict one for duplicates, docs/theory.md §2.4); "
    "reviving the spare latent at the best new atom and refitting reaches the bound from every start. At "
    "d_z = #rays − 1 (premise fails) no start reaches it and the learner ends at irreducible stationary points.",
    kind="replication",
    source=f"{THEORY_PAPER}: in the wide limit the problem is convex and every local minimum is global; "
    "docs/theory.md §2.2, §2.4",
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
    stops = sum(r["wide_non_global_stops"] for r in settings)
    dead = sum(r["wide_non_global_stops_with_dead_latent"] for r in settings)
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
        finding=(f"Only {reached}/{2 * GLOBAL_STARTS} random starts stop at the bound directly. The other "
                 f"{stops} stop at stationary points that are reducible with max‖r_i‖ > λ ({dead} with a dead latent: "
                 f"not local minima; {stops - dead} with duplicated atoms only: equal in (1) to a dead-latent point, "
                 "so not strict local minima, docs/theory.md §2.4); reviving the spare latent reaches the bound."),
    )


#: The symmetric two-ray data of §3.1: rays at ±α from b = 0, these radii on each, λ.
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
    "docs/theory.md §3.1",
    predicted=f"At the reference optima of independent features, parent/child and the dense feature (d_z = 3, 4) the "
    "Hessian of (1) on the constraint face (sphere tangents, active codes, learned b), computed by torch autograd, "
    f"has min eigenvalue ≥ −{HESSIAN_TOL:g}·max|eig| (PSD; strict complementarity holds). At the bisector of two rays "
    f"at ±{SADDLE_ALPHA} (radii {SADDLE_RADII}, λ = {SADDLE_LAM}, one atom, b = 0) the gradient is 0 and the curvature "
    "along the angle is the closed form (2/N)Σρ_i(ρ_i cos 2α − λ cos α) < 0 (autograd to 1e-9, finite differences "
    f"of (1) at exact codes to 1e-5); at ±{MINIMUM_ALPHA} the same closed form is > 0.",
    kind="theorem",
    source=f"{THEORY_PAPER}: narrow stationary points (local conditions) — second-order status derived here; "
    "docs/theory.md §3.1",
    regime=f"{REFERENCE_LEARNER}; the symmetric two-ray point is constructed, not learned",
)
def narrow_second_order(ctx: CheckContext) -> Outcome:
    optima = []
    for name, seed, spare in SECOND_ORDER_FITS:
        toy, fit = toy_reference_fit(name, ctx.seed if seed is None else seed, spare)
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
              and 0 < minimum["closed_form"] and agree <= tol["autograd"] and fd <= tol["finite_difference"]
              and measured["max_gradient"] <= tol["gradient"])
    # The symmetric two-ray point is where positive definiteness breaks: negative curvature, seen two ways.
    controls = [
        negative_control("curvature_along_the_angle_at_the_saddle", measured=-saddle["autograd_reduced"],
                         threshold=1e-6, what="−(autograd curvature along the angle) at the bisector saddle",
                         reference=-saddle["closed_form"], rtol=tol["autograd"]),
        negative_control("min_eigenvalue_at_the_saddle", measured=-saddle["min_eig_joint"], threshold=1e-6,
                         what="−(smallest eigenvalue of the joint Hessian) there"),
    ]
    return Outcome(measured=measured, tolerance=tol, passed=passed, controls=controls,
                   tolerance_reason="The optima are stationary to ~1e-15 and their Hessians are PD with relative "
                   "min eigenvalue ~1e-4, far above −1e-8 (float64 rounding of a ~300-variable Hessian is ~1e-14); "
                   "autograd and the closed form are both exact (rounding ~1e-15); central differences with step "
                   "1e-4 on exact codes (KKT 1e-12) carry O(1e-8) truncation and rounding error.",
                   details={"optima": optima, "saddle": saddle, "minimum": minimum})


#: §4.6 width sweep: two orthogonal groups of two rays each (half-angles below), 3 points per ray, λ, widths.
SPLIT_HALF_ANGLES = (0.35, 0.2)
SPLIT_LAM = 0.1
SPLIT_WIDTHS = (1, 2, 3, 4, 5)
SPLIT_STARTS = 6
SAME_DIRECTION = 1.0 - 1e-6


def _ray_groups(half_angles: tuple[float, float], seed: int) -> tuple[Toy, list[np.ndarray]]:
    """Rays at ±α_g inside the plane span(e_{2g+1}, e_{2g+2}) of R⁴; b = 0 fixed; radii U[1, 2], 3 per ray."""
    planes = [np.eye(4)[:, 2 * g:2 * g + 2] for g in range(2)]
    dirs = np.column_stack([P @ np.array([np.cos(s * a), np.sin(s * a)])
                            for P, a in zip(planes, half_angles) for s in (-1.0, 1.0)])
    toy = make_toy("rays", seed=seed, centre=np.zeros(4), angles=None, directions=dirs, radii=None, n_per_ray=3,
                   radius_range=(1.0, 2.0), near_points=None, lam=SPLIT_LAM)
    return toy, planes


def _structure(W: np.ndarray, Z: np.ndarray, planes: list[np.ndarray]) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """(atoms per group plane, support of each atom) of a dictionary with distinct live atoms."""
    in_plane = np.array([[np.linalg.norm(P.T @ W[:, d]) for P in planes] for d in range(W.shape[1])])
    counts = tuple(int(np.sum(in_plane[:, g] > SAME_DIRECTION)) for g in range(len(planes)))
    return counts, [Z[d] > 1e-9 * max(float(Z.max()), 1e-300) for d in range(W.shape[1])]


def _splits(before: list[np.ndarray], after: list[np.ndarray]) -> int:
    """How many atoms of the narrower dictionary have ≥ 2 atoms of the wider one whose supports lie inside theirs."""
    return sum(sum(bool(s.any() and not np.any(s & ~p)) for s in after) >= 2 for p in before)


def _sweep(toy: Toy, planes: list[np.ndarray], rng: np.random.Generator) -> dict[int, dict]:
    """Best-of-starts (with revival) reference fits at every width: objective, atoms per group, supports."""
    out = {}
    for d_z in SPLIT_WIDTHS:
        best = min(_runs(toy.X, toy.lam, toy.b_fixed, d_z, SPLIT_STARTS, rng), key=lambda r: r.fit.objective)
        W, Z = distinct_atoms(best.fit.W, best.fit.Z)
        counts, supports = _structure(W, Z, planes)
        out[d_z] = {"objective": best.fit.objective, "allocation": counts, "supports": supports}
    return out


def _split_events(per_width: dict[int, dict], widths: tuple[int, ...] = SPLIT_WIDTHS) -> list[int]:
    """Split events between consecutive widths (:func:`_splits`)."""
    return [_splits(per_width[k]["supports"], per_width[k + 1]["supports"]) for k in widths[:-1]]


def _predicted_splits(allocation: dict[int, tuple[int, ...]]) -> list[int]:
    """A group whose atom count goes 1 → 2 between consecutive widths splits (one event)."""
    return [sum(a == 1 and b == 2 for a, b in zip(allocation[k], allocation[k + 1])) for k in SPLIT_WIDTHS[:-1]]


@check(
    "narrow.width_splitting",
    "Features split as width grows: a group's atom is replaced by one atom per ray, in the predicted order",
    "docs/theory.md §4.4, §4.6",
    predicted=f"Two orthogonal groups of two rays (half-angles {SPLIT_HALF_ANGLES} rad, b = 0, λ = {SPLIT_LAM}), widths "
    f"{SPLIT_WIDTHS}: the brute-force optimum (allocation of atoms to groups, computed before fitting and recorded "
    "in details) says which group is represented at d_z = 1, one atom per group at 2, which group splits at 3 (the "
    "one with the larger splitting gain f_g(1) − f_g(2)), both split at 4 (= #rays, the Huber bound) and nothing "
    "changes at 5. The best of the reference-learner starts matches the predicted objective (to 1e-8) and "
    "allocation at every width, and the split events (an atom whose support holds ≥ 2 supports of the next "
    "width) are exactly the predicted ones.",
    kind="replication",
    source=f"{THEORY_PAPER}: feature splitting as the dictionary widens, until every ray has its own atom; "
    "docs/theory.md §4.4, §4.6",
    regime=f"{REFERENCE_LEARNER}; {SPLIT_STARTS} random starts per width with revival, best kept; 12 points in R⁴",
    quick=False,
)
def narrow_width_splitting(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("narrow.width_splitting")
    toy, planes = _ray_groups(SPLIT_HALF_ANGLES, ctx.seed)
    groups = [toy.X[:, np.isin(toy.ground_truth["ray"], (2 * g, 2 * g + 1))] for g in range(2)]
    prediction = predict_groups(groups, planes, toy.lam, list(SPLIT_WIDTHS))
    predicted_splits = _predicted_splits(prediction.allocation)
    measured_sweep = _sweep(toy, planes, rng)
    splits = _split_events(measured_sweep)
    gaps = {k: measured_sweep[k]["objective"] - prediction.objective[k] for k in SPLIT_WIDTHS}
    claim = (all(abs(g) <= GLOBAL_TOL for g in gaps.values()) and splits == predicted_splits
             and all(measured_sweep[k]["allocation"] == prediction.allocation[k] for k in SPLIT_WIDTHS))
    # positive control: the split detector on the brute-force dictionaries themselves
    rays, bisectors = toy.ground_truth["directions"], [one_atom_optimum(X, P, toy.lam)[1] for X, P in zip(groups, planes)]
    constructed = {}
    for k in SPLIT_WIDTHS[:-1]:
        W = np.column_stack([a for g, n in enumerate(prediction.allocation[k])
                             for a in ([bisectors[g]] if n == 1 else list(rays[:, 2 * g:2 * g + n].T))])
        constructed[k] = {"supports": _structure(W, exact_codes(W, toy.X, toy.b_fixed, toy.lam).Z, planes)[1]}
    constructed_splits = _split_events(constructed, SPLIT_WIDTHS[:-1])
    # negative control: each group one ray (half-angles 0): nothing to split
    flat_toy, _ = _ray_groups((0.0, 0.0), ctx.seed)
    flat_splits = _split_events(_sweep(flat_toy, planes, rng))
    controls = [
        Control("split detector on the brute-force optima", "positive", "the detector finds exactly the predicted "
                f"split events {predicted_splits[:-1]} on the constructed optimal dictionaries",
                f"found {constructed_splits}", constructed_splits == predicted_splits[:-1]),
        Control("one ray per group", "negative", "with half-angles 0 there is nothing to split: 0 split events at "
                "every width", f"split events {flat_splits}", not any(flat_splits)),
    ]
    return Outcome.for_replication(
        claim_holds=claim, controls=controls,
        measured={"split_events": splits, "predicted_split_events": predicted_splits,
                  "max_abs_gap_to_predicted_objective": max(abs(g) for g in gaps.values()),
                  "allocations": {str(k): list(measured_sweep[k]["allocation"]) for k in SPLIT_WIDTHS}},
        tolerance={"objective": GLOBAL_TOL},
        tolerance_reason="The brute force is exact up to the angle refinement (~1e-15) and the learner reaches "
        "~1e-13; 1e-8 is far below the smallest margin between allocations (details.margin).",
        details={"predicted_allocation": {str(k): list(v) for k, v in prediction.allocation.items()},
                 "predicted_objective": {str(k): v for k, v in prediction.objective.items()},
                 "margin": {str(k): v for k, v in prediction.margin.items()},
                 "f_sum_per_group": [list(f) for f in prediction.f],
                 "measured_objective": {str(k): v["objective"] for k, v in measured_sweep.items()}},
    )


#: §4.7: K category directions in R^D (K > D: superposition), points per category, λ; b = 0 fixed.
CATEGORIES = {"K": 5, "D": 3, "per_category": 10, "lam": 0.1}
CATEGORY_STARTS = 6
#: Co-occurring points added for the negative control (pairs of categories on together).
CO_OCCURRING = 10


def _categories(rng: np.random.Generator) -> tuple[Toy, np.ndarray]:
    """Exactly one of K categories on per point: x_i = a_i u_{k(i)}, a_i ~ U[1, 2] (the rays toy with K random
    unit directions), and a copy with CO_OCCURRING extra points a u_j + c u_k (j ≠ k)."""
    K, D = CATEGORIES["K"], CATEGORIES["D"]
    U = rng.normal(size=(D, K))
    toy = make_toy("rays", seed=int(rng.integers(2**31)), centre=np.zeros(D), angles=None, directions=U, radii=None,
                   n_per_ray=CATEGORIES["per_category"], radius_range=(1.0, 2.0), near_points=None,
                   lam=CATEGORIES["lam"])
    U = toy.ground_truth["directions"]
    pairs = np.array([rng.choice(K, 2, replace=False) for _ in range(CO_OCCURRING)])
    amps = rng.uniform(1.0, 2.0, (CO_OCCURRING, 2))
    mixed = U[:, pairs[:, 0]] * amps[:, 0] + U[:, pairs[:, 1]] * amps[:, 1]
    return toy, np.column_stack([toy.X, mixed])


def _one_atom_each(W: np.ndarray, Z: np.ndarray, U: np.ndarray, category: np.ndarray) -> tuple[bool, dict]:
    """Whether the distinct atoms are one per category: every atom has cosine > 1 − 1e-6 with one u_k, each u_k
    has exactly one atom, and every point of category k is coded by that atom alone."""
    cos = W.T @ U
    match = np.where(cos.max(axis=1) > SAME_DIRECTION, cos.argmax(axis=1), -1)
    per_category = np.bincount(match[match >= 0], minlength=U.shape[1])
    active = Z > 1e-9 * max(float(Z.max()), 1e-300)
    alone = all(np.all(active[:, category == k] == (match == k)[:, None]) for k in range(U.shape[1])
                if np.sum(match == k) == 1)
    ok = bool(np.all(match >= 0) and np.all(per_category == 1) and alone)
    return ok, {"atoms": int(W.shape[1]), "unmatched_atoms": int(np.sum(match < 0)),
                "atoms_per_category": per_category.tolist(), "points_coded_by_their_atom_alone": bool(alone)}


@check(
    "narrow.exclusive_categories",
    "Mutually exclusive categories stay one atom each, at d_z = K and wider",
    "docs/theory.md §4.1, §4.4, §4.7",
    predicted=f"K = {CATEGORIES['K']} categories in R^{CATEGORIES['D']} (superposition), exactly one on per point "
    f"(x = a u_k, a ~ U[1, 2]), b = 0, λ = {CATEGORIES['lam']}: every category is one ray, so (§4.4) the K category "
    "directions with codes a − λ attain the Huber bound and every optimum has one atom per category (equality in "
    f"(6) forces alignment). From {CATEGORY_STARTS} random starts with revival, at d_z = K and K + 2: objective at the "
    "bound to 1e-8 and one atom per category (cos > 1 − 1e-6), each point coded by its category's atom alone.",
    kind="replication",
    source=f"{THEORY_PAPER}: mutually exclusive features are represented by one atom each; docs/theory.md §4.7",
    regime=f"{REFERENCE_LEARNER}; {CATEGORY_STARTS} random starts per width with revival",
    quick=False,
)
def narrow_exclusive_categories(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("narrow.exclusive_categories")
    toy, X_mixed = _categories(rng)
    K, lam, b = CATEGORIES["K"], toy.lam, toy.b_fixed
    U, category = toy.ground_truth["directions"], toy.ground_truth["ray"]
    bound = huber_objective(b, toy.X, lam)
    rows = []
    for d_z in (K, K + 2):
        for run in _runs(toy.X, lam, b, d_z, CATEGORY_STARTS, rng):
            ok, info = _one_atom_each(*distinct_atoms(run.fit.W, run.fit.Z), U, category)
            rows.append({"d_z": d_z, "gap": run.fit.objective - bound, "direct_gap": run.first_objective - bound,
                         "revivals": run.revivals, "one_atom_each": ok, **info})
    claim = all(r["one_atom_each"] and abs(r["gap"]) <= GLOBAL_TOL for r in rows)
    # positive control: the category dictionary itself, with exact codes, is at the bound and passes the test
    truth = exact_codes(U, toy.X, b, lam)
    truth_ok, _ = _one_atom_each(U, truth.Z, U, category)
    truth_gap = sae_objective(U, truth.Z, b, toy.X, lam) - bound
    # negative control: with co-occurring pairs the categories are no longer exclusive
    mixed_category = np.r_[category, np.full(CO_OCCURRING, -1)]
    mixed = [_one_atom_each(*distinct_atoms(r.fit.W, r.fit.Z), U, mixed_category)[0]
             for r in _runs(X_mixed, lam, b, K + 2, CATEGORY_STARTS // 2, rng)]
    controls = [
        Control("category dictionary", "positive", "the K category directions with exact codes sit at the bound "
                f"(to {GLOBAL_TOL:g}) and pass the one-atom-per-category test",
                f"gap {truth_gap:.1e}, test {'passed' if truth_ok else 'failed'}", truth_ok and abs(truth_gap) <= GLOBAL_TOL),
        Control("co-occurring categories", "negative", f"with {CO_OCCURRING} points where two categories are on "
                "together, no fit at d_z = K + 2 is one atom per category",
                f"{sum(mixed)}/{len(mixed)} fits passed the test", not any(mixed)),
    ]
    return Outcome.for_replication(
        claim_holds=claim, controls=controls,
        measured={"fits_one_atom_each": sum(r["one_atom_each"] for r in rows), "fits": len(rows),
                  "max_abs_gap": max(abs(r["gap"]) for r in rows),
                  "reached_without_revival": sum(r["direct_gap"] <= GLOBAL_TOL for r in rows)},
        tolerance={"gap": GLOBAL_TOL, "cosine": SAME_DIRECTION},
        tolerance_reason="Noise-free data: the optimum is exact and the learner reaches it to ~1e-13; the cosine "
        "1 − 1e-6 separates an aligned atom from any other (the largest cosine between two categories is in details).",
        details={"fits": rows, "bound": bound, "category_cosines_max":
                 float(np.max(np.abs(U.T @ U - np.eye(K))))},
    )
