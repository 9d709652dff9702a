"""Checks joining theory, solvers and empirics; the runner, report and CLI."""
