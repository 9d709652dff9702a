"""``dictcheck activations`` (proofs_checks/cli/activations.py): extraction through the CLI and its
one-line errors (exit 2). Runs on tinycoder."""

from __future__ import annotations

import json

import numpy as np

from dictcheck.empirics.data.activation_store import open_activations
from dictcheck.proofs_checks.cli import main

TINY = ["activations", "--model", "tinycoder", "--context", "8", "--shard-tokens", "32"]


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dictcheck: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_extracts_and_reports_json(tmp_path, capsys):
    out = tmp_path / "acts"
    assert main([*TINY, "--layer", "1", "--tokens", "50", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    store = open_activations(out)
    assert (summary["n_tokens"], summary["d"], summary["layer"], summary["shards"]) == (50, 16, 1, 2)
    assert summary["content_hash"] == store.content_hash() and summary["hook"]["module"] == "model.layers.1"
    assert store.shape == (50, 16) and np.isfinite(store.to_array()).all()
    assert main([*TINY, "--layer", "1", "--tokens", "50", "--out", str(out)]) == 0  # finished: reopened
    text = capsys.readouterr().out
    assert text.startswith("50 tokens x 16 of tinycoder layer 1 (model.layers.1 output) in 2 shard(s)")
    assert "dictcheck train --data" in text


def test_errors_are_one_line(tmp_path, capsys):
    out = str(tmp_path / "acts")
    assert "unknown model 'gpt-9'" in _error(capsys, ["activations", "--model", "gpt-9", "--layer", "0",
                                                      "--tokens", "10", "--out", out])
    assert "layer 2 out of range for tinycoder (0..1)" in _error(capsys, [*TINY, "--layer", "2", "--tokens", "10",
                                                                           "--out", out])
    assert "--tokens must be at least 1, got 0" in _error(capsys, [*TINY, "--layer", "0", "--tokens", "0", "--out", out])
    assert "--context must be at least 2" in _error(capsys, ["activations", "--model", "tinycoder", "--context", "1",
                                                             "--layer", "0", "--tokens", "5", "--out", out])
    assert main([*TINY, "--layer", "0", "--tokens", "10", "--out", out, "--json"]) == 0
    capsys.readouterr()
    assert "holds a different extraction (differs in: n_tokens)" in _error(
        capsys, [*TINY, "--layer", "0", "--tokens", "12", "--out", out])
