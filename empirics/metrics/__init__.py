"""Measurements of trained featurizers: reconstruction and sparsity (:mod:`.reconstruction`), a
featurizer spliced into a language model (:mod:`.lm`), and the manifold benchmark's metrics and
runner (:mod:`.manifold`, :mod:`.manifold_bench`). docs/ecosystem.md §2, docs/bsf.md §5–§9."""
