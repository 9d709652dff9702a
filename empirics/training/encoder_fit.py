"""An SAE's encoder fitted to a given decoder, the decoder frozen (docs/theory.md §7.1).

After polishing (:func:`dictcheck.solvers.polish.polish_dictionary`) the decoder W_dec and b_dec are a
stationary point of objective (1), but the SAE's encoder was trained for the old decoder. :func:`fit_encoder`
trains only the architecture's encoder weights (:attr:`Architecture.encoder_weights`: W_enc and b_enc for the
linear SAEs) with the architecture's own loss and options (its k; its λ; a JumpReLU's thresholds stay as they
are, a BatchTopK's inference threshold is re-estimated as in training), everything else frozen: one run of
:func:`dictcheck.empirics.training.loop.train` (Adam, the schedule, clipping, seeded batches, checkpoints and
``resume``), with b_dec kept (centring rule ``"keep"``). The decoder rows stay unit norm (they already are;
the loop's renormalisation leaves them).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from dictcheck.empirics.architectures import architecture
from dictcheck.empirics.architectures.featurizer import Featurizer
from dictcheck.empirics.training.loop import TrainConfig, TrainResult, train

__all__ = ["fit_encoder", "freeze_all_but_encoder_"]


def freeze_all_but_encoder_(model: Featurizer) -> tuple[str, ...]:
    """Let only the architecture's encoder weights take gradients; return their names (ValueError when the
    architecture declares none: its encoder cannot be fitted to a frozen decoder)."""
    names = architecture(model.arch).encoder_weights
    if not names:
        raise ValueError(f"architecture {model.arch!r} declares no encoder weights to fit to a frozen decoder")
    params = dict(model.named_parameters())
    missing = sorted(set(names) - set(params))
    if missing:
        raise ValueError(f"architecture {model.arch!r}: the model has no parameters {missing}")
    for name, p in params.items():
        p.requires_grad_(name in names)
    return tuple(names)


def fit_encoder(model: Featurizer, X: Any, config: TrainConfig, out: str | os.PathLike[str] | None = None, *,
                resume: bool = False, progress: bool | None = None,
                on_step: Callable[[int], None] | None = None) -> TrainResult:
    """Train ``model``'s encoder on tokens ``X`` (rows) with everything else frozen (module docstring); ``out``
    holds the run's log and checkpoints (and ``resume`` continues it) as in :func:`train`."""
    freeze_all_but_encoder_(model)
    return train(model, X, dataclasses.replace(config, b_dec_init="keep"), out, resume=resume, progress=progress,
                 on_step=on_step)
