"""The public Python API (filled in below)."""
