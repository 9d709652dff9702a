"""The ground-truth metrics and the synthetic generator against SAELens itself (docs/ecosystem.md §6).

Runs in the benchmark venv only (``.venv-bench``: sae-lens installed; skipped where SAELens is absent, as in
CI, which has the numpy re-derivations and committed reference values of tests/test_ground_truth.py):

    .venv-bench/bin/python -m pytest tests/test_ground_truth_saelens.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dictcheck.empirics.architectures import build_model
from dictcheck.empirics.metrics.ground_truth import GroundTruthEval
from dictcheck.empirics.io.sae_folder import new_sae_config, save_sae
from dictcheck.empirics.data.synthetic import FoldedNormal, HierarchySpec, SyntheticModel, SyntheticSpec, ZipfFiring

sae_lens = pytest.importorskip("sae_lens")
from sae_lens.synthetic import evals as sl_evals  # noqa: E402
from sae_lens.synthetic.feature_dictionary import FeatureDictionary  # noqa: E402
from sae_lens.synthetic.firing_magnitudes import FoldedNormalMagnitudeConfig, LinearMagnitudeConfig  # noqa: E402
from sae_lens.synthetic.firing_probabilities import ZipfianFiringProbabilityConfig  # noqa: E402
from sae_lens.synthetic.hierarchy import HierarchyConfig  # noqa: E402
from sae_lens.synthetic.stats import compute_low_rank_correlation_matrix_stats, compute_superposition_stats  # noqa: E402
from sae_lens.synthetic.synthetic_model import LowRankCorrelationConfig, SyntheticModelConfig  # noqa: E402
from sae_lens.synthetic.synthetic_model import SyntheticModel as SaeLensModel  # noqa: E402

SPEC = SyntheticSpec(n_features=512, d=64, firing=ZipfFiring(1.0, 0.3, 0.01), hierarchy=HierarchySpec(16, 4, 2, 1.0),
                     correlation_rank=8, correlation_scale=0.1, magnitude_mean=(2.0, 1.0),
                     magnitude_std=FoldedNormal(0.3, 0.2), seed=0)
SAELENS_CFG = SyntheticModelConfig(
    num_features=512, hidden_dim=64, firing_probability=ZipfianFiringProbabilityConfig(1.0, 0.3, 0.01),
    hierarchy=HierarchyConfig(total_root_nodes=16, branching_factor=4, max_depth=2, mutually_exclusive_portion=1.0),
    correlation=LowRankCorrelationConfig(rank=8, correlation_scale=0.1),
    std_firing_magnitudes=FoldedNormalMagnitudeConfig(0.3, 0.2), mean_firing_magnitudes=LinearMagnitudeConfig(2.0, 1.0),
    bias=1.0, seed=0)
N_SAMPLES = 50_000


class _FixedActivations:
    """Stands in for SAELens' ActivationGenerator: returns the given activations, in order."""

    def __init__(self, acts: torch.Tensor) -> None:
        self.acts, self.pos = acts, 0

    def sample(self, n: int) -> torch.Tensor:
        out = self.acts[self.pos:self.pos + n]
        self.pos += n
        return out


@pytest.mark.parametrize("arch, options", [("relu", {"lam": 0.1}), ("topk", {"k": 4}),
                                           ("jumprelu", {"lam": 0.1, "init_threshold": 0.05})])
def test_metrics_equal_saelens_eval_sae_on_synthetic_data(tmp_path: Path, arch: str, options: dict) -> None:
    synth = SyntheticModel(SPEC)
    batch = synth.sample(4000, np.random.default_rng(1))
    model = build_model(arch, SPEC.d, 96, options, seed=2)
    with torch.no_grad():  # a decoder part-way to the features, so every metric is away from 0 and 1
        gen = torch.Generator().manual_seed(3)
        W = torch.as_tensor(synth.features[:96], dtype=torch.float32) + 0.6 * torch.randn(96, SPEC.d, generator=gen)
        model.W_dec.copy_(W / W.norm(dim=1, keepdim=True))
        model.W_enc.copy_(model.W_dec.T * 1.3)
        model.b_enc.fill_(-0.4)
        model.b_dec.copy_(torch.as_tensor(synth.bias, dtype=torch.float32))
    cfg = new_sae_config(arch, SPEC.d, 96, k=options.get("k"), lam=options.get("lam"))
    save_sae(tmp_path, model.state_weights(), cfg)
    sae = sae_lens.SAE.load_from_disk(str(tmp_path), device="cpu")

    fd = FeatureDictionary(SPEC.n_features, SPEC.d, bias=False, initializer=None)
    fd.feature_vectors.data = torch.as_tensor(synth.features, dtype=torch.float32)
    fd.bias.data = torch.as_tensor(synth.bias, dtype=torch.float32)
    acts = torch.as_tensor(batch.acts.toarray(), dtype=torch.float32)
    ref = sl_evals.eval_sae_on_synthetic_data(sae, fd, _FixedActivations(acts), num_samples=4000, batch_size=1000)

    ours = GroundTruthEval(sae.W_dec.detach(), fd.feature_vectors.detach())
    with torch.no_grad():
        for lo in range(0, 4000, 1000):
            a = acts[lo:lo + 1000]
            x = fd(a)
            z = sae.encode(x)
            ours.update(x, sae.decode(z), z, a)
    got = ours.result()
    want = {**ref.to_dict(), **ref.to_dict()["classification"]}
    want["ve"] = want.pop("explained_variance")
    for key, value in got.items():
        assert value == pytest.approx(want[key], rel=1e-5, abs=1e-6), key


def test_generator_statistics_match_saelens_synthetic_model() -> None:
    """Same configuration, independent draws: the deterministic parts agree exactly (firing probabilities,
    the hierarchy's layout and magnitude means), the random ones in distribution (per-feature firing rates,
    true L0, magnitudes, the copula's RMS correlation, the overlap ρ_mm)."""
    ref = SaeLensModel(SAELENS_CFG)
    ours = SyntheticModel(SPEC)
    np.testing.assert_allclose(ours.p_target, ref.activation_generator.firing_probabilities.numpy(), rtol=1e-6)
    np.testing.assert_allclose(ours.mean, ref.activation_generator.mean_firing_magnitudes.numpy(), rtol=1e-6)
    parents = np.full(SPEC.n_features, -1)
    stack = list(ref.hierarchy.roots)
    while stack:
        node = stack.pop()
        for child in node.children:
            parents[child.feature_index] = node.feature_index
            stack.append(child)
    np.testing.assert_array_equal(ours.forest.parent, parents)

    torch.manual_seed(0)
    _, acts = ref.sample_with_features(N_SAMPLES)
    ref_rates = (acts > 0).double().mean(0).numpy()
    stats = ours.statistics(N_SAMPLES, seed=0)
    rates = stats["firing_rates"]
    # two independent estimates of the same rate differ by ~√(2p(1−p)/N); the copula's shared factors widen it
    assert np.mean(np.abs(rates - ref_rates)) < 4 * np.mean(np.sqrt(2 * ref_rates * (1 - ref_rates) / N_SAMPLES))
    ref_l0 = float((acts > 0).double().sum(1).mean())
    assert stats["true_l0"] == pytest.approx(ref_l0, rel=0.02)
    ours_mag = ours.sample(N_SAMPLES, np.random.default_rng(1)).acts.data
    assert ours_mag.mean() == pytest.approx(float(acts[acts > 0].mean()), rel=0.01)
    ref_std = ref.activation_generator.std_firing_magnitudes.double().numpy()  # per feature, |N(0.3, 0.2²)| draws
    se = np.sqrt(ours.std.var() / ours.std.size + ref_std.var() / ref_std.size)
    assert abs(ours.std.mean() - ref_std.mean()) < 4 * se
    ref_corr = compute_low_rank_correlation_matrix_stats(ref.correlation_matrix).rms_correlation
    assert stats["rms_correlation"] == pytest.approx(ref_corr, rel=0.1)
    ref_rho = compute_superposition_stats(ref.feature_dict).mean_max_abs_cos_sim
    assert stats["rho_mm"] == pytest.approx(ref_rho, rel=0.02)
    assert stats["orphan_fraction"] == 0.0 and stats["exclusive_clashes"] == 0
