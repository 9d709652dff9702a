"""``dictcheck check-sae --nproc 2``: the tokens split over two gloo ranks give the report of one process (λ
identical, every number to 1e-10 relative), and a failing run ends in one line (proofs_checks/cli/ranks.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae
from dictcheck.proofs_checks.cli.check_sae import _failure_line

REL = 1e-10


def _case(tmp: Path, arch: str, seed: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    d_in, d_sae, n = 12, 40, 301  # an odd count: the ranks get 150 and 151 tokens
    W = rng.normal(size=(d_sae, d_in))
    W[5] = -W[4]  # an antipodal pair
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    codes = rng.exponential(size=(n, d_sae)) * (rng.random((n, d_sae)) < 0.1)
    X = (codes @ W + 0.05 * rng.normal(size=(n, d_in))).astype(np.float32)
    np.save(tmp / "X.npy", X)
    Wt = torch.as_tensor(W, dtype=torch.float32)
    weights = {"W_dec": Wt, "W_enc": Wt.T.contiguous(), "b_enc": torch.full((d_sae,), -0.1),
               "b_dec": torch.as_tensor(0.01 * rng.normal(size=d_in), dtype=torch.float32)}
    cfg = new_sae_config(arch, d_in, d_sae, k=4 if arch == "topk" else None, lam=0.05 if arch == "relu" else None)
    return tmp / "X.npy", save_sae(tmp / arch, weights, cfg)


def _run(folder: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dictcheck.proofs_checks.cli", "check-sae", str(folder), "--data",
                           str(data), "--json", *extra], capture_output=True, text=True, timeout=900)


def _same(a, b, path: str = "") -> list[str]:
    """Paths where a and b differ (numbers beyond REL relative; timings and the process count skipped)."""
    if isinstance(a, dict):
        return [d for k in a if k not in ("timings_s", "n_processes") for d in _same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} against {len(b)} entries"]
        return [d for i, (u, v) in enumerate(zip(a, b)) for d in _same(u, v, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if a == b or abs(a - b) <= REL * max(abs(a), abs(b)) else [f"{path}: {a!r} against {b!r}"]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


@pytest.mark.slow
@pytest.mark.parametrize("arch, extra", [("topk", ["--lam", "auto"]), ("relu", ["--polish", "--polish-iters", "3"])])
def test_two_ranks_give_the_report_of_one_process(tmp_path: Path, arch: str, extra: list[str]) -> None:
    data, folder = _case(tmp_path, arch)
    one = _run(folder, data, *extra)
    two = _run(folder, data, "--nproc", "2", *extra)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    assert (a["n_processes"], b["n_processes"]) == (1, 2)
    assert a["lam"] == b["lam"] and a["antipodal_pairs"] == b["antipodal_pairs"] == [[4, 5]]
    assert _same(a, b) == []


def test_a_failing_launch_ends_in_one_line(tmp_path: Path) -> None:
    data, folder = _case(tmp_path, "topk")
    np.save(tmp_path / "wide.npy", np.zeros((10, 13), dtype=np.float32))
    out = _run(folder, tmp_path / "wide.npy", "--nproc", "2")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "d_in = 12" in lines[0], out.stderr


def test_failure_lines_name_the_rank() -> None:
    def failure(exitcode: int, message: str | None = None):
        return SimpleNamespace(exitcode=exitcode, error_file_data={"message": message} if message else None,
                               signal_name=lambda: "SIGKILL")

    assert _failure_line(1, failure(2, "bad data")) == ("rank 1: bad data", 2)
    assert _failure_line(0, failure(-9)) == ("check-sae failed: rank 0 was killed by SIGKILL", 1)
    assert _failure_line(1, failure(1)) == ("check-sae failed: rank 1 exited with code 1", 1)
