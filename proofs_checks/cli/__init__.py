"""The ``dictcheck`` command line: ``run``, ``solve``, ``check-dict``, ``check-sae``, ``polish``, ``train``,
``inspect-bilinear``, ``activations``, ``bench-manifolds`` and ``eval-lm``.

Every command accepts ``--json`` where it prints results. Every failure ends in exactly one line on
stderr and no traceback: ``dictcheck: error: ...`` naming the input and the cause, exit code 2, for
bad input (validated by :mod:`dictcheck.proofs_checks.cli.inputs` before any work starts), an output
folder in use by another run, not enough memory or disk, or a file that cannot be written;
``dictcheck: internal error: ...``, exit code 1, for anything else (a failure of dictcheck itself,
including a computation that returned NaN or inf on valid input). ``--debug`` (before or after the
command) or the environment variable ``DICTCHECK_DEBUG=1`` also prints the traceback.

Only the module of the command being run is imported (``dictcheck --help`` imports them all), so a
rejected input costs no more than that command's imports. Nothing here loads torch, so ``main`` can
shorten OpenMP's idle spin before a command does (:mod:`~dictcheck.empirics.kernels.openmp_spin`; a variable
the user set is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dictcheck.empirics.kernels.openmp_spin import shorten_openmp_spin
from dictcheck.empirics.io.safe_files import FolderInUseError, ResourceError
from dictcheck.proofs_checks.cli.inputs import NonFiniteResultError
from dictcheck.proofs_checks.errors import UserError

#: The commands, in help order; each is the module ``dictcheck.proofs_checks.cli.<name with _>``.
COMMANDS = ("run", "solve", "check-dict", "check-sae", "polish", "train", "inspect-bilinear", "activations",
            "bench-manifolds", "eval-lm")
DEBUG_ENV = "DICTCHECK_DEBUG"
#: OSError numbers that are the environment's doing (a full or read-only disk, permissions): exit code 2.
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                                 errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EFBIG})
_DEBUG_HELP = f"print the traceback of a failure (also: {DEBUG_ENV}=1)"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are a single line on stderr with exit code 2, and whose arguments may depend
    on the command line: :meth:`before_parsing` hooks add them (e.g. options that need a heavy import) when the
    arguments are known."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._before_parsing: list[Callable[[argparse.ArgumentParser, Sequence[str]], None]] = []

    def before_parsing(self, hook: Callable[[argparse.ArgumentParser, Sequence[str]], None]) -> None:
        """Call ``hook(parser, args)`` once, with the arguments this parser is about to parse (also for ``--help``)."""
        self._before_parsing.append(hook)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        hooks, self._before_parsing = self._before_parsing, []
        for hook in hooks:
            hook(self, args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"dictcheck: error: {_one_line(message)}\n")
        raise SystemExit(2)


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The command named in ``argv`` (its first argument that is not an option), if it is one."""
    for arg in argv or ():
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> OneLineParser:
    """The top-level parser; each command module adds its own subparser. With ``argv`` only the named
    command's module is imported (the others get an empty placeholder subparser)."""
    chosen = _command_of(argv)
    parser = OneLineParser(prog="dictcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        if chosen is not None and name != chosen:
            commands.add_parser(name)
            continue
        importlib.import_module(f"dictcheck.proofs_checks.cli.{name.replace('-', '_')}").add_parser(commands)
        commands.choices[name].add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                            help=_DEBUG_HELP)
    return parser


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _failure(exc: BaseException) -> tuple[int, str]:
    """(exit code, message) for an exception that reached the command line."""
    if isinstance(exc, (UserError, FolderInUseError, ResourceError)):
        return 2, f"error: {exc}"
    if isinstance(exc, NonFiniteResultError):
        return 1, f"internal error: {exc}"
    torch = sys.modules.get("torch")
    if isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError)):
        return 2, f"error: not enough memory: {_first_line(exc)}"
    if isinstance(exc, OSError) and exc.errno in _ENVIRONMENT_ERRNOS:
        where = f" ({exc.filename})" if exc.filename else ""
        hint = "; the files written before are complete (every write is atomic)" if exc.errno in (
            errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
        return 2, f"error: {exc.strerror or _first_line(exc)}{where}{hint}"
    return 1, (f"internal error: {type(exc).__name__}: {_first_line(exc)} "
               f"(rerun with --debug or {DEBUG_ENV}=1 for the traceback)")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it unwinds as Ctrl-C does (locks released, temporary
    files removed, checkpoints already written kept): one line and exit code 143 (128 + 15)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM handled like SIGINT while a command runs, in the main thread of a process that is not a
    torchrun worker (the launcher stops its workers with SIGTERM and reads their exit signal); the previous
    handler is restored afterwards."""
    if threading.current_thread() is not threading.main_thread() or "TORCHELASTIC_RUN_ID" in os.environ:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code. Before any command loads torch,
    OpenMP's idle spin is shortened (:mod:`~dictcheck.empirics.kernels.openmp_spin`). SIGINT and SIGTERM end a
    command with one line (exit codes 130 and 143)."""
    shorten_openmp_spin()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        args = build_parser(argv).parse_args(argv)
        debug = debug or bool(getattr(args, "debug", False))
        with _sigterm_as_interrupt():
            return int(args.handler(args))
    except Terminated:
        sys.stderr.write("dictcheck: terminated (SIGTERM)\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write("dictcheck: interrupted\n")
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 — also a Rust panic from a solver (a BaseException)
        code, message = _failure(exc)
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"dictcheck: {_one_line(message)}\n")
        return code
