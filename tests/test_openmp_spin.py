"""empirics/kernels/openmp_spin.py: GOMP_SPINCOUNT is set before torch loads, never over the user's setting or
after torch (libgomp reads it once, at load); the ``dictcheck`` command sets it before any command runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dictcheck.empirics.kernels.openmp_spin import SPIN_COUNT, SPIN_ENV

_REPORT = "import os, sys; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"


def _fresh(code: str, **env: str) -> str:
    """stdout of ``code`` in a fresh interpreter whose environment lacks both OpenMP variables, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in (SPIN_ENV, "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(("before", "env", "expected"), [
    ("", {}, f"True\n{SPIN_COUNT} False"),
    ("", {SPIN_ENV: "5"}, "False\n5 False"),
    ("", {"OMP_WAIT_POLICY": "PASSIVE"}, "False\nNone False"),
    ("import torch; ", {}, "False\nNone True"),  # too late: libgomp has read its environment
])
def test_set_only_before_torch_and_never_over_the_user(before: str, env: dict[str, str], expected: str) -> None:
    code = f"{before}from dictcheck.empirics.kernels.openmp_spin import shorten_openmp_spin; print(shorten_openmp_spin()); {_REPORT}"
    assert _fresh(code, **env) == expected


def test_the_command_sets_it_before_a_command_loads_torch() -> None:
    code = ("import sys\nfrom dictcheck.proofs_checks.cli import main\nassert 'torch' not in sys.modules\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\nimport os\nprint(os.environ.get('GOMP_SPINCOUNT'))")
    assert _fresh(code).splitlines()[-1] == SPIN_COUNT
