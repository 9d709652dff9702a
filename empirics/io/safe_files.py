"""Reading untrusted files and guarding output folders (every error is one line, a ValueError).

* :func:`read_npy`: a plain ``.npy`` array, told apart from ``.npz`` archives, pickles and other
  files before numpy parses it; never unpickles anything.
* :func:`read_json`: JSON with a size limit (checked before reading) and a nesting-depth limit
  (checked before parsing, so a hostile file cannot exhaust the recursion of the parser or of the
  code that walks the result).
* :func:`folder_lock`: an exclusive lock on an output folder for the time of a run, so a second
  writer is refused with one line instead of interleaving its files with the first's. The lock is
  an ``flock`` on ``.dictcheck.lock`` inside the folder: the kernel releases it when the holder
  dies, even by SIGKILL; a clean release removes the file.
* :func:`check_output_dir`, :func:`check_free_space`, :func:`check_memory`: probes run before work
  starts: an output folder that exists as a file, lies under a file or on a read-only file system;
  too little free disk for what a run will write; more memory asked for than the machine has.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LOCK_FILE", "FolderInUseError", "ResourceError", "available_memory", "check_free_space", "check_memory",
           "check_output_dir", "folder_lock", "format_bytes", "read_json", "read_npy", "read_torch"]

#: Name of the lock file :func:`folder_lock` keeps inside a locked output folder.
LOCK_FILE = ".dictcheck.lock"
#: Defaults of :func:`read_json`: a config or metrics file is a few kB and nested a few levels.
JSON_MAX_BYTES = 1 << 20
JSON_MAX_DEPTH = 64
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTOCOL = b"\x80"
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


class FolderInUseError(ValueError):
    """Another process holds the output folder's lock."""


class ResourceError(ValueError):
    """A request needs more memory or disk than the machine has (raised before allocating or writing)."""


def format_bytes(n: float) -> str:
    """``n`` bytes as a short human-readable size (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _existing_file(path: Path, what: str) -> int:
    """The size of ``path``, a regular file (ValueError naming ``what`` otherwise)."""
    if not path.exists():
        raise ValueError(f"{what} {path} does not exist")
    if not path.is_file():
        raise ValueError(f"{what} {path} is not a file")
    return path.stat().st_size


def read_npy(path: str | os.PathLike[str], what: str, *, real: bool = True) -> np.ndarray:
    """The array in the ``.npy`` file ``path``, memory-mapped read-only (so its size can be checked
    before it is read); ValueError (one line, naming ``what`` and the file) otherwise.

    Refused before numpy parses the file: ``.npz`` archives (whatever the name), pickles, anything
    without the ``.npy`` magic. numpy then maps it with ``allow_pickle=False`` (object arrays are
    refused as pickles; a file shorter than its header says is refused). ``real`` also refuses
    dtypes that are not real numbers (bool, integer or float): complex, strings, datetimes and
    timedeltas.
    """
    path = Path(path)
    size = _existing_file(path, what)
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise ValueError(f"{what} {path} is unreadable ({exc.strerror or exc})") from None
    if head.startswith(_ZIP_MAGIC):
        raise ValueError(f"{what} {path} is an .npz archive; save one array with numpy.save (.npy)")
    if head.startswith(_PICKLE_PROTOCOL):
        raise ValueError(f"{what} {path} is a pickle, not an .npy array (pickles are never loaded)")
    if head != _NPY_MAGIC:
        raise ValueError(f"{what} {path} is not an .npy file (no NumPy header)")
    shape, dtype = _header(path, what)
    if dtype.hasobject:
        raise ValueError(f"{what} {path} holds Python objects (a pickled array), not numbers")
    if any(n < 0 for n in shape):
        raise ValueError(f"{what} {path} declares the shape {shape}, with a negative dimension")
    if math.prod(shape) * dtype.itemsize > size:
        raise ValueError(f"{what} {path} declares the shape {shape} of {dtype}, more than its {format_bytes(size)} hold")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{what} {path} is not a readable .npy array ({_first_line(exc)})") from None
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{what} {path} is not a single .npy array")
    if real and array.dtype.kind not in "biuf":
        raise ValueError(f"{what} {path} must hold real numbers, got dtype {array.dtype}")
    return array


def _header(path: Path, what: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an .npy header (format version 1.0 or 2.0, what ``numpy.save`` writes for numbers)
    declares; ValueError for another version or an unreadable header."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            reader = readers.get(version)
            header = None if reader is None else reader(fh)
    except (OSError, EOFError, ValueError) as exc:
        raise ValueError(f"{what} {path} has an unreadable .npy header ({_first_line(exc)})") from None
    if header is None:
        raise ValueError(f"{what} {path} has an unknown .npy format version {version[0]}.{version[1]} "
                         "(1.0 and 2.0 are read)")
    return tuple(int(n) for n in header[0]), header[2]


def read_torch(path: str | os.PathLike[str], what: str) -> Any:
    """The object the torch file ``path`` holds, read with ``weights_only=True``: tensors and plain containers
    only, pickled code refused and never run. ValueError (one line, naming ``what``) for a missing or
    non-regular file and for anything torch cannot read that way, without torch's warnings or its advice to
    load the file unsafely."""
    import pickle
    import warnings

    import torch

    path = Path(path)
    _existing_file(path, what)
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the file is judged below
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{what} {path} holds pickled objects that safe loading refuses (nothing in it was run)") \
            from None
    except Exception as exc:  # noqa: BLE001 — truncated, foreign or hostile files all end here
        raise ValueError(f"{what} {path} is unreadable ({_first_line(exc)[:160]})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text (brackets inside strings do not count)."""
    code = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    step = np.isin(code, (ord("["), ord("{"))).astype(np.int64) - np.isin(code, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def read_json(path: str | os.PathLike[str], what: str = "JSON file", *, max_bytes: int = JSON_MAX_BYTES,
              max_depth: int = JSON_MAX_DEPTH) -> Any:
    """The JSON value in ``path``; ValueError (one line) for a missing or unreadable file, one larger
    than ``max_bytes`` (checked before reading) or nested deeper than ``max_depth``."""
    path = Path(path)
    size = _existing_file(path, what)
    if size > max_bytes:
        raise ValueError(f"{what} {path} is {format_bytes(size)}, more than the {format_bytes(max_bytes)} allowed")
    try:
        data = path.read_bytes()[: max_bytes + 1]
    except OSError as exc:
        raise ValueError(f"{what} {path} is unreadable ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} is larger than the {format_bytes(max_bytes)} allowed")
    depth = json_depth(data)
    if depth > max_depth:
        raise ValueError(f"{what} {path} is nested {depth} levels deep, more than the {max_depth} allowed")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} {path}: unreadable JSON ({exc})") from None


# ---------------------------------------------------------------------------------------- output folders
def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a symlink counts as existing)."""
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def check_output_dir(path: str | os.PathLike[str], what: str = "output folder") -> None:
    """ValueError (one line) unless ``path`` is a writable folder or can be created as one: not when it
    exists and is not a folder, lies under a file, or would be on a read-only or unwritable file
    system; :class:`FolderInUseError` when another process holds its :func:`folder_lock` now (a probe
    so that a command refuses before its work; the command takes the lock itself when it starts
    writing). Creates nothing."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ValueError(f"{what} {path} exists and is not a directory")
    _check_not_locked(path)
    anchor = _nearest_existing(path)
    if not anchor.is_dir():
        raise ValueError(f"{what} {path} lies under {anchor}, which is not a directory")
    if os.statvfs(anchor).f_flag & os.ST_RDONLY:
        raise ValueError(f"{what} {path} is on a read-only file system ({anchor})")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path} is not writable ({anchor}: permission denied)")


def _holder(fd: int) -> str:
    return os.read(fd, 512).decode("utf-8", "replace").strip() or "another process"


def _in_use(folder: Path, holder: str) -> FolderInUseError:
    return FolderInUseError(f"{folder} is in use by {holder}; wait for it to finish or choose another output folder")


def _check_not_locked(folder: Path) -> None:
    """:class:`FolderInUseError` when another process holds ``folder``'s lock (nothing is created)."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:  # no lock file (or none readable): nobody holds the folder
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(folder, _holder(fd)) from None
    finally:
        os.close(fd)


def check_free_space(path: str | os.PathLike[str], need_bytes: int, what: str) -> None:
    """:class:`ResourceError` when the file system of ``path`` (or of its nearest existing ancestor) has
    less than ``need_bytes`` free for ``what``."""
    free = shutil.disk_usage(_nearest_existing(Path(path))).free
    if need_bytes > free:
        raise ResourceError(f"{what} needs about {format_bytes(need_bytes)} of disk but the file system of {path} "
                            f"has {format_bytes(free)} free")


def _meminfo_available() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_available() -> int | None:
    """Memory left under this process's cgroup limit (v2, then v1), or None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        with contextlib.suppress(OSError, ValueError):
            limit = Path(limit_file).read_text().strip()
            if limit != "max" and int(limit) < 1 << 60:
                return max(0, int(limit) - int(Path(usage_file).read_text().strip()))
    return None


def available_memory() -> int:
    """Bytes of memory this process can still allocate: MemAvailable, capped by a cgroup limit."""
    found = [v for v in (_meminfo_available(), _cgroup_available()) if v is not None]
    if not found:
        found = [os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    return min(found)


def check_memory(need_bytes: int, what: str) -> None:
    """:class:`ResourceError` when ``what`` needs more than the memory available now."""
    have = available_memory()
    if need_bytes > have:
        raise ResourceError(f"{what} needs about {format_bytes(need_bytes)} of memory, more than the "
                            f"{format_bytes(have)} available")


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], what: str) -> Iterator[Path]:
    """Hold an exclusive lock on ``folder`` (created with its parents) for the block.

    :class:`FolderInUseError` (one line, naming the holder) when another process holds it. ``what``
    (e.g. ``"dictcheck run"``) is recorded for the message a second writer sees. Folders this call
    created and that are empty when the block ends (a run that failed before writing anything) are
    removed again.
    """
    folder = Path(folder)
    anchor = _nearest_existing(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _in_use(folder, holder) from None
        try:  # a holder that released the lock may have removed the file: then lock the new one
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)
    with contextlib.suppress(OSError):  # who holds it, for the message (best effort on a full disk)
        os.ftruncate(fd, 0)
        os.write(fd, f"{what} (pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})".encode())
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
        created = Path(os.path.abspath(folder))
        while created != anchor and anchor in created.parents:
            try:
                created.rmdir()  # only succeeds when empty
            except OSError:
                break
            created = created.parent
