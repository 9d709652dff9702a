"""Loading and validating user inputs for the CLI (one-line errors, never a traceback)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from dictcheck.proofs_checks.errors import UserError


def load_array(path: str | Path, what: str) -> NDArray[np.float64]:
    """Load a finite float64 array from an .npy file, or raise UserError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} file not found: {path}")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"{what} file {path} is not a readable .npy array ({exc})") from None
    if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise UserError(f"{what} file {path} must hold real numbers, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)):
        raise UserError(f"{what} file {path} contains NaN or inf")
    return array


def load_points(path: str | Path) -> NDArray[np.float64]:
    """Load data of shape (N, D), one point per row, N ≥ 1 and D ≥ 1; returns it as stored."""
    X = load_array(path, "data")
    if X.ndim != 2:
        raise UserError(f"data file {path} must be 2-D (N, D), got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise UserError(f"data file {path} is empty: shape {X.shape} (need N >= 1 points, D >= 1)")
    return X


def positive_lambda(value: float) -> float:
    """Validate λ > 0 and finite."""
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"--lam must be a positive finite number, got {value}")
    return float(value)
