"""The theory lives in docs/: every check cites it, and every section and equation it cites exists there."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dictcheck.proofs_checks.registry import load_all_checks

DOCS = Path(__file__).resolve().parents[1] / "docs"
_DOC = re.compile(r"docs/(theory|bilinear|bsf|vasae|ecosystem)\.md")
_SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
_EQUATION = re.compile(r"\((\d|5′|KKT-z)\)")


def _sections(doc: str) -> set[str]:
    """Section numbers of the headings of docs/<doc>.md ("## 4. …", "### 4.3 …")."""
    text = (DOCS / f"{doc}.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,4} (\d+(?:\.\d+)?)\.? ", text, re.M))


def _cited(spec: str) -> list[tuple[str, str]]:
    """(document, section) pairs of a check's spec string; a section belongs to the last document named."""
    pairs, doc = [], None
    for m in re.finditer(rf"{_DOC.pattern}|{_SECTION.pattern}", spec):
        if m.group(1):
            doc = m.group(1)
        else:
            pairs.append((doc, m.group(2)))
    return pairs


@pytest.mark.parametrize("check", sorted(load_all_checks().values(), key=lambda c: c.id), ids=lambda c: c.id)
def test_every_check_cites_existing_sections_of_docs(check) -> None:
    assert _DOC.search(check.spec), f"{check.id}: spec {check.spec!r} names no docs/*.md"
    for doc, section in _cited(check.spec):
        assert doc is not None, f"{check.id}: §{section} before any document in {check.spec!r}"
        assert section in _sections(doc), f"{check.id}: docs/{doc}.md has no §{section}"
    for eq in _EQUATION.findall(check.spec):
        assert f"({eq})" in (DOCS / "theory.md").read_text(encoding="utf-8"), f"{check.id}: no equation ({eq})"
    text = (check.func.__doc__ or "") + (sys.modules[check.func.__module__].__doc__ or "")
    assert "docs/" in text, f"{check.id}: neither its docstring nor its module's cites docs/"


def test_docs_keep_the_spec_numbering() -> None:
    assert {"1", "2", "2.1", "2.2", "2.3", "3", "4.1", "4.2", "4.3", "4.4", "4.5", "5.1", "5.2", "5.3", "5.4",
            "6", "7", "8", "9"} <= _sections("theory")
    text = (DOCS / "theory.md").read_text(encoding="utf-8")
    for eq in ("(1)", "(2)", "(3)", "(4)", "(5)", "(5′)", "(6)", "(7)", "(KKT-z)"):
        assert eq in text, eq
