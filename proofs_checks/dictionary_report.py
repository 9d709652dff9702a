"""The JSON report of a dictionary check (``check-dict``, ``check-sae``, :func:`dictcheck.check_dictionary`):
the docs/theory.md §6 diagnostic keys first, then supporting detail and a per-atom table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dictcheck.solvers.dictionary_check import DictionaryCheck

__all__ = ["summary", "atom_row"]


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def summary(result: DictionaryCheck) -> dict[str, Any]:
    """The JSON summary: the §6 keys first, then supporting detail and a per-atom table."""
    d = result.diagnostics
    out: dict[str, Any] = {
        "kkt_violation": d.kkt_violation,
        "stationarity_violation": _finite(d.stationarity_violation),
        "hull_violation": _finite(d.hull_violation),
        "bias_identity_violation": _finite(d.bias_identity_violation),
        "firing_fraction": d.firing_fraction.tolist(),
        "antipode_gain": d.antipode_gain.tolist(),
        "nested_pairs": [list(p) for p in d.nested_pairs],
        "stationary": d.stationary,
        "failed_conditions": list(d.failed_checks),
        "tolerances": {k: v for k, v in vars(d.tolerances).items()},
        "best_new_atom_gain": result.best_new_atom.gain_mean,
        "wide_gap": result.wide_gap,
        "cert_ratio": d.cert_ratio,
        "certified_gap": result.certified_gap,
        "objective": d.objective,
        "bias": result.b.tolist(),
        "bias_mode": result.bias_mode,
        "bias_residual_mean_norm": d.bias_residual_mean_norm,
        "atoms_renormalised": result.renormalised,
        "codes_kkt_violation": result.codes_kkt_violation,
        "tau_act": d.tau_act,
        "n_atoms": d.n_atoms,
        "n_points": d.n_points,
        "dead_atoms": list(d.dead_atoms),
        "atoms_firing_over_half": [int(i) for i in np.flatnonzero(d.firing_fraction > 0.5)],
        "hull_prime_violation": _finite(d.hull_prime_violation),
        "r2_violation": _finite(d.r2_violation),
    }
    if result.hull is not None:
        out["hull_distance"] = {k: [_finite(x) for x in v] for k, v in result.hull.distances.items()}
    nested_in: dict[int, list[int]] = {}
    for i, j in d.nested_pairs:
        nested_in.setdefault(int(i), []).append(int(j))
    dead = set(d.dead_atoms)
    out["atoms"] = [atom_row(result, k, nested_in.get(k, []), k in dead) for k in range(d.n_atoms)]
    return out


def atom_row(result: DictionaryCheck, k: int, nested_in: list[int], dead: bool) -> dict[str, Any]:
    """One row of the per-atom table (``nested_in``: the atoms j with A_k ⊆ A_j; ``dead``: A_k = ∅)."""
    d = result.diagnostics
    return {
        "atom": k, "norm_on_load": float(result.column_norms[k]), "firing_fraction": float(d.firing_fraction[k]),
        "stationarity": _finite(d.stationarity_per_atom[k]), "hull": _finite(d.hull_per_atom[k]),
        "bias_off_mean": _finite(d.bias_off_mean[k]), "bias_target": _finite(d.bias_target[k]),
        "antipode_gain": float(d.antipode_gain[k]),
        "hull_distance": _finite(result.hull.distances["H-act-res"][k]) if result.hull is not None else None,
        "nested_in": nested_in, "dead": dead,
    }
