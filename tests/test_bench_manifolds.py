"""``dictcheck bench-manifolds`` (docs/bsf.md §5–§7): the --quick JSON contract and bad input."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from dictcheck.empirics.data.manifold_toy import make_manifold_benchmark
from dictcheck.proofs_checks.cli import main
from dictcheck.empirics.metrics.manifold_bench import QUICK, prepare


def _run(argv: list[str]) -> int:
    """Exit code of ``dictcheck`` (argparse usage errors raise SystemExit, UserError returns 2)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = _run(["bench-manifolds", "--quick", "--json", "--seed", "1", "--out", str(out)])
    return rc, json.loads(buf.getvalue()), out


def test_quick_json_contract(quick_run):
    rc, result, out = quick_run
    assert rc == 0
    assert set(result) == {"settings", "recovery", "mdl"}
    assert result["settings"]["seed"] == 1 and result["settings"]["steps"] == QUICK.steps
    models = [r["model"] for r in result["recovery"]]
    assert models == ["bsf-vanilla", "bsf-grassmann", "bsf-grouplasso", "sae-topk", "bsf-vanilla-q1"]
    for r in result["recovery"]:
        assert set(r["per_type_best"]) == {"circle", "sphere", "torus"}
        assert r["mean_best"] == pytest.approx(np.mean(r["best"]))
        assert r["mean_hungarian"] <= r["mean_best"] + 1e-12  # one-to-one can only lose against best-block
        assert r["n_b"] * r["q"] == 48
    mdl = result["mdl"]
    assert [r["q"] for r in mdl["rows"]] == list(QUICK.mdl_block_sizes)
    for r in mdl["rows"]:
        assert r["total"] == pytest.approx(r["L_support"] + r["L_code"] + r["L_resid"] + r["L_dict"])
        assert r["n_b"] * r["q"] == mdl["width"] == 48
        assert r["k"] == 3 * -(-4 // r["q"])  # k_true·⌈n_max/q⌉ with n_max = 4 (tori)
    assert mdl["argmin_q"] == min(mdl["rows"], key=lambda r: r["total"])["q"]
    p = mdl["precisions"]
    X = make_manifold_benchmark(QUICK.data, seed=1).eval.X
    assert p["delta_x"] == pytest.approx(0.01 * np.sqrt(X.var(axis=0).mean())) and p["B_w"] == 16
    assert json.loads((out / "bench_manifolds.json").read_text()) == result


def test_prepare_spec_scaling():
    bench = make_manifold_benchmark(QUICK.data, seed=0)
    prep = prepare(bench)
    assert np.allclose(prep.train.mean(axis=0), 0, atol=1e-12)
    assert np.mean(np.sum(prep.train**2, axis=1)) == pytest.approx(bench.config.D)
    assert np.allclose(prep.eval / prep.scale + prep.mu, bench.eval.X)


@pytest.mark.parametrize("argv", [["--seed", "-1"], ["--steps", "0"], ["--steps", "many"]])
def test_bad_input_exit_2_one_line(argv, capsys):
    assert _run(["bench-manifolds", "--quick", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dictcheck: error:") and err.count("\n") == 1


def test_restart_protocol_candidates_and_choice():
    from dataclasses import replace

    from dictcheck.empirics.metrics.manifold_bench import train_best

    s = replace(QUICK, restarts=3, lrs=(1e-3, 1e-2))
    assert s.candidates(1) == [(3, 1e-3), (3, 1e-2), (4, 1e-3), (4, 1e-2), (5, 1e-3), (5, 1e-2)]
    assert replace(QUICK, restarts=1).candidates(7) == [(7, QUICK.lr)]
    with pytest.raises(ValueError, match="restarts"):
        replace(QUICK, restarts=0)
    with pytest.raises(ValueError, match="learning rates"):
        replace(QUICK, lrs=(0.0,))
    bench = make_manifold_benchmark(QUICK.data, seed=0)
    two = replace(QUICK, restarts=2, steps=10)
    best = train_best(prepare(bench), "bsf-vanilla", 24, 3, {"block_size": 4}, two, seed=0)
    objectives = [c["train_objective"] for c in best.metrics["candidates"]]
    assert len(objectives) == 2 and best.metrics["chosen"] == int(np.argmin(objectives))
    assert best.metrics["train_objective"] == min(objectives)
