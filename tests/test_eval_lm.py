"""``dictcheck eval-lm`` on the tinycoder fixture: identity splice, JSON report, one-line errors."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae
from dictcheck.proofs_checks.cli import eval_lm as cmd_eval_lm
from dictcheck.proofs_checks.errors import UserError

torch.set_num_threads(1)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cmd_eval_lm.add_parser(parser.add_subparsers())
    return parser.parse_args(argv)


def _save_identity_topk(path, d: int = 16) -> None:
    """A topk SAE with W_enc = [I, −I], W_dec = [I; −I], k = d: x̂ = x exactly."""
    eye = torch.eye(d)
    weights = {"W_enc": torch.cat([eye, -eye], 1), "b_enc": torch.zeros(2 * d), "W_dec": torch.cat([eye, -eye], 0),
               "b_dec": torch.zeros(d)}
    save_sae(path, weights, new_sae_config("topk", d, 2 * d, k=d))


def test_identity_sae_report(tmp_path, capsys) -> None:
    _save_identity_topk(tmp_path / "sae")
    args = _parse(["eval-lm", str(tmp_path / "sae"), "--layer", "0", "--model", "tinycoder", "--tokens", "40",
                   "--context", "9", "--batch-size", "2", "--names", "3", "--json"])
    assert args.handler(args) == 0
    r = json.loads(capsys.readouterr().out)
    m = r["metrics"]
    assert m["n_eval_tokens"] == 40 and r["n_windows"] == 5 and m["n_ce_tokens"] == 5 * 8
    assert m["ve"] == pytest.approx(1.0, abs=1e-12) and m["ce_recovered"] == pytest.approx(1.0, abs=1e-6)
    assert abs(m["kl"]) < 1e-9 and m["delta_ce"] == pytest.approx(0.0, abs=1e-9) and m["ce_zero"] > 0
    assert m["l0"] <= 16 and 0 <= m["dead_frac"] <= 1
    a = r["alignment"]
    assert a["n_features"] == 32 and a["n_vocab"] == 32000 and sum(a["buckets"].values()) == 32
    assert a["n_alive"] == round(32 * (1 - m["dead_frac"]))
    assert len(r["names"]) == 3 and all(len(n["tokens"]) == 5 and isinstance(n["tokens"][0], str) for n in r["names"])
    s_named = [n["cos"][0] for n in r["names"]]
    assert s_named == sorted(s_named, reverse=True)
    args = _parse(["eval-lm", str(tmp_path / "sae"), "--layer", "1", "--model", "tinycoder", "--tokens", "16",
                   "--context", "9"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "ce_recovered" in out and "alignment_rate_alive" in out and "model.layers.1" in out


@pytest.mark.parametrize("argv,message", [
    (["--layer", "2"], "layer"),
    (["--layer", "0", "--tokens", "0"], "--tokens must be >= 1"),
    (["--layer", "0", "--context", "1"], "--context must be >= 2"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, argv, message) -> None:
    _save_identity_topk(tmp_path / "sae")
    args = _parse(["eval-lm", str(tmp_path / "sae"), "--model", "tinycoder", *argv])
    with pytest.raises(UserError, match=message) as e:
        args.handler(args)
    assert "\n" not in str(e.value)


def test_missing_folder_and_width_mismatch(tmp_path) -> None:
    args = _parse(["eval-lm", str(tmp_path / "nothing"), "--layer", "0", "--model", "tinycoder"])
    with pytest.raises(UserError):
        args.handler(args)
    _save_identity_topk(tmp_path / "wide", d=8)
    args = _parse(["eval-lm", str(tmp_path / "wide"), "--layer", "0", "--model", "tinycoder"])
    with pytest.raises(UserError, match="d_in=8 but tinycoder's residual width is 16"):
        args.handler(args)
    args = _parse(["eval-lm", str(tmp_path / "wide"), "--layer", "0", "--model", "no-such-model"])
    with pytest.raises(UserError):
        args.handler(args)
