"""The registry of checks: each check states its prediction before it measures.

A check is a function ``CheckContext -> Outcome`` registered with :func:`check`. Its prediction
(what the theory says will be measured) is part of the registration, so it is fixed before any
number is computed. The runner (proofs_checks.runner) records predicted, measured, tolerance and
the reason for that tolerance for every check.

Every check has a **kind** (docs/verdicts.md):

* ``theorem``: a derived result; it must pass (a failure is a bug in the theory or the code).
* ``invariant``: a property the implementation promises; it must pass.
* ``replication``: a paper's empirical claim, run in a stated regime. Its verdict is ``replicated``,
  ``not replicated`` or ``inconclusive`` (:func:`replication_verdict`), decided with its controls: a
  positive control (the effect is produced where it must be, or a precondition holds) and a negative
  control (the measurement does not report the effect where it cannot be).
* ``hypothesis``: an open question of the theory; pass means the data support the stated conjecture.
* ``descriptive``: a measurement reported for what it is, with no pass/fail claim about the theory
  (it fails only when it cannot be measured).

Each check also records its ``source`` (the paper and section, or the docs section of a derivation)
and the ``regime`` it runs in (data, sizes, training budget).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

JSONValue = Any

#: The kinds of check, in the order the table and the report show them.
KINDS = ("theorem", "invariant", "replication", "hypothesis", "descriptive")
#: Kinds whose failure (or error) makes ``dictcheck run`` exit non-zero; ``--strict`` adds replications.
MUST_PASS = ("theorem", "invariant")
#: A replication's verdicts.
VERDICTS = ("replicated", "not replicated", "inconclusive")
#: The roles of a replication's controls.
CONTROL_ROLES = ("positive", "negative", "precondition")


@dataclass(frozen=True)
class Control:
    """One control of a replication: its ``role`` (``positive``: the effect is produced where it must be;
    ``negative``: the measurement does not report the effect where it cannot be; ``precondition``: the regime
    the claim needs holds, e.g. the trained objective is near a computable reference), what it ``expected``,
    what it ``showed`` (numbers in words), and whether it came out as expected (``ok``)."""

    name: str
    role: str
    expected: str
    showed: str
    ok: bool

    def __post_init__(self) -> None:
        if self.role not in CONTROL_ROLES:
            raise ValueError(f"control {self.name!r}: role must be one of {CONTROL_ROLES}, got {self.role!r}")

    def record(self) -> dict[str, JSONValue]:
        return {"name": self.name, "role": self.role, "expected": self.expected, "showed": self.showed,
                "ok": bool(self.ok)}


def negative_control(name: str, *, measured: float, threshold: float, what: str, reference: float | None = None,
                     rtol: float = 1e-9) -> Control:
    """A theorem or invariant check's negative control: its measurement at a perturbed point where the identity
    breaks. It comes out as expected (``ok``) when the measured violation exceeds ``threshold`` (the measurement
    sees the break) and, given the same quantity computed independently (``reference``: another implementation
    or a brute-force formula), agrees with it to ``rtol`` (it measures the break right: a diagnostic that
    returns zero, or a rescaled one, fails here)."""
    agrees = reference is None or abs(measured - reference) <= rtol * max(abs(reference), 1e-300)
    expected = f"{what} > {threshold:g}" + ("" if reference is None else
                                             f", equal to its independent computation to {rtol:g} relative")
    showed = f"{measured:.6g}" + ("" if reference is None else f" (independent: {reference:.6g})")
    return Control(name=name, role="negative", expected=expected, showed=showed,
                   ok=bool(measured > threshold and agrees))


def must_pass_verdict(claim_holds: bool, controls: list[Control]) -> tuple[bool, str | None]:
    """A theorem or invariant check's verdict and, when it fails for its controls, why: it passes only when the
    claim holds, it has at least one negative control (docs/verdicts.md: a check that could not fail proves
    nothing) and every control came out as expected."""
    if not any(c.role == "negative" for c in controls):
        return False, "No negative control: the measurement was never shown to fail where the identity breaks."
    missed = [c.name for c in controls if not c.ok]
    if missed:
        return False, f"Control(s) not as expected: {', '.join(missed)} (the measurement cannot be trusted)."
    return claim_holds, None


def replication_verdict(claim_holds: bool, controls: list[Control]) -> str:
    """``inconclusive`` when any control or precondition failed (the experiment could not have shown the claim,
    or would have shown it where it is absent), else ``replicated`` or ``not replicated`` by the claim. A
    replication without at least one positive and one negative control is ``inconclusive``."""
    roles = {c.role for c in controls}
    if not {"positive", "negative"} <= roles or not all(c.ok for c in controls):
        return "inconclusive"
    return "replicated" if claim_holds else "not replicated"


@dataclass
class Outcome:
    """What a check measured.

    ``passed`` is the verdict at ``tolerance``; ``tolerance_reason`` says why that tolerance.
    ``finding`` is set when the measurement contradicts the theory's claim (reported, not hidden).
    A replication also sets ``verdict`` (one of :data:`VERDICTS`, normally from :func:`replication_verdict`)
    and ``controls``; its ``passed`` is ``verdict == "replicated"`` (:meth:`for_replication`).
    """

    measured: JSONValue
    tolerance: JSONValue
    tolerance_reason: str
    passed: bool
    details: dict[str, JSONValue] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    finding: str | None = None
    verdict: str | None = None
    controls: list[Control] = field(default_factory=list)

    @classmethod
    def for_replication(cls, *, claim_holds: bool, controls: list[Control], measured: JSONValue,
                        tolerance: JSONValue, tolerance_reason: str, **extra: Any) -> Outcome:
        """A replication's outcome: the verdict from the claim and the controls (:func:`replication_verdict`)."""
        verdict = replication_verdict(claim_holds, controls)
        return cls(measured=measured, tolerance=tolerance, tolerance_reason=tolerance_reason,
                   passed=verdict == "replicated", verdict=verdict, controls=controls, **extra)


@dataclass(frozen=True)
class CheckContext:
    """Where a check writes figures, its seed, and whether this is the quick suite."""

    out_dir: Path
    seed: int
    quick: bool

    def rng(self, check_id: str) -> np.random.Generator:
        """A generator seeded by (seed, check id): checks stay reproducible when run alone."""
        digest = hashlib.sha256(f"{self.seed}:{check_id}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:8], "little"))

    def figure_path(self, name: str) -> Path:
        """Path for a PNG figure inside the output directory (created on demand)."""
        path = self.out_dir / "figures" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


@dataclass(frozen=True)
class Check:
    """A registered check: id, title, spec section, the prediction, its kind, source and regime, and the
    measuring function."""

    id: str
    title: str
    spec: str
    predicted: JSONValue
    func: Callable[[CheckContext], Outcome]
    kind: str
    source: str
    regime: str
    quick: bool = True


REGISTRY: dict[str, Check] = {}


def check(
    id: str, title: str, spec: str, predicted: JSONValue, *, kind: str, source: str, regime: str,
    quick: bool = True,
) -> Callable[[Callable[[CheckContext], Outcome]], Callable[[CheckContext], Outcome]]:
    """Register a check of ``kind`` (one of :data:`KINDS`). ``quick=False`` keeps it out of
    ``dictcheck run --quick``."""
    if kind not in KINDS:
        raise ValueError(f"check {id}: kind must be one of {KINDS}, got {kind!r}")
    if not source.strip() or not regime.strip():
        raise ValueError(f"check {id}: source and regime must be stated")

    def register(func: Callable[[CheckContext], Outcome]) -> Callable[[CheckContext], Outcome]:
        if id in REGISTRY:
            raise ValueError(f"check id registered twice: {id}")
        REGISTRY[id] = Check(id=id, title=title, spec=spec, predicted=predicted, func=func, kind=kind,
                             source=source, regime=regime, quick=quick)
        return func

    return register


@dataclass(frozen=True)
class CheckListing:
    """What ``dictcheck run --list`` shows of a check, read from its registration without running its module."""

    id: str
    title: str
    spec: str
    kind: str
    quick: bool = True


def list_checks() -> list[CheckListing]:
    """Every check's listing, read from the ``@check(...)`` decorators of the modules of proofs_checks.checks
    (their id, title, spec, kind and quick are literals), so that listing imports none of them (nor torch).
    tests/test_cli_startup.py holds this equal to the registrations of :func:`load_all_checks`."""
    import ast

    import dictcheck.proofs_checks.checks as package

    found = []
    for path in sorted(Path(package.__path__[0]).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for deco in getattr(node, "decorator_list", ()):
                if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name) and deco.func.id == "check":
                    args = [ast.literal_eval(a) for a in deco.args[:3]]
                    kw = {k.arg: ast.literal_eval(k.value) for k in deco.keywords if k.arg in ("kind", "quick")}
                    found.append(CheckListing(*args, **kw))
    return found


def load_all_checks() -> dict[str, Check]:
    """Import every module of proofs_checks.checks so that their checks register."""
    import importlib
    import pkgutil

    import dictcheck.proofs_checks.checks as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return REGISTRY
