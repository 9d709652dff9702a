"""Tests for empirics.architectures.bsf (docs/bsf.md §2–§4, §9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.architectures import REGISTRY, architecture, build_model
from dictcheck.empirics.architectures.bsf import BlockSparseFeaturizer
from dictcheck.empirics.architectures.featurizer import FeaturizerOutput
from dictcheck.empirics.kernels.straight_through import StepFn
from dictcheck.theory.block_sparse import block_soft_threshold as np_soft_threshold
from dictcheck.theory.block_sparse import block_topk as np_topk

ARCHS = [name for name, a in REGISTRY.items() if a.family == "bsf"]

D, N_B, Q, K = 6, 4, 2, 2
F64 = torch.float64


def _kw(arch: str, **extra) -> dict:
    kw = {"block_size": Q, **extra}
    if arch != "bsf-grouplasso":
        kw["k"] = K
    return kw


def _model(arch: str, *, seed: int = 0, dtype=F64, **extra) -> BlockSparseFeaturizer:
    return build(arch, D, N_B * Q, seed=seed, dtype=dtype, **_kw(arch, **extra))


def build(arch: str, d_in: int, d_sae: int, *, seed: int = 0, dtype=torch.float32, b_dec_init=None, **options):
    """The architecture's model (options as keywords), with an optional centring vector."""
    model = build_model(arch, d_in, d_sae, options, seed=seed, dtype=dtype)
    model.set_centring_(b_dec_init)
    return model


def resolve_options(arch: str, d_sae: int, options: dict) -> dict:
    return architecture(arch).options(options, d_sae).to_dict()


def _x(seed: int = 1, n: int = 16, d: int = D) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _perturbed(model: BlockSparseFeaturizer, seed: int = 5) -> BlockSparseFeaturizer:
    """Move every parameter off its init (so round trips and formulas are not checked at a special point)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        model.b_dec.copy_(torch.randn(model.d_in, generator=g, dtype=model.b_dec.dtype))
    return model


def _adam_steps(model: BlockSparseFeaturizer, x: torch.Tensor, steps: int, after_step) -> None:
    """The training loop's hook order (empirics.architectures.featurizer): forward, backward, project, clip, step, project."""
    opt = torch.optim.Adam(model.parameters(), lr=5e-2)
    model.project_parameters_()
    for _ in range(steps):
        out = model(x)
        opt.zero_grad()
        out.loss.backward()
        model.project_gradients_()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.project_parameters_()
        after_step(model)


# ----------------------------------------------------------------------------------------------- options


def test_options_fill_defaults():
    assert resolve_options("bsf-vanilla", 8, {"k": 2, "block_size": 2}) == {"block_size": 2, "denoise": 0.1, "k": 2}
    assert resolve_options("bsf-grouplasso", 8, {"block_size": 4}) == {
        "block_size": 4, "denoise": 0.1, "c_gl": 1e-2, "gate": "shrink", "k_target": None, "penalty": "code"}
    assert resolve_options("bsf-grouplasso", 32, {"block_size": 2, "gate": "ste"})["k_target"] == 16
    assert resolve_options("bsf-grassmann", 8, {"k": 1, "block_size": 8, "denoise": 0}) == {
        "block_size": 8, "denoise": 0.0, "k": 1}


@pytest.mark.parametrize("arch, d_sae, k, lam, options, message", [
    ("bsf-nope", 8, 2, None, {"block_size": 2}, "arch must be one of"),
    ("bsf-vanilla", 8, 2, None, {}, "requires the option block_size"),
    ("bsf-vanilla", 8, 2, None, {"block_size": 3}, "must divide"),
    ("bsf-vanilla", 8, 2, None, {"block_size": 0}, "block_size must be an int >= 1"),
    ("bsf-vanilla", 8, None, None, {"block_size": 2}, "requires k"),
    ("bsf-grassmann", 8, 5, None, {"block_size": 2}, r"k must be an int in \[1, n_b=4\]"),
    ("bsf-vanilla", 8, 0, None, {"block_size": 2}, "k must be"),
    ("bsf-grouplasso", 8, 2, None, {"block_size": 2}, r"does not take option\(s\) \['k'\]"),
    ("bsf-vanilla", 8, 2, 0.1, {"block_size": 2}, r"does not take option\(s\) \['lam'\]"),
    ("bsf-vanilla", 8, 2, None, {"block_size": 2, "c_gl": 0.1}, "does not take option"),
    ("bsf-vanilla", 8, 2, None, {"block_size": 2, "denoise": -0.1}, "denoise must be"),
    ("bsf-vanilla", 8, 2, None, {"block_size": 2, "denoise": math.nan}, "denoise must be"),
    ("bsf-grouplasso", 8, None, None, {"block_size": 2, "c_gl": -1.0}, "c_gl must be"),
    ("bsf-grouplasso", 8, None, None, {"block_size": 2, "gate": "relu"}, "gate must be"),
    ("bsf-grouplasso", 8, None, None, {"block_size": 2, "gate": "ste"}, "k_target = 16 exceeds n_b = 4"),
    ("bsf-grouplasso", 8, None, None, {"block_size": 2, "k_target": 2}, "only to gate='ste'"),
])
def test_options_reject(arch, d_sae, k, lam, options, message):
    given = {**options, **({} if k is None else {"k": k}), **({} if lam is None else {"lam": lam})}
    with pytest.raises(ValueError, match=message):
        resolve_options(arch, d_sae, given)


def test_build_rejects_bad_arguments():
    with pytest.raises(ValueError, match="block_size q = 4 <= d_in = 3"):
        build("bsf-grassmann", 3, 8, k=1, block_size=4)
    with pytest.raises(ValueError, match="b_dec_init has shape"):
        build("bsf-vanilla", D, 8, k=1, block_size=2, b_dec_init=torch.zeros(D + 1))
    with pytest.raises(ValueError, match="non-finite"):
        build("bsf-vanilla", D, 8, k=1, block_size=2, b_dec_init=torch.full((D,), math.nan))
    with pytest.raises(ValueError, match="tokens as rows"):
        _model("bsf-vanilla")(torch.zeros(3, D + 1, dtype=F64))


# ----------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_fields_and_loss(arch):
    model = _perturbed(_model(arch)).eval()
    x = _x()
    out = model(x)
    assert isinstance(out, FeaturizerOutput)
    assert tuple(out.codes.shape) == (16, N_B * Q) and tuple(out.x_hat.shape) == (16, D)
    assert torch.allclose(out.mse, ((x - out.x_hat) ** 2).sum() / (16 * D))  # mean over all B·D entries
    assert torch.allclose(out.loss, out.mse + out.sparsity_loss + out.aux_loss) and float(out.aux_loss) == 0
    blocks = out.codes.view(16, N_B, Q)
    assert torch.allclose(out.extra["block_l0"], (blocks.norm(dim=-1) > 1e-6).sum(-1).to(F64).mean())
    assert torch.allclose(out.l0, (out.codes != 0).sum(-1).to(F64).mean())
    if arch == "bsf-grouplasso":
        assert torch.allclose(out.sparsity_loss, 1e-2 * blocks.norm(dim=-1).sum(-1).mean())
    else:
        assert float(out.sparsity_loss) == 0 and bool((blocks.norm(dim=-1) > 0).sum(-1).eq(K).all())
    # x̂ = Σ_g W_g z_g + b_dec, three ways: decode, contributions, and the W_dec layout (block g = rows g·q…).
    assert torch.allclose(model.decode(out.codes), out.x_hat)
    assert torch.allclose(model.block_contributions(x).sum(1) + model.b_dec, out.x_hat)
    W = model.decoder_blocks()
    assert tuple(W.shape) == (N_B, D, Q)
    manual = sum(blocks[:, g] @ W[g].T for g in range(N_B)) + model.b_dec
    assert torch.allclose(manual, out.x_hat)
    if arch != "bsf-grassmann":
        assert torch.equal(W[1], model.W_dec[Q:2 * Q].T)
    assert torch.equal(model.encode(x), out.codes)
    out.loss.backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_codes_match_the_numpy_operators(arch):
    model = _perturbed(_model(arch)).eval()
    x = _x(2)
    xc = (x - model.b_dec).numpy()
    if arch == "bsf-grassmann":
        W = model.decoder_blocks().detach().numpy()
        a = float(model.gamma.detach()) * np.einsum("bd,gdq->bgq", xc, W)
    else:
        a = (xc @ model.W_enc.detach().numpy() + model.b_enc.detach().numpy()).reshape(-1, N_B, Q)
    expected = np_soft_threshold(a, float(model.theta.detach())) if arch == "bsf-grouplasso" else np_topk(a, K)
    np.testing.assert_allclose(model.encode(x).detach().numpy().reshape(-1, N_B, Q), expected, atol=1e-12)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 5))
def test_q1_vanilla_is_a_signed_absolute_topk_sae(seed, k):
    model = _perturbed(build("bsf-vanilla", D, 5, k=k, block_size=1, seed=seed, dtype=F64), seed).eval()
    x = _x(seed % 1000)
    a = ((x - model.b_dec) @ model.W_enc + model.b_enc).detach().numpy()
    keep = np.argsort(-np.abs(a), axis=1)[:, :k]  # ties have probability 0 here
    expected = np.zeros_like(a)
    np.put_along_axis(expected, keep, np.take_along_axis(a, keep, 1), 1)  # signed values, no ReLU
    z = model.encode(x).detach().numpy()
    np.testing.assert_allclose(z, expected, atol=1e-12)
    model.project_parameters_()
    np.testing.assert_allclose(model.W_dec.detach().norm(dim=1).numpy(), 1.0, atol=1e-12)  # unit atoms


def test_q1_vanilla_keeps_the_largest_magnitude_with_its_sign():
    model = build("bsf-vanilla", 3, 3, k=1, block_size=1, dtype=F64).eval()
    with torch.no_grad():
        model.W_enc.copy_(torch.eye(3, dtype=F64))
    z = model.encode(torch.tensor([[1.0, -3.0, 2.0]], dtype=F64))
    assert torch.equal(z, torch.tensor([[0.0, -3.0, 0.0]], dtype=F64))


def test_grassmann_reconstruction_is_scaled_sum_of_projections():
    model = _perturbed(_model("bsf-grassmann")).eval()
    x = _x(3)
    xc = x - model.b_dec
    W = model.decoder_blocks()
    energy = torch.einsum("bd,gdq->bgq", xc, W).norm(dim=-1)
    top = torch.topk(energy, K, dim=-1).indices
    for i in range(x.shape[0]):
        P = sum(W[g] @ W[g].T for g in top[i].tolist())
        assert torch.allclose(model(x).x_hat[i], model.gamma * P @ xc[i] + model.b_dec)


def test_grassmann_qr_sign_convention_and_gradient():
    model = _perturbed(_model("bsf-grassmann"))
    W = model.decoder_blocks()
    R = W.transpose(1, 2) @ model.B  # B_g = W_g R_g ⇒ R_g = W_gᵀB_g
    assert torch.allclose(torch.triu(R), R, atol=1e-12)
    assert bool((torch.diagonal(R, dim1=-2, dim2=-1) > 0).all())
    assert torch.allclose(W @ R, model.B, atol=1e-12)
    # Gradients flow through the QR: autograd = central finite differences (Π_k support is locally fixed).
    model.eval()
    x = _x(4)
    loss = model(x).loss
    (grad,) = torch.autograd.grad(loss, model.B)
    E = torch.randn(model.B.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    h = 1e-6
    with torch.no_grad():
        model.B.add_(h * E)
        up = float(model(x).loss)
        model.B.sub_(2 * h * E)
        down = float(model(x).loss)
        model.B.add_(h * E)
    assert (up - down) / (2 * h) == pytest.approx(float((grad * E).sum()), rel=1e-6)


def test_grassmann_frames_stay_orthonormal_through_float32_training():
    model = _model("bsf-grassmann", dtype=torch.float32, seed=3)
    errors = []

    def record(m):
        W = m.decoder_blocks().detach().double()
        errors.append(float((W.transpose(1, 2) @ W - torch.eye(Q, dtype=F64)).norm(dim=(1, 2)).max()))

    _adam_steps(model, _x(5).float(), 60, record)
    assert max(errors) <= 1e-6
    B = model.B.detach().double()
    assert float((B.transpose(1, 2) @ B - torch.eye(Q, dtype=F64)).norm()) > 1e-2  # B itself moved off


@pytest.mark.parametrize("arch", ["bsf-vanilla", "bsf-grouplasso"])
def test_unit_frobenius_blocks_after_every_step(arch):
    model = _model(arch, dtype=torch.float32, seed=2)
    norms = []
    _adam_steps(model, _x(6).float(), 40, lambda m: norms.append(m.decoder_blocks().detach().double().norm(dim=(1, 2))))
    assert max(float((n - 1).abs().max()) for n in norms) <= 1e-6
    assert not torch.allclose(model.W_enc.detach(), model.W_dec.detach().T)  # the encoder is untied


@pytest.mark.parametrize("arch", ARCHS)
def test_init_is_deterministic_and_as_specified(arch):
    a, b = _model(arch, seed=7), _model(arch, seed=7)
    assert all(torch.equal(a.state_weights()[n], w) for n, w in b.state_weights().items())
    assert not torch.equal(a.decoder_blocks(), _model(arch, seed=8).decoder_blocks())
    W = a.decoder_blocks()
    if arch == "bsf-grassmann":
        assert torch.allclose(W, a.B) and float(a.gamma.detach()) == 1.0  # B = Q of a QR, γ₀ = 1
    else:
        assert torch.allclose(W.norm(dim=(1, 2)), torch.ones(N_B, dtype=F64))
        assert torch.equal(a.W_enc, a.W_dec.T) and not a.b_enc.any() and not a.b_dec.any()
    if arch == "bsf-grouplasso":
        assert float(a.theta.detach()) == 1.0  # θ₀ = 1


# ----------------------------------------------------------------------------------------------- denoising


@pytest.mark.parametrize("arch", ARCHS)
def test_denoising_only_in_training_mode(arch):
    model = _perturbed(_model(arch))
    x = _x(7)
    model.eval()
    clean = model(x)
    assert torch.equal(clean.codes, model.encode(x))
    model.train()
    torch.manual_seed(11)
    noisy = model(x)
    torch.manual_seed(11)
    assert torch.equal(model(x).x_hat, noisy.x_hat)  # the global RNG drives the noise
    assert not torch.allclose(noisy.x_hat, clean.x_hat)
    assert torch.allclose(noisy.mse, ((x - noisy.x_hat) ** 2).mean())  # target: the clean x
    model.denoise = 0.0
    assert torch.equal(model(x).x_hat, clean.x_hat)


def test_noise_is_snr_times_batch_std_times_gaussian():
    """With one orthonormal D×D block (q = D) the Grassmann reconstruction at γ = 1 is the encoder input."""
    model = build("bsf-grassmann", D, D, k=1, block_size=D, denoise=0.1, dtype=F64,
                  b_dec_init=torch.linspace(-1, 1, D, dtype=F64)).train()
    x = _x(8)
    xc = x - model.b_dec
    torch.manual_seed(3)
    out = model(x)
    torch.manual_seed(3)
    expected = xc + 0.1 * xc.std() * torch.randn_like(xc) + model.b_dec
    assert torch.allclose(out.x_hat, expected, atol=1e-12)


# ----------------------------------------------------------------------------------------------- STE gate


def test_ste_gate_cold_start_and_gradients():
    model = build("bsf-grouplasso", D, 16, block_size=2, gate="ste", k_target=3, denoise=0.0, dtype=F64)
    x = _x(9, n=32)
    assert not model.gate_ready and model.arch_fields()["gate_width"] is None
    out = model(x)  # training mode: the first batch sets θ and w
    norms = (x @ model.W_enc).detach().view(32, 8, 2).norm(dim=-1)
    theta0 = torch.quantile(norms.reshape(-1), 1 - 3 / 8)
    assert torch.allclose(model.theta, theta0.expand(8))
    assert float(model.gate_width) == pytest.approx(0.5 * float(norms.std()) + 1e-6)
    active = (norms > theta0).to(F64)
    assert torch.allclose(out.sparsity_loss, 1e-2 * active.sum(-1).mean())
    assert torch.allclose(out.codes.view(32, 8, 2), x.matmul(model.W_enc).view(32, 8, 2) * active[..., None])
    # The step's θ-gradient is the rectangle kernel; no gradient reaches the norms through H.
    theta = model.theta.detach().requires_grad_(True)
    norms_req = norms.detach().requires_grad_(True)
    StepFn.apply(norms_req, theta, 0.2, True).sum().backward()
    kernel = ((norms - theta.detach()).abs() <= 0.1).to(F64)
    assert torch.allclose(theta.grad, -(kernel / 0.2).sum(0))
    assert not norms_req.grad.any()
    width = float(model.gate_width)
    model(x)  # frozen after the cold start
    assert float(model.gate_width) == width


# ----------------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("arch, extra", [(a, {}) for a in ARCHS] + [("bsf-grouplasso", {"gate": "ste", "k_target": 2})])
def test_state_weights_round_trip(arch, extra):
    src = _perturbed(_model(arch, **extra))
    if extra:
        src(_x())  # cold start
    dst = _model(arch, seed=99, **extra)
    weights = src.state_weights()
    assert set(weights) == set(src.weight_shapes())
    dst.load_state_weights(weights)
    dst.load_arch_fields(src.arch_fields())
    src.eval(), dst.eval()
    x = _x(10)
    assert torch.equal(src(x).x_hat, dst(x).x_hat)
    fields = src.arch_fields()
    assert (fields["n_b"], fields["q"], fields["k"]) == (N_B, Q, K if arch != "bsf-grouplasso" else None)
    given = {**src.options(), **({} if fields["k"] is None else {"k": fields["k"]})}
    assert {n: v for n, v in resolve_options(arch, N_B * Q, given).items() if v is not None} == given
    with pytest.raises(ValueError, match="unexpected tensors"):
        dst.load_state_weights({**weights, "extra": torch.zeros(1)})
    name = next(n for n in weights if n != "b_dec")
    with pytest.raises(ValueError, match="missing tensors"):
        dst.load_state_weights({n: w for n, w in weights.items() if n != name})
    with pytest.raises(ValueError, match="has shape"):
        dst.load_state_weights({**weights, name: torch.zeros(1, 1, 1, 1)})
    dst.load_state_weights({n: w for n, w in weights.items() if n != "b_dec"})  # b_dec is optional
    assert not dst.b_dec.any()


def test_firing_metrics_count_dead_blocks():
    model = _model("bsf-vanilla")
    counts = torch.tensor([0, 0, 0, 3, 1, 0, 0, 0])  # block 0 dead, 1 and 2 alive, 3 dead
    assert model.firing_metrics(counts, 10) == {"dead_blocks": 2}
    with pytest.raises(ValueError, match="expected d_sae"):
        model.firing_metrics(torch.zeros(3), 10)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_loop_saves_a_loadable_folder(arch, tmp_path):
    """empirics.training.loop.train drives the BSF; the saved folder reloads into an identical model."""
    from dictcheck.empirics.io.sae_folder import load_sae
    from dictcheck.empirics.training.loop import TrainConfig, train

    X = np.random.default_rng(0).normal(size=(64, D))
    cfg = TrainConfig(steps=3, batch_size=16, seed=0, device="cpu", checkpoint_every=0, log_every=3,
                      keep_checkpoints=1, eval_tokens=64)
    result = train(_model(arch), X, cfg, tmp_path, progress=False)
    trained = result.model
    weights, saved = load_sae(tmp_path)
    fields = saved.metadata["dictcheck"]["bsf"]
    assert (fields["n_b"], fields["q"]) == (N_B, Q)
    k = {} if fields["k"] is None else {"k": fields["k"]}
    model = build(arch, D, N_B * Q, dtype=F64, **k, **{n: fields[n] for n in trained.options()})
    model.load_state_weights(weights)
    model.eval()
    assert not trained.training  # train() returns its model in eval mode
    x = torch.from_numpy(X)
    assert torch.equal(model(x).x_hat, trained(x).x_hat)
    assert set(result.weights) == set(trained.weight_shapes())
