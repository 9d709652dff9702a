"""The validation layer at the CLI boundary, shared by every command (the value checks also serve the
Python API, :mod:`dictcheck.proofs_checks.api`).

Every command validates what it was given here, before any work starts and before any model is
loaded, so a bad input ends in one line (:class:`UserError`, exit code 2) and nothing else is
printed or written:

* **arrays**: the file exists and is a plain ``.npy`` array (not ``.npz``, not a pickle:
  :func:`dictcheck.empirics.io.safe_files.read_npy`), of real numbers (bool, integer or float; not
  complex, strings or timedeltas), finite, of the expected shape, with entries of magnitude at most
  :data:`MAX_ENTRY`, and small enough to fit in memory as float64;
* **numbers**: λ finite and within :data:`LAMBDA_RANGE`; the exact codes' tolerance within
  :data:`CODES_TOL_RANGE`; other tolerances and sizes within the range each command documents;
* **output paths**: a folder (or a file's folder) that exists as a folder or can be created as one,
  on a writable file system (:func:`dictcheck.empirics.io.safe_files.check_output_dir`); created by the
  command only once everything else was checked;
* **results**: :func:`finite_result` refuses to print a result holding NaN or ±inf.

Ranges (Decision). The objective is homogeneous: scaling the data, the bias and λ by s scales every
value by s² (docs/theory.md §1), so nothing is lost by asking for data in a sane range. With
|x| ≤ 1e50 and 1e-50 ≤ λ ≤ 1e50, any product or quotient of two or three of them, squared norms
summed over any number of points and dimensions that fit in memory, and λ² all stay far inside
float64 (max 1.8e308, smallest normal 2.2e-308); at 1e308 the Huber value and squared norms overflow.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dictcheck.empirics.io.safe_files import check_memory, check_output_dir, read_npy
from dictcheck.proofs_checks.errors import UserError
from dictcheck.theory.scaling import LAMBDA_RANGE, MAX_ENTRY

__all__ = ["MAX_ENTRY", "LAMBDA_RANGE", "CODES_TOL_RANGE", "MIN_ATOM", "SCAN_BYTES", "FIGURE_SUFFIXES",
           "NonFiniteResultError", "checked_array", "checked_points", "checked_dictionary", "checked_bias",
           "checked_lambda", "checked_range", "positive_lambda", "load_array", "load_points", "scan_points_file",
           "output_dir", "output_file", "finite_result"]

#: Smallest largest-entry magnitude of a dictionary atom: smaller atoms cannot be normalised (their
#: squared norm leaves the normal float64 range).
MIN_ATOM = 1e-100
#: The accepted range of the exact codes' relative KKT tolerance: below 1e-15 is beneath float64
#: resolution (the solver stops at ~1e-15 anyway), above 1e-3 the codes are not near exact and the
#: §3 diagnostics, judged at 1e-6, lose their meaning.
CODES_TOL_RANGE = (1e-15, 1e-3)
#: Bytes of float64 rows :func:`scan_points_file` holds at a time.
SCAN_BYTES = 64 << 20
#: File types ``--figure`` can write (matplotlib's raster and vector formats that need no extra package).
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


class NonFiniteResultError(RuntimeError):
    """A computation on validated input returned NaN or ±inf (an internal failure: exit code 1)."""


def checked_array(A: ArrayLike, what: str) -> NDArray[np.float64]:
    """``A`` as float64 after checking it holds real, finite numbers of magnitude ≤ :data:`MAX_ENTRY`
    (:class:`UserError` naming ``what`` otherwise)."""
    A = np.asarray(A)
    if A.dtype.kind not in "biuf":
        raise UserError(f"{what} must hold real numbers, got dtype {A.dtype}")
    A = A.astype(np.float64)
    if not np.isfinite(A).all():
        raise UserError(f"{what} contains NaN or inf")
    biggest = float(np.abs(A).max(initial=0.0))
    if biggest > MAX_ENTRY:
        raise UserError(f"{what} has entries up to {biggest:.3g} in magnitude, more than the {MAX_ENTRY:g} accepted "
                        "(squared norms would overflow); rescale it, and λ with it")
    return A


def checked_points(A: ArrayLike, what: str = "X") -> NDArray[np.float64]:
    """:func:`checked_array` of (N, D) points, one per row, N ≥ 1 and D ≥ 1."""
    shape = np.shape(A)
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise UserError(f"{what} must have shape (N, D) with N >= 1 points as rows and D >= 1, got shape {shape}")
    return checked_array(A, what)


def checked_dictionary(W: ArrayLike, D: int, what: str = "the dictionary") -> NDArray[np.float64]:
    """A (D, d_z) dictionary, one atom per column, d_z ≥ 1, checked by :func:`checked_array`, every atom
    normalisable: its largest entry at least :data:`MIN_ATOM` in magnitude."""
    shape = np.shape(W)
    if len(shape) != 2:
        raise UserError(f"{what} must be 2-D (D, d_z), one atom per column, got shape {shape}")
    if shape[1] == 0:
        raise UserError(f"{what} has zero atoms (shape {shape})")
    if shape[0] != D:
        raise UserError(f"{what} has D = {shape[0]} rows but the data have D = {D} columns")
    A = checked_array(W, what)
    small = np.flatnonzero(np.abs(A).max(axis=0) < MIN_ATOM)
    if small.size:
        raise UserError(f"{what}: atoms {small.tolist()} are zero (every entry below {MIN_ATOM:g} in magnitude) and "
                        "cannot be normalised")
    return A


def checked_bias(b: ArrayLike, D: int, what: str = "the bias") -> NDArray[np.float64]:
    """A bias of D entries (any shape holding D numbers), checked by :func:`checked_array`, flattened."""
    if np.size(b) != D:
        raise UserError(f"{what} has {np.size(b)} entries but the data have D = {D}")
    return checked_array(b, what).reshape(-1)


def checked_range(value: Any, name: str, low: float, high: float) -> float:
    """``value`` as a float if it is a finite real number in [low, high] (:class:`UserError` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or not low <= value <= high:
        raise UserError(f"{name} must be a finite number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def checked_lambda(value: Any, name: str = "lam") -> float:
    """λ: a finite number in :data:`LAMBDA_RANGE`."""
    return checked_range(value, name, *LAMBDA_RANGE)


def positive_lambda(value: float) -> float:
    """The ``--lam`` flag: :func:`checked_lambda`."""
    return checked_lambda(value, "--lam")


def load_array(path: str | Path, what: str) -> NDArray[np.float64]:
    """The array in the .npy file ``path`` as float64, checked by :func:`checked_array` (and refused
    before it is read when its float64 copy would not fit in memory)."""
    try:
        array = read_npy(path, f"{what} file")
        check_memory(array.size * 8, f"{what} file {path} as float64")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return checked_array(array, f"{what} file {path}")


def _points_file(path: str | Path, what: str) -> np.ndarray:
    """The memory-mapped (N, D) array of an .npy file of points, N ≥ 1 and D ≥ 1 (nothing read yet)."""
    try:
        array = read_npy(path, f"{what} file")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if array.ndim != 2:
        raise UserError(f"{what} file {path} must be 2-D (N, D), got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise UserError(f"{what} file {path} is empty: shape {array.shape} (need N >= 1 points, D >= 1)")
    return array


def load_points(path: str | Path, what: str = "data") -> NDArray[np.float64]:
    """Load data of shape (N, D), one point per row, N ≥ 1 and D ≥ 1, checked by :func:`checked_array`
    (and refused before it is read when its float64 copy would not fit in memory)."""
    array = _points_file(path, what)
    try:
        check_memory(array.size * 8, f"{what} file {path} as float64")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return checked_array(array, f"{what} file {path}")


def scan_points_file(path: str | Path, what: str = "data") -> None:
    """Check an .npy file of (N, D) points as :func:`load_points` does, without holding it in memory (the
    file is read once, :data:`SCAN_BYTES` at a time); a folder (an activation store) is left to its reader,
    which validates its manifest and shards."""
    if Path(path).is_dir():
        return
    array = _points_file(path, what)
    step = max(1, SCAN_BYTES // (8 * array.shape[1]))
    for start in range(0, array.shape[0], step):
        stop = min(start + step, array.shape[0])
        checked_array(array[start:stop], f"{what} file {path} (rows {start}..{stop - 1})")


def output_dir(path: str | os.PathLike[str], flag: str = "--out") -> Path:
    """``path`` if it is a writable folder or can be created as one (nothing is created here)."""
    try:
        check_output_dir(path, flag)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return Path(path)


def output_file(path: str | os.PathLike[str], flag: str, suffixes: Iterable[str]) -> Path:
    """``path`` if it names a file of one of ``suffixes`` that can be written (its folder is created
    by the writer)."""
    path = Path(path)
    suffixes = tuple(suffixes)
    if path.suffix.lower() not in suffixes:
        raise UserError(f"{flag} {path} must end in one of {', '.join(suffixes)}")
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory")
    output_dir(path.parent, f"{flag} folder")
    return path


def _non_finite(value: Any, where: str) -> Iterable[str]:
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        yield f"{where} = {value}"
    elif isinstance(value, np.ndarray) and value.dtype.kind in "fc" and not np.isfinite(value).all():
        yield f"{where} ({int((~np.isfinite(value)).sum())} non-finite entries)"
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _non_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _non_finite(v, f"{where}[{i}]")


def finite_result(result: Any, what: str, *, allow: Iterable[str] = ()) -> Any:
    """``result`` if it holds no NaN or ±inf, except at the paths ``allow`` (e.g. ``metrics.rel_recon_bias``,
    documented as +inf in some cases); else RuntimeError (exit code 1: the inputs were valid, so the
    computation failed) naming the first offending entries."""
    allowed = set(allow)
    bad = [entry for entry in _non_finite(result, "") if entry.split(" ")[0] not in allowed]
    if bad:
        raise NonFiniteResultError(f"{what} produced non-finite values ({'; '.join(bad[:3])}"
                                   f"{f'; and {len(bad) - 3} more' if len(bad) > 3 else ''}): a numerical failure "
                                   "on valid input; nothing was printed")
    return result
