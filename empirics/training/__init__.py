"""Training every featurizer: the loop (:mod:`.loop`), its crash-safe checkpoints
(:mod:`.checkpoints`) and data-parallel runs over several processes (:mod:`.distributed`).
docs/ecosystem.md §3."""
