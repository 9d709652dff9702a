"""Numerical optimisers: medians, conic relaxations, exact codes, reference learners.

May import theory; nothing from empirics or proofs_checks (layer contract in pyproject.toml).
"""
