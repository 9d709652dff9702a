"""Compiled and low-level operations the featurizers call: the products with a sparse code matrix
(:mod:`.sparse_products`), the row-wise top-k of the pre-activations (:mod:`.topk_select`), the
straight-through threshold functions (:mod:`.straight_through`) and the OpenMP spin setting
(:mod:`.openmp_spin`). docs/ecosystem.md §3."""
