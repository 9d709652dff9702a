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


@pytest.mark.parametrize("m", mutations.MUTATIONS, ids=[m.name for m in mutations.MUTATIONS])
def test_every_mutation_applies_once_and_changes_the_code(m) -> None:
    text = (ROOT / m.path).read_text()
    assert text.count(m.old) == 1, f"{m.name}: the fragment moved in {m.path}"
    assert m.new != m.old


def test_a_planted_sign_error_is_caught_and_the_control_passes(tmp_path: Path) -> None:
    (m,) = [m for m in mutations.MUTATIONS if m.name == "certificate-sign"]
    control = mutations.run_tier(mutations.stage(tmp_path / "control").parent, tmp_path / "c-out",
                                 only="wide.global_optimum")
    assert control["exit"] == 0 and control["failed"] == [], control
    pkg = mutations.stage(tmp_path / "mutant")
    mutations.apply(pkg, m)
    mutant = mutations.run_tier(pkg.parent, tmp_path / "m-out", only="wide.global_optimum")
    assert mutant["exit"] == 1 and mutant["failed"] == ["wide.global_optimum (fail)"], mutant
