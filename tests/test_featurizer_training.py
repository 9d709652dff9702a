"""The training loop drives any Featurizer through its hooks (empirics/featurizer.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dictcheck.empirics.architectures import ARCHITECTURES, architecture, family_of
from dictcheck.empirics.featurizer import Featurizer, FeaturizerOutput
from dictcheck.empirics.training import ARCHS, TrainConfig, train


class _Recorder(Featurizer):
    """A linear map trained on ‖x − xA‖² with no input-space x_hat exposed, recording hook calls."""

    def __init__(self, d_in: int, d_sae: int) -> None:
        super().__init__()
        self.arch, self.d_in, self.d_sae = "relu", d_in, d_sae
        self.A = torch.nn.Parameter(torch.zeros(d_in, d_in, dtype=torch.float64))
        self.calls: list[tuple[str, int | None]] = []

    def set_step(self, step: int) -> None:
        self.calls.append(("step", step))

    def project_gradients_(self) -> None:
        self.calls.append(("grad", None))

    def project_parameters_(self) -> None:
        self.calls.append(("param", None))

    def forward(self, x: torch.Tensor, dead_mask: torch.Tensor | None = None) -> FeaturizerOutput:
        err = (x - x @ self.A).pow(2).sum(1)
        codes = torch.zeros(x.shape[0], self.d_sae, dtype=x.dtype)
        codes[:, 0] = 1.0  # latent 0 always fires, the others never
        zero = err.new_zeros(())
        return FeaturizerOutput(x_hat=None, codes=codes, loss=err.mean(), mse=err.mean(), sparsity_loss=zero,
                                aux_loss=zero, l0=codes.sum(1).mean(), extra={"half_mse": 0.5 * err.mean()})

    def state_weights(self) -> dict[str, torch.Tensor]:
        return {"W_enc": self.A.detach().clone()[:, : self.d_sae], "b_enc": torch.zeros(self.d_sae),
                "W_dec": torch.zeros(self.d_sae, self.d_in), "b_dec": torch.zeros(self.d_in)}

    def firing_metrics(self, fire_counts: torch.Tensor, n_tokens: int) -> dict[str, int]:
        return {"never_fired": int((fire_counts == 0).sum())}


def test_loop_calls_hooks_and_reports_extra_metrics(tmp_path):
    X = np.random.default_rng(0).normal(size=(50, 4))
    made: list[_Recorder] = []

    def factory(arch, d_in, d_sae, **kwargs):
        made.append(_Recorder(d_in, d_sae))
        return made[-1]

    cfg = TrainConfig(arch="relu", d_sae=3, lam=0.1, steps=5, batch_size=10, lr=1e-2, device="cpu", dtype="float64",
                      checkpoint_every=0, log_every=5, b_dec_init="zero", keep_checkpoints=1)
    res = train(X, cfg, tmp_path, progress=False, model_factory=factory)
    assert res.model is made[0] and not res.model.training
    calls = made[0].calls
    assert calls[0] == ("param", None)  # projected once before training
    assert [c for c in calls if c[0] == "step"] == [("step", s) for s in range(5)]
    assert calls[1:] == [c for s in range(5) for c in (("step", s), ("grad", None), ("param", None))]
    m = json.loads((tmp_path / "metrics.json").read_text())
    # no input-space reconstruction → no fvu; the extra mean is averaged over the 50 evaluation tokens
    assert "fvu" not in m and m["never_fired"] == 2 and m["eval_batch_size"] == 10
    A = made[0].A.detach()
    Xt = torch.from_numpy(X)
    assert m["half_mse"] == pytest.approx(0.5 * float((Xt - Xt @ A).pow(2).sum(1).mean()), rel=1e-12)
    assert res.metrics["l0"] == 1.0


def test_architecture_registry():
    assert set(ARCHS) == set(ARCHITECTURES)
    assert {family_of(a) for a in ARCHS} == {"sae", "bsf", "bilinear", "vasae"}
    with pytest.raises(ValueError, match="arch must be one of"):
        architecture("gated")
    assert architecture("topk").default_lr(2**14) == pytest.approx(2e-4)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(arch="topk", k=2, options={"block_size": 2}), "takes no options"),
        (dict(arch="topk", k=2, options=[1]), "options must be a dict"),
        (dict(arch="topk", k=2, b_dec_init="none"), "b_dec_init"),
    ],
)
def test_options_and_centring_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(d_sae=4, **kw).validate()


def test_arch_defaults_resolved_at_construction():
    cfg = TrainConfig(arch="topk", d_sae=2**14, k=4)
    assert cfg.b_dec_init == "geometric_median" and cfg.lr == pytest.approx(2e-4)
    assert cfg.result_fields()["options"] == {}


class _Store:
    """A minimal row store: the protocol train() accepts besides numpy arrays."""

    def __init__(self, X: np.ndarray) -> None:
        self.X = X
        self.shape, self.dtype = X.shape, X.dtype
        self.reads = 0

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        self.reads += 1
        return self.X[rows]

    def content_hash(self) -> str:
        return "store-hash"


def test_row_store_trains_like_the_array(tmp_path):
    X = np.random.default_rng(1).normal(size=(80, 6)).astype(np.float32)
    cfg = TrainConfig(arch="topk", d_sae=8, k=2, steps=6, batch_size=16, device="cpu", checkpoint_every=0,
                      log_every=6, keep_checkpoints=1)
    a = train(X, cfg, tmp_path / "array", progress=False)
    store = _Store(X)
    b = train(store, cfg, tmp_path / "store", progress=False)
    assert store.reads >= 6
    for name in a.weights:
        assert torch.equal(a.weights[name], b.weights[name]), name
    cfg_json = json.loads((tmp_path / "store" / "cfg.json").read_text())
    assert cfg_json["metadata"]["dictcheck"]["data_hash"] == "store-hash"


def test_row_store_with_nan_rows_is_rejected(tmp_path):
    X = np.ones((20, 3), dtype=np.float32)
    X[:, 0] = np.nan
    cfg = TrainConfig(arch="topk", d_sae=4, k=1, steps=2, batch_size=4, device="cpu", b_dec_init="zero")
    with pytest.raises(ValueError, match="NaN or inf"):
        train(_Store(X), cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match="activation store"):
        train([[1.0]], cfg, tmp_path / "list", progress=False)
