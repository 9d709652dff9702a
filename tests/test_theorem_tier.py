"""The quick theorem and invariant tier runs in `make test`: a regression in a derived result or an
implementation invariant fails CI (docs/verdicts.md). One test per check, so a failure names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dictcheck.proofs_checks.registry import MUST_PASS, CheckContext
from dictcheck.proofs_checks.runner import run_check, select_checks

TIER = select_checks(quick=True, only=None, kinds=",".join(MUST_PASS))


def test_the_tier_is_not_empty() -> None:
    kinds = {c.kind for c in TIER}
    assert kinds == set(MUST_PASS) and len(TIER) >= 15


@pytest.mark.parametrize("check", TIER, ids=[c.id for c in TIER])
def test_theorem_and_invariant_checks_pass(check, tmp_path: Path) -> None:
    record = run_check(check, CheckContext(out_dir=tmp_path, seed=0, quick=True))
    assert record["status"] == "pass", (record.get("error") or record.get("finding") or record["measured"])
    negative = [c for c in record["controls"] if c["role"] == "negative"]
    assert negative and all(c["ok"] for c in record["controls"]), record["controls"]
