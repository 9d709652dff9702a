"""SAELens SAE objects in memory, against SAELens itself (needs sae-lens: run in ``.venv-bench``; skipped in CI,
where tests/test_saelens_folders.py checks the same semantics on fixture folders SAELens wrote)."""

from __future__ import annotations

import warnings

import pytest
import torch

import dictcheck

sae_lens = pytest.importorskip("sae_lens")

#: SAELens training architecture -> its config arguments.
ARCHS = {"standard": {}, "topk": {"k": 3}, "batchtopk": {"k": 3}, "jumprelu": {}}


def _perturbed(sae: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            if name == "threshold":
                p.abs_()
    return sae


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_training_and_inference_objects_compute_what_saelens_computes(arch: str, tmp_path) -> None:
    from sae_lens import SAE
    from sae_lens.registry import SAE_TRAINING_CLASS_REGISTRY

    warnings.filterwarnings("ignore")
    cls, cfg_cls = SAE_TRAINING_CLASS_REGISTRY[arch]
    torch.manual_seed(0)
    training = _perturbed(cls(cfg_cls(d_in=6, d_sae=16, **ARCHS[arch])))
    training.save_inference_model(tmp_path)
    inference = SAE.load_from_disk(tmp_path)
    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        z = inference.encode(x)
        x_hat = inference.decode(z)
    for obj in (training, inference):
        model, _ = dictcheck.load_sae(obj)
        with torch.no_grad():
            out = model(x)
        assert float((out.codes - z).abs().max()) <= 1e-6 * max(1.0, float(z.abs().max())), type(obj).__name__
        assert float((out.x_hat - x_hat).abs().max()) <= 1e-6 * max(1.0, float(x_hat.abs().max())), type(obj).__name__
