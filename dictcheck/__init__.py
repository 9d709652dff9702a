"""dictcheck: a theory-first verification suite for sparse dictionary learning.

Python entry points (data as (N, D) ROWS, like the CLI; details in :mod:`dictcheck.proofs_checks.api`)::

    import dictcheck
    dictcheck.huber_median(X, lam)             # the wide-limit optimum's bias and objective
    dictcheck.wide_limit(X, lam)               # closed-form optimum, narrowest dictionary, certificate
    dictcheck.dnn(X, lam)                      # the convex (DNN) relaxation, solved with cvxpy
    dictcheck.geometric_median(X)
    dictcheck.exact_codes(W, X, lam)           # W (D, d_z), one atom per column
    dictcheck.check_dictionary(W, X, lam)      # local optimality conditions of a dictionary
    dictcheck.check_sae("sae_dir", X, lam)     # a trained SAE folder (SAELens layout)
    dictcheck.polish("sae_dir", X, "polished") # the SAE at the nearest stationary point, as a folder
    model, cfg = dictcheck.load_sae("sae_dir")
    result = dictcheck.train(X, "topk", 256, {"k": 16}, steps=2000)
    dictcheck.run_checks(quick=True)           # the verification suite

The four layers install as :mod:`dictcheck.theory`, :mod:`dictcheck.solvers`, :mod:`dictcheck.empirics` and
:mod:`dictcheck.proofs_checks`. Names load on first use, so ``import dictcheck`` (and the ``dictcheck``
command) stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["geometric_median", "huber_median", "wide_limit", "dnn", "exact_codes", "check_dictionary",
           "check_sae", "polish", "load_sae", "train", "run_checks", "build_model", "TrainConfig", "architectures"]

_HOME = {
    **{name: "dictcheck.proofs_checks.api" for name in ("geometric_median", "huber_median", "wide_limit", "dnn",
                                                          "exact_codes", "check_dictionary", "check_sae",
                                                          "polish", "load_sae", "train", "run_checks")},
    "build_model": "dictcheck.empirics.architectures",
    "TrainConfig": "dictcheck.empirics.training.loop",
}


def __getattr__(name: str) -> Any:
    if name == "architectures":
        return importlib.import_module("dictcheck.empirics.architectures").REGISTRY
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dictcheck' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
