"""Crash-safe file writes: a fsynced temporary file next to the target, then ``os.replace``.

A reader sees either the old file or the complete new one, never a partial write.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def staged_file(path: Path, data: bytes) -> Path:
    """Write ``data`` to a fsynced temporary file next to ``path`` and return the temporary path.

    The caller moves it into place with :func:`os.replace` (several files can be staged first and
    replaced together). On error the temporary file is removed.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that a rename inside it survives a crash (no-op where unsupported)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically."""
    tmp = staged_file(path, data)
    try:
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            with contextlib.suppress(OSError):
                tmp.unlink()
    fsync_dir(path.parent)
