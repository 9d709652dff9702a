"""A module of an earlier commit, loaded under a name of its own, for paired benchmarks against this checkout
(benchmarks/paired_training.py).

Loading this checkout's file under another name would mix up numba's on-disk cache, so the earlier commit's
file is written to a temporary directory under a name that carries the commit.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_at(rev: str, source: str, workdir: Path, imports: dict[str, str] | None = None):
    """The file ``source`` (e.g. solvers/active_set.py) of commit ``rev``, written to ``workdir`` and
    loaded under a name of its own (never the checkout's file under another name: numba's on-disk
    cache would mix them up); ``imports`` maps a module path it imports to the name of one loaded
    here before (e.g. the same commit's dependency)."""
    stem = Path(source).stem
    name = f"{stem}_{rev.replace('/', '_').replace('~', '_').replace('^', '_')}"
    path = workdir / f"{name}.py"
    src = subprocess.run(["git", "show", f"{rev}:{source}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    for old, new in (imports or {}).items():
        src = src.replace(f"from {old} import", f"from {new} import")
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
