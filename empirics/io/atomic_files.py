"""Crash-safe file writes: a fsynced temporary file next to the target, then ``os.replace``.

A reader sees either the old file or the complete new one, never a partial write. The files get
the permissions of a plain ``open()`` (0666 less the umask; the temporary file starts as 0600), so
a group that shares the output folder can read them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    """The process umask (read from /proc where possible: setting it to read it is not thread-safe)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def staged_file(path: Path, data: bytes) -> Path:
    """Write ``data`` to a fsynced temporary file next to ``path`` and return the temporary path.

    The caller moves it into place with :func:`os.replace` (several files can be staged first and
    replaced together). On error the temporary file is removed; an OSError (a full disk) names ``path``.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~_umask())
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:  # ENOSPC: name the file
            raise OSError(exc.errno, exc.strerror, str(path)) from None
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
