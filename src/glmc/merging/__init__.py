"""Merges of aligned models beyond the straight line (Fisher, RegMean); the pipeline scores what they return."""

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
