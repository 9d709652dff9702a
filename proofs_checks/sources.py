"""The papers the checks replicate or derive from (docs/README.md, "Source papers"); a check's ``source`` names
one and the part of it, or the docs section of a derivation made for this project."""

THEORY_PAPER = "Dorrell, How Optimality Structures Sparse Dictionaries (arXiv:2606.02385)"
BILINEAR_PAPER = "Dooms et al., Bilinear autoencoders find interpretable manifolds (arXiv:2605.08891)"
BSF_PAPER = "Fel et al., Structuring Sparsity: Block-Sparse Featurizers (arXiv:2606.25234)"
VASAE_PAPER = "Zhang et al., VASAE: Vocabulary-Aligned Anchoring (arXiv:2606.27941)"
#: The regime of the narrow theorem checks.
REFERENCE_LEARNER = "toy data, the reference learner (exact alternating minimisation in float64, no SGD)"
