"""Data the checks and the training loop run on: toy generators (:mod:`.toys`, :mod:`.manifold_toy`,
:mod:`.quadric_toy`), synthetic data with ground-truth features (:mod:`.synthetic`), the offline text
corpus (:mod:`.corpus`), offline language models and their residual streams (:mod:`.lm_models`,
:mod:`.activation_store`) and row-batch readers (:mod:`.row_source`). docs/theory.md §4–§5,
docs/ecosystem.md §5–§6."""
