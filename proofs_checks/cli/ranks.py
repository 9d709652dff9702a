"""Several processes for one command: ``--nproc P`` starts P ranks of the same command through PyTorch's elastic
launcher (what ``torchrun --standalone --nproc-per-node P`` runs), and a failed rank ends the job with one line.

Used by ``dictcheck train`` (data-parallel training) and ``dictcheck check-sae`` (tokens split over ranks).
The workers run the command with the same options minus ``--nproc``; each records its one-line error in
torchrun's error file (``TORCHELASTIC_ERROR_FILE``) and leaves reporting to the launcher, which names the rank
that explains the failure (:func:`root_failure`). Workers default to OMP_NUM_THREADS = cores // P.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["LAUNCHED_ENV", "USER_ERROR_EXIT", "launch_ranks", "worker_argv", "root_failure", "record_worker_crash",
           "report_worker_error", "user_error_line", "failed_rank_line"]

#: Set by ``--nproc`` for its workers: they leave reporting errors to the launcher.
LAUNCHED_ENV = "DICTCHECK_LAUNCHED"
#: Namespace entries that are not options of the workers' command line.
_NOT_FORWARDED = frozenset({"command", "handler", "nproc"})
#: Worker exit code of a reported user error (the CLI's code for bad input).
USER_ERROR_EXIT = 2


def _record_worker_error(message: str, trace: str | None = None) -> None:
    """Write a worker's failure to torchrun's error file (``ProcessFailure`` reads ``message`` and
    ``timestamp``; ``traceback`` is ours)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        Path(error_file).write_text(json.dumps({"message": message, "timestamp": int(time.time()), "traceback": trace}))


def report_worker_error(world_size: int, rank: int, message: str) -> int:
    """A worker's user error: into torchrun's error file, and on stderr unless ``--nproc`` launched it."""
    _record_worker_error(message)
    if os.environ.get(LAUNCHED_ENV) != "1":
        sys.stderr.write(f"dictcheck: error: [rank {rank}/{world_size}] {message}\n")
    return USER_ERROR_EXIT


def record_worker_crash(exc: Exception) -> int:
    """A worker's crash (or a lost peer): recorded with its traceback for the launcher, which reports it in one
    line; re-raised when no ``--nproc`` launcher is there to report it."""
    if os.environ.get(LAUNCHED_ENV) != "1":
        raise exc
    first = (str(exc).splitlines() or [""])[0]
    _record_worker_error(f"{type(exc).__name__}: {first}", traceback.format_exc())
    return 1


def worker_argv(args: argparse.Namespace, positionals: tuple[str, ...] = ()) -> list[str]:
    """The workers' arguments: the ``positionals`` (destinations) first, then every given option but ``--nproc``
    (each option's flag is ``--`` + its destination with ``_`` → ``-``)."""
    argv: list[str] = [str(getattr(args, dest)) for dest in positionals]
    for dest, value in vars(args).items():
        if dest in _NOT_FORWARDED or dest in positionals or value is None or value is False:
            continue
        flag = "--" + dest.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


@contextlib.contextmanager
def _quiet_launcher_logs() -> Iterator[None]:
    """Silence the elastic agent's log records (the launcher reports a failure in one line itself)."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.distributed.launcher")]
    saved = [(lg.propagate, list(lg.handlers)) for lg in loggers]
    for lg in loggers:
        lg.propagate = False
        lg.handlers = [logging.NullHandler()]
    try:
        yield
    finally:
        for lg, (propagate, handlers) in zip(loggers, saved):
            lg.propagate, lg.handlers = propagate, handlers


def _recorded(failure: Any, key: str) -> str | None:
    """A string field of what the failed worker wrote to its error file (None when absent)."""
    data = getattr(failure, "error_file_data", None)
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def root_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """The failure that explains the others: a user error, else a rank killed by a signal other than
    SIGTERM, else a crash, else a rank the launcher terminated (SIGTERM); the earliest within a kind.
    (When one rank dies its peers fail too, e.g. "connection reset" in a collective, or are terminated.)"""
    def rank_key(item: tuple[int, Any]) -> tuple[int, float, int]:
        rank, f = item
        if f.exitcode == USER_ERROR_EXIT and _recorded(f, "message"):
            kind = 0
        elif f.exitcode < 0:
            kind = 3 if -f.exitcode == signal.SIGTERM else 1
        else:
            kind = 2
        return kind, f.timestamp, rank

    return min(failures.items(), key=rank_key)


def user_error_line(rank: int, failure: Any) -> tuple[str, int] | None:
    """(the recorded one-line user error, its exit code) of a rank that reported one, else None."""
    message = _recorded(failure, "message")
    if failure.exitcode == USER_ERROR_EXIT and message is not None:
        return (f"rank {rank}: {message}" if rank else message), USER_ERROR_EXIT
    return None


def failed_rank_line(rank: int, failure: Any, trace_dir: Path | None) -> str:
    """What happened to a rank that did not report a user error: the signal that killed it, or its exit code and
    recorded error, with the traceback saved as ``trace_dir/rank<r>_traceback.txt`` (when a folder is given)."""
    if failure.exitcode < 0:
        return f"rank {rank} was killed by {failure.signal_name()}"
    what = f"rank {rank} exited with code {failure.exitcode}"
    trace = _recorded(failure, "traceback")
    if trace is not None:
        if trace_dir is None:
            return what + f" ({_recorded(failure, 'message')})"
        saved = trace_dir / f"rank{rank}_traceback.txt"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(trace)
        what += f" ({_recorded(failure, 'message')}; traceback in {saved})"
    return what


def launch_ranks(command: str, args: argparse.Namespace, failure_line: Callable[[int, Any], tuple[str, int]],
                 positionals: tuple[str, ...] = ()) -> int:
    """Run ``dictcheck COMMAND`` (minus ``--nproc``) in ``args.nproc`` ranks under torch's elastic launcher; on a
    failure print ``failure_line(rank, failure)`` of the root failure on one line and return its code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nproc = int(args.nproc)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"dictcheck-{uuid.uuid4()}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    os.environ[LAUNCHED_ENV] = "1"
    try:
        with _quiet_launcher_logs():
            elastic_launch(config, sys.executable)("-m", "dictcheck.proofs_checks.cli", command,
                                                   *worker_argv(args, positionals))
    except ChildFailedError as exc:
        message, code = failure_line(*root_failure(exc.failures))
        sys.stderr.write(f"dictcheck: error: {message}\n")
        return code
    finally:
        del os.environ[LAUNCHED_ENV]
    return 0
