"""The torch device a command computes on, from its ``--device`` value (one rule for every command).

Accepted: ``auto`` (CUDA when this torch build sees a GPU, else the CPU), ``cpu``, ``cuda`` and ``cuda:N`` for a
device that exists. Anything else (``meta``, ``mps``, an empty string, a typo, a CUDA device on a machine without
one) is a ValueError with one line saying what is accepted and, for CUDA, what this machine has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads when a device is resolved: the CLI's parsers import this module for its names
    import torch

__all__ = ["DEVICE_CHOICES", "resolve_device"]

#: How the accepted values are named in messages and help texts.
DEVICE_CHOICES = "'auto', 'cpu', 'cuda' or 'cuda:N'"


def resolve_device(value: Any, what: str = "device") -> torch.device:
    """The torch device ``value`` names (module docstring); ValueError naming ``what`` otherwise."""
    import torch

    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be {DEVICE_CHOICES}, got {value!r}")
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{what} must be {DEVICE_CHOICES}, got {value!r}") from None
    if device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index not in (None, 0)):
        raise ValueError(f"{what} must be {DEVICE_CHOICES}, got {value!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{what} {value!r} asked for, but no CUDA device is available (this torch build "
                             f"{'has no CUDA' if torch.version.cuda is None else 'sees no GPU'}); use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{what} {value!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist")
    return device
