"""The saturation precondition of the VASAE checks (proofs_checks/checks/vasae.py, docs/vasae.md §11):
the dead columns' alignment curve and its plateau test, against a hand-computed curve."""

from __future__ import annotations

import numpy as np
import pytest

from dictcheck.proofs_checks.checks import vasae
from dictcheck.proofs_checks.registry import load_all_checks


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


def test_saturation_without_dead_columns_or_refreshes_is_not_saturated() -> None:
    hist, _ = _history([0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9])
    assert vasae.saturation(hist, np.ones(4, dtype=bool))["saturated"] is False
    one = {"steps": np.array([0]), "s": np.zeros((1, 4), dtype=np.float32)}
    assert vasae.saturation(one, np.zeros(4, dtype=bool))["saturated"] is False


def test_vasae_checks_are_replications_stating_the_regime() -> None:
    for cid in ("vasae.alignment", "vasae.hard_tied_worse", "vasae.recon_parity"):
        c = load_all_checks()[cid]
        assert c.kind == "replication" and f"d_z = {vasae.D_Z}" in c.regime and "authors" in c.regime
