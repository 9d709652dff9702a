"""The linear SAEs' ``freeze_b_dec`` option: b_dec keeps its b_dec_init value through training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dictcheck.empirics.architectures import architecture, build_model
from dictcheck.empirics.training.loop import TrainConfig, train


def _trained(arch: str, options: dict, b_dec_init: str, steps: int = 30):
    rows = np.random.default_rng(0).normal(size=(64, 3)) + np.array([2.0, -1.0, 0.5])
    model = build_model(arch, 3, 4, options, seed=0, dtype=torch.float64)
    w0 = model.W_dec.detach().clone()
    cfg = TrainConfig(steps=steps, batch_size=64, lr=1e-2, seed=0, device="cpu", checkpoint_every=0, log_every=steps,
                      b_dec_init=b_dec_init)
    result = train(model, rows, cfg, progress=False)
    return result, w0, rows


@pytest.mark.parametrize("arch, options", [("relu", {"lam": 0.1}), ("jumprelu", {"lam": 0.1}), ("topk", {"k": 2})])
def test_frozen_b_dec_stays_zero_and_the_rest_trains(arch: str, options: dict) -> None:
    result, w0, _ = _trained(arch, {**options, "freeze_b_dec": True}, "zero")
    assert torch.equal(result.weights["b_dec"], torch.zeros(3, dtype=torch.float64))
    assert not torch.allclose(result.weights["W_dec"], w0)
    free, _, _ = _trained(arch, options, "zero")
    assert float(free.weights["b_dec"].abs().max()) > 1e-3  # unfrozen, b_dec moves off 0 on off-centre data


def test_frozen_b_dec_keeps_a_nonzero_init() -> None:
    """After 1 step and after 30 steps b_dec is the same: the first batch's mean (the centring rule)."""
    one, _, _ = _trained("relu", {"lam": 0.1, "freeze_b_dec": True}, "mean", steps=1)
    many, _, _ = _trained("relu", {"lam": 0.1, "freeze_b_dec": True}, "mean", steps=30)
    assert float(one.weights["b_dec"].abs().min()) > 0.1
    assert torch.equal(one.weights["b_dec"], many.weights["b_dec"])


def test_option_is_validated_and_saved() -> None:
    with pytest.raises(ValueError, match="freeze_b_dec must be true or false"):
        build_model("relu", 3, 4, {"lam": 0.1, "freeze_b_dec": "yes"})
    relu = architecture("relu")
    opts = relu.options({"lam": 0.1, "freeze_b_dec": True}, 4)
    top, others = relu.saved_options(opts)
    assert others == {"freeze_b_dec": True}
    assert relu.options_from_saved(top, others, 4).freeze_b_dec is True
    assert relu.options({"lam": 0.1}, 4).freeze_b_dec is False
