"""Ways to combine aligned models beyond the straight line: Fisher-weighted averaging and RegMean.

Merges build models and never score them: the pipeline evaluates what they return.
"""

from glmc.merging.fisher_regmean import (
    MERGE_KINDS,
    fisher_average,
    fisher_information,
    fisher_merge,
    gram_matrices,
    merged_model,
    regmean_from_grams,
    regmean_merge,
)

__all__ = [
    "MERGE_KINDS",
    "fisher_average",
    "fisher_information",
    "fisher_merge",
    "gram_matrices",
    "merged_model",
    "regmean_from_grams",
    "regmean_merge",
]
