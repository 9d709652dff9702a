"""Measurements of trained featurizers: reconstruction and sparsity (:mod:`.reconstruction`), recovery of
known features on synthetic data (:mod:`.ground_truth`), a featurizer spliced into a language model
(:mod:`.lm`), and the manifold benchmark's metrics and runner (:mod:`.manifold`, :mod:`.manifold_bench`).
docs/ecosystem.md §2, §6, docs/bsf.md §5–§9."""
