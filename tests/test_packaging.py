"""The installed layout: one top-level package ``dictcheck`` holding the four layers, a fast lazy API, and
the README's Python quick start running as written."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("theory", "solvers", "empirics", "proofs_checks")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("dictcheck-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_installs_only_dictcheck_at_the_top_level(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"dictcheck"} and len(dist_info) == 1
    entry_points = wheel.read(f"{dist_info.pop()}/entry_points.txt").decode()
    assert re.search(r"^dictcheck = dictcheck\.proofs_checks\.cli:main$", entry_points, re.M)
    # every module of the four layers is in the wheel, under dictcheck/<layer>/
    for layer in LAYERS:
        for source in (REPO / layer).rglob("*.py"):
            assert f"dictcheck/{layer}/{source.relative_to(REPO / layer).as_posix()}" in names, source
    assert "dictcheck/empirics/data/corpus.jsonl.gz" in names
    assert {"dictcheck/proofs_checks/baselines/quick.json", "dictcheck/proofs_checks/baselines/full.json"} <= set(names)


def test_the_layers_never_import_the_top_level_api() -> None:
    """dictcheck/__init__.py imports the layers lazily; a layer importing it back would be a cycle."""
    pattern = re.compile(r"^\s*(import dictcheck\s*$|from dictcheck import )", re.M)
    offenders = [str(p.relative_to(REPO)) for layer in LAYERS for p in (REPO / layer).rglob("*.py")
                 if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_import_dictcheck_is_lazy_and_complete() -> None:
    code = ("import sys, dictcheck; assert 'torch' not in sys.modules and 'numpy' not in sys.modules; "
            "missing = [n for n in dictcheck.__all__ if getattr(dictcheck, n, None) is None]; "
            "assert not missing, missing; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_readme_python_quick_start_runs_as_written(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README has no ```python block under '## Python quick start'"
    proc = subprocess.run([sys.executable, "-c", "\n".join(blocks)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
