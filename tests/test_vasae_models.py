"""VASAE model (docs/vasae.md §1–§4, §9): chunked anchor loss vs the naive full max, anchor_every,
the nearest-token refresh every M_refresh steps, training-mode-only anchor, the authors' init,
hard-tied baseline and its size errors, save/load round trip, resume with stale tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.architectures import architecture, build_model
from dictcheck.empirics.architectures.vasae import make_vasae
from dictcheck.empirics.architectures.vasae import (
    ANCHOR_TOPK,
    anchor_loss,
    default_chunk,
    embedding_sha256,
    nearest_tokens,
    top_tokens,
)

torch.set_num_threads(1)


def _naive_cos(W: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """The full (d_z × V) cosine matrix with autograd (the unchunked reference)."""
    return (W / W.norm(dim=1, keepdim=True)) @ (E / E.norm(dim=1, keepdim=True)).T


def _naive_anchor(W: torch.Tensor, E: torch.Tensor, mode: str) -> torch.Tensor:
    C = _naive_cos(W, E)
    if mode == "nearest":
        s = C.max(dim=1).values
    else:
        top = torch.topk(C, ANCHOR_TOPK, dim=1).values
        s = torch.logsumexp(top, 1) if mode == "logsumexp" else (torch.softmax(top, 1) * top).sum(1)
    return -s.mean()


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), d_z=st.integers(1, 23), chunk=st.integers(1, 30))
def test_chunked_argmax_equals_unchunked(seed: int, d_z: int, chunk: int) -> None:
    W, E = _rand(seed, d_z, 5), _rand(seed + 1, 37, 5)
    s, t = nearest_tokens(W, E, chunk=chunk)
    C = _naive_cos(W, E)
    assert torch.equal(t, C.argmax(dim=1))
    torch.testing.assert_close(s, C.max(dim=1).values, rtol=0, atol=1e-12)
    v, i = top_tokens(W, E, 3, chunk=chunk)
    s0, t0 = top_tokens(W, E, 3, chunk=None)
    assert torch.equal(i, t0)  # identical tokens; cosines agree to rounding (BLAS blocking differs)
    torch.testing.assert_close(v, s0, rtol=0, atol=1e-14)


@pytest.mark.parametrize("mode", ["nearest", "logsumexp", "softmax"])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), chunk=st.sampled_from([1, 3, 7, 64]))
def test_gathered_anchor_equals_naive_value_and_gradient(mode: str, seed: int, chunk: int) -> None:
    E = _rand(seed, 40, 6)
    W1 = _rand(seed + 7, 9, 6).requires_grad_(True)
    W2 = W1.detach().clone().requires_grad_(True)
    fast = anchor_loss(W1, E, mode, chunk)
    slow = _naive_anchor(W2, E, mode)
    fast.backward()
    slow.backward()
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-13)
    torch.testing.assert_close(W1.grad, W2.grad, rtol=0, atol=1e-13)


def test_nearest_gradient_closed_form() -> None:
    """∂L/∂w_d = −(1/d_z)(ê_t − s_d ŵ_d)/‖w_d‖, orthogonal to w_d (spec §2 [derived])."""
    E, W = _rand(3, 30, 4), _rand(4, 6, 4).requires_grad_(True)
    anchor_loss(W, E).backward()
    s, t = nearest_tokens(W, E)
    w = W.detach()
    norm = w.norm(dim=1, keepdim=True)
    e_hat = E[t] / E[t].norm(dim=1, keepdim=True)
    expected = -(e_hat - s[:, None] * w / norm) / norm / w.shape[0]
    torch.testing.assert_close(W.grad, expected, rtol=0, atol=1e-14)
    torch.testing.assert_close((W.grad * w).sum(1), torch.zeros(6, dtype=w.dtype), rtol=0, atol=1e-14)


def test_zero_column_gives_no_nan() -> None:
    E, W = _rand(5, 10, 3), torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    loss = anchor_loss(W, E)
    loss.backward()
    assert float(loss.detach()) == 0.0 and bool(torch.isfinite(W.grad).all())


def test_default_chunk_keeps_block_under_256_mb() -> None:
    """§3: one [chunk × n_vocab] block ≤ 256 MB, decimal as in the spec's "2048 × 49152 ≈ 0.40 GB"."""
    c = default_chunk(49152, 4)
    assert c * 49152 * 4 <= 256 * 10**6 < (c + 1) * 49152 * 4


def test_chunk_budget_uses_the_dtype_of_the_cosine_block(monkeypatch) -> None:
    """The block W_hat @ E_hatᵀ is in W's dtype (E is cast to it), so a float64 W against a float32 E
    must be chunked by 8-byte entries, else the block is twice the §3 budget."""
    import dictcheck.empirics.architectures.vasae as vm

    seen: list[int] = []
    real = vm.default_chunk
    monkeypatch.setattr(vm, "default_chunk", lambda n_vocab, itemsize: seen.append(itemsize) or real(n_vocab, itemsize))
    vm.top_tokens(_rand(0, 3, 4), _rand(1, 9, 4).float(), 2)
    assert seen == [8]


def _model(E: np.ndarray, **kw) -> torch.nn.Module:
    return make_vasae(E.shape[1], kw.pop("d_sae", 12), k=kw.pop("k", 3), embedding=E, dtype=torch.float64, **kw)


def test_encoder_is_topk_of_relu_without_b_dec_subtraction() -> None:
    E = np.random.default_rng(0).standard_normal((20, 5))
    m = _model(E, b_dec_init=torch.full((5,), 3.0, dtype=torch.float64))
    x = _rand(1, 16, 5)
    z = m.encode(x)
    a = x @ m.W_enc + m.b_enc  # no b_dec subtraction
    assert bool((z >= 0).all()) and bool(((z != 0).sum(1) <= 3).all())
    vals, idx = torch.topk(a, 3, dim=1)  # TopK-then-ReLU gives the same output [derived]
    torch.testing.assert_close(z, torch.zeros_like(a).scatter(1, idx, torch.relu(vals)), rtol=0, atol=0)
    out = m(x)
    torch.testing.assert_close(out.mse, ((x - z @ m.W_dec - m.b_dec) ** 2).mean(), rtol=1e-15, atol=0)


def test_anchor_only_in_training_every_m_steps_and_when_coef_positive() -> None:
    E = np.random.default_rng(0).standard_normal((20, 5))
    x = _rand(2, 8, 5)
    m = _model(E, anchor_coef=0.5, anchor_every=3)
    expected = 0.5 * float(anchor_loss(m.W_dec, torch.from_numpy(E)).detach())
    m.train()
    for t in range(7):
        m.set_step(t)
        with torch.no_grad():
            out = m(x)
        if t % 3 == 0:
            assert float(out.aux_loss) == pytest.approx(expected, rel=1e-13)
            assert float(out.loss) == pytest.approx(float(out.mse) + expected, rel=1e-13)
        else:
            assert float(out.aux_loss) == 0.0 and float(out.loss) == float(out.mse)
    m.eval()
    m.set_step(0)
    with torch.no_grad():
        assert float(m(x).aux_loss) == 0.0
        plain = make_vasae(5, 12, k=3, dtype=torch.float64)  # λ_anchor = 0 needs no embedding at all
        plain.train()
        out = plain(x)
    assert float(out.aux_loss) == 0.0 and float(out.loss) == float(out.mse)


def _fit(m: torch.nn.Module, X: torch.Tensor, steps: int) -> None:
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    m.train()
    for t in range(steps):
        m.set_step(t)
        opt.zero_grad()
        m(X).loss.backward()
        opt.step()


def test_anchoring_aligns_decoder_and_zero_coef_is_the_plain_sae() -> None:
    rng = np.random.default_rng(1)
    E = rng.standard_normal((50, 6))
    X = torch.from_numpy(rng.standard_normal((64, 6)))
    anchored, plain, plain2 = (_model(E, anchor_coef=c, seed=3) for c in (1.0, 0.0, 0.0))
    for m in (anchored, plain, plain2):
        _fit(m, X, 150)
    E_t = torch.from_numpy(E)
    assert float(nearest_tokens(anchored.W_dec, E_t)[0].mean()) > float(nearest_tokens(plain.W_dec, E_t)[0].mean()) + 0.1
    for a, b in zip(plain.state_weights().values(), plain2.state_weights().values()):
        assert torch.equal(a, b)  # deterministic under the seed


def test_hard_tie_freezes_decoder_to_embedding() -> None:
    E = np.random.default_rng(0).standard_normal((12, 5))
    m = _model(E, tie="hard")
    assert torch.equal(m.W_dec.detach(), torch.from_numpy(E)) and float(m.b_dec.abs().sum()) == 0.0
    assert not m.W_dec.requires_grad and not m.b_dec.requires_grad
    W_enc0 = m.W_enc.detach().clone()
    _fit(m, _rand(1, 32, 5), 5)
    assert torch.equal(m.W_dec.detach(), torch.from_numpy(E)) and not torch.equal(m.W_enc.detach(), W_enc0)
    w = m.state_weights()
    assert torch.equal(w["W_dec"], torch.from_numpy(E)) and float(w["b_dec"].abs().sum()) == 0.0
    sub = _model(E, d_sae=4, tie="hard", vocab_ids=[7, 0, 3, 11])
    assert torch.equal(sub.W_dec.detach(), torch.from_numpy(E[[7, 0, 3, 11]]))


def test_hard_tie_size_mismatch_is_a_one_line_error() -> None:
    E = np.random.default_rng(0).standard_normal((12, 5))
    with pytest.raises(ValueError, match=r"^tie='hard' needs d_sae = n_vocab: W_E is 12x5 but the SAE is d_sae=10") as e:
        _model(E, d_sae=10, tie="hard")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="embedding width D=5 differs from the SAE's d_in=4"):
        make_vasae(4, 12, k=2, embedding=E, tie="hard")
    with pytest.raises(ValueError, match="vocab_ids holds token id 12 >= n_vocab=12"):
        _model(E, d_sae=2, k=1, tie="hard", vocab_ids=[0, 12])


@pytest.mark.parametrize("k,lam,options,message", [
    (None, None, {}, "needs k"),
    (13, None, {}, "needs k"),
    (2, 0.1, {}, r"does not take option\(s\) \['lam'\]"),
    (2, None, {"anchor_coef": -1.0}, "anchor_coef must be"),
    (2, None, {"anchor_coef": 1e-4}, "needs anchor_source"),
    (2, None, {"anchor_every": 0}, "anchor_every must be"),
    (2, None, {"anchor_every": 2, "anchor_refresh": 3}, "anchor_refresh must be a multiple of anchor_every=2"),
    (2, None, {"anchor_refresh": 0}, "anchor_refresh must be"),
    (2, None, {"init": "xavier"}, "init must be one of"),
    (2, None, {"anchor_mode": "hard"}, "anchor_mode must be"),
    (2, None, {"anchor_chunk": 0}, "anchor_chunk must be"),
    (2, None, {"tie": "soft"}, "tie must be"),
    (2, None, {"tie": "hard", "anchor_source": "x.npy", "anchor_coef": 1.0}, "anchor_coef must be 0"),
    (2, None, {"vocab_ids": [1] * 12}, "needs tie='hard'"),
    (2, None, {"tie": "hard", "anchor_source": "x.npy", "vocab_ids": [1] * 12}, "distinct"),
    (2, None, {"bogus": 1}, "does not take option"),
])
def test_options_reject_bad_input(k, lam, options, message) -> None:
    given = {**options, **({} if k is None else {"k": k}), **({} if lam is None else {"lam": lam})}
    with pytest.raises(ValueError, match=message):
        architecture("vasae").options(given, 12)


def test_build_from_npy_source_and_round_trip(tmp_path) -> None:
    E = np.random.default_rng(0).standard_normal((30, 4)).astype(np.float32)
    path = str(tmp_path / "emb.npy")
    np.save(path, E)
    opts = {"k": 2, "anchor_coef": 1e-3, "anchor_source": path}
    m = build_model("vasae", 4, 8, opts, seed=1)
    m.train()
    assert float(m(torch.randn(4, 4)).aux_loss.detach()) < 0  # loads W_E lazily from the .npy
    fields = m.arch_fields()
    assert fields["embedding_source"] == path and fields["embedding_sha256"] == embedding_sha256(E)
    assert fields["decoder_mode"] == "learnable" and fields["embedding_shape"] == [30, 4]
    assert fields["anchor_mode"] == "nearest" and fields["anchor_topk"] == 10  # §9: anchor_topk (10), any mode
    m2 = build_model("vasae", 4, 8, opts, seed=2)
    m2.load_state_weights(m.state_weights())
    x = torch.randn(5, 4)
    assert torch.equal(m.eval()(x).x_hat, m2.eval()(x).x_hat)
    with pytest.raises(ValueError, match="has shape"):
        m2.load_state_weights({**m.state_weights(), "b_dec": torch.zeros(3)})
    m3 = build_model("vasae", 4, 8, opts)
    m3.load_arch_fields({**fields, "embedding_sha256": "0" * 64})
    with pytest.raises(ValueError, match="no longer holds the embedding"):
        m3.train()(torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"does not take option\(s\) \['aux_coef'\]"):  # VASAE has no AuxK
        build_model("vasae", 4, 8, {**opts, "aux_coef": 0.1})
    with pytest.raises(ValueError, match=r"anchor_source .*no.npy does not exist"):
        build_model("vasae", 4, 30, {"k": 2, "tie": "hard", "anchor_source": str(tmp_path / "no.npy")})


def test_train_save_and_reload_through_the_loop(tmp_path) -> None:
    """empirics.training.loop.train drives vasae (the registered 'vasae' architecture)."""
    import json

    from dictcheck.empirics.io.sae_folder import load_featurizer
    from dictcheck.empirics.training.loop import TrainConfig, train

    rng = np.random.default_rng(0)
    E = rng.standard_normal((40, 6)).astype(np.float32)
    np.save(tmp_path / "emb.npy", E)
    X = rng.standard_normal((256, 6))
    model = build_model("vasae", 6, 10, {"k": 3, "anchor_coef": 0.01, "anchor_every": 2,
                                         "anchor_source": str(tmp_path / "emb.npy")}, seed=1, dtype=torch.float64)
    cfg = TrainConfig(steps=20, batch_size=32, seed=1, device="cpu", checkpoint_every=0, log_every=1,
                      keep_checkpoints=1)
    result = train(model, X, cfg, tmp_path / "sae", progress=False)
    saved = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert saved["architecture"] == "topk" and saved["k"] == 3 and saved["apply_b_dec_to_input"] is False
    fields = saved["metadata"]["dictcheck"]["vasae"]
    assert fields["embedding_sha256"] == embedding_sha256(E) and fields["anchor_every"] == 2
    model, _ = load_featurizer(tmp_path / "sae")
    for name, t in result.weights.items():
        assert torch.equal(model.state_weights()[name], t)
    log = [json.loads(line) for line in (tmp_path / "sae" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 20  # record "step" is 1-based: optimiser step t = step − 1
    assert all((rec["aux_loss"] < 0) == ((rec["step"] - 1) % 2 == 0) for rec in log)  # anchor only when t ≡ 0 mod 2


def test_refresh_every_m_steps_gathers_stale_tokens_in_between() -> None:
    """With anchor_refresh = M the tokens t_d are the exact argmax on steps t ≡ 0 (mod M) and stay fixed
    in between: the loss is then −mean cos(w_d, e_{t_d}) at the held tokens, even when the argmax moved."""
    rng = np.random.default_rng(4)
    E = rng.standard_normal((30, 5))
    E_t = torch.from_numpy(E)
    x = _rand(5, 8, 5)
    m = _model(E, anchor_coef=1.0, anchor_refresh=3)
    assert m.arch_fields()["refresh_interval"] == 3 and m.anchor_refresh == 3
    m.train()
    held = None
    for t in range(8):
        m.set_step(t)
        with torch.no_grad():
            m.W_dec.copy_(_rand(10 + t, 12, 5))  # a new decoder every step: the argmax moves
            out = m(x)
        exact = nearest_tokens(m.W_dec, E_t)
        if t % 3 == 0:
            held = exact[1]
            assert torch.equal(m.anchor_ids[:, 0], held) and m.last_refresh[0] == t
            torch.testing.assert_close(m.last_refresh[1], exact[0], rtol=0, atol=0)
        cos = torch.nn.functional.cosine_similarity(m.W_dec, E_t[held], dim=1)
        torch.testing.assert_close(out.aux_loss, -cos.mean(), rtol=1e-12, atol=0)
        if t % 3:
            assert torch.equal(m.anchor_ids[:, 0], held) and m.last_refresh[0] == t - t % 3
    assert not torch.equal(nearest_tokens(m.W_dec, E_t)[1], held)  # the held tokens were stale
    every = _model(E, anchor_coef=1.0, anchor_every=2)
    assert every.anchor_refresh == 2  # default: refresh on every anchor step


def test_authors_init_is_normal_002_with_zero_biases() -> None:
    m = make_vasae(64, 512, k=4, init="authors", seed=7)
    torch_init = make_vasae(64, 512, k=4, seed=7)
    W_enc, b_enc, W_dec, b_dec = (m.state_weights()[n] for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    for W in (W_enc, W_dec):
        assert abs(float(W.mean())) < 1e-3 and float(W.std()) == pytest.approx(0.02, rel=0.01)
    assert float(b_enc.abs().max()) == 0.0 and float(b_dec.abs().max()) == 0.0
    assert torch.equal(make_vasae(64, 512, k=4, init="authors", seed=7).state_weights()["W_dec"], W_dec)
    w = torch_init.state_weights()
    assert float(w["W_enc"].abs().max()) <= 1 / 8 and float(w["b_enc"].abs().max()) > 0  # U(±1/√64)
    assert m.arch_fields()["init"] == "authors" and torch_init.arch_fields()["init"] == "torch"


def test_resume_with_refresh_is_bit_identical(tmp_path) -> None:
    """The held tokens are a buffer in the checkpoint: resuming from step 6 (between the refreshes at
    4 and 8) gives the uninterrupted run's weights bit for bit."""
    from dictcheck.empirics.training.loop import TrainConfig, train

    rng = np.random.default_rng(0)
    E = rng.standard_normal((40, 6)).astype(np.float32)
    np.save(tmp_path / "emb.npy", E)
    X = rng.standard_normal((256, 6))
    opts = {"k": 3, "anchor_coef": 0.1, "anchor_refresh": 4, "init": "authors",
            "anchor_source": str(tmp_path / "emb.npy")}

    def run(out, resume: bool = False):
        model = build_model("vasae", 6, 10, opts, seed=1, dtype=torch.float64)
        cfg = TrainConfig(steps=12, batch_size=32, seed=1, device="cpu", checkpoint_every=6, log_every=1,
                          keep_checkpoints=5)
        return train(model, X, cfg, out, resume=resume, progress=False)

    full = run(tmp_path / "full")
    part = tmp_path / "part" / "checkpoints"
    part.mkdir(parents=True)
    src = tmp_path / "full" / "checkpoints" / "ckpt_00000006.pt"
    (part / src.name).write_bytes(src.read_bytes())
    res = run(tmp_path / "part", resume=True)
    assert res.resumed_from == 6
    for name, t in full.weights.items():
        assert torch.equal(res.weights[name], t)
