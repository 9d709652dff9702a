"""LM metrics (docs/vasae.md §5, docs/ecosystem.md §2) on the tinycoder fixture and hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dictcheck.empirics.metrics.lm import alignment_metrics, ce_and_kl, feature_names, next_token_logp, splice_metrics
from dictcheck.empirics.data.lm_models import lm_loss, load_lm
from dictcheck.empirics.architectures.vasae import make_vasae

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_lm("tinycoder")


def _batches(lm, seed: int = 0, n: int = 2, B: int = 2, T: int = 12):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(lm.vocab_size, (B, T), generator=g)
        mask = torch.ones(B, T, dtype=torch.long)
        if i == 1:
            mask[0, T - 4:] = 0  # right padding in one row
        out.append((ids, mask))
    return out


def _identity_sae(d: int) -> torch.nn.Module:
    """W_enc = [I, −I], W_dec = [I; −I], k = d: x̂ = ReLU(x) − ReLU(−x) = x exactly."""
    m = make_vasae(d, 2 * d, k=d)
    eye = torch.eye(d)
    with torch.no_grad():
        m.W_enc.copy_(torch.cat([eye, -eye], 1))
        m.b_enc.zero_()
        m.W_dec.copy_(torch.cat([eye, -eye], 0))
        m.b_dec.zero_()
    return m


def _zero_sae(d: int) -> torch.nn.Module:
    m = make_vasae(d, 8, k=2)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    return m


def test_identity_splice_recovers_everything(tiny) -> None:
    r = splice_metrics(tiny, _identity_sae(tiny.d_model), 0, _batches(tiny))
    assert r["ce_sae"] == pytest.approx(r["ce_clean"], abs=1e-9)
    assert r["ce_recovered"] == pytest.approx(1.0, abs=1e-6) and r["ce_recovered_batch_mean"] == pytest.approx(1.0, abs=1e-6)
    assert abs(r["kl"]) < 1e-9 and r["kl_score"] == pytest.approx(1.0, abs=1e-6)
    assert r["delta_ce"] == pytest.approx(0.0, abs=1e-9)
    assert r["ve"] == pytest.approx(1.0, abs=1e-12) and r["n_eval_tokens"] == 2 * 2 * 12 - 4
    assert r["n_ce_tokens"] == 2 * 2 * 11 - 4 and r["kl_zero"] > 0
    assert r["ce_zero"] != pytest.approx(r["ce_clean"], abs=1e-6)


def test_zero_splice_recovers_nothing_and_ce_matches_lm_loss(tiny) -> None:
    batches = _batches(tiny, seed=1, n=1)  # no padding: the zero SAE equals zero ablation
    r = splice_metrics(tiny, _zero_sae(tiny.d_model), 1, batches)
    assert r["ce_sae"] == pytest.approx(r["ce_zero"], abs=1e-12)
    assert r["ce_recovered"] == pytest.approx(0.0, abs=1e-9) and r["kl_score"] == pytest.approx(0.0, abs=1e-9)
    assert r["fvu"] > 1.0 and r["ve"] == pytest.approx(1.0 - r["fvu"])  # x̂ = 0 is worse than the mean
    assert r["l0"] == 0.0 and r["dead_frac"] == 1.0 and not r["alive"].any()
    ids, mask = batches[0]
    with torch.no_grad():
        ref = float(lm_loss(tiny, ids, mask).sum() / (mask[:, :-1] * mask[:, 1:]).sum())
    assert r["ce_clean"] == pytest.approx(ref, rel=1e-5)  # float32 vs float64 log-softmax


def test_ce_and_kl_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.standard_normal((2, 5, 7)))
    ref_logits = torch.from_numpy(rng.standard_normal((2, 5, 7)))
    ids = torch.from_numpy(rng.integers(0, 7, (2, 5)))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    logp, targets = next_token_logp(logits, ids, mask)
    ref, _ = next_token_logp(ref_logits, ids, mask)
    ce, kl = ce_and_kl(logp, targets, ref)
    ce_bf, kl_bf, n = 0.0, 0.0, 0
    for b in range(2):
        for t in range(4):
            if mask[b, t] and mask[b, t + 1]:
                p = np.exp(logits[b, t].numpy()) / np.exp(logits[b, t].numpy()).sum()
                q = np.exp(ref_logits[b, t].numpy()) / np.exp(ref_logits[b, t].numpy()).sum()
                ce_bf -= np.log(p[ids[b, t + 1]])
                kl_bf += float((q * np.log(q / p)).sum())
                n += 1
    assert n == logp.shape[0] == 6
    assert ce == pytest.approx(ce_bf, rel=1e-12) and kl == pytest.approx(kl_bf, rel=1e-12) and kl > 0


def test_splice_rejects_wrong_width(tiny) -> None:
    with pytest.raises(ValueError, match="residual width is 16"):
        splice_metrics(tiny, make_vasae(8, 4, k=1), 0, _batches(tiny))
    with pytest.raises(ValueError, match="layer must be in"):
        splice_metrics(tiny, make_vasae(16, 4, k=1), 2, _batches(tiny))


def test_alignment_all_vs_alive_and_coverage() -> None:
    E = np.eye(4)  # tokens are the axes
    W = np.array([
        [1.0, 0.0, 0.0, 0.0],   # s = 1, token 0
        [2.0, 0.1, 0.0, 0.0],   # s ≈ 0.9988, token 0 again (coverage counts it once)
        [0.0, 1.0, 1.0, 0.0],   # s = 0.7071: medium
        [0.0, 0.0, 0.0, -1.0],  # s = 0 (every cosine ≤ 0): none
        [0.0, 0.0, 0.0, 3.0],   # s = 1, token 3
        [1.0, 1.0, 1.0, 1.0],   # s = 0.5: medium
    ])
    alive = np.array([True, False, True, True, False, False])
    r = alignment_metrics(W, E, alive, chunk=4)
    assert r["buckets"] == {"strong": 3, "medium": 2, "weak": 0, "none": 1}
    assert r["alignment_rate_all"] == pytest.approx(3 / 6) and r["coverage"] == pytest.approx(2 / 4)
    assert r["n_alive"] == 3 and r["n_alive_aligned"] == 1
    assert r["alignment_rate_alive"] == pytest.approx(1 / 3) and r["coverage_alive"] == pytest.approx(1 / 4)
    assert r["s_min"] == pytest.approx(0.0) and r["s_max"] == pytest.approx(1.0)
    assert sum(r["s_histogram"]["counts"]) == 6 and list(r["t"][[0, 1, 4]]) == [0, 0, 3]
    none_alive = alignment_metrics(W, E, np.zeros(6, bool))
    assert none_alive["alignment_rate_alive"] is None and none_alive["n_alive"] == 0
    assert alignment_metrics(W, E)["n_alive"] is None
    with pytest.raises(ValueError, match="alive has 2 entries"):
        alignment_metrics(W, E, np.ones(2, bool))


def test_feature_names_are_token_strings(tiny) -> None:
    E = tiny.embedding()
    W = E[[5, 17, 300]] * torch.tensor([[2.0], [0.5], [1.0]])
    names = feature_names(W, E, tiny, [0, 2], top=5)
    assert [n["feature"] for n in names] == [0, 2]
    assert names[0]["token_ids"][0] == 5 and names[1]["token_ids"][0] == 300
    assert names[0]["cos"][0] == pytest.approx(1.0) and len(names[0]["tokens"]) == 5
    assert names[0]["tokens"] == tiny.token_strings(names[0]["token_ids"])
    assert all(isinstance(s, str) for s in names[1]["tokens"])


@pytest.fixture(scope="session")
def smollm2():
    return load_lm("smollm2")


@pytest.mark.slow
def test_smollm2_identity_splice_and_zero_ablation(smollm2) -> None:
    """The real model: identity splice recovers everything; zero-ablating a block costs many nats (spec §5)."""
    text = "The capital of France is Paris. It is a large city with many museums, parks and old churches."
    ids = torch.tensor([smollm2.tokenizer(text).input_ids])
    T = ids.shape[1]
    r = splice_metrics(smollm2, _identity_sae(smollm2.d_model), 5, [(ids, torch.ones_like(ids))], skip_first=True)
    assert r["ce_recovered"] == pytest.approx(1.0, abs=1e-6) and abs(r["kl"]) < 1e-8
    assert r["ce_zero"] > r["ce_clean"] + 3.0 and r["n_eval_tokens"] == T - 1 and r["n_ce_tokens"] == T - 1
