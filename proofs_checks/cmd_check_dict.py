"""``dictcheck check-dict`` (placeholder wired in by the narrow-dictionary work)."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``dictcheck check-dict`` (not yet available)."""
