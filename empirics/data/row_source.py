"""Data read one batch of rows at a time: an (N, D) ``.npy`` file (memory-mapped), an activation store
folder (:mod:`dictcheck.empirics.data.activation_store`) or an array in memory. Tokens are ROWS."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dictcheck.empirics.io.safe_files import read_npy

__all__ = ["RowSource", "open_rows"]


@dataclass(frozen=True)
class RowSource:
    """``n_rows`` × ``dim`` tokens from ``data`` (an array or memmap, or an activation store); ``name`` says
    where they come from."""

    data: Any
    n_rows: int
    dim: int
    name: str
    offset: int = 0

    def rows(self, start: int, stop: int) -> NDArray[np.float64]:
        """Rows start … stop − 1 as a fresh, writable float64 array (ValueError when any is NaN or inf)."""
        lo, hi = self.offset + start, self.offset + stop
        if isinstance(self.data, np.ndarray):
            block = np.array(self.data[lo:hi], dtype=np.float64)
        else:
            block = np.array(self.data[np.arange(lo, hi)], dtype=np.float64)
        if not np.isfinite(block).all():
            raise ValueError(f"{self.name}: rows {lo}…{hi - 1} contain NaN or inf")
        return block

    def batches(self, batch: int, limit: int | None = None) -> Iterator[tuple[int, NDArray[np.float64]]]:
        """(first row index, rows) over the first ``limit`` rows (all by default), ``batch`` rows at a time."""
        n = self.n_rows if limit is None else min(limit, self.n_rows)
        for start in range(0, n, batch):
            yield start, self.rows(start, min(start + batch, n))

    def sample(self, n: int) -> NDArray[np.float64]:
        """``n`` rows evenly spaced over the source (all of them when there are fewer), in order."""
        return self.rows_at(self.sample_indices(n))

    def sample_indices(self, n: int) -> NDArray[np.int64]:
        """The indices of :meth:`sample`'s rows."""
        if n >= self.n_rows:
            return np.arange(self.n_rows)
        return np.unique(np.linspace(0, self.n_rows - 1, n).round().astype(np.int64))

    def rows_at(self, idx: NDArray[np.int64]) -> NDArray[np.float64]:
        """The rows of the sorted indices ``idx`` as a fresh float64 array (ValueError for NaN or inf)."""
        block = np.array(self.data[np.asarray(idx, dtype=np.int64) + self.offset], dtype=np.float64)
        if not np.isfinite(block).all():
            raise ValueError(f"{self.name}: the sampled rows contain NaN or inf")
        return block

    def part(self, start: int, stop: int) -> RowSource:
        """Rows start … stop − 1 as a source of their own (indices from 0; e.g. one process's share)."""
        return RowSource(self.data, stop - start, self.dim, self.name, self.offset + start)


def open_rows(data: str | os.PathLike[str] | NDArray) -> RowSource:
    """A :class:`RowSource` for an (N, D) array, an ``.npy`` file (memory-mapped, nothing read yet) or an
    activation store folder. ValueError (one line) for anything else."""
    if isinstance(data, np.ndarray):
        if data.ndim != 2 or data.shape[0] < 1 or data.shape[1] < 1 or data.dtype.kind not in "biuf":
            raise ValueError(f"data must be a real (N, D) array with one token per row, got {data.dtype} {data.shape}")
        return RowSource(data, int(data.shape[0]), int(data.shape[1]), "data")
    path = Path(data)
    if path.is_dir():
        from dictcheck.empirics.data.activation_store import open_activations  # loads the LM stack: only for stores

        store = open_activations(path)
        return RowSource(store, int(store.shape[0]), int(store.shape[1]), str(path))
    array = read_npy(path, "data file")  # a regular file holding a plain .npy array of real numbers
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"data file {path} must hold a real (N, D) array, one token per row, got "
                         f"{array.dtype} {array.shape}")
    return RowSource(array, int(array.shape[0]), int(array.shape[1]), str(path))
