from glmc.models.canonical import (
    CanonicalConfig,
    CanonicalTransformer,
    canonical_forward,
    relative_deviation,
)
from glmc.models.convert import to_canonical

__all__ = ["CanonicalConfig", "CanonicalTransformer", "canonical_forward", "relative_deviation", "to_canonical"]
