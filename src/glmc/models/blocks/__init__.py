"""Block kinds: one module per sublayer kind (attention or MLP), each declaring its forward, the roles of
its tensors, the symmetry it keeps and what the matchers do for its own spaces (registry.BlockKind); the
registry finds a kind by name, and register_kind adds one defined elsewhere.
"""

from glmc.models.blocks.registry import ActivationHook, BlockKind, block_kind, kind_names, register_kind

__all__ = ["ActivationHook", "BlockKind", "block_kind", "kind_names", "register_kind"]
