"""The 50% threshold for a dense scalar feature in the wide limit (docs/theory.md §5.1, §3 S6) and its L0
analogue (§5.5)."""

from __future__ import annotations

import numpy as np

from dictcheck.empirics.data.toys import make_toy
from dictcheck.proofs_checks.figures import plot_threshold_1d
from dictcheck.proofs_checks.registry import CheckContext, Outcome, check, negative_control
from dictcheck.proofs_checks.sources import THEORY_PAPER
from dictcheck.solvers.l0_scalar import l0_fit, l0_fit_exhaustive, l0_optimum
from dictcheck.solvers.wide_limit import solve_wide_limit
from dictcheck.theory.dense_scalar import L0_ATOM_SETS, dense_scalar_optimum, l0_uniform_optimum, l0_uniform_threshold
from dictcheck.theory.symbolic import dense_scalar_bias

# docs/theory.md §5.1 deterministic table (a = 2, N = 1000): λ → p → (b*, mean objective)
_SPEC_TABLE = {
    0.1: {0.20: (0.025000, 0.077500), 0.40: (0.066667, 0.153333), 0.49: (0.096078, 0.186392),
          0.51: (1.903922, 0.186392), 0.60: (1.933333, 0.153333), 0.80: (1.975000, 0.077500)},
    0.3: {0.20: (0.075000, 0.217500), 0.40: (0.200000, 0.420000), 0.49: (0.288235, 0.501529),
          0.51: (1.711765, 0.501529), 0.60: (1.800000, 0.420000), 0.80: (1.925000, 0.217500)},
    0.6: {0.20: (0.150000, 0.390000), 0.40: (0.400000, 0.720000), 0.49: (0.576471, 0.830118),
          0.51: (1.423529, 0.830118), 0.60: (1.600000, 0.720000), 0.80: (1.850000, 0.390000)},
}
_SPEC_DEGENERATE = {0.20: (0.375, "+u"), 0.40: (0.8, "none"), 0.49: (0.98, "none"), 0.51: (1.02, "none"),
                    0.60: (1.2, "none"), 0.80: (1.625, "-u")}  # λ = 1.5, a = 2


def _evaluate(expr, values: dict[str, float]) -> float:
    """Evaluate a sympy expression, matching its symbols by name."""
    return float(expr.subs({sym: values[sym.name] for sym in expr.free_symbols}))


def _atoms(solution) -> str:
    """Which of ±u the wide-limit optimum uses in 1-D ('+u', '-u', '+u,-u' or 'none')."""
    signs = sorted({"+u" if a[0] > 0 else "-u" for a in solution.rays.atoms.T})
    return ",".join(signs) if signs else "none"


@check(
    "antipodal.threshold_1d",
    "Dense scalar: one ray below p = 1/2, an antipodal pair above",
    "docs/theory.md §5.1, §3 S6",
    predicted="Active values U[1, 3], N = 4000, λ ∈ {0.1, 0.3}: for p < 1/2 the optimum uses only +u with "
    "b* = λp̂/(1−p̂) exactly; for p > 1/2 it uses the pair ±u and b* > 0.5. Constant amplitude a = 2: the spec's "
    "table of b*, objective and atoms (λ ∈ {0.1, 0.3, 0.6, 1.5}) and the closed form b* = λp/(1−p).",
    kind="theorem",
    source=f"{THEORY_PAPER}: the 50% threshold of a dense variable; derived in docs/theory.md §5.1",
    regime="1-D dense scalar, exact 1-D Huber median (no training); N = 1000 and 4000",
)
def threshold_1d(ctx: CheckContext) -> Outcome:
    b_sym, value_sym = dense_scalar_bias()
    table_err, closed_err, symbolic_err, atom_mismatch = 0.0, 0.0, 0.0, []
    for lam, row in _SPEC_TABLE.items():
        for p, (b_ref, obj_ref) in row.items():
            toy = make_toy("dense_scalar", p=p, N=1000, amplitude="constant", a=2.0, lam=lam)
            s = solve_wide_limit(toy.X, lam)
            closed = dense_scalar_optimum(p, 2.0, lam)
            table_err = max(table_err, abs(s.b[0] - b_ref), abs(s.objective - obj_ref))
            closed_err = max(closed_err, abs(s.b[0] - closed.b), abs(s.objective - closed.objective))
            expected = "+u" if p < 0.5 else "-u"
            if _atoms(s) != expected:
                atom_mismatch.append({"lam": lam, "p": p, "atoms": _atoms(s), "expected": expected})
            if p < 0.5:
                values = {"lambda": lam, "p": p, "a": 2.0}
                symbolic_err = max(symbolic_err, abs(_evaluate(b_sym, values) - closed.b),
                                   abs(_evaluate(value_sym, values) - closed.objective))
    for p, (b_ref, expected) in _SPEC_DEGENERATE.items():
        s = solve_wide_limit(make_toy("dense_scalar", p=p, N=1000, amplitude="constant", a=2.0, lam=1.5).X, 1.5)
        table_err = max(table_err, abs(s.b[0] - b_ref))
        if _atoms(s) != expected:
            atom_mismatch.append({"lam": 1.5, "p": p, "atoms": _atoms(s), "expected": expected})
    grid = np.array([0.1, 0.2, 0.3, 0.4, 0.45, 0.49, 0.51, 0.55, 0.6, 0.7, 0.8, 0.9])
    curves, uniform_rows, bias_formula_err = {}, [], 0.0
    for lam in (0.1, 0.3):
        bs, counts = [], []
        for p in grid:
            toy = make_toy("dense_scalar", seed=ctx.seed, p=float(p), N=4000, amplitude="uniform", lam=lam)
            s = solve_wide_limit(toy.X, lam)
            bs.append(s.b[0])
            counts.append(s.n_rays)
            p_hat = toy.ground_truth["p_hat"]
            ok = _atoms(s) == "+u" if p < 0.5 else (_atoms(s) == "+u,-u" and s.b[0] > 0.5)
            if p < 0.5:
                bias_formula_err = max(bias_formula_err, abs(s.b[0] - lam * p_hat / (1 - p_hat)))
            uniform_rows.append({"lam": lam, "p": float(p), "p_hat": p_hat, "b": s.b[0], "atoms": _atoms(s), "ok": ok})
        curves[lam] = {"b": np.array(bs), "n_atoms": np.array(counts)}
    fig = plot_threshold_1d(ctx.figure_path("antipodal_threshold_1d.png"), grid, curves)
    tol = {"spec_table": 5e-7, "closed_form": 1e-10, "bias_formula": 1e-10}
    measured = {"max_spec_table_error": table_err, "max_closed_form_error": closed_err,
                "max_symbolic_error": symbolic_err, "max_bias_formula_error_uniform": bias_formula_err,
                "atom_mismatches": atom_mismatch, "uniform_failures": [r for r in uniform_rows if not r["ok"]]}
    passed = (table_err <= tol["spec_table"] and closed_err <= tol["closed_form"] and symbolic_err <= tol["closed_form"]
              and bias_formula_err <= tol["bias_formula"] and not atom_mismatch and not measured["uniform_failures"])
    # Above p = 1/2 the one-ray bias λp/(1 − p) is not the optimum (the pair is): the measurement must see it miss.
    above = [(lam, p) for lam, row in _SPEC_TABLE.items() for p in row if p > 0.5]
    missed = max(abs(solve_wide_limit(make_toy("dense_scalar", p=p, N=1000, amplitude="constant", a=2.0, lam=lam).X,
                                      lam).b[0] - lam * p / (1 - p)) for lam, p in above)
    controls = [negative_control(
        "one_ray_bias_formula_above_one_half", measured=missed, threshold=0.5,
        what="max |b* − λp/(1 − p)| over the table's rows with p > 1/2 (where the optimum is the pair)",
        reference=max(abs(_SPEC_TABLE[lam][p][0] - lam * p / (1 - p)) for lam, p in above), rtol=1e-5)]
    return Outcome(
        measured=measured, tolerance=tol, passed=passed, controls=controls,
        tolerance_reason="The 1-D Huber median is computed exactly (root of a piecewise-linear ψ), so closed forms "
        "agree to float64 rounding; the spec's table is printed to 6 decimals.",
        details={"uniform": uniform_rows}, figures=[str(fig.relative_to(ctx.out_dir))],
    )


# --------------------------------------------------------------------------------------------------
# antipodal.l0_threshold_1d

#: The L0 toy of docs/theory.md §5.5: active values U[L0_LO, L0_HI], prices c (JumpReLU's lam).
L0_LO, L0_HI = 1.0, 3.0
L0_PRICES = (0.1, 0.2)
L0_QUANTILE_N = 20000
L0_P_GRID = (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
L0_TOY_P = (0.5, 0.6, 0.7, 0.75, 0.9, 0.95)
L0_TOY_MARGIN = 0.05  # seeded toy rows are asserted only this far from p*
L0_TOL = {"quantile_value": 1e-4, "quantile_threshold": 1e-3, "exhaustive": 1e-10}


def _quantile_sample(p: float, c_n: int = L0_QUANTILE_N) -> np.ndarray:
    """k = round(pN) active values at the midpoint quantiles of U[lo, hi], the rest zeros (deterministic)."""
    k = int(round(p * c_n))
    s = np.zeros(c_n)
    s[:k] = L0_LO + (L0_HI - L0_LO) * (np.arange(k) + 0.5) / k
    return s


def _empirical_threshold(c: float) -> float:
    """The smallest k/N (quantile samples, N = L0_QUANTILE_N) at which the pair beats +u, by bisection on k."""
    lo_k, hi_k = 1, L0_QUANTILE_N - 1
    pays = lambda k: l0_fit(_quantile_sample(k / L0_QUANTILE_N), c, "+u,-u").objective < \
        l0_fit(_quantile_sample(k / L0_QUANTILE_N), c, "+u").objective - 1e-12  # noqa: E731
    while hi_k - lo_k > 1:
        mid = (lo_k + hi_k) // 2
        lo_k, hi_k = (lo_k, mid) if pays(mid) else (mid, hi_k)
    return hi_k / L0_QUANTILE_N


@check(
    "antipodal.l0_threshold_1d",
    "Dense scalar under an L0 price: one latent up to p* = 1/(1 + (4/3)√c/(hi − lo)), not 1/2",
    "docs/theory.md §5.5, §5.1",
    predicted=f"Active values U[{L0_LO:g}, {L0_HI:g}], price c ∈ {list(L0_PRICES)} (each point costs min((s − b)², c) "
    "with an atom of the residual's sign): the pair beats +u iff p > p* = 1/(1 + (4/3)√c/(hi − lo)) (0.8259, 0.7703); "
    "on quantile samples (N = 20000) +u costs p̂c, the pair min(p̂c, c − p̂G), one −u ties the pair, the "
    "empirical switch is at p* ± 1e-3; the exact solver equals exhaustive search on small samples; constant "
    "amplitude switches at ½ by one flipped latent; on seeded toys (N = 4000) b jumps into [lo, hi] at p*, "
    "while the L1 optimum (§5.1) uses a pair from p = ½.",
    kind="theorem",
    source="derived for this project: docs/theory.md §5.5 (the L0 analogue of the 50% rule of §5.1)",
    regime="1-D dense scalar, exact minimisation over b (no training); quantile samples N = 20000, seeded toys "
    "N = 4000, exhaustive search on samples of ≤ 7 points",
)
def l0_threshold_1d(ctx: CheckContext) -> Outcome:
    value_err, rows, thresholds, side_failures = 0.0, [], {}, []
    for c in L0_PRICES:
        p_star = l0_uniform_threshold(c, L0_LO, L0_HI)
        thresholds[str(c)] = {"closed_form": p_star, "quantile_sample": _empirical_threshold(c)}
        for p in L0_P_GRID:
            s = _quantile_sample(p)
            p_hat = float(np.mean(s != 0))
            pop = l0_uniform_optimum(p_hat, c, L0_LO, L0_HI)
            opt = l0_optimum(s, c)
            fits = opt.fits
            value_err = max(value_err, abs(fits["+u"].objective - pop.one_latent),
                            abs(fits["+u,-u"].objective - pop.objective), abs(fits["-u"].objective - pop.pair))
            above = p > p_star
            ok = (opt.best.atoms == "-u" and L0_LO <= opt.best.b <= L0_HI) if above else \
                (opt.best.atoms == "+u" and opt.best.b == 0.0)
            if not ok:
                side_failures.append({"c": c, "p": p, "best": opt.best.atoms, "b": opt.best.b})
            rows.append({"c": c, "p": p, "p_star": p_star, "best": opt.best.atoms, "b": opt.best.b,
                         **{f"value_{a}": f.objective for a, f in fits.items()},
                         "closed_one": pop.one_latent, "closed_pair": pop.pair})
    thr_err = max(abs(t["closed_form"] - t["quantile_sample"]) for t in thresholds.values())
    rng = ctx.rng("antipodal.l0_threshold_1d")
    exhaustive_err = 0.0
    for _ in range(20):
        n = int(rng.integers(1, 8))
        s = np.where(rng.random(n) < 0.5, 0.0, rng.uniform(0.0, 3.0, n))
        c = float(rng.uniform(0.05, 1.0))
        for atoms in L0_ATOM_SETS:
            exhaustive_err = max(exhaustive_err, abs(l0_fit(s, c, atoms).objective - l0_fit_exhaustive(s, c, atoms)))
    constant = {}
    for p in (0.4, 0.6):
        opt = l0_optimum(make_toy("dense_scalar", p=p, N=1000, amplitude="constant", a=2.0).ground_truth["s"], 0.1)
        constant[str(p)] = {"best": opt.best.atoms, "b": opt.best.b, "value": opt.best.objective}
        if opt.best.atoms != ("+u" if p < 0.5 else "-u"):
            side_failures.append({"constant_amplitude_p": p, "best": opt.best.atoms})
    toy_rows = []
    c = L0_PRICES[0]
    p_star = l0_uniform_threshold(c, L0_LO, L0_HI)
    for p in L0_TOY_P:
        toy = make_toy("dense_scalar", seed=ctx.seed, p=p, N=4000, amplitude="uniform", lam=c)
        opt = l0_optimum(toy.ground_truth["s"], c)
        jumped = bool(opt.best.b >= L0_LO)
        l1 = solve_wide_limit(toy.X, c)
        row = {"p": p, "p_hat": toy.ground_truth["p_hat"], "l0_best": opt.best.atoms, "l0_b": opt.best.b,
               "l0_minus_u_over_pair": opt.fits["-u"].objective - opt.fits["+u,-u"].objective, "l0_jumped": jumped,
               "l1_b": float(l1.b[0]), "l1_atoms": _atoms(l1)}
        toy_rows.append(row)
        if abs(p - p_star) >= L0_TOY_MARGIN and jumped != (p > p_star):
            side_failures.append({"toy_p": p, "l0_b": opt.best.b})
    measured = {"thresholds": thresholds, "max_threshold_error": thr_err, "max_quantile_value_error": value_err,
                "max_exhaustive_error": exhaustive_err, "constant_amplitude": constant,
                "side_failures": side_failures, "seeded_toy": toy_rows}
    passed = (value_err <= L0_TOL["quantile_value"] and thr_err <= L0_TOL["quantile_threshold"]
              and exhaustive_err <= L0_TOL["exhaustive"] and not side_failures)
    # The L1 rule (switch at p = 1/2) is where the L0 claim breaks: its switch lies well above 1/2.
    controls = [negative_control(
        f"l0_switch_is_not_at_one_half_c_{c:g}", measured=thresholds[str(c)]["quantile_sample"] - 0.5, threshold=0.1,
        what=f"the empirical switch p minus 1/2 at price c = {c:g}",
        reference=thresholds[str(c)]["closed_form"] - 0.5, rtol=1e-2) for c in L0_PRICES]
    return Outcome(
        measured=measured, tolerance={**L0_TOL, "seeded_toy_margin": L0_TOY_MARGIN}, passed=passed, controls=controls,
        tolerance_reason="Quantile samples are the midpoint rule for the population integrals: with k ≥ 6000 active "
        "nodes the values agree to O(c/k) < 1e-4 and the switch to 1e-3 in p (the two costs cross at slope c + G). "
        "The solver and exhaustive search are both exact (rounding only). Seeded toys differ from the population by "
        "sampling (p̂ − p ≈ 0.008, G by a few %), so only rows ≥ 0.05 from p* are asserted.",
        details={"rows": rows},
    )
