"""Tests for theory.bilinear_lifted and empirics.architectures.bilinear (docs/bilinear.md §0–§5, §9, §10)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.architectures import REGISTRY, architecture, build_model
from dictcheck.empirics.architectures.bilinear import HOYER_WARMUP_STEPS, hoyer_mean
from dictcheck.empirics.io.sae_folder import load_featurizer, load_sae, new_sae_config, save_sae
from dictcheck.theory.bilinear_lifted import (
    BilinearDictionary,
    block_pairs,
    hoyer_density,
    kernel_lifted_loss,
    lifted_loss_gradients,
    naive_lifted_loss,
    naive_ordered_lifted_loss,
    normalise_tokens,
    ordered_lifted_loss,
)

torch.set_num_threads(1)

#: "compound-glu": the compound prior with GLU atoms u_j v_jᵀ (the authors' mixed model), both decoders.
VARIANTS = [("quadratic", "symmetric"), ("quadratic", "asymmetric"), ("atomic", "symmetric"), ("compound", "symmetric"),
            ("compound-glu", "symmetric"), ("compound-glu", "asymmetric")]
MODEL_VARIANTS = [
    ("bilinear-quadratic", {}),
    ("bilinear-quadratic", {"decoder": "asymmetric"}),
    ("bilinear-atomic", {}),
    ("bilinear-compound", {"n_atoms": 9, "k_c": 3}),
    ("bilinear-compound", {"n_atoms": 9, "k_c": 9, "atoms": "glu", "hoyer_on": "atoms"}),
    ("bilinear-compound", {"n_atoms": 9, "k_c": 4, "atoms": "glu", "decoder": "asymmetric"}),
]
REL = 1e-10


def _f(t) -> float:
    """Python float of a (possibly grad-requiring) scalar tensor."""
    return float(t.detach())


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b))


def _dictionary(rng: np.random.Generator, prior: str, decoder: str, D: int, d_z: int, n_a: int) -> BilinearDictionary:
    compound = prior.startswith("compound")
    m = n_a if compound else d_z
    U = rng.normal(size=(m, D))
    V = rng.normal(size=(m, D)) if prior in ("quadratic", "compound-glu") else None
    C = rng.normal(size=(d_z, n_a)) if compound else None
    return BilinearDictionary(prior.removesuffix("-glu"), U, V, C, decoder)


def _tokens(rng: np.random.Generator, N: int, D: int) -> np.ndarray:
    return normalise_tokens(rng.normal(size=(N, D)))[0]


def _batch(seed: int, B: int, D: int) -> torch.Tensor:
    return torch.randn(B, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _model(arch: str, opts: dict, D: int = 5, d_sae: int = 7, seed: int = 0, **extra):
    return build_model(arch, D, d_sae, {**opts, **extra}, seed=seed, dtype=torch.float64)


def _resolve(arch: str, d_sae: int, opts: dict) -> dict:
    return architecture(arch).options(opts, d_sae).to_dict()


# ----------------------------------------------------------------------------- kernel loss (theory)
shapes = st.tuples(st.integers(2, 6), st.integers(1, 8), st.integers(1, 9), st.integers(1, 7), st.integers(0, 10**6))


@pytest.mark.parametrize("prior,decoder", VARIANTS)
@settings(max_examples=15, deadline=None)
@given(shape=shapes)
def test_kernel_loss_equals_naive_lifted_loss(prior, decoder, shape):
    D, d_z, N, n_a, seed = shape
    rng = np.random.default_rng(seed)
    d = _dictionary(rng, prior, decoder, D, d_z, n_a)
    X = _tokens(rng, N, D)
    naive = naive_lifted_loss(X, d.forms())
    assert _rel(kernel_lifted_loss(X, d), naive) < REL
    for tile in (1, 2, 3):
        assert _rel(kernel_lifted_loss(X, d, tile=tile), naive) < REL


def test_kernel_matches_forms_and_latents_match_forms():
    rng = np.random.default_rng(3)
    X = _tokens(rng, 6, 4)
    for prior, decoder in VARIANTS:
        d = _dictionary(rng, prior, decoder, 4, 5, 6)
        W = d.forms()
        np.testing.assert_allclose(d.kernel(), np.einsum("jde,lde->jl", W, W), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d.latents(X), np.einsum("nd,jde,ne->nj", X, W, X), rtol=1e-12, atol=1e-12)
        assert np.allclose(W, W.transpose(0, 2, 1)) == (decoder == "symmetric")


def test_block_pairs_weights():
    pairs = block_pairs(7, 3)  # blocks [0,3) [3,6) [6,7): 3 diagonal + 3 off-diagonal pairs
    assert [(I.start, J.start, w) for I, J, w in pairs] == [
        (0, 0, 1.0), (0, 3, 2.0), (0, 6, 2.0), (3, 3, 1.0), (3, 6, 2.0), (6, 6, 1.0)
    ]
    assert block_pairs(7, 0) == block_pairs(7, 7) == block_pairs(7, 50) == [(slice(0, 7), slice(0, 7), 1.0)]
    with pytest.raises(ValueError, match="tile"):
        block_pairs(7, -1)


def test_kernel_loss_rejects_unnormalised_rows_and_bad_shapes():
    rng = np.random.default_rng(0)
    d = _dictionary(rng, "atomic", "symmetric", 3, 2, 1)
    with pytest.raises(ValueError, match="unit norm"):
        kernel_lifted_loss(2.0 * _tokens(rng, 4, 3), d)
    with pytest.raises(ValueError, match="columns"):
        kernel_lifted_loss(_tokens(rng, 4, 5), d)
    with pytest.raises(ValueError, match="decoder"):
        BilinearDictionary("atomic", d.U, decoder="asymmetric")
    with pytest.raises(ValueError, match="V must be given"):
        BilinearDictionary("quadratic", d.U)
    with pytest.raises(ValueError, match="non-finite"):
        BilinearDictionary("atomic", np.full((2, 3), np.nan))


# ----------------------------------------------------------------------------- gradients
def _fd_gradient(f, A: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(A)
    for idx in np.ndindex(A.shape):
        e = np.zeros_like(A)
        e[idx] = h
        g[idx] = (f(A + e) - f(A - e)) / (2 * h)
    return g


@pytest.mark.parametrize("prior,decoder", VARIANTS)
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_closed_form_gradients_equal_finite_differences(prior, decoder, seed):
    rng = np.random.default_rng(seed)
    d = _dictionary(rng, prior, decoder, 3, 4, 5)
    X = _tokens(rng, 6, 3)
    grads = lifted_loss_gradients(X, d)
    for name, G in grads.items():
        def loss(A, name=name):
            kw = {"U": d.U, "V": d.V, "C": d.C, name: A}
            return naive_lifted_loss(X, BilinearDictionary(d.prior, decoder=decoder, **kw).forms())

        num = _fd_gradient(loss, getattr(d, name))
        assert np.max(np.abs(num - G)) <= 1e-6 * max(1.0, np.max(np.abs(G))), name


@pytest.mark.parametrize("arch,opts", MODEL_VARIANTS)
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10**6), B=st.integers(2, 12), tile=st.integers(0, 4))
def test_model_loss_and_autograd_equal_naive_and_closed_form(arch, opts, seed, B, tile):
    model = _model(arch, opts, seed=seed, hoyer_coef=0.0, tile=tile)
    x = _batch(seed, B, model.d_in)
    out = model(x)
    out.loss.backward()
    d = model.dictionary()
    X = normalise_tokens(x.numpy())[0]
    assert _rel(_f(out.mse.detach()), naive_lifted_loss(X, d.forms())) < REL
    assert _f(out.extra["nmse_lifted"]) == _f(out.mse.detach())
    for name, G in lifted_loss_gradients(X, d).items():
        got = getattr(model, name).grad.numpy()
        assert np.max(np.abs(got - G)) <= REL * np.max(np.abs(G)), name


@pytest.mark.parametrize("arch,opts", MODEL_VARIANTS)
def test_tiled_equals_untiled(arch, opts):
    x = _batch(7, 10, 5)
    results = []
    for tile in (0, 1, 2, 4, 100):
        model = _model(arch, opts, d_sae=7, seed=3, tile=tile)
        out = model(x)
        out.loss.backward()
        results.append((_f(out.loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}))
    loss0, grads0 = results[0]
    for loss, grads in results[1:]:
        assert _rel(loss, loss0) < REL
        for n, g in grads.items():
            torch.testing.assert_close(g, grads0[n], rtol=1e-10, atol=1e-13)


def test_compound_topk_is_straight_through():
    model = _model("bilinear-compound", {"n_atoms": 9, "k_c": 3}, hoyer_coef=0.0)
    C_eff = model.effective_C().detach()
    assert torch.all((C_eff != 0).sum(dim=1) == 3)
    kept = C_eff != 0
    assert torch.equal(C_eff[kept], model.C.detach()[kept])
    model(_batch(1, 8, 5)).loss.backward()
    # dropped entries get the gradient of the effective C (closed form, all entries), not zero
    assert torch.count_nonzero(model.C.grad[~kept]) == int((~kept).sum())


def test_c_l1_penalty():
    x = _batch(2, 8, 5)
    base = _model("bilinear-compound", {"n_atoms": 9, "k_c": 3}, hoyer_coef=0.0)
    pen = _model("bilinear-compound", {"n_atoms": 9, "k_c": 3}, hoyer_coef=0.0, c_l1=0.5)
    with torch.no_grad():
        o0, o1 = base(x), pen(x)
    assert _f(o1.sparsity_loss) == pytest.approx(0.5 * float(pen.C.detach().abs().sum()), rel=1e-12)
    assert _f(o1.loss - o0.loss) == pytest.approx(_f(o1.sparsity_loss), rel=1e-12)


# ----------------------------------------------------------------------------- Hoyer density
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), N=st.integers(2, 20), d=st.integers(1, 6), scale=st.floats(1e-3, 1e3))
def test_hoyer_scale_invariant_in_range_and_torch_twin(seed, N, d, scale):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(N, d)) * (rng.random((N, d)) < 0.6)
    h = hoyer_density(A)
    live = ~h.dead
    assert np.all((h.eta[live] >= -1e-12) & (h.eta[live] <= 1 + 1e-12))
    B = A.copy()
    B[:, 0] *= -scale  # rescale (and flip) one latent
    np.testing.assert_allclose(hoyer_density(B).eta, h.eta, rtol=1e-12, atol=1e-12)
    # definition, one latent at a time
    for j in np.flatnonzero(live):
        a = np.abs(A[:, j])
        assert h.eta[j] == pytest.approx((a.sum() / math.sqrt((a * a).sum()) - 1) / (math.sqrt(N) - 1), rel=1e-12, abs=1e-14)
    mean_t, dead_t = hoyer_mean(torch.from_numpy(A))
    assert dead_t == h.n_dead
    assert float(mean_t) == pytest.approx(h.mean, rel=1e-12, abs=1e-14)


def test_hoyer_extremes_and_dead_latent():
    N = 9
    A = np.zeros((N, 4))
    A[3, 0] = -2.5  # one active token -> 0
    A[:, 1] = 0.7 * np.where(np.arange(N) % 2, 1.0, -1.0)  # uniform magnitude -> 1
    A[:, 3] = np.arange(N)  # column 2 stays dead
    h = hoyer_density(A)
    assert h.eta[0] == pytest.approx(0.0, abs=1e-15)
    assert h.eta[1] == pytest.approx(1.0, rel=1e-14)
    assert h.dead.tolist() == [False, False, True, False] and h.n_dead == 1
    assert np.all(np.isfinite(h.eta))
    assert h.mean == pytest.approx(np.mean(h.eta[[0, 1, 3]]), rel=1e-14)
    At = torch.from_numpy(A).requires_grad_(True)
    mean_t, dead_t = hoyer_mean(At)
    mean_t.backward()
    assert dead_t == 1 and float(mean_t.detach()) == pytest.approx(h.mean, rel=1e-12)
    assert torch.all(torch.isfinite(At.grad)) and torch.all(At.grad[:, 2] == 0)
    all_dead = hoyer_density(np.zeros((3, 2)))
    assert all_dead.mean == 0.0 and all_dead.n_dead == 2
    with pytest.raises(ValueError, match="at least 2"):
        hoyer_density(np.ones((1, 2)))


def test_model_dead_latent_is_counted_and_gradient_finite():
    model = _model("bilinear-atomic", {}, hoyer_coef=1.0)
    with torch.no_grad():
        model.U[2] = 0.0
    out = model(_batch(4, 8, 5))
    out.loss.backward()
    assert _f(out.extra["hoyer_dead"]) == 1.0
    assert torch.all(torch.isfinite(model.U.grad))
    z = out.codes.detach().numpy()
    assert _f(out.extra["hoyer_density"]) == pytest.approx(hoyer_density(z).mean, rel=1e-12)


def test_model_hoyer_invariant_to_rescaling_a_latent():
    model = _model("bilinear-quadratic", {}, d_sae=6)
    x = _batch(5, 10, 5)
    before = _f(model(x).extra["hoyer_density"])
    with torch.no_grad():
        model.U[1] *= 7.0
        model.V[4] *= -0.01
    assert _f(model(x).extra["hoyer_density"]) == pytest.approx(before, rel=1e-12)


# ----------------------------------------------------------------------------- tokens, warm-up, outputs
@pytest.mark.parametrize("arch,opts", MODEL_VARIANTS)
def test_zero_rows_dropped_and_tokens_normalised(arch, opts):
    model = _model(arch, opts)
    x = _batch(6, 6, 5)
    ref = model(x)
    padded = torch.cat([torch.zeros(1, 5, dtype=x.dtype), 3.0 * x[:3], torch.zeros(2, 5, dtype=x.dtype), 0.5 * x[3:]])
    out = model(padded)
    for field in ("loss", "mse", "sparsity_loss", "l0"):
        assert _f(getattr(out, field)) == pytest.approx(_f(getattr(ref, field)), rel=1e-12), field
    assert _f(out.extra["hoyer_density"]) == pytest.approx(_f(ref.extra["hoyer_density"]), rel=1e-12)
    assert torch.all(out.codes[[0, 4, 5]] == 0)
    torch.testing.assert_close(out.codes[[1, 2, 3, 6, 7, 8]], ref.codes, rtol=1e-12, atol=1e-14)
    assert out.x_hat is None and _f(out.aux_loss) == 0.0 and out.codes.shape == (9, model.d_sae)
    with pytest.raises(ValueError, match="no nonzero row"):
        model(torch.zeros(3, 5, dtype=x.dtype))
    with pytest.raises(ValueError, match="shape"):
        model(torch.ones(3, 4, dtype=x.dtype))
    with pytest.raises(ValueError, match="non-finite"):
        model(torch.full((3, 5), float("nan"), dtype=x.dtype))


def test_single_token_batch_has_zero_hoyer_term():
    model = _model("bilinear-atomic", {}, hoyer_coef=1.0)
    out = model(_batch(1, 1, 5))
    assert _f(out.sparsity_loss) == 0.0 and _f(out.extra["hoyer_dead"]) == 0.0
    assert math.isfinite(_f(out.loss))


def test_hoyer_warmup():
    model = _model("bilinear-quadratic", {}, hoyer_coef=0.3)
    x = _batch(8, 8, 5)
    model.eval()
    eta = _f(model(x).extra["hoyer_density"])
    assert _f(model(x).sparsity_loss) == pytest.approx(0.3 * eta, rel=1e-12)  # eval: s = 1
    model.train()
    assert _f(model(x).sparsity_loss) == pytest.approx(0.3 * eta, rel=1e-12)  # no step set: s = 1
    for t, s in ((0, 0.0), (64, 0.25), (HOYER_WARMUP_STEPS, 1.0), (5000, 1.0)):
        model.set_step(t)
        out = model(x)
        assert _f(out.sparsity_loss) == pytest.approx(0.3 * s * eta, rel=1e-12, abs=1e-15)
        assert _f(out.loss) == pytest.approx(_f(out.mse + out.sparsity_loss), rel=1e-12)
    model.eval()
    assert _f(model(x).sparsity_loss) == pytest.approx(0.3 * eta, rel=1e-12)


def test_l0_counts_nonzero_codes():
    model = _model("bilinear-atomic", {}, d_sae=4)
    with torch.no_grad():
        model.U[1] = 0.0
    out = model(_batch(9, 5, 5))
    assert _f(out.l0) == 3.0


# ----------------------------------------------------------------------------- init, save/load, options
@pytest.mark.parametrize("arch,opts", MODEL_VARIANTS)
def test_init_is_seeded_and_initial_loss_below_one(arch, opts):
    a, b, c = (build_model(arch, 12, 96, opts, seed=s) for s in (4, 4, 5))
    for (n, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q) and not torch.equal(p, r), n
    x = torch.randn(512, 12, generator=torch.Generator().manual_seed(0))
    assert 0.0 < _f(a(x).mse) < 1.0


@pytest.mark.parametrize("arch,opts", MODEL_VARIANTS)
def test_state_weights_round_trip_through_save_format(arch, opts, tmp_path):
    model = _model(arch, opts, hoyer_coef=0.2, tile=2)
    weights = model.state_weights()
    cfg = new_sae_config(arch, model.d_in, model.d_sae, arch_fields=model.arch_fields(), dtype="float64")
    save_sae(tmp_path / "m", weights, cfg)
    loaded, cfg2 = load_sae(tmp_path / "m")
    fresh = _model(arch, opts, seed=99)
    fresh.load_arch_fields(cfg2.metadata["dictcheck"]["bilinear"])
    fresh.load_state_weights(loaded)
    x = _batch(10, 7, 5)
    o1, o2 = model(x), fresh(x)
    assert _f(o1.loss) == _f(o2.loss)
    assert torch.equal(o1.codes, o2.codes)
    assert fresh.arch_fields() == model.arch_fields()
    for n, t in fresh.state_weights().items():
        assert torch.equal(t, weights[n])
    with pytest.raises(ValueError, match="exactly"):
        fresh.load_state_weights({**loaded, "extra": loaded["U"]})
    with pytest.raises(ValueError, match="shape"):
        fresh.load_state_weights({**loaded, "U": loaded["U"][:1]})


def test_arch_fields_and_forms():
    q = _model("bilinear-quadratic", {"decoder": "asymmetric"})
    assert q.arch_fields() == {
        "hoyer_coef": 0.1, "decoder": "asymmetric", "tile": 0, "hoyer_warmup_steps": 256,
        "token_normalisation": "x/||x||, zero rows dropped",
    }
    c = _model("bilinear-compound", {})
    assert c.arch_fields()["n_atoms"] == 14 and c.arch_fields()["k_c"] == 8 and c.arch_fields()["c_l1"] == 0.0
    for model in (q, c, _model("bilinear-atomic", {})):
        W = model.forms()
        assert W.shape == (model.d_sae, 5, 5) and np.allclose(W, W.transpose(0, 2, 1))
        x = _batch(11, 4, 5)
        X = normalise_tokens(x.numpy())[0]
        np.testing.assert_allclose(np.einsum("nd,jde,ne->nj", X, W, X), model(x).codes.detach().numpy(), rtol=1e-10, atol=1e-13)


def test_options_defaults_and_errors():
    assert _resolve("bilinear-quadratic", 8, {}) == {"hoyer_coef": 0.1, "tile": 0, "decoder": "symmetric"}
    assert _resolve("bilinear-atomic", 8, {"tile": 4}) == {"hoyer_coef": 0.1, "tile": 4}
    assert _resolve("bilinear-compound", 8, {}) == {"hoyer_coef": 0.1, "n_atoms": 16, "k_c": 8, "c_l1": 0.0, "tile": 0,
                                                    "decoder": "symmetric", "atoms": "rank1", "hoyer_on": "latents"}
    assert _resolve("bilinear-compound", 2, {})["k_c"] == 4  # min(8, n_atoms)
    bad = [
        ("bilinear-quadratic", {"k": 3}, "does not take option"),
        ("bilinear-atomic", {"lam": 0.1}, "does not take option"),
        ("bilinear-atomic", {"decoder": "symmetric"}, "does not take option"),
        ("bilinear-quadratic", {"decoder": "both"}, "decoder must be"),
        ("bilinear-quadratic", {"hoyer_coef": -0.1}, "hoyer_coef"),
        ("bilinear-quadratic", {"hoyer_coef": float("nan")}, "hoyer_coef"),
        ("bilinear-atomic", {"tile": -1}, "tile"),
        ("bilinear-atomic", {"tile": 2.5}, "tile"),
        ("bilinear-compound", {"n_atoms": 4, "k_c": 5}, "k_c must be <="),
        ("bilinear-compound", {"n_atoms": 0}, "n_atoms"),
        ("bilinear-compound", {"c_l1": True}, "c_l1"),
        ("bilinear-compound", {"atoms": "cubic"}, "atoms must be"),
        ("bilinear-compound", {"hoyer_on": "tokens"}, "hoyer_on"),
        ("bilinear-compound", {"decoder": "asymmetric"}, "needs GLU atoms"),
    ]
    for arch, opts, msg in bad:
        with pytest.raises(ValueError, match=msg):
            _resolve(arch, 8, opts)
    with pytest.raises(ValueError, match="arch must be"):
        architecture("bilinear-cubic")
    with pytest.raises(ValueError, match="no centring vector"):
        _model("bilinear-atomic", {}).set_centring_(torch.zeros(5))
    assert {n for n, a in REGISTRY.items() if a.family == "bilinear"} == {"bilinear-quadratic", "bilinear-atomic",
                                                                          "bilinear-compound"}


# ----------------------------------------------------------------------------- ordered variant (§10)
@pytest.mark.parametrize("prior,decoder", VARIANTS)
def test_ordered_loss_equals_mean_over_prefixes(prior, decoder):
    rng = np.random.default_rng(12)
    d = _dictionary(rng, prior, decoder, 4, 6, 5)
    X = _tokens(rng, 7, 4)
    assert _rel(ordered_lifted_loss(X, d), naive_ordered_lifted_loss(X, d)) < REL


# ----------------------------------------------------------------------------- the shared training loop
@pytest.mark.parametrize("arch,opts", MODEL_VARIANTS)
def test_trains_and_saves_through_the_shared_loop(arch, opts, tmp_path):
    from dictcheck.empirics.training.loop import TrainConfig, train

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 5)) @ rng.normal(size=(5, 5))
    X[::7] = 0.0  # zero rows are dropped: evaluation weights each batch by its real tokens
    cfg = TrainConfig(steps=40, batch_size=64, seed=1, device="cpu", checkpoint_every=0, log_every=40,
                      keep_checkpoints=1, eval_tokens=400)
    res = train(_model(arch, opts, seed=1), X, cfg, tmp_path / "m", progress=False)
    model, _ = load_featurizer(tmp_path / "m")
    x = torch.from_numpy(X)
    assert _f(model(x).mse) == pytest.approx(res.metrics["nmse_lifted"], rel=1e-10)
    assert naive_lifted_loss(normalise_tokens(X)[0], model.dictionary().forms()) == pytest.approx(
        res.metrics["nmse_lifted"], rel=1e-10)
    assert res.metrics["nmse_lifted"] < _f(_model(arch, opts, seed=1)(x).mse)  # training lowered the loss


# ----------------------------------------------------------------------------- the authors' Muon regime (§8)
def test_muon_schedule_and_training_is_deterministic():
    from dictcheck.empirics.architectures.bilinear import MuonConfig, train_muon

    cfg = MuonConfig(steps=40, batch_size=32, lr=0.02, seed=3)
    assert [cfg.lr_factor(s) for s in (0, 19, 20, 30)] == [1.0, 1.0, 1.0, 0.5]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5))
    opts = {"n_atoms": 12, "k_c": 12, "atoms": "glu", "hoyer_on": "atoms", "decoder": "asymmetric"}
    runs = [_model("bilinear-compound", opts, d_sae=4, seed=2, hoyer_coef=0.0) for _ in range(2)]
    before = _f(runs[0](torch.from_numpy(X)).mse)
    logs = [train_muon(m, X, cfg) for m in runs]
    assert logs[0] == logs[1] and torch.equal(runs[0].U, runs[1].U)
    assert _f(runs[0](torch.from_numpy(X)).mse) < before
    with pytest.raises(ValueError, match="MuonConfig"):
        MuonConfig(cooldown=0.0)
