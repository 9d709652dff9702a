"""The homogeneity of objective (1) and the canonical scale the solvers compute at (docs/theory.md §1.1).

Scaling the data, the bias and λ by s > 0 maps the codes to sZ and leaves the atoms alone, so

    O(W, sZ, sb; sX, sλ) = s² O(W, Z, b; X, λ),

and every quantity has a degree k: it scales as s^k. Values of (1), gains and gaps have k = 2; codes,
biases, residuals, λ and τ_act k = 1; every violation measured in units of λ (KKT-z, S1, (4), (5)),
the certificate ratio, cosines and firing fractions k = 0.

Decision (docs/theory.md §1.1): a solver whose steps hold an absolute constant, a tolerance or a float32
stage divides its inputs of degree 1 by :func:`canonical_scale` σ, solves, and multiplies each result by
σ^k. σ is a power of two, so both divisions are exact in binary floating point (no rounding, as long as
nothing leaves the normal range): at s = 2^j every result is bit for bit s^k times the result at s = 1,
and at any other s it differs only by what rounding the input sX itself did.
"""

from __future__ import annotations

import math

__all__ = ["MAX_ENTRY", "LAMBDA_RANGE", "canonical_scale"]

#: Largest magnitude accepted for an entry of data, a dictionary, a bias or an SAE's weights.
MAX_ENTRY = 1e50
#: The accepted range of λ (inclusive), from the CLI, the API or an SAE folder. With |x| ≤ 1e50 and λ in
#: this range, any product or quotient of two or three of them, squared norms summed over any number of
#: points, and λ² stay far inside float64 (max 1.8e308, smallest normal 2.2e-308).
LAMBDA_RANGE = (1e-50, 1e50)


def canonical_scale(value: float) -> float:
    """The power of two σ nearest to |value| in the log (σ/√2 < |value| ≤ √2·σ): a problem of scale |value|
    divided by σ has scale within a factor √2 of 1. ValueError unless value is finite and non-zero."""
    v = abs(float(value))
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"a scale must be finite and non-zero, got {value!r}")
    mantissa, exponent = math.frexp(v)  # v = mantissa · 2^exponent, mantissa in [1/2, 1)
    return math.ldexp(1.0, exponent - 1 if mantissa <= math.sqrt(0.5) else exponent)
