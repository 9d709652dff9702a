"""Checks of the local optimality conditions for narrow dictionaries (docs/theory.md §3, §5.2–§5.4)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from dictcheck.empirics.data.toys import Toy, make_toy
from dictcheck.proofs_checks.figures import plot_absorption, plot_firing_against_p
from dictcheck.proofs_checks.registry import CheckContext, Control, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import REFERENCE_LEARNER, THEORY_PAPER
from dictcheck.solvers.hull_distance import HULL_CANDIDATES, hull_candidate_distances
from dictcheck.solvers.lasso_codes import exact_codes, kkt_violation
from dictcheck.solvers.reference_learner import ReferenceFit, fit_reference
from dictcheck.solvers.stream_diagnostics import SparseCodes, column_batches, nested_pairs_of_codes, stream_diagnostics
from dictcheck.theory.diagnostics import (
    DictionaryDiagnostics,
    correlations,
    dictionary_diagnostics,
    gain,
    hull_prime_summands,
    most_antipodal_pair,
    residuals,
)
from dictcheck.theory.diagnostics import kkt_violation as kkt_of_correlations  # the standalone one is its reference
from dictcheck.theory.huber import huber_objective

STATIONARY_TOL = 1e-8
PERTURBATION = 0.05
#: The bias of narrow.bias_identity's negative control: the optimum's moved by this many λ in a random direction.
BIAS_SHIFT = 0.5
#: Points per batch of the streamed diagnostics, the independent computation the negative controls compare with
#: (small, so that their sums run in another order than the reference's).
STREAM_BATCH = 64
#: Agreement of a diagnostic with its streamed computation at a perturbed point (both float64; the sums differ
#: in order only).
CROSS_CHECK_RTOL = 1e-9


def _ground_truth_start(toy: Toy) -> tuple[np.ndarray, np.ndarray]:
    """Unit-atom start at the ground truth: W_true and codes (Z_true − λ)₊ (docs/theory.md §5.2)."""
    return toy.ground_truth["W_true"], np.maximum(toy.ground_truth["Z_true"] - toy.lam, 0.0)


@lru_cache(maxsize=16)
def toy_reference_fit(name: str, seed: int, spare: bool = False, **params: float) -> tuple[Toy, ReferenceFit]:
    """Reference-learner fit of a toy from its ground truth (plus the §5.4 spare latent if asked)."""
    toy = make_toy(name, seed=seed, **params)
    W0, Z0 = _ground_truth_start(toy)
    if spare:
        W0 = np.column_stack([W0, -W0[:, 0]])
        Z0 = np.vstack([Z0, 0.3 * (~toy.ground_truth["dense_on"])])
    b0 = toy.ground_truth.get("b_true", np.zeros(toy.X.shape[0]))
    return toy, fit_reference(toy.X, toy.lam, W0=W0, Z0=Z0, b0=b0, learn_bias=toy.learn_bias)


def _diagnose(toy: Toy, fit: ReferenceFit) -> DictionaryDiagnostics:
    return dictionary_diagnostics(fit.W, fit.Z, fit.b, toy.X, toy.lam, learned_bias=toy.learn_bias)


def _perturbed(W: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    Wp = W + PERTURBATION * rng.normal(size=W.shape)
    return Wp / np.linalg.norm(Wp, axis=0)


def _streamed(W: np.ndarray, Z: np.ndarray, b: np.ndarray, X: np.ndarray, lam: float,
              learned_bias: bool = False) -> DictionaryDiagnostics:
    """The same diagnostics computed independently (:func:`dictcheck.solvers.stream_diagnostics.stream_diagnostics`:
    sums over batches of points, none of theory.diagnostics' functions), the reference of the negative controls."""
    return stream_diagnostics(W, SparseCodes.from_dense(Z), b, column_batches(X, STREAM_BATCH), lam,
                              learned_bias=learned_bias).diagnostics


def _control(name: str, measured: float, threshold: float, what: str, reference: float) -> Control:
    """A negative control whose measurement must exceed ``threshold`` and equal its streamed computation."""
    return negative_control(name, measured=measured, threshold=threshold, what=what, reference=reference,
                            rtol=CROSS_CHECK_RTOL)


@check(
    "narrow.kkt",
    "KKT-z (R1) at the reference learner's optimum, and its failure at a perturbed dictionary",
    "docs/theory.md §1 (KKT-z), §3 R1",
    predicted=f"Independent-features toy: at the reference optimum max |φ_id − 1| on supports and (φ_id − 1)₊ off "
    f"them ≤ {STATIONARY_TOL:g}; the exact codes of the learned dictionary equal the learner's codes; with the codes "
    f"held fixed and the atoms perturbed by N(0, {PERTURBATION}²) the violation exceeds 1e-3.",
    kind="theorem",
    source=f"{THEORY_PAPER}: KKT conditions of the codes (feature-residual constraints); docs/theory.md §1, §3 R1",
    regime=f"{REFERENCE_LEARNER}",
)
def narrow_kkt(ctx: CheckContext) -> Outcome:
    toy, fit = toy_reference_fit("independent_features", ctx.seed)
    at_opt = _diagnose(toy, fit)
    codes = exact_codes(fit.W, toy.X, fit.b, toy.lam)
    Wp = _perturbed(fit.W, ctx.rng("narrow.kkt"))
    perturbed = dictionary_diagnostics(Wp, fit.Z, fit.b, toy.X, toy.lam)
    streamed = _streamed(Wp, fit.Z, fit.b, toy.X, toy.lam)
    active = fit.Z > perturbed.tau_act
    Phi = correlations(Wp, residuals(Wp, fit.Z, fit.b, toy.X), toy.lam)
    summands = [hull_prime_summands(Phi, fit.Z, active, d, j)
                for d in range(fit.W.shape[1]) for j in range(fit.W.shape[1]) if d != j]
    min_summand = min((float(s.min()) for s in summands if s.size), default=np.inf)
    measured = {"kkt_at_optimum": at_opt.kkt_violation, "kkt_perturbed": perturbed.kkt_violation,
                "max_code_difference_exact_vs_learner": float(np.max(np.abs(codes.Z - fit.Z))),
                "exact_codes_kkt": codes.kkt_violation}
    tol = {"kkt_at_optimum": STATIONARY_TOL, "kkt_perturbed_min": 1e-3, "code_difference": 1e-6}
    passed = (at_opt.kkt_violation <= tol["kkt_at_optimum"]
              and measured["max_code_difference_exact_vs_learner"] <= tol["code_difference"])
    # The learner's codes held fixed at perturbed atoms: KKT-z breaks (some φ_id > 1 off the support), so the
    # (5′) summands π_ji(1 − φ_id) go negative; each measured two independent ways.
    controls = [
        _control("kkt_at_perturbed_atoms", perturbed.kkt_violation, tol["kkt_perturbed_min"],
                 "KKT-z violation with the atoms perturbed by N(0, 0.05²) and the codes fixed",
                 kkt_violation(Wp, fit.Z, toy.X, fit.b, toy.lam, tau_act=perturbed.tau_act)),
        _control("kkt_at_perturbed_atoms_streamed", streamed.kkt_violation, tol["kkt_perturbed_min"],
                 "the same violation, streamed", perturbed.kkt_violation),
        _control("kkt_of_the_correlations_at_perturbed_atoms", kkt_of_correlations(Phi, active),
                 tol["kkt_perturbed_min"], "max entrywise KKT-z violation of Φ there", streamed.kkt_violation),
        _control("min_5_prime_summand_at_perturbed_atoms", -perturbed.hull_prime_min_summand, 1e-6,
                 "−(smallest (5′) summand π_ji(1 − φ_id)) there", -streamed.hull_prime_min_summand),
        _control("min_5_prime_summand_from_the_summands", -min_summand, 1e-6,
                 "−(smallest summand listed by hull_prime_summands) there", -perturbed.hull_prime_min_summand),
    ]
    return Outcome(measured=measured, tolerance=tol, passed=passed, controls=controls,
                   tolerance_reason="The reference learner (L-BFGS-B + Newton polish, float64) reaches ~1e-13; "
                   "1e-8 is the issue's bar. A 0.05 perturbation moves φ by O(0.05·‖r‖/λ) ≫ 1e-3; the streamed "
                   "and standalone computations of a violation agree to rounding (1e-9 relative).",
                   details={"objective": fit.objective, "iterations": fit.iterations})


@check(
    "narrow.atom_stationarity",
    "Each atom is the activation-weighted mean of its residuals divided by λ (S1)",
    "docs/theory.md §3 S1, R2",
    predicted=f"At the reference optimum max_d ‖ŵ_d − Σ_i π_di r_i/λ‖ ≤ {STATIONARY_TOL:g} (learner codes and exact "
    "codes); at a perturbed dictionary with its own exact codes KKT still holds but S1 fails by more than 1e-3.",
    kind="theorem",
    source=f"{THEORY_PAPER}: atom stationarity (feature-residual constraints); docs/theory.md §3 S1",
    regime=f"{REFERENCE_LEARNER}",
)
def narrow_atom_stationarity(ctx: CheckContext) -> Outcome:
    toy, fit = toy_reference_fit("independent_features", ctx.seed)
    at_opt = _diagnose(toy, fit)
    codes = exact_codes(fit.W, toy.X, fit.b, toy.lam)
    exact_opt = dictionary_diagnostics(fit.W, codes.Z, fit.b, toy.X, toy.lam)
    Wp = _perturbed(fit.W, ctx.rng("narrow.atom_stationarity"))
    Zp = exact_codes(Wp, toy.X, fit.b, toy.lam).Z
    perturbed = dictionary_diagnostics(Wp, Zp, fit.b, toy.X, toy.lam)
    streamed = _streamed(Wp, Zp, fit.b, toy.X, toy.lam)
    measured = {"s1_at_optimum": at_opt.stationarity_violation, "s1_exact_codes": exact_opt.stationarity_violation,
                "r2_at_optimum": at_opt.r2_violation, "s1_perturbed": perturbed.stationarity_violation,
                "kkt_perturbed_exact_codes": perturbed.kkt_violation}
    tol = {"s1": STATIONARY_TOL, "s1_perturbed_min": 1e-3, "kkt_exact": STATIONARY_TOL}
    passed = (max(at_opt.stationarity_violation, exact_opt.stationarity_violation, at_opt.r2_violation) <= tol["s1"]
              and perturbed.kkt_violation <= tol["kkt_exact"])
    controls = [
        _control("s1_at_perturbed_atoms", perturbed.stationarity_violation, tol["s1_perturbed_min"],
                 "S1 at atoms perturbed by N(0, 0.05²) with their own exact codes", streamed.stationarity_violation),
        _control("r2_at_perturbed_atoms", perturbed.r2_violation, tol["s1_perturbed_min"],
                 "R2 (the part of S1 perpendicular to ŵ_d) there", streamed.r2_violation),
    ]
    return Outcome(measured=measured, tolerance=tol, passed=passed, controls=controls,
                   tolerance_reason="S1 is exact at a stationary point; the learner reaches ~1e-13 and exact codes "
                   "~1e-13 relative KKT. A 0.05 atom perturbation changes ŵ_d by ~0.05, far above 1e-3; the "
                   "streamed computation agrees to rounding.")


@check(
    "narrow.bias_identity",
    "Bias identity (4): mean of φ_id over points where d is off equals −p_d/(1 − p_d)",
    "docs/theory.md §3 (4)",
    predicted=f"At learned-bias reference optima (independent features; dense feature with d_z = 3 and 4) every "
    f"atom with 0 < p_d < 1 satisfies (4) to {STATIONARY_TOL:g}, and ‖R1‖/N ≤ {STATIONARY_TOL:g}.",
    kind="theorem",
    source=f"{THEORY_PAPER}: the learned-bias identity; docs/theory.md §3 (4)",
    regime=f"{REFERENCE_LEARNER}",
)
def narrow_bias_identity(ctx: CheckContext) -> Outcome:
    rows = []
    for name, seed, spare in [("independent_features", ctx.seed, False), ("dense_feature", 1, False),
                              ("dense_feature", 1, True)]:
        toy, fit = toy_reference_fit(name, seed, spare)
        d = _diagnose(toy, fit)
        rows.append({"toy": name + (" + spare" if spare else ""), "violation": d.bias_identity_violation,
                     "residual_mean_norm": d.bias_residual_mean_norm, "off_mean": d.bias_off_mean,
                     "target": d.bias_target, "firing_fraction": d.firing_fraction})
    worst = max(r["violation"] for r in rows)
    worst_r1 = max(r["residual_mean_norm"] for r in rows)
    # The bias moved off its optimum by BIAS_SHIFT·λ (codes exact for the moved bias): Σ r_i ≠ 0, so (4) breaks.
    toy, fit = toy_reference_fit("independent_features", ctx.seed)
    u = ctx.rng("narrow.bias_identity").normal(size=fit.b.shape)
    b_shifted = fit.b + BIAS_SHIFT * toy.lam * u / np.linalg.norm(u)
    Z_shifted = exact_codes(fit.W, toy.X, b_shifted, toy.lam).Z
    shifted = dictionary_diagnostics(fit.W, Z_shifted, b_shifted, toy.X, toy.lam, learned_bias=True)
    streamed = _streamed(fit.W, Z_shifted, b_shifted, toy.X, toy.lam, learned_bias=True)
    controls = [
        _control("bias_identity_at_a_shifted_bias", shifted.bias_identity_violation, 1e-3,
                 f"(4)'s violation with b moved by {BIAS_SHIFT:g}·λ", streamed.bias_identity_violation),
        _control("residual_mean_at_a_shifted_bias", shifted.bias_residual_mean_norm / toy.lam, 1e-3,
                 "‖R1‖/(Nλ) there", streamed.bias_residual_mean_norm / toy.lam),
    ]
    return Outcome(measured={"max_violation": worst, "max_residual_mean_norm": worst_r1},
                   tolerance=STATIONARY_TOL, passed=worst <= STATIONARY_TOL and worst_r1 <= STATIONARY_TOL,
                   controls=controls,
                   tolerance_reason="(4) follows exactly from Σ r_i = 0 and KKT-z; the learner's stationarity is ~1e-13. "
                   "A bias shifted by half of λ moves the mean residual by O(λ/2), far above 1e-3.",
                   details={"fits": rows, "shifted_bias": {"violation": shifted.bias_identity_violation,
                                                            "residual_mean_norm": shifted.bias_residual_mean_norm}})


@check(
    "narrow.hull_condition",
    "Convex-hull condition (5) holds at optima; which hull form of the paper's eq. 6 holds (open question)",
    "docs/theory.md §3 (5), (5′), §8 Q1",
    predicted="(5) holds exactly: c_d· = Σ_{i∈A_d} π_di φ_i (identity ≤ 1e-8, distance to conv{φ_i : i ∈ A_d} ≤ 1e-6) "
    "at every live atom of every toy's reference optimum. The inactive-point forms (H-inact-res, H-inact-data) and "
    "H-act-data are open; they are measured, not predicted.",
    kind="theorem",
    source=f"{THEORY_PAPER}: the convex-hull condition (feature-feature constraints, eq. 6); docs/theory.md §3 "
    "(5)",
    regime=f"{REFERENCE_LEARNER}; the eq. 6 variants are measured (open question §8 Q1)",
)
def narrow_hull_condition(ctx: CheckContext) -> Outcome:
    fits = [("independent_features", ctx.seed, False), ("parent_child", ctx.seed, False),
            ("dense_feature", 1, False), ("dense_feature", 1, True)]
    per_toy, identity, control = [], 0.0, 0.0
    fractions = {name: [] for name in HULL_CANDIDATES}
    for name, seed, spare in fits:
        toy, fit = toy_reference_fit(name, seed, spare)
        d = _diagnose(toy, fit)
        hull = hull_candidate_distances(fit.W, fit.Z, fit.b, toy.X, toy.lam)
        identity = max(identity, d.hull_violation)
        control = max(control, float(np.nanmax(hull.distances["H-act-res"])))
        row = {"toy": name + (" + spare" if spare else ""), "identity_5": d.hull_violation,
               "identity_5_prime": d.hull_prime_violation, "min_5_prime_summand": d.hull_prime_min_summand}
        for cand in HULL_CANDIDATES:
            within = hull.fraction_within(1e-6)[cand]
            row[f"{cand} fraction within 1e-6"] = within
            row[f"{cand} max distance"] = float(np.nanmax(hull.distances[cand])) if np.any(np.isfinite(hull.distances[cand])) else None
            fractions[cand].append(within)
        per_toy.append(row)
    holds_everywhere = {c: bool(all(f == 1.0 for f in v if f == f)) for c, v in fractions.items()}
    toy, fit = toy_reference_fit("independent_features", ctx.seed)
    Wp = _perturbed(fit.W, ctx.rng("narrow.hull_condition"))
    Zp = exact_codes(Wp, toy.X, fit.b, toy.lam).Z
    perturbed = dictionary_diagnostics(Wp, Zp, fit.b, toy.X, toy.lam)
    streamed = _streamed(Wp, Zp, fit.b, toy.X, toy.lam)
    controls = [
        _control("identity_5_at_perturbed_atoms", perturbed.hull_violation, 1e-3,
                 "(5)'s violation at atoms perturbed by N(0, 0.05²) with their exact codes", streamed.hull_violation),
        _control("identity_5_prime_at_perturbed_atoms", perturbed.hull_prime_violation, 1e-3,
                 "(5′)'s violation there", streamed.hull_prime_violation),
    ]
    finding = ("Eq. 6 question: " + "; ".join(f"{c} {'holds at every atom' if ok else 'fails at some atom'}"
                                              for c, ok in holds_everywhere.items())
               + ". Only forms that hold at every stationary point are consistent with the paper's statement.")
    return Outcome(measured={"max_identity_5": identity, "max_distance_H_act_res": control,
                             "holds_at_every_atom": holds_everywhere},
                   tolerance={"identity_5": STATIONARY_TOL, "distance": 1e-6},
                   passed=identity <= STATIONARY_TOL and control <= 1e-6, controls=controls,
                   tolerance_reason="(5) is an identity at stationary points (learner precision ~1e-13); the hull QP "
                   "(Wolfe min-norm point) is exact to ~1e-11 relative, 1e-6 separates 'in the hull' from clear misses.",
                   details={"per_toy": per_toy}, finding=finding)


@check(
    "narrow.absorption",
    "Parent/child hierarchy: the ground truth is not stationary and the optimum absorbs",
    "docs/theory.md §3 S4, §5.2",
    predicted="Ground-truth atoms I₃ with exact codes are not stationary (S1 > 0.1) and have nested supports; the "
    "stationary point reached from them has no nested supports, an objective between the wide-limit bound and the "
    "start, and absorption: the parent is off on some child points and/or the children tilt toward the parent (cos > 0.1).",
    kind="theorem",
    source=f"{THEORY_PAPER}: absorption in hierarchies; docs/theory.md §3 S4, §5.2",
    regime=f"{REFERENCE_LEARNER}",
)
def narrow_absorption(ctx: CheckContext) -> Outcome:
    toy, fit = toy_reference_fit("parent_child", ctx.seed)
    X, lam, labels = toy.X, toy.lam, toy.ground_truth["labels"]
    W_true = toy.ground_truth["W_true"]
    gt_codes = exact_codes(W_true, X, np.zeros(3), lam)
    gt = dictionary_diagnostics(W_true, gt_codes.Z, np.zeros(3), X, lam)
    opt = _diagnose(toy, fit)
    parent = int(np.argmax(np.abs(fit.W[0])))
    children = [d for d in range(3) if d != parent]
    active = fit.Z > opt.tau_act
    parent_off = {f"child {c}": int(np.sum(~active[parent][labels == c])) for c in (1, 2)}
    tilt = [float(fit.W[:, parent] @ fit.W[:, d]) for d in children]
    bound = huber_objective(np.zeros(3), X, lam)
    start = fit.start_objective
    measured = {"gt_stationarity_violation": gt.stationarity_violation, "gt_nested_pairs": gt.nested_pairs,
                "opt_nested_pairs": opt.nested_pairs, "opt_stationarity_violation": opt.stationarity_violation,
                "objective_sum": {"ground_truth_exact_codes": gt.objective * toy.N, "start": start * toy.N,
                                  "optimum": fit.objective_sum, "wide_limit_bound": bound * toy.N},
                "parent_off_on_child_points": parent_off, "child_parent_cosines": tilt}
    absorbed = sum(parent_off.values()) > 0 or max(tilt) > 0.1
    passed = (not opt.nested_pairs and opt.stationarity_violation <= STATIONARY_TOL and bound < fit.objective < start
              and absorbed)
    # The ground truth is the point where the identities break: S1 is O(1) and its supports nest.
    streamed = _streamed(W_true, gt_codes.Z, np.zeros(3), X, lam)
    streamed_pairs = nested_pairs_of_codes(SparseCodes.from_dense(gt_codes.Z), gt.tau_act)
    direct_defects = [1.0 - float(W_true[:, d] @ W_true[:, j]) for d, j in gt.nested_pairs]
    controls = [
        _control("s1_at_the_ground_truth", gt.stationarity_violation, 0.1, "S1 at the ground-truth atoms I₃",
                 streamed.stationarity_violation),
        _control("nested_pairs_at_the_ground_truth", float(len(gt.nested_pairs)), 0.5,
                 "the number of nested support pairs there (bitsets of the streamed codes: the reference)",
                 float(len(streamed_pairs))),
        _control("nesting_cosine_defect_at_the_ground_truth", float(np.max(gt.nesting_cosine_defect, initial=0.0)),
                 0.5, "the largest 1 − c_dj over those pairs", max(direct_defects, default=0.0)),
    ]
    before_after = ctx.figure_path("absorption_atoms.png")
    plot_absorption(before_after, X, labels, W_true, fit.W)
    return Outcome(measured=measured, tolerance={"gt_s1_min": 0.1, "opt_s1": STATIONARY_TOL, "tilt_cos": 0.1},
                   passed=passed, controls=controls, tolerance_reason="The spec's robust assertions (§5.2): non-stationarity is O(1), far "
                   "above 0.1; stationarity of the optimum to the learner's precision; tilt measured against 0.1.",
                   details={"spec_seeded_reference": "sums 51.74 / 50.63 / 43.26, bound 42.09; cos 0.629, 0.610; "
                            "parent on 22/30 and 20/30 child points (different random stream)"},
                   figures=[str(before_after.relative_to(ctx.out_dir))])


@check(
    "narrow.antipodal_50pct",
    "The 50% rule: a dense feature splits into an antipodal pair when a spare latent exists",
    "docs/theory.md §3 S6, §5.4",
    predicted="Dense-feature toy (p = 0.7): with d_z = 3 the dense atom fires on > 1/2 of the points, (4) holds to "
    "1e-4 and its antipode gain is positive; with a spare latent (d_z = 4) the optimum has a pair with cosine < −0.99 "
    "whose members each fire on ≤ 1/2 + 2/N of the points, at a lower objective.",
    kind="theorem",
    source=f"{THEORY_PAPER}: the 50% rule in a narrow dictionary; docs/theory.md §3 S6, §5.4",
    regime=f"{REFERENCE_LEARNER}",
)
def narrow_antipodal_50pct(ctx: CheckContext) -> Outcome:
    toy3, fit3 = toy_reference_fit("dense_feature", 1)
    toy4, fit4 = toy_reference_fit("dense_feature", 1, True)
    d3 = _diagnose(toy3, fit3)
    dense = int(np.argmax(np.abs(fit3.W[0])))
    d, j, cos = most_antipodal_pair(fit4.W)
    p4 = fit4.firing_fraction
    N = toy3.N
    measured = {"dz3_dense_firing": float(d3.firing_fraction[dense]), "dz3_dense_antipode_gain": float(d3.antipode_gain[dense]),
                "dz3_bias_identity_violation": d3.bias_identity_violation, "dz4_pair_cosine": cos,
                "dz4_pair_firing": [float(p4[d]), float(p4[j])], "objective_sum": [fit3.objective_sum, fit4.objective_sum]}
    passed = (d3.firing_fraction[dense] > 0.5 and d3.bias_identity_violation <= 1e-4
              and cos < -0.99 and max(p4[d], p4[j]) <= 0.5 + 2 / N and fit4.objective < fit3.objective)
    # d_z = 3 is the point where the 50% rule says the optimum breaks: the dense atom's antipode gains.
    streamed3 = _streamed(fit3.W, fit3.Z, fit3.b, toy3.X, toy3.lam, learned_bias=True)
    R3 = residuals(fit3.W, fit3.Z, fit3.b, toy3.X)
    controls = [
        _control("antipode_gain_of_the_dense_atom_at_d_z_3", float(d3.antipode_gain[dense]), 1e-6,
                 "gain(−ŵ)/N of the atom firing on more than half the points", float(streamed3.antipode_gain[dense])),
        _control("gain_of_its_antipode", gain(-fit3.W[:, dense], R3, toy3.lam) / N, 1e-6,
                 "the gain lemma's Σ_i (−ŵᵀr_i − λ)₊²/N for it", float(streamed3.antipode_gain[dense])),
        _control("firing_of_the_dense_atom_at_d_z_3", float(d3.firing_fraction[dense]), 0.5,
                 "its firing fraction p_d", float(streamed3.firing_fraction[dense])),
    ]
    grid = np.array([0.3, 0.45, 0.55, 0.6, 0.7, 0.8, 0.9]) if ctx.quick else np.linspace(0.3, 0.9, 13)
    without, with_spare = [], []
    for p in grid:
        t3, f3 = toy_reference_fit("dense_feature", 1, False, p_dense=float(p))
        without.append(float(f3.firing_fraction[int(np.argmax(np.abs(f3.W[0])))]))
        t4, f4 = toy_reference_fit("dense_feature", 1, True, p_dense=float(p))
        dense_atoms = np.flatnonzero(np.abs(f4.W[0]) > 0.9)
        with_spare.append(float(np.max(f4.firing_fraction[dense_atoms])) if dense_atoms.size else float("nan"))
    fig = plot_firing_against_p(ctx.figure_path("antipodal_firing_vs_p.png"), grid, np.array(without), np.array(with_spare))
    return Outcome(measured=measured, tolerance={"pair_cosine": -0.99, "firing_max": 0.5 + 2 / N, "bias_identity": 1e-4},
                   passed=passed, controls=controls, tolerance_reason="The spec's robust assertions (§5.4): 2/N allows one point either "
                   "way at the threshold; (4) to 1e-4 as the spec states.",
                   details={"sweep_p": grid, "sweep_firing_dz3": without, "sweep_max_firing_dz4": with_spare,
                            "spec_seeded_reference": "sums 70.40 (d_z=3), 53.57 (d_z=4); pair cos −0.99977; firing 0.455/0.465"},
                   figures=[str(fig.relative_to(ctx.out_dir))])
