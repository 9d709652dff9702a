"""The mutation script (benchmarks/mutations.py, docs/verdicts.md): every planted bug still applies to the
code as it is, and one of them, run end to end on a staged copy, is caught by the check that must catch it.
The whole sweep (every mutation against the full quick tier) is the benchmark's job, recorded in
benchmarks/RESULTS.md §10."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutations", ROOT / "benchmarks" / "mutations.py")
mutations = importlib.util.module_from_spec(_spec)
sys.modules["mutations"] = mutations  # dataclasses look their module up there
_spec.loader.exec_module(mutations)


@pytest.mark.parametrize("m", mutations.ALL_MUTATIONS, ids=[m.name for m in mutations.ALL_MUTATIONS])
def test_every_mutation_applies_once_and_changes_the_code(m, tmp_path: Path) -> None:
    text = (ROOT / m.path).read_text()
    assert text.count(m.old) == 1, f"{m.name}: the fragment moved in {m.path}"
    (tmp_path / "dictcheck" / m.path).parent.mkdir(parents=True)
    (tmp_path / "dictcheck" / m.path).write_text(text)
    mutations.apply(tmp_path / "dictcheck", m)
    mutated = (tmp_path / "dictcheck" / m.path).read_text()
    assert mutated != text
    compile(mutated, m.path, "exec")


def test_every_public_diagnostic_of_theory_has_a_blind_and_a_scaled_mutant() -> None:
    """docs/verdicts.md: each public function of theory/diagnostics.py and theory/certificate.py that returns a
    diagnostic (a violation, a gain, a certificate, the nested pairs, the firing fractions) has both mutants
    (nested_pairs returns a list: blind only)."""
    import ast

    basics = {"unit_atom_norm_check", "clean_codes", "residuals", "default_activity_threshold", "active_sets",
              "correlations", "activation_weights", "cosine_matrix", "most_antipodal_pair", "dictionary_diagnostics"}
    wrapped = {(m.path, m.function, m.name.rsplit("-", 1)[1]) for m in mutations.DIAGNOSTIC_MUTATIONS}
    for path in ("theory/diagnostics.py", "theory/certificate.py"):
        tree = ast.parse((ROOT / path).read_text())
        for fn in (n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")):
            if fn in basics:
                continue
            assert (path, fn, "blind") in wrapped, f"{path}: {fn} has no blind mutant"
            assert fn == "nested_pairs" or (path, fn, "scaled") in wrapped, f"{path}: {fn} has no scaled mutant"


def test_a_planted_sign_error_is_caught_and_the_control_passes(tmp_path: Path) -> None:
    (m,) = [m for m in mutations.MUTATIONS if m.name == "certificate-sign"]
    control = mutations.run_tier(mutations.stage(tmp_path / "control").parent, tmp_path / "c-out",
                                 only="wide.global_optimum")
    assert control["exit"] == 0 and control["failed"] == [], control
    pkg = mutations.stage(tmp_path / "mutant")
    mutations.apply(pkg, m)
    mutant = mutations.run_tier(pkg.parent, tmp_path / "m-out", only="wide.global_optimum")
    assert mutant["exit"] == 1 and mutant["failed"] == ["wide.global_optimum (fail)"], mutant


def test_a_blind_bias_identity_is_caught_by_its_negative_control(tmp_path: Path) -> None:
    """Issue 30's case: with theory.diagnostics.bias_identity returning zero violations, narrow.bias_identity's
    claim still holds at the optima; its negative control (a shifted bias) sees zero and fails it."""
    (m,) = [m for m in mutations.ALL_MUTATIONS if m.name == "bias-identity-blind"]
    pkg = mutations.stage(tmp_path / "mutant")
    mutations.apply(pkg, m)
    mutant = mutations.run_tier(pkg.parent, tmp_path / "m-out", only="narrow.bias_identity")
    assert mutant["exit"] == 1 and mutant["failed"] == ["narrow.bias_identity (fail)"], mutant
