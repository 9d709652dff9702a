"""The :class:`~dictcheck.solvers.reductions.Reduction` of the processes of a torch.distributed process group
(gloo: the reductions are of CPU arrays): element-wise sums, maxima and minima by ``all_reduce`` (every rank
receives the result; gloo combines the ranks' partial sums in an order of its own, fixed for a given number of
ranks), and gathers of picklable objects in rank order."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from numpy.typing import NDArray

__all__ = ["RankReduction"]


class RankReduction:
    """The reductions over the initialised default process group."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def _all_reduce(self, a: NDArray, op: Any) -> NDArray:
        arr = np.asarray(a)
        kind = arr.dtype
        work = arr.astype(np.int64) if kind == np.bool_ else np.ascontiguousarray(arr).copy()
        t = torch.from_numpy(work)
        dist.all_reduce(t, op=op)
        out = t.numpy()
        return out.astype(np.bool_) if kind == np.bool_ else out

    def sum(self, a: NDArray) -> NDArray:
        return self._all_reduce(a, dist.ReduceOp.SUM)

    def max(self, a: NDArray) -> NDArray:
        return self._all_reduce(a, dist.ReduceOp.MAX)

    def min(self, a: NDArray) -> NDArray:
        return self._all_reduce(a, dist.ReduceOp.MIN)

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out
