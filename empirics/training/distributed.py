"""Data-parallel training over several processes (torchrun + DistributedDataParallel).

:func:`empirics.training.loop.train` runs unchanged in each of P processes started by ``torchrun`` (or
``dictcheck train --nproc P``); a :class:`World` tells it this process's rank and does the few
collectives the loop needs. Backend: gloo on the CPU, nccl on CUDA (one GPU per process,
``cuda:LOCAL_RANK``).

**Batch split (Decision).** ``batch_size`` B is the GLOBAL batch: each of the P ranks trains on
b = B/P rows per step (B must be divisible by P). Every rank draws the same B global row indices
from the seeded batch generator, exactly as one process does, and rank r reads only rows
r·b … (r+1)·b − 1 of that draw (:meth:`World.shard`), gathering them from the (memory-mapped)
activation store. So the shuffling is deterministic under the seed and independent of P, and the
P ranks together see exactly the rows one process sees.

**Equivalence.** For a loss that is a mean over tokens, L = (1/B)Σ_t ℓ_t, DDP's average of the
per-rank gradients is (1/P)Σ_r ∇(1/b)Σ_{t∈r} ℓ_t = ∇L. The gradient projection, clipping at the
norm of that averaged gradient, the Adam step and the parameter projection then run identically on
every rank. Hence P ranks with ``batch_size`` B compute the same updates as one process with
``batch_size`` B (equivalently: two ranks train the same SAE as one process with the doubled
per-rank batch), equal up to the summation order of floating-point sums: each step's gradient to
~1e-15 of its largest entry at the same weights. The trajectories need not stay that close: Adam
divides each gradient component by √v̂ + eps, so a component whose exact gradient vanishes (e.g.
data symmetric about b_dec) turns rounding noise into steps of up to lr·noise/eps and the two runs
drift apart, as far as one process does from itself with each batch merely reversed (measured:
~1e-6 in W_enc after 11 steps of ``abs`` on a two-point toy). This holds for every architecture and
options whose :meth:`~dictcheck.empirics.architectures.base.Architecture.ddp_inexactness` is None (its
loss is a mean over tokens); for the others that method names what differs: their loss couples the tokens
of a batch (e.g. AuxK, batchtopk's batch-wide selection, the BSF's denoising scale), and each rank couples
only its own b tokens.

**Dead latents** use the global batch: the per-rank "fired" masks are OR-ed (all-reduce MAX) and
the counters advance by B. **Logged** loss, mse, sparsity_loss, aux_loss and l0 are the means of
the ranks' batch means (= global batch means for equal b). Only rank 0 writes the log,
checkpoints and the saved folder; a checkpoint holds every rank's torch RNG state and the world
size, and resuming with another world size is an error.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["World", "SINGLE", "current_world", "process_group", "env_world_size",
           "rank_seed"]


def env_world_size() -> int:
    """WORLD_SIZE as torchrun sets it (1 when absent); ValueError when it is not an integer >= 1."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"WORLD_SIZE must be an integer >= 1, got {raw!r}")
    return size


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` data-parallel ranks; collectives are no-ops for size 1.

    ``device`` is where collective tensors live (CPU for gloo, this rank's GPU for nccl).
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, idx: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous 1/size of the global batch indices ``idx`` (``idx`` itself for size 1)."""
        if self.size == 1:
            return idx
        n = idx.shape[0]
        if n % self.size:
            raise ValueError(f"batch_size {n} must be divisible by the number of ranks {self.size}")
        b = n // self.size
        return idx[self.rank * b:(self.rank + 1) * b]

    def any(self, mask: torch.Tensor) -> torch.Tensor:
        """Element-wise OR of a bool tensor over the ranks."""
        if self.size == 1:
            return mask
        flag = mask.to(device=self.device, dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.to(device=mask.device, dtype=torch.bool)

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Mean over the ranks of a float tensor (same shape; detached)."""
        if self.size == 1:
            return values.detach()
        out = values.detach().to(self.device, copy=True)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return (out / self.size).to(values.device)

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's copy of a same-shaped tensor, in rank order, on the CPU (all ranks receive all)."""
        if self.size == 1:
            return [tensor.detach().cpu().clone()]
        local = tensor.detach().to(self.device)
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local)
        return [p.cpu() for p in parts]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's picklable ``obj`` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the training loop calls: DDP around ``model`` for size > 1, else ``model``.

        DDP broadcasts rank 0's parameters and buffers at construction and rank 0's buffers
        before every forward pass (e.g. the batchtopk threshold), and averages gradients in
        ``backward``. Every parameter of every featurizer here receives a gradient each step, so
        DDP runs without ``find_unused_parameters``.
        """
        if self.size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=False)


SINGLE = World()


def current_world() -> World:
    """The :class:`World` of the initialised default process group, or :data:`SINGLE` without one."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return SINGLE
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    return World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=local_rank, device=device)


@contextlib.contextmanager
def process_group(cuda: bool) -> Iterator[World]:
    """Join the process group torchrun describes in the environment (WORLD_SIZE > 1), leave it after.

    Backend nccl when ``cuda`` (and this process uses GPU LOCAL_RANK), else gloo. Yields
    :data:`SINGLE` without touching torch.distributed when WORLD_SIZE is 1 or unset.
    """
    if env_world_size() == 1:
        yield SINGLE
        return
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    try:
        yield current_world()
    finally:
        gc.collect()  # a DDP module (reference cycles) must not outlive the group it reduces over
        dist.destroy_process_group()


def rank_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s global torch RNG (randomness inside ``forward``, e.g. BSF denoising
    noise): ``seed`` on rank 0, so one process is unchanged, and seed + rank·2^32 on the others, so
    no two ranks share a stream while seeds stay below 2^32."""
    return int(seed) + (int(rank) << 32)
