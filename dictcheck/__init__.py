"""dictcheck: a theory-first verification suite for sparse dictionary learning (placeholder; API below)."""
