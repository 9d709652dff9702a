"""The saturation precondition of the VASAE checks (proofs_checks/checks/vasae.py, docs/vasae.md §11):
the dead columns' alignment curve and its plateau test, against a hand-computed curve."""

from __future__ import annotations

import numpy as np
import pytest

from dictcheck.proofs_checks.checks import vasae
from dictcheck.proofs_checks.registry import REGISTRY


def _history(dead_curve: list[float], alive_value: float = 0.1) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Four columns, the first two dead: s_d at each refresh is the curve (dead) or a constant (alive)."""
    steps = np.arange(len(dead_curve)) * vasae.REFRESH
    S = np.array([[v, v, alive_value, alive_value] for v in dead_curve], dtype=np.float32)
    return {"steps": steps, "s": S}, np.array([False, False, True, True])


def test_saturation_reads_the_last_interval_before_the_decay() -> None:
    n = vasae.STEPS // vasae.REFRESH  # refreshes at 0, 50, ..., STEPS − 50
    decay_start = vasae.STEPS - vasae.STEPS // 5
    last = max(t for t in range(0, vasae.STEPS, vasae.REFRESH) if t <= decay_start)
    i = last // vasae.REFRESH
    # the dead columns cross 0.8 one refresh at a time, except within the window, where none does
    hist = {"steps": np.arange(n) * vasae.REFRESH,
            "s": np.array([[0.9 if r >= c else 0.1 for c in range(n)] + [0.95] for r in range(n)], dtype=np.float32)}
    hist["s"][i] = hist["s"][i - 1]
    alive = np.array([False] * n + [True])
    out = vasae.saturation(hist, alive)
    assert out["window"] == [last - vasae.REFRESH, last]
    assert out["rise_per_100_steps"] == 0.0 and out["saturated"]
    assert out["dead_aligned_frac"][0] == pytest.approx(1 / n)  # the alive column is not counted
    assert out["dead_s_mean"][0] == pytest.approx((0.9 + 0.1 * (n - 1)) / n, abs=1e-4)
    hist["s"][i] = [0.9 if i >= c else 0.1 for c in range(n)] + [0.95]  # one more column crosses in the window
    out = vasae.saturation(hist, alive)
    assert out["rise_per_100_steps"] == pytest.approx(100 / n / vasae.REFRESH) and not out["saturated"]
    hist["s"][i] = [0.1] * n + [0.95]  # every dead column falls back in the window: no plateau either
    out = vasae.saturation(hist, alive)
    assert out["rise_per_100_steps"] < -vasae.SATURATION_RISE and not out["saturated"]


def test_saturation_without_dead_columns_or_refreshes_is_not_saturated() -> None:
    hist, _ = _history([0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9])
    assert vasae.saturation(hist, np.ones(4, dtype=bool))["saturated"] is False
    one = {"steps": np.array([0]), "s": np.zeros((1, 4), dtype=np.float32)}
    assert vasae.saturation(one, np.zeros(4, dtype=bool))["saturated"] is False


def test_vasae_checks_are_replications_stating_the_regime() -> None:
    for cid in ("vasae.alignment", "vasae.hard_tied_worse", "vasae.recon_parity"):
        c = REGISTRY[cid]  # registered by importing the module above
        assert c.kind == "replication" and f"d_z = {vasae.D_Z}" in c.regime and "authors" in c.regime


@pytest.mark.parametrize("norm", [0.3, 0.6])
def test_dead_column_alignment_rate_matches_torch_adam(norm: float) -> None:
    """theory.anchor_dynamics against brute force: one dead column under torch's Adam with only the
    anchor term (λ/d_z)·(−cos) crosses s = 0.8 at the predicted step, deep in the ε-limited regime
    (|g_i| ≈ ε/100); at |g_i| ≈ ε/10 (λ = 1e-5 at lr 1e-3) it comes ≈ 10% later, as lr·g/(|g| + ε) says."""
    import torch

    from dictcheck.empirics.architectures.vasae import anchor_loss
    from dictcheck.theory.anchor_dynamics import alignment_rate, steps_to_alignment

    lr, lam, d_z, D = 1e-2, 1e-6, 8192, 16
    gen = torch.Generator().manual_seed(0)
    E = torch.randn(5, D, generator=gen, dtype=torch.float64)
    w = torch.randn(1, D, generator=gen, dtype=torch.float64)
    w = (w * norm / w.norm()).requires_grad_()
    opt = torch.optim.Adam([w], lr=lr)
    s0 = -float(anchor_loss(w, E).detach())
    crossed = None
    for t in range(20_000):  # t Adam steps taken so far
        loss = anchor_loss(w, E)  # −cos(w, e_t) for one column
        if -float(loss.detach()) >= 0.8:
            crossed = t
            break
        opt.zero_grad()
        (lam / d_z * loss).backward()
        opt.step()
    predicted = steps_to_alignment(s0, 0.8, alignment_rate(lr, lam, 1e-8, d_z, norm**2))
    assert crossed is not None and crossed == pytest.approx(predicted, rel=0.03)
    assert float(w.detach().norm()) == pytest.approx(norm, rel=0.02)  # ‖w‖ constant to first order


def test_anchor_dynamics_rejects_bad_input() -> None:
    from dictcheck.theory.anchor_dynamics import alignment_rate, steps_to_alignment

    with pytest.raises(ValueError, match="d_z must be"):
        alignment_rate(1e-3, 1e-4, 1e-8, 0, 0.2)
    with pytest.raises(ValueError, match="need -1 < s0 <= s < 1"):
        steps_to_alignment(0.9, 0.8, 1e-3)
