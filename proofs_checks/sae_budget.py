"""The memory ``dictcheck check-sae`` needs, estimated from the shapes before any work is done.

The largest objects of a check (module docstring of :mod:`dictcheck.proofs_checks.sae_report`), in bytes, for
d_sae latents, D inputs, N tokens, weights of ``w`` bytes per entry, a token batch B, an encoder batch B_e:

* the SAE's two weight matrices, 2·w·d_sae·D (memory-mapped files count when they are read), and the atoms'
  screening copy (2·d_sae·D in bfloat16 where the processor multiplies it fast, 4·d_sae·D in float32 for
  weights stored in another dtype, none for float32 weights screened as stored);
* the tokens in float64, 8·N·D, and the wide limit's working copies of them (two more);
* the codes, exact and the encoder's, 24 bytes per non-zero each (at most N·min(D, d_sae) non-zeros; the
  estimate takes N·L0 with L0 = the SAE's k when it has one, else min(D, d_sae, 256));
* one float64 row of sums per live latent, 8·min(d_sae, N·L0)·D;
* the encoder pass's dense (B_e, d_sae) arrays (≈ 32·B_e·d_sae), a batch's solver state (2 × 64 MiB) and
  screened products (≈ 3 × 256 MiB, or 3·(B·L)·2 with ``--latent-block`` L);
* the Gram cache of a small dictionary (12·d_sae² when that is at most 256 MiB);
* 1 GiB for the interpreter, torch and numba.

:func:`refuse_if_too_large` compares the total with the memory available and, when it cannot fit, raises one
line naming the estimate, its largest parts and the ``--batch-size`` / ``--latent-block`` that would fit (or
that the tokens or weights alone do not).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dictcheck.solvers.atom_rows import BLOCK_BYTES, bf16_is_fast
from dictcheck.solvers.lasso_codes import GRAM_CACHE_BYTES

__all__ = ["MemoryEstimate", "estimate_memory", "available_memory", "refuse_if_too_large"]

_GIB = 1 << 30
_RUNTIME = 1 << 30
_SOLVER_STATE = 2 * (64 << 20)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part (module docstring) and their total."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def largest(self, k: int = 3) -> str:
        top = sorted(self.parts.items(), key=lambda kv: -kv[1])[:k]
        return ", ".join(f"{name} {value / _GIB:.1f}" for name, value in top)


def estimate_memory(d_sae: int, d_in: int, n_tokens: int, weight_bytes: int, stored_float32: bool, batch: int,
                    encoder_batch: int, k: int | None, latent_block: int | None, device: str = "cpu") -> MemoryEstimate:
    """The estimate of the module docstring for these shapes and settings."""
    import torch

    l0 = min(d_in, d_sae, k if k else 256)
    nnz = n_tokens * l0
    bf16 = bf16_is_fast(torch.device(device))
    screen = 2 * d_sae * d_in if bf16 else (0 if stored_float32 else 4 * d_sae * d_in)
    block = BLOCK_BYTES if latent_block is None else 2 * batch * latent_block
    gram = 12 * d_sae * d_sae
    return MemoryEstimate(parts={
        "weights": 2 * weight_bytes * d_sae * d_in + screen,
        "tokens": 3 * 8 * n_tokens * d_in,
        "codes": 2 * 24 * nnz,
        "latent sums": 8 * min(d_sae, nnz) * d_in,
        "encoder batch": 32 * encoder_batch * d_sae,
        "screened blocks": 3 * block + _SOLVER_STATE,
        "Gram cache": gram if gram <= GRAM_CACHE_BYTES else 0,
        "runtime": _RUNTIME,
    })


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def refuse_if_too_large(estimate: MemoryEstimate, available: int | None, *, d_sae: int, batch: int,
                        encoder_batch: int, latent_block: int | None) -> None:
    """ValueError (one line) when ``estimate`` exceeds ``available``: the estimate, its largest parts, and the
    smaller batch and latent block that would fit, or which part alone does not."""
    if available is None or estimate.total <= available:
        return
    fixed = estimate.total - estimate.parts["encoder batch"] - estimate.parts["screened blocks"]
    room = available - fixed - _SOLVER_STATE
    head = (f"check-sae needs about {estimate.total / _GIB:.1f} GiB ({estimate.largest()} GiB) but "
            f"{available / _GIB:.1f} GiB are available")
    if room <= 0:
        raise ValueError(f"{head}; the weights and tokens alone take {fixed / _GIB:.1f} GiB: check fewer tokens "
                         "(a smaller .npy or --data sample) or on a larger machine")
    enc_b = max(1, int(room // 2 // (32 * d_sae)))
    lat = max(256, int(room // 2 // 3 // (2 * max(batch, 1))))
    raise ValueError(f"{head}; try --batch-size {min(batch, max(1, enc_b))} --latent-block {lat}")
