"""Block kinds: one module per sublayer kind (attention or MLP), each declaring its forward, the roles of
its tensors and the symmetry it keeps (registry.BlockKind); the registry finds a kind by name.
"""

from glmc.models.blocks.registry import BlockKind, block_kind, kind_names

__all__ = ["BlockKind", "block_kind", "kind_names"]
