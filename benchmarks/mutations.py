"""Plant small bugs in theory/ and solvers/ and show that the quick theorem tier catches each one.

    python benchmarks/mutations.py                 # every mutation (about 55 runs of the quick tier)
    python benchmarks/mutations.py --only sign     # mutations whose name contains "sign"
    python benchmarks/mutations.py --json out.json

Each mutation replaces one exact line fragment of one module (a constant, a sign, a 1% shift of an
optimum, a diagnostic that returns zero), or rebinds one public diagnostic function of theory/ to a wrapper
that zeroes (*blind*) or halves (*scaled*) what it returns (:class:`Wrapped`), in a staged copy of the
installed package
(``STAGE/dictcheck/{theory,solvers,empirics,proofs_checks}``, imported first through PYTHONPATH), then runs
``dictcheck run --quick --kind theorem,invariant`` there in a fresh process. A mutation is **caught** when that
run exits 1 (a theorem or invariant check failed or raised); the checks that failed are listed. The unmutated
copy runs first as the control and must pass. Exit code: 0 when the control passed and every mutation was
caught, 1 otherwise (docs/verdicts.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("theory", "solvers", "empirics", "proofs_checks")


@dataclass(frozen=True)
class Mutation:
    """Replace ``old`` (which must occur exactly once in ``path``) by ``new``."""

    name: str
    path: str
    old: str
    new: str
    what: str


@dataclass(frozen=True)
class Wrapped:
    """Rebind the module-level function ``function`` of ``path`` to a wrapper returning ``result``, an expression
    of ``out`` (what the original returned). Callers in the module look the name up when they call it, and other
    modules import it after the module ran, so every caller gets the wrapper."""

    name: str
    path: str
    function: str
    result: str
    what: str

    @property
    def old(self) -> str:
        return f"\ndef {self.function}("


def _blind_and_scaled(path: str, function: str, *, blind: str = "0.0 * out", scaled: str | None = "0.5 * out",
                      what: str) -> tuple[Wrapped, ...]:
    """The two mutants of a diagnostic: its violations zero (blind) and halved (scaled)."""
    stem = function.replace("_", "-")
    out = [Wrapped(f"{stem}-blind", path, function, blind, f"{what} returns zero")]
    if scaled is not None:
        out.append(Wrapped(f"{stem}-scaled", path, function, scaled, f"{what} returns half its value"))
    return tuple(out)


_DIAG = "theory/diagnostics.py"
_CERT = "theory/certificate.py"
#: Every public diagnostic function of theory/ (docs/theory.md §3, §6; the certificate of §2.3), blind and scaled.
DIAGNOSTIC_MUTATIONS = (
    *_blind_and_scaled(_DIAG, "kkt_violations", what="the entrywise KKT-z violations"),
    *_blind_and_scaled(_DIAG, "kkt_violation", what="the max KKT-z violation of Φ"),
    *_blind_and_scaled(_DIAG, "stationarity_violations", what="S1 per atom"),
    *_blind_and_scaled(_DIAG, "r2_violations", what="R2 per atom"),
    *_blind_and_scaled(_DIAG, "bias_residual_mean_norm", what="‖R1‖/N"),
    *_blind_and_scaled(_DIAG, "bias_identity", blind="BiasIdentity(out.off_mean, out.target, 0.0 * out.violation)",
                       scaled="BiasIdentity(out.off_mean, out.target, 0.5 * out.violation)",
                       what="identity (4)'s violation per atom"),
    *_blind_and_scaled(_DIAG, "hull_identity_violations", what="identity (5) per atom"),
    *_blind_and_scaled(_DIAG, "hull_prime_matrix", what="the right side of (5′)"),
    *_blind_and_scaled(_DIAG, "hull_prime_violations", what="(5′) per pair"),
    *_blind_and_scaled(_DIAG, "hull_prime_summands", what="the (5′) summands"),
    *_blind_and_scaled(_DIAG, "hull_prime_min_summand", blind="max(out, 0.0)", what="the smallest (5′) summand"),
    *_blind_and_scaled(_DIAG, "nested_pairs", blind="[]", scaled=None, what="the nested support pairs"),
    *_blind_and_scaled(_DIAG, "nesting_cosine_defects", what="1 − c_dj of nested pairs"),
    *_blind_and_scaled(_DIAG, "new_atom_codes", what="a new atom's codes (uᵀr − λ)₊"),
    *_blind_and_scaled(_DIAG, "gain", what="gain(u)"),
    *_blind_and_scaled(_DIAG, "antipode_gains", what="the antipode gains"),
    *_blind_and_scaled(_DIAG, "firing_fractions", what="the firing fractions p_d"),
    *_blind_and_scaled(_CERT, "certificate_matrix", what="the certificate G = λ11ᵀ − RᵀR/λ"),
    *_blind_and_scaled(_CERT, "cert_ratio", what="max‖r_i‖/λ"),
    *_blind_and_scaled(_CERT, "certificate_slack", what="⟨G, Q⟩/N"),
    *_blind_and_scaled(_CERT, "certified_gap", blind="CertifiedGap(0.0 * out.gap_at_bias, 0.0 * out.bias_term)",
                       scaled="CertifiedGap(0.5 * out.gap_at_bias, 0.5 * out.bias_term)", what="the certified gap"),
)

MUTATIONS = (
    Mutation("objective-constant", "theory/objective.py",
             "return float((np.sum(R * R) + 2.0 * lam * np.sum(np.abs(Z))) / N)",
             "return float((np.sum(R * R) + lam * np.sum(np.abs(Z))) / N)",
             "objective (1) loses the 2 of its 2λ"),
    Mutation("ridge-residual-constant", "theory/objective.py",
             "return lam * np.linalg.solve(Q + lam * np.eye(N), X_centred.T).T",
             "return lam * np.linalg.solve(Q + 1.01 * lam * np.eye(N), X_centred.T).T",
             "the residuals R = λX̃(Q + λI)⁻¹ of program (3) with λ off by 1% inside the inverse"),
    Mutation("certificate-sign", "theory/certificate.py",
             "return lam * np.ones((N, N)) - R.T @ R / lam",
             "return lam * np.ones((N, N)) + R.T @ R / lam",
             "the certificate G = λ11ᵀ − RᵀR/λ with the sign of RᵀR flipped"),
    Mutation("huber-constant", "theory/huber.py",
             "return np.where(rho <= lam, rho**2, 2.0 * lam * rho - lam**2)",
             "return np.where(rho <= lam, rho**2, 2.0 * lam * rho - 0.99 * lam**2)",
             "h_λ's −λ² beyond λ off by 1%"),
    Mutation("dense-scalar-shift", "theory/dense_scalar.py",
             "shift = lam * q / (1.0 - q)",
             "shift = 1.01 * lam * q / (1.0 - q)",
             "the dense scalar's closed-form bias b* = λp/(1 − p) shifted by 1%"),
    Mutation("bias-identity-sign", "theory/diagnostics.py",
             "target = np.where(ok, -p / np.where(ok, 1.0 - p, 1.0), np.nan)",
             "target = np.where(ok, p / np.where(ok, 1.0 - p, 1.0), np.nan)",
             "the bias identity's target −p/(1 − p) with the wrong sign"),
    Mutation("stationarity-zero", "theory/diagnostics.py",
             "stationarity_violation=_nanmax(s1),",
             "stationarity_violation=0.0,",
             "the S1 diagnostic returns zero"),
    Mutation("kkt-zero", "theory/diagnostics.py",
             "kkt_violation=float(kkt_entries.max(initial=0.0)),",
             "kkt_violation=0.0,",
             "the KKT-z diagnostic returns zero"),
    Mutation("group-threshold-shift", "theory/block_sparse.py",
             "return np.maximum(0.0, 1.0 - theta / norms) * a",
             "return np.maximum(0.0, 1.0 - 0.99 * theta / norms) * a",
             "the group soft-threshold sh_θ thresholds at 0.99θ"),
    Mutation("bilinear-kernel-constant", "theory/bilinear_lifted.py",
             "        return UU * UU\n",
             "        return 1.01 * UU * UU\n",
             "the atomic/compound kernel ⟨W_j, W_l⟩_F scaled by 1.01"),
    Mutation("median-shift", "solvers/medians.py",
             "b=loc.b, objective=float(loc.value),",
             "b=1.01 * loc.b, objective=float(loc.value),",
             "the Huber and geometric medians returned 1% off the optimum"),
    Mutation("exact-codes-lambda", "solvers/lasso_codes.py",
             "        lam = _as_lambda(lam)\n        tol = _as_positive_float(tol, \"tol\")",
             "        lam = 0.99 * _as_lambda(lam)\n        tol = _as_positive_float(tol, \"tol\")",
             "the exact codes solve the lasso at 0.99λ (their own KKT check agrees with them)"),
    Mutation("learner-gradient-constant", "solvers/reference_learner.py",
             "grad_Z = 2.0 * (lam * row[:, None] - W.T @ R)",
             "grad_Z = 2.0 * (1.01 * lam * row[:, None] - W.T @ R)",
             "the reference learner's gradient in Z uses 1.01λ"),
    Mutation("ray-codes-lambda", "solvers/wide_limit.py",
             "point_codes[beyond] = np.maximum(np.sum(atoms[:, labels] * Xc[:, beyond], axis=0) - lam, 0.0)",
             "point_codes[beyond] = np.maximum(np.sum(atoms[:, labels] * Xc[:, beyond], axis=0) - 0.99 * lam, 0.0)",
             "the ray dictionary's codes shrink by 0.99λ instead of λ"),
)


ALL_MUTATIONS = (*MUTATIONS, *DIAGNOSTIC_MUTATIONS)


def stage(into: Path) -> Path:
    """A copy of the installed layout under ``into``: dictcheck/ with the four layers inside."""
    pkg = into / "dictcheck"
    pkg.mkdir(parents=True)
    for f in (ROOT / "dictcheck").glob("*.py"):
        shutil.copy2(f, pkg / f.name)
    for layer in LAYERS:
        shutil.copytree(ROOT / layer, pkg / layer, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def apply(pkg: Path, m: Mutation | Wrapped) -> None:
    path = pkg / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"mutation {m.name}: the fragment occurs {text.count(m.old)} times in {m.path} (need 1); "
                         "the code moved, update the mutation")
    if isinstance(m, Wrapped):
        text += (f"\n\n_unmutated_{m.function} = {m.function}\n\n\ndef {m.function}(*args, **kwargs):\n"
                 f"    out = _unmutated_{m.function}(*args, **kwargs)\n    return {m.result}\n")
        path.write_text(text)
    else:
        path.write_text(text.replace(m.old, m.new))


def run_tier(stage_root: Path, out: Path, only: str | None = None) -> dict:
    """The quick theorem and invariant tier on the staged package (or the checks ``only`` names, comma-separated):
    exit code, failing checks, seconds."""
    env = {**os.environ, "PYTHONPATH": str(stage_root), "PYTHONDONTWRITEBYTECODE": "1"}
    selection = ["--only", only] if only else []
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "run", "--quick", "--kind",
                           "theorem,invariant", *selection, "--json", "--out", str(out)], capture_output=True,
                          text=True, env=env, cwd=stage_root)
    seconds = time.perf_counter() - t
    try:
        results = json.loads(proc.stdout)["results"]
    except (json.JSONDecodeError, KeyError):
        return {"exit": proc.returncode, "failed": [], "stderr": proc.stderr.strip()[-400:], "seconds": seconds}
    failed = [f"{r['id']} ({r['status']})" for r in results if r["status"] != "pass"]
    return {"exit": proc.returncode, "failed": failed, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the mutations whose name contains this text")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    chosen = [m for m in ALL_MUTATIONS if not args.only or args.only in m.name]
    if not chosen:
        raise SystemExit(f"no mutation name contains {args.only!r}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="dictcheck-mutations-") as tmp:
        control_root = Path(tmp) / "control"
        stage(control_root)
        control = run_tier(control_root, Path(tmp) / "control-out")
        print(f"control (no mutation): exit {control['exit']}, {control['seconds']:.0f} s"
              + (f", failed: {control['failed']}" if control["failed"] else ""), flush=True)
        for m in chosen:
            root = Path(tmp) / m.name
            apply(stage(root), m)
            result = run_tier(root, Path(tmp) / f"{m.name}-out")
            caught = result["exit"] == 1 and bool(result["failed"])
            rows.append({"mutation": m.name, "file": m.path, "what": m.what, "caught": caught, **result})
            print(f"{m.name:<34} {'CAUGHT' if caught else 'MISSED'}  {result['seconds']:5.0f} s  "
                  f"{', '.join(result['failed']) or result.get('stderr', '')}", flush=True)
            shutil.rmtree(root)
    ok = control["exit"] == 0 and all(r["caught"] for r in rows)
    print(f"\n{sum(r['caught'] for r in rows)} of {len(rows)} mutations caught; control "
          f"{'passed' if control['exit'] == 0 else 'FAILED'}")
    if args.json:
        args.json.write_text(json.dumps({"control": control, "mutations": rows}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
