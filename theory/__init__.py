"""Closed forms, identities and symbolic derivations (docs/theory.md).

Conventions (docs/README.md): vectors are columns, so a data matrix ``X`` has shape (D, N)
with one point per column, codes ``Z`` have shape (d_z, N), a dictionary ``W`` has shape
(D, d_z) with one atom per column and the bias ``b`` has shape (D,). Every objective value is
a mean over points (the 1/N of objective (1)) unless its name ends in ``_sum``.

This package imports nothing else of dictcheck (layer contract in pyproject.toml).
"""
