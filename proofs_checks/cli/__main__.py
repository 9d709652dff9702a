"""``python -m dictcheck.proofs_checks.cli``: the ``dictcheck`` command (torchrun workers start it this way)."""

from dictcheck.proofs_checks.cli import main

raise SystemExit(main())
