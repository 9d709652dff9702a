"""Checks of the wide-limit theory (docs/theory.md §2 and §4)."""

from __future__ import annotations

import itertools

import numpy as np

from dictcheck.empirics.data.toys import make_toy
from dictcheck.proofs_checks.figures import plot_wide_limit_2d
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import THEORY_PAPER
from dictcheck.solvers.dnn import solve_dnn
from dictcheck.solvers.medians import geometric_median, huber_median
from dictcheck.solvers.reference_learner import fit_reference
from dictcheck.solvers.wide_limit import solve_wide_limit
from dictcheck.theory.certificate import cert_ratio, certificate_matrix, certificate_slack, certified_gap
from dictcheck.theory.huber import huber_objective, huber_objective_gradient, huber_objective_hessian
from dictcheck.theory.objective import centred, q_program, q_program_gradient, q_residuals, ridge_decoder, scaled_objective
from dictcheck.theory.wide_limit import wide_optimum_at_bias


@check(
    "wide.q_reformulation",
    "min over W of form (2) equals J(Q, b) of program (3)",
    "docs/theory.md §2.2 (3)",
    predicted="For random X, Z ≥ 0, b, λ: min_W F(W, Z, b) = J(ZᵀZ, b); the ridge W* equals an "
    "independent least-squares solve; R = λX̃(Q+λI)⁻¹ and W* = RZᵀ/λ; ∇_Q J = G/N.",
    kind="theorem",
    source=f"{THEORY_PAPER}: the reformulation over Q = ZᵀZ; docs/theory.md §2.2",
    regime="random X, Z ≥ 0, b, λ; no training",
)
def q_reformulation(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("wide.q_reformulation")
    rel_value, rel_ridge, rel_identity, rel_grad = [], [], [], []
    for _ in range(40):
        D, N, d_z = rng.integers(1, 6), rng.integers(2, 9), rng.integers(1, 7)
        lam = float(rng.uniform(0.05, 2.0))
        X, b = rng.normal(size=(D, N)), rng.normal(size=D)
        Z = rng.exponential(size=(d_z, N)) * (rng.random((d_z, N)) < 0.7)
        Xc = centred(X, b)
        W = ridge_decoder(Z, Xc, lam)
        F_min, J = scaled_objective(W, Z, b, X, lam), q_program(Z.T @ Z, b, X, lam)
        rel_value.append(abs(F_min - J) / max(abs(J), 1e-300))
        stacked = np.vstack([Z.T, np.sqrt(lam) * np.eye(d_z)])
        W_lstsq = np.linalg.lstsq(stacked, np.vstack([Xc.T, np.zeros((d_z, D))]), rcond=None)[0].T
        rel_ridge.append(np.linalg.norm(W - W_lstsq) / max(np.linalg.norm(W_lstsq), 1e-300))
        Q = Z.T @ Z
        R = q_residuals(Q, Xc, lam)
        rel_identity.append(max(np.linalg.norm(R - (Xc - W @ Z)), np.linalg.norm(W - R @ Z.T / lam))
                            / max(np.linalg.norm(Xc), 1e-300))
        E = rng.normal(size=(N, N))
        E = (E + E.T) / 2
        h = 1e-6
        fd = (q_program(Q + h * E, b, X, lam) - q_program(Q - h * E, b, X, lam)) / (2 * h)
        analytic = float(np.sum(q_program_gradient(Q, b, X, lam).grad_Q * E))
        rel_grad.append(abs(fd - analytic) / max(abs(analytic), 1e-8))
    # W moved off the ridge optimum: form (2) exceeds J by exactly (‖EZ‖² + λ‖E‖²)/N (F is quadratic in W).
    E = 0.1 * rng.normal(size=W.shape)
    excess = scaled_objective(W + E, Z, b, X, lam) - J
    controls = [negative_control(
        "form_2_off_the_ridge_decoder", measured=excess, threshold=1e-6,
        what="F(W* + E, Z, b) − J(ZᵀZ, b) for a random E of scale 0.1",
        reference=float((np.sum((E @ Z) ** 2) + lam * np.sum(E * E)) / N), rtol=1e-7)]
    measured = {"max_rel_value_diff": max(rel_value), "max_rel_ridge_diff": max(rel_ridge),
                "max_rel_identity_diff": max(rel_identity), "max_rel_fd_gradient_diff": max(rel_grad)}
    tol = {"value": 1e-10, "ridge": 1e-10, "identity": 1e-10, "gradient": 1e-6}
    passed = (measured["max_rel_value_diff"] <= tol["value"] and measured["max_rel_ridge_diff"] <= tol["ridge"]
              and measured["max_rel_identity_diff"] <= tol["identity"] and measured["max_rel_fd_gradient_diff"] <= tol["gradient"])
    return Outcome(
        measured=measured, tolerance=tol, passed=passed, controls=controls,
        tolerance_reason="float64 linear algebra on well-conditioned (Q + λI, λ ≥ 0.05) systems rounds at ~1e-13; "
        "the central finite difference with h = 1e-6 has truncation + rounding error ~1e-8 relative.",
        details={"instances": 40},
    )


def _bias_tolerance(X: np.ndarray, b_star: np.ndarray, lam: float) -> float:
    """max(1e-4, sqrt(2·1e-8/μ)): how well a value accurate to 1e-8 determines b near b* (μ: curvature of H)."""
    mu = float(np.linalg.eigvalsh(huber_objective_hessian(b_star, X, lam))[0])
    return max(1e-4, float(np.sqrt(2e-8 / mu)) if mu > 0 else float("inf"))


def _global_optimum_cases(ctx: CheckContext) -> list[tuple[str, np.ndarray, float, np.ndarray | None, bool]]:
    """(name, X, λ, fixed b or None, generic) for the data sets of wide.global_optimum."""
    rng = ctx.rng("wide.global_optimum")
    cases = []
    for N in (5, 6, 8):
        X = rng.normal(size=(3, N))
        cases.append((f"gaussian N={N}, b=0", X, 0.5, np.zeros(3), True))
        cases.append((f"gaussian N={N}, learned b", X, 0.5, None, True))
    crowded = make_toy("crowded_median")
    cases.append(("crowded (C3), learned b", crowded.X, crowded.lam, None, True))
    rays = make_toy("rays_reference")
    cases.append(("shared rays (D), b=0", rays.X, rays.lam, np.zeros(2), False))
    cases.append(("shared rays (D), learned b", rays.X, rays.lam, None, True))
    clusters = make_toy("clusters", seed=ctx.seed, n_clusters=2, n_per_cluster=4, D=2)
    cases.append(("two clusters N=8, learned b", clusters.X, clusters.lam, None, True))
    return cases


def _certificate_controls(X: np.ndarray, lam: float) -> list:
    """The certificate and the certified gap at points that are not optimal, each against a direct computation:
    half the closed-form Q* at the Huber median (residuals longer than λ: the certificate must fail), and the
    Huber median moved by λ/2 (its bias term must be positive)."""
    b = solve_wide_limit(X, lam).b
    Xc = centred(X, b)
    N = X.shape[1]
    Q = 0.5 * np.diag(wide_optimum_at_bias(X, b, lam).q_diag)
    R = q_residuals(Q, Xc, lam)
    RR = R.T @ R
    b_off = b + 0.5 * lam * np.eye(X.shape[0])[0]
    gap = certified_gap(huber_objective(b_off, X, lam), b_off, X, lam, learned_bias=True)
    return [
        negative_control("cert_ratio_at_half_the_optimal_Q", measured=cert_ratio(R, lam) - 1.0, threshold=1e-3,
                         what="max‖r_i‖/λ − 1 at Q = Q*/2", reference=float(np.sqrt(np.max(np.diag(RR)))) / lam - 1.0),
        negative_control("certificate_negative_at_half_the_optimal_Q",
                         measured=-float(np.min(certificate_matrix(R, lam))), threshold=1e-3,
                         what="−min G there", reference=float(np.max(RR)) / lam - lam),
        negative_control("slackness_at_half_the_optimal_Q", measured=abs(certificate_slack(R, Q, lam)), threshold=1e-6,
                         what="|⟨G, Q⟩|/N there", reference=abs(float(lam * np.sum(Q) - np.sum(RR * Q) / lam) / N)),
        negative_control("certified_gap_off_the_median", measured=gap.certified_gap, threshold=1e-6,
                         what="the certified gap of the closed form at the Huber median moved by λ/2",
                         reference=float(np.linalg.norm(huber_objective_gradient(b_off, X, lam))
                                         * np.max(np.linalg.norm(X - b_off[:, None], axis=0)))),
    ]


@check(
    "wide.global_optimum",
    "DNN relaxation of (3) = Huber closed form (7), certified by G = λ11ᵀ − RᵀR/λ",
    "docs/theory.md §2.3, §4.2, §4.3",
    predicted="For every data set (N = 5…9, shared rays included): DNN value = (1/N)Σh_λ(‖x_i − b‖) at b or at "
    "the Huber median; Q* = diag((ρ−λ)₊) for generic data; DNN b = Huber median; at the DNN solution G ≥ 0, "
    "max‖r_i‖/λ = 1 (some point lies beyond λ) and complementary slackness ⟨G, Q⟩ = 0; at the closed form "
    "‖r_i‖ = λ for every point beyond λ of b, r_i = x_i − b for the others, ⟨G, Q*⟩ = 0; the closed-form "
    "dictionary's certified gap is 0.",
    kind="theorem",
    source=f"{THEORY_PAPER}: convexity in the wide limit (CP/DNN program) and its closed form; docs/theory.md "
    "§2.3, §4.2–§4.3",
    regime="N = 5…9 points, DNN relaxation by Clarabel against the closed form",
)
def global_optimum(ctx: CheckContext) -> Outcome:
    rows = []
    for name, X, lam, b, generic in _global_optimum_cases(ctx):
        dnn = solve_dnn(X, lam, b=b)
        wide = solve_wide_limit(X, lam, b=b)
        R = q_residuals(dnn.Q, centred(X, dnn.b), lam)
        q_formula = wide_optimum_at_bias(X, dnn.b, lam).q_diag
        closed = wide_optimum_at_bias(X, wide.b, lam)
        beyond = closed.rho > lam
        R_closed = q_residuals(np.diag(closed.q_diag), centred(X, wide.b), lam)
        norms = np.linalg.norm(R_closed, axis=0)
        rows.append({
            "data": name, "N": X.shape[1], "dnn_value": dnn.objective, "closed_form_value": wide.objective,
            "value_diff": abs(dnn.objective - wide.objective),
            "q_diff": float(np.max(np.abs(dnn.Q - np.diag(q_formula)))) if generic and b is not None else None,
            "b_diff": float(np.linalg.norm(dnn.b - wide.b)) if b is None else None,
            "b_tolerance": _bias_tolerance(X, wide.b, lam) if b is None else None,
            "points_beyond_lam": int(beyond.sum()),
            "cert_ratio": cert_ratio(R, lam), "min_G": float(np.min(certificate_matrix(R, lam))),
            "slack": certificate_slack(R, dnn.Q, lam),
            "closed_residual_norm_error": float(np.max(np.abs(norms[beyond] - lam), initial=0.0)),
            "closed_inside_residual_error": float(np.max(np.abs(R_closed[:, ~beyond] - centred(X, wide.b)[:, ~beyond]),
                                                         initial=0.0)),
            "closed_slack": certificate_slack(R_closed, np.diag(closed.q_diag), lam),
            "certified_gap": wide.certified_gap, "solver": dnn.solver,
        })
    controls = _certificate_controls(*_global_optimum_cases(ctx)[1][1:3])
    tol = {"value": 1e-6, "Q": 2e-4, "b": "max(1e-4, sqrt(2·1e-8/μ)) per data set", "cert_ratio_minus_one": 1e-4,
           "min_G": -1e-4, "slack": 1e-5, "closed_form_identities": 1e-12, "certified_gap": 1e-10}
    worst = {
        "value_diff": max(r["value_diff"] for r in rows),
        "q_diff": max(r["q_diff"] for r in rows if r["q_diff"] is not None),
        "b_diff": max(r["b_diff"] for r in rows if r["b_diff"] is not None),
        "b_diff_over_tolerance": max(r["b_diff"] / r["b_tolerance"] for r in rows if r["b_diff"] is not None),
        "cert_ratio_minus_one": max(abs(r["cert_ratio"] - 1.0) for r in rows),
        "min_G": min(r["min_G"] for r in rows),
        "max_abs_slack": max(abs(r["slack"]) for r in rows),
        "closed_form_identity_error": max(max(r["closed_residual_norm_error"], r["closed_inside_residual_error"],
                                              abs(r["closed_slack"])) for r in rows),
        "min_points_beyond_lam": min(r["points_beyond_lam"] for r in rows),
        "certified_gap": max(abs(r["certified_gap"]) for r in rows),
    }
    passed = (worst["value_diff"] <= tol["value"] and worst["q_diff"] <= tol["Q"] and worst["b_diff_over_tolerance"] <= 1
              and worst["min_points_beyond_lam"] > 0 and worst["cert_ratio_minus_one"] <= tol["cert_ratio_minus_one"]
              and worst["min_G"] >= tol["min_G"] and worst["max_abs_slack"] <= tol["slack"]
              and worst["closed_form_identity_error"] <= tol["closed_form_identities"]
              and worst["certified_gap"] <= tol["certified_gap"])
    return Outcome(
        measured=worst, tolerance=tol, passed=passed, controls=controls,
        tolerance_reason="The conic solver (Clarabel, gap/feasibility tolerances 1e-9) returns Q to about 1e-4 on "
        "the optimal face, which the spec's reference solves also reached (§9 C1/C2: 1e-6 in value, 2e-4 in Q, "
        "1e-4 in b). Where H is flat (μ = smallest eigenvalue of ∇²H at b* small, e.g. two equal clusters: "
        "the median is nearly a segment) a value accuracy of 1e-8 only pins b to sqrt(2·1e-8/μ), so that is the b "
        "tolerance when larger; the solver's residual norms and ⟨G, Q⟩ carry the same ~1e-5 error (measured ≤ 7e-6 "
        "and 3e-6). Every data set has a point beyond λ, so max‖r_i‖ = λ is an equality there, asserted both ways. "
        "The closed form and its certificate are exact up to float64 rounding (≤ 1e-12).",
        details={"cases": rows},
    )


@check(
    "wide.ray_clustering",
    "Ray clustering gives the narrowest optimal dictionary; merging two rays raises the loss",
    "docs/theory.md §4.4",
    predicted="Reference (D): at b = 0 three rays attain the optimum 0.670278 exactly in objective (1); with "
    "learned b (0.089407, 0.017366) eight rays. Any two rays forced to share an atom leave the loss above the optimum.",
    kind="theorem",
    source=f"{THEORY_PAPER}: the narrowest optimal dictionary clusters rays; docs/theory.md §4.4",
    regime="the reference toy of docs/theory.md §4.4; exact objective",
)
def ray_clustering(ctx: CheckContext) -> Outcome:
    toy = make_toy("rays_reference")
    X, lam = toy.X, toy.lam
    at_zero = solve_wide_limit(X, lam, b=np.zeros(2))
    learned = solve_wide_limit(X, lam)
    merged = []
    for k, l in itertools.combinations(range(at_zero.n_rays), 2):
        keep = [j for j in range(at_zero.n_rays) if j not in (k, l)]
        shared = at_zero.rays.atoms[:, k] + at_zero.rays.atoms[:, l]
        W0 = np.column_stack([at_zero.rays.atoms[:, keep], shared / np.linalg.norm(shared)])
        fit = fit_reference(X, lam, W0=W0, b0=np.zeros(2), learn_bias=False)
        merged.append({"merged_rays": [k, l], "objective": fit.objective, "excess": fit.objective - at_zero.objective})
    ref = toy.ground_truth["reference"]
    measured = {
        "n_rays_b0": at_zero.n_rays, "objective_b0": at_zero.objective,
        "attained_minus_optimum_b0": at_zero.attained_objective - at_zero.objective,
        "n_rays_learned": learned.n_rays, "b_learned": learned.b, "objective_learned": learned.objective,
        "attained_minus_optimum_learned": learned.attained_objective - learned.objective,
        "min_excess_when_two_rays_share_an_atom": min(m["excess"] for m in merged),
    }
    tol = {"spec_values": 5e-7, "attained": 1e-12, "min_excess": 1e-6}
    controls = [negative_control("two_rays_sharing_an_atom", measured=measured["min_excess_when_two_rays_share_an_atom"],
                                 threshold=tol["min_excess"],
                                 what="the objective above the optimum when two rays must share one atom")]
    passed = (
        at_zero.n_rays == ref["b0_n_rays"] and learned.n_rays == ref["learned_b_n_rays"]
        and abs(at_zero.objective - ref["b0_mean_objective"]) <= tol["spec_values"]
        and abs(learned.objective - ref["learned_b_mean_objective"]) <= tol["spec_values"]
        and np.max(np.abs(learned.b - np.array(ref["huber_median"]))) <= tol["spec_values"]
        and abs(measured["attained_minus_optimum_b0"]) <= tol["attained"]
        and abs(measured["attained_minus_optimum_learned"]) <= tol["attained"]
    )
    fig = plot_wide_limit_2d(ctx.figure_path("wide_limit_rays_2d.png"), [
        {"title": f"b = 0: {at_zero.n_rays} rays, objective {at_zero.objective:.6f}", "X": X, "b": at_zero.b,
         "lam": lam, "atoms": at_zero.rays.atoms, "assignment": at_zero.rays.assignment},
        {"title": f"learned b*: {learned.n_rays} rays, objective {learned.objective:.6f}", "X": X, "b": learned.b,
         "lam": lam, "atoms": learned.rays.atoms, "assignment": learned.rays.assignment},
    ])
    return Outcome(
        measured=measured, tolerance=tol, passed=passed, controls=controls,
        tolerance_reason="Spec values are printed to 6 decimals (±5e-7); the ray dictionary's attained value is "
        "computed in closed form (rounding ~1e-15); a merged dictionary must lose by far more than the reference "
        "learner's stationarity (~1e-8) to count as a real increase.",
        details={"merged": merged, "ray_tol": at_zero.rays.tolerance,
                 "note": "merged dictionaries are local optima of the reference learner started from the merged atoms"},
        figures=[str(fig.relative_to(ctx.out_dir))],
    )


@check(
    "wide.huber_vs_geometric_median",
    "Huber median = geometric median iff no point lies within λ of it",
    "docs/theory.md §4.3",
    predicted="Spread data, λ below every distance to the geometric median: the two coincide. Crowded data (C3, "
    "λ = 0.8): Huber median (0.241520, 0.284281), mean 1.855247; geometric median (0.070623, 0.071584), mean "
    "distance 1.427347; Huber objective at the geometric median 1.898639 > 1.855247.",
    kind="theorem",
    source=f"{THEORY_PAPER}: the optimal bias is a Huber-smoothed geometric median; docs/theory.md §4.3",
    regime="spread and crowded 2-D data; exact medians",
)
def huber_vs_geometric_median(ctx: CheckContext) -> Outcome:
    rng = ctx.rng("wide.huber_vs_geometric_median")
    spread_diffs, skipped = [], 0
    while len(spread_diffs) < 5:
        X = rng.normal(size=(3, 25)) * rng.uniform(0.5, 3.0)
        gm = geometric_median(X)
        nearest = float(np.min(np.linalg.norm(X - gm.b[:, None], axis=0)))
        if nearest <= 1e-6 * float(np.max(np.abs(X))):
            skipped += 1  # the median sits on a data point: no λ > 0 meets the premise
            continue
        spread_diffs.append(float(np.linalg.norm(huber_median(X, 0.5 * nearest).b - gm.b)))
    toy = make_toy("crowded_median")
    ref = toy.ground_truth["reference"]
    hm, gm = huber_median(toy.X, toy.lam), geometric_median(toy.X)
    huber_at_gm = huber_objective(gm.b, toy.X, toy.lam)
    measured = {
        "max_spread_median_distance": max(spread_diffs), "crowded_huber_median": hm.b,
        "crowded_huber_objective": hm.objective, "crowded_geometric_median": gm.b,
        "crowded_mean_distance": gm.objective, "crowded_huber_objective_at_geometric_median": huber_at_gm,
        "crowded_median_distance": float(np.linalg.norm(hm.b - gm.b)),
    }
    tol = {"coincide": 1e-8, "spec_values": 5e-7}
    spec_err = max(
        float(np.max(np.abs(hm.b - np.array(ref["huber_median"])))), abs(hm.objective - ref["mean_objective"]),
        float(np.max(np.abs(gm.b - np.array(ref["geometric_median"])))), abs(gm.objective - 1.427347),
        abs(huber_at_gm - 1.898639),
    )
    passed = max(spread_diffs) <= tol["coincide"] and spec_err <= tol["spec_values"]
    controls = [
        negative_control("medians_differ_when_points_lie_within_lambda", measured=measured["crowded_median_distance"],
                         threshold=1e-3, what="‖Huber median − geometric median‖ on the crowded data (C3)",
                         reference=float(np.linalg.norm(np.array(ref["huber_median"]) - np.array(ref["geometric_median"]))),
                         rtol=1e-5),
        negative_control("huber_objective_higher_at_the_geometric_median", measured=huber_at_gm - hm.objective,
                         threshold=1e-3, what="H(geometric median) − H(Huber median) there",
                         reference=1.898639 - ref["mean_objective"], rtol=1e-4),
    ]
    return Outcome(
        measured=measured, tolerance=tol, passed=passed, controls=controls,
        tolerance_reason="Both medians are solved to a gradient norm ≤ 1e-10 (distance error ≲ 1e-9 on these "
        "well-conditioned sets); the spec prints its reference values to 6 decimals.",
        details={"max_spec_value_error": spec_err, "spread_draws_skipped_median_on_a_point": skipped},
    )
