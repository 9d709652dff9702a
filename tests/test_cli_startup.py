"""Start-up of the ``dictcheck`` command: building its parsers (``--help`` of the command and of every
subcommand, ``run --list``) imports no heavy package. The timings are in benchmarks/RESULTS.md §13; this test
holds what makes them: the list of packages those invocations may import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dictcheck.proofs_checks.cli import COMMANDS

#: The only packages outside the standard library that building a parser may import.
ALLOWED = {"dictcheck", "numpy"}
_PROBE = """
import json, sys
from dictcheck.proofs_checks.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
tops = {{m.split('.')[0] for m in sys.modules}} - set(sys.stdlib_module_names)
print(json.dumps(sorted(t for t in tops if not t.startswith('_'))))  # '_'-names: interpreter and install shims
"""


def _imported(argv: list[str]) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in COMMANDS), ["run", "--list"]],
                         ids=" ".join)
def test_building_the_parsers_imports_nothing_heavy(argv: list[str]) -> None:
    assert _imported(argv) <= ALLOWED


def test_the_probe_sees_a_heavy_import() -> None:
    """Negative control: training options of an architecture need its module, which loads torch."""
    assert "torch" in _imported(["train", "--arch", "topk", "--help"])


def test_the_listing_read_from_the_decorators_is_the_registry() -> None:
    """``run --list`` reads the checks' decorators (no import); what it shows is what registering them gives."""
    from dictcheck.proofs_checks.registry import list_checks, load_all_checks

    listed = {c.id: (c.title, c.spec, c.kind, c.quick) for c in list_checks()}
    assert len(listed) == len(list_checks())  # no id twice
    assert listed == {c.id: (c.title, c.spec, c.kind, c.quick) for c in load_all_checks().values()}
