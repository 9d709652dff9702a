"""The ``dictcheck`` command line: ``run``, ``solve``, ``check-dict``, ``check-sae``, ``train``,
``inspect-bilinear``, ``bench-manifolds``, ``activations`` and ``eval-lm``.

Every command accepts ``--json`` where it prints results. Bad input exits with code 2 and one
line on stderr (``dictcheck: error: ...``); no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dictcheck.proofs_checks.errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are a single line on stderr with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"dictcheck: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> OneLineParser:
    """The top-level parser; each command module adds its own subparser."""
    from dictcheck.proofs_checks.cli import (
        activations,
        bench_manifolds,
        check_dict,
        check_sae,
        eval_lm,
        inspect_bilinear,
        run,
        solve,
        train,
    )

    parser = OneLineParser(prog="dictcheck", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for command in (run, solve, check_dict, check_sae, train, inspect_bilinear, activations, bench_manifolds, eval_lm):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except UserError as exc:
        sys.stderr.write(f"dictcheck: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("dictcheck: interrupted\n")
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
