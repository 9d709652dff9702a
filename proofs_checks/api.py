"""The Python API behind ``import dictcheck``: every entry point takes data as (N, D) ROWS, like the CLI,
SAELens and torch (the solvers' column convention stays inside). Results are the dicts the CLI prints
with ``--json``, with numpy arrays where the JSON has lists. Bad input raises ValueError (one line).

Math and constants: docs/theory.md (objective (1) with the 2λ on the L1 term and the 1/N mean).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from dictcheck.empirics.architectures import ArchOptions, build_model
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.io.formats import load_any_sae
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.empirics.training.loop import TrainConfig, TrainResult
from dictcheck.empirics.training.loop import train as train_model
from dictcheck.proofs_checks.cli.inputs import (
    CODES_TOL_RANGE,
    checked_bias,
    checked_dictionary,
    checked_lambda,
    checked_points,
    checked_range,
)
from dictcheck.proofs_checks.dictionary_report import summary
from dictcheck.proofs_checks.runner import run_suite, select_checks
from dictcheck.proofs_checks.sae_polish import PolishSettings, polish_sae
from dictcheck.proofs_checks.sae_report import SaeCheckSettings, sae_report
from dictcheck.solvers.dictionary_check import check_dictionary as run_dictionary_check
from dictcheck.solvers.dnn import solve_dnn
from dictcheck.solvers.lasso_codes import exact_codes as solve_exact_codes
from dictcheck.solvers.medians import geometric_median as solve_geometric_median
from dictcheck.solvers.medians import huber_median as solve_huber_median
from dictcheck.solvers.wide_limit import DEFAULT_RAY_TOL, solve_wide_limit

__all__ = [
    "rows",
    "geometric_median",
    "huber_median",
    "wide_limit",
    "dnn",
    "exact_codes",
    "check_dictionary",
    "check_sae",
    "polish",
    "load_sae",
    "train",
    "run_checks",
]


def rows(X: ArrayLike, what: str = "X") -> NDArray[np.float64]:
    """``X`` as a float64 (N, D) array, one point per row, N, D ≥ 1, of real finite numbers of magnitude
    ≤ 1e50 (ValueError otherwise; :func:`dictcheck.proofs_checks.cli.inputs.checked_points`)."""
    return checked_points(X, what)


def _lam(lam: float) -> float:
    return checked_lambda(lam, "lam")


def _bias(bias: ArrayLike | None, D: int) -> NDArray[np.float64] | None:
    return None if bias is None else checked_bias(bias, D, "bias")


def geometric_median(X: ArrayLike) -> dict[str, Any]:
    """The geometric median b = argmin (1/N) Σ‖x_i − b‖ (docs/theory.md §4.3): ``b``, ``objective`` (the mean
    distance), ``converged``, ``gradient_norm``, ``iterations``."""
    r = solve_geometric_median(rows(X).T)
    return {"b": r.b, "objective": r.objective, "converged": r.converged, "gradient_norm": r.gradient_norm,
            "iterations": r.iterations}


def huber_median(X: ArrayLike, lam: float) -> dict[str, Any]:
    """The Huber-smoothed median b = argmin (1/N) Σ h_λ(‖x_i − b‖) (docs/theory.md §4.3 (7)): ``b``,
    ``objective`` (the mean of h_λ, the wide-limit optimum of objective (1)), ``lam``, ``converged``,
    ``gradient_norm``, ``iterations``."""
    lam = _lam(lam)
    r = solve_huber_median(rows(X).T, lam)
    return {"b": r.b, "objective": r.objective, "lam": lam, "converged": r.converged,
            "gradient_norm": r.gradient_norm, "iterations": r.iterations}


def wide_limit(X: ArrayLike, lam: float, *, bias: ArrayLike | None = None,
               ray_tol: float = DEFAULT_RAY_TOL) -> dict[str, Any]:
    """The closed-form wide-limit optimum and its narrowest dictionary (docs/theory.md §4.2–§4.4): ``b``,
    ``objective``, ``n_rays``, ``atoms`` (one unit atom per row), ``certified_gap``, ``attained_objective``,
    ``learned_bias``, ``ray_tol``, ``lam``. ``bias`` fixes b (default: the Huber median)."""
    X = rows(X)
    lam = _lam(lam)
    ray_tol = checked_range(ray_tol, "ray_tol (radians)", 0.0, math.pi)
    s = solve_wide_limit(X.T, lam, b=_bias(bias, X.shape[1]), ray_tol=ray_tol)
    return {"b": s.b, "objective": s.objective, "n_rays": s.n_rays, "atoms": s.rays.atoms.T,
            "certified_gap": s.certified_gap, "attained_objective": s.attained_objective,
            "learned_bias": s.learned_bias, "ray_tol": s.rays.tolerance, "lam": lam}


def dnn(X: ArrayLike, lam: float, *, bias: ArrayLike | None = None) -> dict[str, Any]:
    """The doubly-nonnegative relaxation of program (3) solved with cvxpy (docs/theory.md §2.3; exact for
    every N): ``objective``, ``b``, ``status``, ``solver``, ``seconds``, ``learned_bias``, ``lam``. The conic
    solve grows like N⁵; :func:`wide_limit` gives the same optimum for any N. ``DNNSolveError`` when the
    solver does not reach status optimal."""
    X = rows(X)
    lam = _lam(lam)
    s = solve_dnn(X.T, lam, b=_bias(bias, X.shape[1]))
    return {"objective": s.objective, "b": s.b, "status": s.status, "solver": s.solver, "seconds": s.seconds,
            "learned_bias": s.learned_bias, "lam": lam}


def exact_codes(W: ArrayLike, X: ArrayLike, lam: float, *, bias: ArrayLike | None = None,
                tol: float = 1e-8) -> dict[str, Any]:
    """The exact non-negative lasso codes of objective (1) for a fixed dictionary W (D, d_z; one atom per
    column, any norms) and bias (default 0): ``codes`` (N, d_z), one row per point, and ``kkt_violation``
    (relative, ≤ ``tol``; docs/theory.md §1 (KKT-z))."""
    X = rows(X)
    lam = _lam(lam)
    W = checked_dictionary(W, X.shape[1])
    b = _bias(bias, X.shape[1])
    tol = checked_range(tol, "tol", *CODES_TOL_RANGE)
    r = solve_exact_codes(W, X.T, np.zeros(X.shape[1]) if b is None else b, lam, tol=tol)
    return {"codes": np.ascontiguousarray(r.Z.T), "kkt_violation": r.kkt_violation}


def check_dictionary(W: ArrayLike, X: ArrayLike, lam: float, *, bias: ArrayLike | None = None,
                     learn_bias: bool = False, tol: float = 1e-8, hull_candidates: bool = False,
                     progress: bool = False) -> dict[str, Any]:
    """Which local optimality conditions the dictionary W (D, d_z; one atom per column, normalised on load)
    satisfies on data X (N, D) at λ, with exact codes (docs/theory.md §3, §6): the report of
    ``dictcheck check-dict --json``. The bias is ``bias``, the optimal one (``learn_bias``), or 0.
    ``hull_candidates`` adds the four hull distances of docs/theory.md §8 Q1 (one QP per atom)."""
    X = rows(X)
    lam = _lam(lam)
    W = checked_dictionary(W, X.shape[1])
    tol = checked_range(tol, "tol", *CODES_TOL_RANGE)
    result = run_dictionary_check(W, X.T, lam, b=_bias(bias, X.shape[1]), learn=learn_bias, tol=tol,
                                  hull_candidates=hull_candidates, progress=progress)
    return summary(result)


def check_sae(folder: str | os.PathLike[str] | Any, X: ArrayLike | str | os.PathLike[str],
              lam: float | str | None = None, **settings: Any) -> dict[str, Any]:
    """A trained SAE against the theory on tokens X: a folder (SAELens, either save method; sparsify;
    dictionary_learning; Gemma Scope) or an SAE object in memory (a SAELens ``SAE``/``TrainingSAE``, a sparsify
    ``SparseCoder``, a dictionary_learning module, a dictcheck featurizer; TypeError for anything else). X: an
    (N, D) array, an ``.npy`` path or an activation store folder. The report of ``dictcheck check-sae --json``
    (docs/theory.md §3, §6, §7). ``lam``: a number, ``"auto"``, or None (the folder's λ, else auto);
    ``settings``: the fields of :class:`dictcheck.proofs_checks.sae_report.SaeCheckSettings` (``polish=True``,
    ``hull=True``, ``batch_size``, ...)."""
    data = rows(X) if not isinstance(X, (str, os.PathLike)) else X
    source = str(folder) if isinstance(folder, (str, os.PathLike)) else folder
    return sae_report(source, data, SaeCheckSettings(lam=lam if lam in (None, "auto") else _lam(lam), **settings))


def polish(folder: str | os.PathLike[str], X: ArrayLike | str | os.PathLike[str], out: str | os.PathLike[str],
           lam: float | str | None = None, *, resume: bool = False, **settings: Any) -> dict[str, Any]:
    """``dictcheck polish``: the SAE folder polished to the nearest stationary point of objective (1) on tokens X
    (an (N, D) array, an ``.npy`` path or an activation store folder), an encoder fitted to the polished decoder,
    written to ``out`` as a folder of the input's format with ``polish.json``, whose contents are returned
    (docs/theory.md §7.1). ``lam`` as in :func:`check_sae`; ``settings``: the fields of
    :class:`dictcheck.proofs_checks.sae_polish.PolishSettings` (``sweeps``, ``holdout``, ``fit_steps``, ...)."""
    data = rows(X) if not isinstance(X, (str, os.PathLike)) else X
    return polish_sae(str(folder), data, out, PolishSettings(lam=lam if lam in (None, "auto") else _lam(lam),
                                                               **settings), resume=resume)


def load_sae(folder: str | os.PathLike[str] | Any) -> tuple[Featurizer, SaeConfig]:
    """The model an SAE folder holds (any registered architecture, any format of :func:`check_sae`; eval mode)
    and its config; an SAE object in memory is converted as its saved folder would load (TypeError for an
    object of no accepted kind)."""
    model, cfg, _ = load_any_sae(folder)
    return model, cfg


def train(X: ArrayLike, arch: str, d_sae: int, options: dict[str, Any] | ArchOptions | None = None, *,
          out: str | os.PathLike[str] | None = None, seed: int = 0, dtype: str = "float32",
          resume: bool = False, progress: bool | None = None, **config: Any) -> TrainResult:
    """Build a ``arch`` model of width ``d_sae`` (initialised with ``seed``) and train it on X (N, D) with
    :class:`TrainConfig` fields ``config`` (steps, batch_size, lr, ...; ``seed`` also orders the batches).
    With ``out`` the run writes the SAELens folder, log and checkpoints there (``resume`` continues)."""
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    data = np.asarray(X)
    if data.ndim != 2:
        raise ValueError(f"X must have shape (N, D) with one point per row, got {data.shape}")
    model = build_model(arch, int(data.shape[1]), d_sae, options, seed=seed, dtype=getattr(torch, dtype))
    return train_model(model, data, TrainConfig(seed=seed, **config), out, resume=resume, progress=progress)


def run_checks(*, quick: bool = True, only: str | None = None, kinds: str | None = None, strict: bool = False,
               out: str | os.PathLike[str] = "dictcheck-out", seed: int = 0) -> dict[str, Any]:
    """Run the verification checks (``dictcheck run``): the summary written to ``out/results.json``. ``kinds``:
    comma-separated kinds to run; ``summary["passed"]`` is the run's verdict (theorems and invariants; with
    ``strict`` every check)."""
    return run_suite(select_checks(quick, only, kinds), Path(out), seed=seed, quick=quick, only=only, kinds=kinds,
                     strict=strict)
