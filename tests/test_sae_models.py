"""Tests for empirics.architectures.linear_sae (docs/ecosystem.md §1, §3; docs/theory.md §1, §4.5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dictcheck.empirics.architectures.featurizer import FeaturizerOutput
from dictcheck.empirics.architectures import REGISTRY, architecture
from dictcheck.empirics.architectures.linear_sae import LinearSAE, make_sae
from dictcheck.empirics.kernels.straight_through import JumpReLUFn, StepFn
from dictcheck.theory.objective import sae_objective

D_IN, D_SAE, B = 8, 24, 16


def _f(t) -> float:
    """Python float of a (possibly grad-requiring) scalar tensor."""
    return float(t.detach()) if isinstance(t, torch.Tensor) else float(t)


#: Every linear SAE architecture.
ARCHS = [name for name, a in REGISTRY.items() if a.family == "sae"]


def _takes(arch: str, option: str) -> bool:
    return option in architecture(arch).Options.field_names()


def _kw(arch: str) -> dict:
    return {"k": 3} if _takes(arch, "k") else {"lam": 0.1}


def _x(seed: int = 1, n: int = B, d: int = D_IN, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("arch", ARCHS)
def test_shapes_and_output_fields(arch):
    sae = make_sae(arch, D_IN, D_SAE, **_kw(arch))
    assert isinstance(sae, LinearSAE)
    assert sae.arch == arch and sae.d_in == D_IN and sae.d_sae == D_SAE and sae.apply_b_dec_to_input
    assert tuple(sae.W_enc.shape) == (D_IN, D_SAE)
    assert tuple(sae.b_enc.shape) == (D_SAE,)
    assert tuple(sae.W_dec.shape) == (D_SAE, D_IN)
    assert tuple(sae.b_dec.shape) == (D_IN,)
    x = _x()
    out = sae(x)
    assert isinstance(out, FeaturizerOutput)
    assert tuple(out.x_hat.shape) == (B, D_IN)
    assert tuple(out.codes.shape) == (B, D_SAE)
    for name in ("loss", "mse", "sparsity_loss", "aux_loss", "l0"):
        t = getattr(out, name)
        assert t.dim() == 0 and torch.isfinite(t), name
    assert torch.allclose(out.loss, out.mse + out.sparsity_loss + out.aux_loss)
    assert torch.allclose(out.mse, ((x - out.x_hat) ** 2).sum() / B)
    assert torch.allclose(out.l0, (out.codes != 0).float().sum(1).mean())
    assert torch.allclose(out.x_hat, sae.decode(out.codes))
    out.loss.backward()  # differentiable for every arch
    assert sae.W_dec.grad is not None
    assert torch.allclose(sae.encode(x), out.codes)


@pytest.mark.parametrize("arch", ARCHS)
def test_init_unit_rows_tied_and_bias(arch):
    b0 = torch.arange(D_IN, dtype=torch.float32)
    sae = make_sae(arch, D_IN, D_SAE, b_dec_init=b0, **_kw(arch))
    norms = sae.W_dec.detach().norm(dim=1)
    assert torch.allclose(norms, torch.ones(D_SAE), atol=1e-6)
    assert torch.equal(sae.W_enc.detach(), sae.W_dec.detach().T)
    assert torch.equal(sae.b_enc.detach(), torch.zeros(D_SAE))
    assert torch.equal(sae.b_dec.detach(), b0)
    assert torch.equal(make_sae(arch, D_IN, D_SAE, **_kw(arch)).b_dec.detach(), torch.zeros(D_IN))


def test_relu_loss_equals_theory_objective_1():
    lam = 0.37
    b0 = torch.linspace(-0.5, 0.5, D_IN, dtype=torch.float64)
    sae = make_sae("relu", D_IN, D_SAE, lam=lam, b_dec_init=b0, dtype=torch.float64, seed=3)
    with torch.no_grad():  # move off the tied init so the codes are non-trivial, keep unit rows
        sae.b_enc.copy_(torch.linspace(-0.3, 0.2, D_SAE, dtype=torch.float64))
        sae.W_enc.add_(0.1 * torch.randn(D_IN, D_SAE, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    x = _x(dtype=torch.float64) * 2.0
    out = sae(x)
    assert _f(out.l0) > 0
    W = sae.W_dec.detach().T.numpy()
    assert np.allclose(np.linalg.norm(W, axis=0), 1.0)
    obj = sae_objective(W, out.codes.detach().T.numpy(), sae.b_dec.detach().numpy(), x.T.numpy(), lam)
    assert out.loss.item() == pytest.approx(obj, rel=1e-12, abs=1e-12)
    assert _f(out.sparsity_loss) == pytest.approx(2 * lam * _f(out.codes.abs().sum()) / B, rel=1e-12)


def test_topk_at_most_k_nonzeros_per_token():
    k = 4
    sae = make_sae("topk", D_IN, D_SAE, k=k, seed=2)
    x = _x(7, n=64)
    z = sae.encode(x)
    nnz = (z != 0).sum(1)
    assert int(nnz.max()) <= k
    assert bool((z >= 0).all())
    # the kept values are the k largest pre-activations of each token (when positive)
    a = sae.pre_activation(x)
    top = torch.topk(a, k, dim=1).values
    assert torch.allclose(torch.sort(z, dim=1, descending=True).values[:, :k], torch.relu(top))


def test_batchtopk_train_exactly_kB_and_eval_threshold():
    k = 3
    sae = make_sae("batchtopk", D_IN, D_SAE, k=k, seed=4)
    x = _x(8, n=32)
    sae.train()
    out = sae(x)
    assert int((out.codes != 0).sum()) == k * 32
    # batch-level: per-token counts vary but the total is exact
    r = torch.relu(sae.pre_activation(x)).detach()
    kept_min = out.codes[out.codes > 0].min()
    assert _f(sae.batchtopk_threshold) == pytest.approx(_f(kept_min))  # first batch initialises θ
    assert int((r > kept_min).sum()) == k * 32 - 1
    sae(_x(9, n=32))  # a second training batch moves θ (running mean; rule tested below)
    sae.eval()
    th = _f(sae.batchtopk_threshold)
    z = sae.encode(x).detach()
    assert torch.equal(z, r * (r > th))
    assert sae.arch_fields()["threshold"] == pytest.approx(th)


def test_batchtopk_running_mean_rule():
    sae = make_sae("batchtopk", D_IN, D_SAE, k=2, batchtopk_momentum=0.25)
    assert sae.arch_fields() == {"threshold": None}
    x1, x2 = _x(1), _x(2)
    m1 = _kept_min(sae, x1)
    assert _f(sae.batchtopk_threshold) == pytest.approx(m1)
    m2 = _kept_min(sae, x2)  # forward in train mode: also updates θ
    assert _f(sae.batchtopk_threshold) == pytest.approx(0.75 * m1 + 0.25 * m2, rel=1e-6)
    # eval before any training: falls back to the batch rule
    fresh = make_sae("batchtopk", D_IN, D_SAE, k=2).eval()
    assert int((fresh.encode(x1) != 0).sum()) == 2 * B
    # arch_fields round trip
    other = make_sae("batchtopk", D_IN, D_SAE, k=2)
    other.load_arch_fields(sae.arch_fields())
    assert _f(other.batchtopk_threshold) == pytest.approx(_f(sae.batchtopk_threshold))


def _kept_min(sae, x):
    z = sae(x).codes.detach()
    return _f(z[z > 0].min())


def test_jumprelu_forward_exact_and_ste_threshold_gradient():
    eps = 0.05
    sae = make_sae("jumprelu", D_IN, D_SAE, lam=0.5, jumprelu_bandwidth=eps, init_threshold=0.2, seed=1)
    x = _x(3, n=64)
    out = sae(x)
    a = sae.pre_activation(x).detach()
    theta = sae.threshold.detach()
    assert torch.allclose(theta, torch.full((D_SAE,), 0.2))
    assert torch.equal(out.codes.detach(), a * (a > theta).float())
    assert _f(out.sparsity_loss) == pytest.approx(0.5 * _f((a > theta).float().sum()) / 64, rel=1e-6)
    # L0 term alone: gradient only on θ (through log_threshold), non-zero where tokens are near θ
    sae.zero_grad()
    out.sparsity_loss.backward()
    g = sae.log_threshold.grad
    near = ((a - theta).abs() < eps / 2).sum(0)
    assert bool((near > 0).any())
    expected = -(0.5 / 64) * (1 / eps) * near.float() * theta  # chain rule through exp
    assert torch.allclose(g, expected, rtol=1e-5, atol=1e-7)
    assert bool((g[near > 0] < 0).all()) and bool((g[near == 0] == 0).all())
    assert sae.W_enc.grad is None or _f(sae.W_enc.grad.abs().max()) == 0.0


def test_jumprelu_autograd_functions_directly():
    a = torch.tensor([[0.0, 0.99, 1.0, 1.004, 1.2]], dtype=torch.float64, requires_grad=True)
    theta = torch.ones(5, dtype=torch.float64, requires_grad=True)
    eps = 0.01
    z = JumpReLUFn.apply(a, theta, eps)
    assert torch.equal(z.detach(), torch.tensor([[0.0, 0.0, 0.0, 1.004, 1.2]], dtype=torch.float64))
    z.sum().backward()
    assert torch.equal(a.grad, torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0]], dtype=torch.float64))
    # K((a − θ)/ε) = 1 for |a − θ| < ε/2: entries 2 (a = θ) and 3 (a − θ = 0.004)
    assert torch.allclose(theta.grad, torch.tensor([0.0, 0.0, -100.0, -100.0, 0.0], dtype=torch.float64))
    theta.grad = None
    a.grad = None
    StepFn.apply(a, theta, eps).sum().backward()
    assert torch.equal(a.grad, torch.zeros_like(a))
    assert torch.allclose(theta.grad, torch.tensor([0.0, 0.0, -100.0, -100.0, 0.0], dtype=torch.float64))


def test_abs_codes_signed_odd_and_soft_threshold():
    sae = make_sae("abs", D_IN, D_SAE, lam=0.1, seed=6)
    with torch.no_grad():
        sae.b_enc.fill_(-0.3)  # threshold 0.3 on both sides
    x = _x(4)
    z = sae.encode(x).detach()
    assert bool((z < 0).any()) and bool((z > 0).any()) and bool((z == 0).any())
    assert torch.equal(sae.encode(-x).detach(), -z)
    u = (x @ sae.W_enc).detach()
    assert torch.allclose(z, torch.sign(u) * torch.relu(u.abs() - 0.3))
    out = sae(x)
    assert _f(out.sparsity_loss) == pytest.approx(2 * 0.1 * _f(z.abs().sum()) / B, rel=1e-6)


def test_abs_loss_equals_signed_objective_1():
    lam = 0.2
    sae = make_sae("abs", D_IN, D_SAE, lam=lam, dtype=torch.float64)
    with torch.no_grad():
        sae.b_enc.fill_(-0.1)
        sae.b_dec.fill_(0.05)
    x = _x(dtype=torch.float64)
    out = sae(x)
    W = sae.W_dec.detach().T.numpy()
    obj = sae_objective(W, out.codes.detach().T.numpy(), sae.b_dec.detach().numpy(), x.T.numpy(), lam)
    assert _f(out.loss) == pytest.approx(obj, rel=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_normalise_decoder_and_remove_parallel_grad(arch):
    sae = make_sae(arch, D_IN, D_SAE, **_kw(arch))
    out = sae(_x(5) * 3)
    out.loss.backward()
    with torch.no_grad():
        sae.W_dec.mul_(torch.linspace(0.5, 2.0, D_SAE)[:, None])
    sae.remove_parallel_grad_()
    g, w = sae.W_dec.grad, sae.W_dec.detach()
    assert _f(g.abs().max()) > 0
    # |g_d·w_d| ≤ rounding × ‖g_d‖‖w_d‖ for every row (rows without gradient trivially pass)
    assert bool(((g * w).sum(1).abs() <= 1e-5 * g.norm(dim=1) * w.norm(dim=1)).all())
    g_before = g.clone()
    sae.remove_parallel_grad_()  # idempotent
    assert torch.allclose(sae.W_dec.grad, g_before, atol=1e-6)
    sae.normalise_decoder_()
    assert torch.allclose(sae.W_dec.detach().norm(dim=1), torch.ones(D_SAE), atol=1e-6)


def test_remove_parallel_grad_without_grad_is_noop():
    sae = make_sae("relu", D_IN, D_SAE, lam=0.1)
    sae.remove_parallel_grad_()
    assert sae.W_dec.grad is None


@pytest.mark.parametrize("arch", ["topk", "batchtopk"])
def test_auxk_zero_without_dead_and_positive_with_dead(arch):
    sae = make_sae(arch, D_IN, D_SAE, k=2, aux_coef=1 / 32, seed=0)
    x = _x(11, n=32)
    for mask in (None, torch.zeros(D_SAE, dtype=torch.bool)):
        out = sae(x, dead_mask=mask)
        assert _f(out.aux_loss) == 0.0 and not math.isnan(_f(out.aux_loss))
    mask = torch.zeros(D_SAE, dtype=torch.bool)
    mask[::2] = True
    out = sae(x, dead_mask=mask)
    assert _f(out.aux_loss) > 0
    assert torch.allclose(out.loss, out.mse + out.aux_loss)
    # aux_coef = 0 disables it
    off = make_sae(arch, D_IN, D_SAE, k=2, aux_coef=0.0, seed=0)
    assert _f(off(x, dead_mask=mask).aux_loss) == 0.0


def test_auxk_formula_and_detached_residual():
    d_in, d_sae, n = 6, 20, 10
    coef = 0.5
    sae = make_sae("topk", d_in, d_sae, k=2, aux_coef=coef, dtype=torch.float64, seed=2)
    with torch.no_grad():
        sae.b_dec.fill_(0.3)  # must NOT enter the aux reconstruction
    x = _x(12, n=n, d=d_in, dtype=torch.float64)
    mask = torch.zeros(d_sae, dtype=torch.bool)
    mask[[1, 4, 7, 9, 15]] = True  # n_dead = 5 > k_aux = 3
    out = sae(x, dead_mask=mask)
    # reference computation
    a = sae.pre_activation(x).detach()
    e = (x - out.x_hat).detach()
    k_aux = d_in // 2
    masked = torch.where(mask, a, torch.full_like(a, -math.inf))
    v, i = torch.topk(masked, min(k_aux, 5), dim=1)
    z_aux = torch.zeros_like(a).scatter(1, i, torch.relu(v))
    e_hat = z_aux @ sae.W_dec.detach()
    ref = coef * min(5 / k_aux, 1.0) * ((e - e_hat) ** 2).sum() / ((e - e.mean(0)) ** 2).sum()
    assert _f(out.aux_loss) == pytest.approx(_f(ref), rel=1e-12)
    # n_dead < k_aux scales by n_dead / k_aux and uses only dead latents
    mask2 = torch.zeros(d_sae, dtype=torch.bool)
    mask2[3] = True
    out2 = sae(x, dead_mask=mask2)
    z2 = torch.zeros_like(a)
    z2[:, 3] = torch.relu(a[:, 3])
    ref2 = coef * (1 / k_aux) * ((e - z2 @ sae.W_dec.detach()) ** 2).sum() / ((e - e.mean(0)) ** 2).sum()
    assert _f(out2.aux_loss) == pytest.approx(_f(ref2), rel=1e-12)
    # no gradient flows into the main path: live decoder rows / encoder columns get none
    sae.zero_grad()
    out.aux_loss.backward()
    live = ~mask
    assert _f(sae.W_dec.grad[live].abs().max()) == 0.0
    assert _f(sae.W_enc.grad[:, live].abs().max()) == 0.0
    assert _f(sae.b_enc.grad[live].abs().max()) == 0.0
    assert _f(sae.W_dec.grad[mask].abs().max()) > 0.0


def test_auxk_zero_residual_variance_is_zero_not_nan():
    sae = make_sae("topk", D_IN, D_SAE, k=2, aux_coef=1.0)
    out = sae(_x(n=1), dead_mask=torch.ones(D_SAE, dtype=torch.bool))
    assert _f(out.aux_loss) == 0.0


def test_an_option_the_architecture_does_not_take_is_refused():
    with pytest.raises(ValueError, match=r"does not take option\(s\) \['aux_coef'\]"):
        make_sae("relu", D_IN, D_SAE, lam=0.1, aux_coef=1.0)
    out = make_sae("relu", D_IN, D_SAE, lam=0.1)(_x(), dead_mask=torch.ones(D_SAE, dtype=torch.bool))
    assert _f(out.aux_loss) == 0.0


@pytest.mark.parametrize("arch", ARCHS)
def test_state_weights_round_trip(arch):
    src = make_sae(arch, D_IN, D_SAE, seed=1, **({"init_threshold": 0.05} if _takes(arch, "init_threshold") else {}),
                   **_kw(arch))
    with torch.no_grad():
        src.b_enc.normal_(generator=torch.Generator().manual_seed(0))
        src.b_dec.normal_(generator=torch.Generator().manual_seed(1))
    w = src.state_weights()
    names = {"W_enc", "b_enc", "W_dec", "b_dec"} | ({"threshold"} if arch in ("jumprelu", "batchtopk") else set())
    assert set(w) == names
    assert all(not t.requires_grad for t in w.values())
    if arch == "jumprelu":
        assert tuple(w["threshold"].shape) == (D_SAE,)
        assert torch.allclose(w["threshold"], torch.full((D_SAE,), 0.05))
    w["W_enc"].add_(1.0)  # copies, not views
    assert not torch.equal(w["W_enc"], src.W_enc.detach())
    w = src.state_weights()
    dst = make_sae(arch, D_IN, D_SAE, seed=99, **_kw(arch))
    dst.load_state_weights(w)
    for name, t in dst.state_weights().items():
        assert torch.allclose(t, w[name], rtol=1e-6, atol=0), name
    x = _x()
    src.eval(), dst.eval()
    if arch == "batchtopk":
        dst.load_arch_fields(src.arch_fields())
    assert torch.allclose(src(x).x_hat, dst(x).x_hat, atol=1e-6)


def test_load_state_weights_errors():
    sae = make_sae("jumprelu", D_IN, D_SAE, lam=0.1)
    w = sae.state_weights()
    with pytest.raises(ValueError, match="missing"):
        sae.load_state_weights({k: v for k, v in w.items() if k != "threshold"})
    with pytest.raises(ValueError, match="unexpected"):
        sae.load_state_weights({**w, "foo": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        sae.load_state_weights({**w, "b_dec": torch.zeros(D_IN + 1)})
    with pytest.raises(ValueError, match=">= 0"):
        sae.load_state_weights({**w, "threshold": torch.full((D_SAE,), -0.1)})
    sae.load_state_weights({**w, "threshold": torch.zeros(D_SAE)})  # θ = 0: SAELens' clamp, z = ReLU(a)
    x = _x()
    assert torch.equal(sae.eval().encode(x), torch.relu(sae.pre_activation(x)))


@pytest.mark.parametrize("arch", ARCHS)
def test_determinism_under_seed(arch):
    a = make_sae(arch, D_IN, D_SAE, seed=5, **_kw(arch))
    b = make_sae(arch, D_IN, D_SAE, seed=5, **_kw(arch))
    c = make_sae(arch, D_IN, D_SAE, seed=6, **_kw(arch))
    for name, t in a.state_weights().items():
        assert torch.equal(t, b.state_weights()[name])
    assert not torch.equal(a.W_dec.detach(), c.W_dec.detach())
    x = _x()
    assert torch.equal(a(x).loss, b(x).loss)


def test_dtype_float64():
    sae = make_sae("topk", D_IN, D_SAE, k=2, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in sae.parameters())
    assert sae(_x(dtype=torch.float64)).loss.dtype == torch.float64


def test_clear_errors():
    with pytest.raises(ValueError, match="arch must be one of"):
        make_sae("no-such-arch", D_IN, D_SAE)
    with pytest.raises(ValueError, match="not a linear SAE"):
        make_sae("bsf-vanilla", D_IN, D_SAE)
    for arch in ("topk", "batchtopk"):
        with pytest.raises(ValueError, match="needs k"):
            make_sae(arch, D_IN, D_SAE)
        with pytest.raises(ValueError, match=r"needs k, an int in \[1, d_sae=24\], got 25"):
            make_sae(arch, D_IN, D_SAE, k=D_SAE + 1)
    for arch in ("relu", "jumprelu", "abs"):
        with pytest.raises(ValueError, match="needs lam"):
            make_sae(arch, D_IN, D_SAE)
        with pytest.raises(ValueError, match="lam must be"):
            make_sae(arch, D_IN, D_SAE, lam=-1.0)
    with pytest.raises(ValueError, match="b_dec_init"):
        make_sae("relu", D_IN, D_SAE, lam=0.1, b_dec_init=torch.zeros(D_IN + 1))
    with pytest.raises(ValueError, match="d_in"):
        make_sae("relu", 0, D_SAE, lam=0.1)
    sae = make_sae("relu", D_IN, D_SAE, lam=0.1)
    with pytest.raises(ValueError, match="tokens as rows"):
        sae(torch.zeros(D_IN, B))
    with pytest.raises(ValueError, match="d_sae"):
        sae.decode(torch.zeros(B, D_SAE + 1))
    with pytest.raises(ValueError, match="dead_mask"):
        make_sae("topk", D_IN, D_SAE, k=2, aux_coef=0.1)(_x(), dead_mask=torch.ones(3, dtype=torch.bool))


# --------------------------------------------------------------------------------------------
# Sparse decode of the TopK family (ActiveLatents, embedding-bag style) = the dense product
# --------------------------------------------------------------------------------------------

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
# A batchtopk batch whose heavy row (5) holds θ̂ itself: recomputing that row alone rounded it an ulp
# lower, so the sparse path lost the entry and kept another (issue 17 review).
@example(seed=373263, arch="batchtopk", auxk=False, eval_mode=False, n=8, d_in=7, d_sae=24, k=4)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(["topk", "batchtopk"]),
    st.booleans(),  # AuxK with some dead latents
    st.booleans(),  # batchtopk: eval mode with a trained threshold
    st.integers(1, 12),
    st.integers(1, 10),
    st.integers(2, 40),
    st.integers(1, 6),
)
def test_sparse_decode_equals_dense_values_and_gradients(seed, arch, auxk, eval_mode, n, d_in, d_sae, k):
    """Forward values (x̂, codes, every loss term) and the gradient of every parameter agree
    between the gathered decode and z @ W_dec, in float64, to rounding."""
    k = min(k, d_sae)
    g = torch.Generator().manual_seed(seed)
    models = []
    for sparse in (True, False):
        m = make_sae(arch, d_in, d_sae, k=k, aux_coef=0.25 if auxk else 0.0, dtype=torch.float64, seed=seed % 1000)
        with torch.no_grad():
            m.b_enc.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed))
            m.b_dec.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed + 1))
        m.sparse_decode = sparse
        models.append(m)
    x0 = torch.randn(n, d_in, generator=g, dtype=torch.float64)
    dead = torch.rand(d_sae, generator=g) < 0.5
    outs, x_grads = [], []
    for m in models:
        if arch == "batchtopk" and eval_mode:
            m(x0)  # one training batch sets θ
            m.eval()
        x = x0.clone().requires_grad_()  # the input's gradient too (attribution)
        out = m(x, dead_mask=dead if auxk else None)
        m.zero_grad(set_to_none=True)
        out.loss.backward()
        outs.append(out)
        x_grads.append(x.grad)
    torch.testing.assert_close(x_grads[0], x_grads[1], rtol=1e-11, atol=1e-12)
    s, d = outs
    for name in ("x_hat", "codes", "loss", "mse", "aux_loss", "l0"):
        torch.testing.assert_close(getattr(s, name), getattr(d, name), rtol=1e-12, atol=1e-12, msg=name)
    assert s.live_latents is not None and d.live_latents is None
    assert torch.equal(s.fired(d_sae), d.fired(d_sae))
    for (name, ps), pd in zip(models[0].named_parameters(), models[1].parameters()):
        if pd.grad is None:
            assert ps.grad is None or bool((ps.grad == 0).all()), name
        else:
            torch.testing.assert_close(ps.grad, pd.grad, rtol=1e-11, atol=1e-12, msg=name)


@pytest.mark.parametrize("arch", ["topk", "batchtopk"])
def test_gathering_forward_builds_the_dense_codes_only_when_read(arch):
    """FeaturizerOutput.codes is lazy for a gathering model; fired() reads the active list."""
    sae = make_sae(arch, D_IN, D_SAE, k=3, seed=0)
    out = sae(_x())
    assert callable(out.__dict__["codes"])
    z = out.codes
    assert out.codes is z and tuple(z.shape) == (B, D_SAE) and z.grad_fn is not None
    assert torch.equal(out.fired(D_SAE), (z != 0).any(dim=0))
    assert torch.equal(z, sae.encode(_x()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_batchtopk_heavy_rows_select_as_the_dense_path(seed, dtype):
    """A batch of 40 tokens (> ALIKE_ROWS, so heavy rows are recomputed from a padded product) whose
    few large tokens hold far more than 2k of the batch's top k·B entries: the gathered path keeps
    exactly the dense path's entries, with the same values bit for bit."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 12, generator=g, dtype=dtype)
    x[torch.randperm(40, generator=g)[:3]] *= 30.0  # heavy rows
    out = []
    for sparse in (True, False):
        m = make_sae("batchtopk", 12, 64, k=3, dtype=dtype, seed=seed)
        with torch.no_grad():
            m.b_enc.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed))
        m.sparse_decode = sparse
        out.append(m(x).codes.detach())
    assert torch.equal(out[0], out[1])
    assert int((out[0] != 0).sum()) == 40 * 3


def test_sparse_decode_is_the_default_for_the_topk_family():
    for arch in ("topk", "batchtopk"):
        sae = make_sae(arch, D_IN, D_SAE, k=3, seed=0)
        assert sae.sparse_decode
        out = sae(_x())
        assert torch.allclose(out.x_hat, sae.decode(out.codes), atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 12), st.integers(1, 60), st.integers(1, 8), st.floats(0.0, 0.95))
def test_batch_topk_selection_equals_flat_topk(seed, n, d, k, zero_frac):
    """The candidate-based batch top-k keeps exactly the entries of a flat top-(k·B) of ReLU(a):
    rows of very different scale hold more than 2k of them (the heavy-row path), negative
    pre-activations force ties at 0."""
    from dictcheck.empirics.architectures.batchtopk import _batch_topk

    k = min(k, d)
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(n, d, generator=g, dtype=torch.float64) * torch.logspace(0, 6, n, dtype=torch.float64)[torch.randperm(n, generator=g)].unsqueeze(1)
    a = torch.where(torch.rand(n, d, generator=g) < zero_frac, -r, r)
    r = torch.relu(a)
    n_keep = min(k * n, r.numel())
    cand, cand_cols = torch.topk(a, min(d, 2 * k), dim=1)
    rows, cols, vals = _batch_topk(cand, cand_cols, n_keep, d, a.__getitem__)
    assert rows.numel() == n_keep and bool((torch.diff(rows * d + cols) > 0).all())  # sorted, distinct
    assert torch.equal(vals, a[rows, cols])
    ref = torch.topk(r.reshape(-1), n_keep)
    torch.testing.assert_close(torch.sort(r[rows, cols]).values, torch.sort(ref.values).values, rtol=0, atol=0)
    pos_ref = set(ref.indices[ref.values > 0].tolist())
    assert {int(i) for i, v in zip(rows * d + cols, r[rows, cols]) if v > 0} == pos_ref
