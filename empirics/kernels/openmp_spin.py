"""How long torch's OpenMP threads spin-wait, set before torch loads, for the CPU TopK step's compiled kernels.

torch's Linux CPU wheels run their parallel operators on GNU OpenMP (libgomp). After a parallel
region, each worker thread spin-waits for the next one for ``GOMP_SPINCOUNT`` iterations before it
sleeps: 300 000 by default (``OMP_WAIT_POLICY`` unset), each iteration a PAUSE instruction (about 140
cycles on recent Intel cores, i.e. about 14 ms per region). The sparse TopK step's compiled kernels
(:mod:`~dictcheck.empirics.kernels.sparse_products`, :mod:`~dictcheck.empirics.kernels.topk_select`) run on Python
threads (``run_split``) right after torch operators, so for those milliseconds a spinning OpenMP
worker shares a core with a kernel thread. With 10 000 iterations (well under a millisecond) the
sparse step took 0.899 (TopK) and 0.877 (BatchTopK) of its time on the issue 17 setup (two threads,
8 paired processes; benchmarks/RESULTS.md §4); the dense ReLU step and the exact codes did not
change. Waiting changes no number.

libgomp reads the variable once, when it loads (with torch), so :func:`shorten_openmp_spin` must run
before ``import torch``: the ``dictcheck`` command calls it first thing. A user's own setting of
``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is left alone. This module imports nothing that loads torch.
"""

from __future__ import annotations

import os
import sys

__all__ = ["SPIN_COUNT", "SPIN_ENV", "shorten_openmp_spin"]

SPIN_ENV = "GOMP_SPINCOUNT"
#: Spin iterations of an idle libgomp thread (module docstring; measured against 0, 1 000, 30 000,
#: 100 000 and the default, benchmarks/RESULTS.md §4).
SPIN_COUNT = "10000"


def shorten_openmp_spin() -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` unless it or ``OMP_WAIT_POLICY`` is set already,
    or torch (and with it libgomp) is loaded; returns whether it was set."""
    if SPIN_ENV in os.environ or "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ[SPIN_ENV] = SPIN_COUNT
    return True
