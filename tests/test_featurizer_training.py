"""The training loop drives any Featurizer through its hooks (empirics/architectures/featurizer.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dictcheck.empirics.architectures import (
    REGISTRY,
    ArchOptions,
    Architecture,
    architecture,
    build_model,
    family_of,
    option,
    register,
    unregister,
)
from dictcheck.empirics.architectures.featurizer import Featurizer, FeaturizerOutput
from dictcheck.empirics.io.sae_folder import load_featurizer
from dictcheck.empirics.training.loop import ARCHS, TrainConfig, train
from dictcheck.proofs_checks.cli import main


class _Recorder(Featurizer):
    """A linear map trained on ‖x − xA‖² with no input-space x_hat exposed, recording hook calls."""

    def __init__(self, arch: str, d_in: int, d_sae: int, scale: float) -> None:
        super().__init__()
        self.arch, self.d_in, self.d_sae = arch, d_in, d_sae
        self.A = torch.nn.Parameter(scale * torch.eye(d_in, dtype=torch.float64))
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
        return {"A": self.A.detach().clone()}

    def load_state_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.A.copy_(weights["A"])

    def firing_metrics(self, fire_counts: torch.Tensor, n_tokens: int) -> dict[str, int]:
        return {"never_fired": int((fire_counts == 0).sum())}


# ---- a new architecture is one class (what a family module holds) plus one registration line ----
@dataclass(frozen=True)
class _ToyOptions(ArchOptions):
    scale: float = option(0.0, type=float, help="initial A = scale·I (toy-linear)")


class _ToyLinear(Architecture):
    name = "toy-linear"
    family = "toy"
    family_title = "toy architectures (tests)"
    fields_key = "toy"
    saved_name = "dictcheck/toy-linear"
    decoder_norm = "none"
    b_dec_inits = ("none",)
    Options = _ToyOptions

    def default_lr(self, d_sae: int) -> float:
        return 1e-2

    def weight_schema(self, d_in: int, d_sae: int, fields) -> dict:
        return {"A": ((d_in, d_in), True)}

    def init_model(self, d_in: int, d_sae: int, options, *, seed: int, dtype: torch.dtype) -> Featurizer:
        return _Recorder(self.name, d_in, d_sae, options.scale)


@pytest.fixture
def toy_arch():
    register(_ToyLinear)  # the one line
    yield architecture("toy-linear")
    unregister("toy-linear")


def test_loop_calls_hooks_and_reports_extra_metrics(tmp_path, toy_arch):
    X = np.random.default_rng(0).normal(size=(50, 4))
    model = toy_arch.build(4, 3, {"scale": 0.5}, dtype=torch.float64)
    cfg = TrainConfig(steps=5, batch_size=10, lr=1e-2, device="cpu", checkpoint_every=0, log_every=5,
                      keep_checkpoints=1)
    res = train(model, X, cfg, tmp_path, progress=False)
    assert res.model is model and not res.model.training
    calls = model.calls
    assert calls[0] == ("param", None)  # projected once before training
    assert [c for c in calls if c[0] == "step"] == [("step", s) for s in range(5)]
    assert calls[1:] == [c for s in range(5) for c in (("step", s), ("grad", None), ("param", None))]
    m = json.loads((tmp_path / "metrics.json").read_text())
    # no input-space reconstruction → no fvu; the extra mean is averaged over the 50 evaluation tokens
    assert "fvu" not in m and m["never_fired"] == 2 and m["eval_batch_size"] == 10
    A = model.A.detach()
    Xt = torch.from_numpy(X)
    assert m["half_mse"] == pytest.approx(0.5 * float((Xt - Xt @ A).pow(2).sum(1).mean()), rel=1e-12)
    assert res.metrics["l0"] == 1.0


def test_a_toy_architecture_registered_in_a_test_trains_saves_loads_and_has_cli_options(tmp_path, toy_arch,
                                                                                          capsys):
    X = np.random.default_rng(1).normal(size=(40, 3))
    res = train(toy_arch.build(3, 2, {"scale": 0.25}, dtype=torch.float64), X,
                TrainConfig(steps=4, batch_size=8, device="cpu", log_every=4), tmp_path / "m", progress=False)
    cfg_json = json.loads((tmp_path / "m" / "cfg.json").read_text())
    assert cfg_json["architecture"] == "dictcheck/toy-linear"
    assert cfg_json["metadata"]["dictcheck"]["training"]["options"] == {"scale": 0.25}
    loaded, _ = load_featurizer(tmp_path / "m")
    assert isinstance(loaded, _Recorder) and torch.equal(loaded.A, res.model.A)
    assert loaded.arch_options == _ToyOptions(scale=0.25)
    np.save(tmp_path / "X.npy", X)
    code = main(["train", "--arch", "toy-linear", "--data", str(tmp_path / "X.npy"), "--d-sae", "2",
                 "--scale", "0.5", "--steps", "3", "--batch-size", "8", "--dtype", "float64",
                 "--out", str(tmp_path / "cli"), "--json"])
    assert code == 0
    assert json.loads((tmp_path / "cli" / "cfg.json").read_text())["metadata"]["dictcheck"]["training"][
        "options"] == {"scale": 0.5}
    with pytest.raises(SystemExit):
        main(["train", "--arch", "toy-linear", "--help"])
    assert "--scale" in capsys.readouterr().out


def test_architecture_registry():
    assert set(ARCHS) == set(REGISTRY)
    assert {family_of(a) for a in ARCHS} == {"sae", "bsf", "bilinear", "vasae"}
    with pytest.raises(ValueError, match="arch must be one of"):
        architecture("gated")
    assert architecture("topk").default_lr(2**14) == pytest.approx(2e-4)
    with pytest.raises(ValueError, match="registered twice"):
        register(type(architecture("topk")))


@pytest.mark.parametrize(
    "arch, options, match",
    [
        ("topk", {"k": 2, "block_size": 2}, "does not take option"),
        ("topk", {"k": 2}, "b_dec_init"),
    ],
)
def test_options_and_centring_are_validated(arch, options, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(b_dec_init="none").for_model(build_model(arch, 3, 4, options))


def test_arch_defaults_resolved_for_the_model():
    cfg = TrainConfig().for_model(build_model("topk", 3, 2**14, {"k": 4}))
    assert cfg.b_dec_init == "geometric_median" and cfg.lr == pytest.approx(2e-4)


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
    cfg = TrainConfig(steps=6, batch_size=16, device="cpu", checkpoint_every=0, log_every=6, keep_checkpoints=1)
    a = train(build_model("topk", 6, 8, {"k": 2}), X, cfg, tmp_path / "array", progress=False)
    store = _Store(X)
    b = train(build_model("topk", 6, 8, {"k": 2}), store, cfg, tmp_path / "store", progress=False)
    assert store.reads >= 6
    for name in a.weights:
        assert torch.equal(a.weights[name], b.weights[name]), name
    cfg_json = json.loads((tmp_path / "store" / "cfg.json").read_text())
    assert cfg_json["metadata"]["dictcheck"]["data_hash"] == "store-hash"


def test_row_store_with_nan_rows_is_rejected(tmp_path):
    X = np.ones((20, 3), dtype=np.float32)
    X[:, 0] = np.nan
    cfg = TrainConfig(steps=2, batch_size=4, device="cpu", b_dec_init="zero")
    with pytest.raises(ValueError, match="NaN or inf"):
        train(build_model("topk", 3, 4, {"k": 1}), _Store(X), cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match="activation store"):
        train(build_model("topk", 3, 4, {"k": 1}), [[1.0]], cfg, tmp_path / "list", progress=False)
