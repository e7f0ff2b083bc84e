"""What a model family declares (the class attributes and its own methods), and what is derived from it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch.nn.functional as F
from torch import Tensor, nn

from glmc.models.blocks.registry import BlockKind, block_kind
from glmc.models.families.roles import POST_NORMS, Role, layer_space_order, role_key, writer

if TYPE_CHECKING:
    from glmc.models.canonical import CanonicalConfig, CanonicalTransformer

# glmc.config.ModelConfig keys every family reads: the label, the family and the block sizes
COMMON_MODEL_KEYS = (
    "name",
    "family",
    "hidden_size",
    "num_layers",
    "num_heads",
    "mlp_size",
    "hidden_act",
    "dropout",
    "layer_norm_eps",
)


class Family:
    name: str
    model_types: tuple[str, ...]  # Hugging Face config model_type values this family reads
    hf_classes: tuple[str, ...]  # the HF model classes it converts
    data_kind: str  # "images" | "text": the datasets it trains on
    tasks: tuple[str, ...] = ()  # the data tasks its models train on (data.task)
    # ModelConfig keys `build` reads beyond COMMON_MODEL_KEYS (any other key set is refused)
    model_keys: tuple[str, ...] = ()
    # keys only this family and its kin read: other families leave them out of their endpoint cache keys
    own_model_keys: tuple[str, ...] = ()
    # ModelConfig keys whose value the architecture fixes (OPT's LayerNorm eps)
    fixed_model_values: dict[str, Any] = {}
    # ModelConfig keys that endpoints of different widths must share with the first (beyond the layers)
    shared_model_keys: tuple[str, ...] = ()
    residual_classes: tuple[str, ...] = ("orthogonal", "permutation")
    # why the residual stream admits no wider class, where residual_classes has no orthogonal
    residual_note: str = "a post-norm stream is a LayerNorm's output: no rotation commutes with its mean and gain"
    # "pre": a parameter-free RMS norm before every reader; "post": each sublayer's LayerNorm kept (BERT)
    norm: str = "pre"
    # the block kinds of its layers' sublayers (glmc.models.blocks): their forward, roles and symmetry
    attention_kind: str = "full"
    mlp_kind: str = "plain"
    # the kind each sublayer's output passes through before it joins the stream (blocks.sandwich: a norm with
    # a gain); None: added as it is
    branch_kind: str | None = None
    # whether each sublayer reads the stream through the parameter-free RMS norm (False: the raw stream, as
    # in OLMo-2, whose only norms follow the branches)
    pre_norms: bool = True
    # a stream kept mean-zero, which an export to LayerNorms needs (RMSNorm families need none)
    mean_zero_stream: bool = True
    # whether the (D+1) x (D+1) QK/OV circuit form exists (not under rotary positions)
    circuit_form: bool = True
    embed_roles: tuple[Role, ...] = ()
    head_roles: tuple[Role, ...] = ()
    # a head per task (model.head): head -> its data task; empty where the family has one head
    task_heads: dict[str, str] = {}
    # a mixture of experts' Hugging Face config key counting each layer's experts; None without experts
    experts_key: str | None = None

    # ---- the family's own: building, conversion, the input side ----
    def build(self, cfg: Any) -> nn.Module:
        """The Hugging Face model a model config (glmc.config.ModelConfig) describes."""
        raise NotImplementedError

    def to_canonical(self, hf_model: nn.Module) -> CanonicalTransformer:
        raise NotImplementedError

    def to_hf(self, model: CanonicalTransformer, template: nn.Module) -> nn.Module:
        raise NotImplementedError

    def embed(self, config: CanonicalConfig, params: dict[str, Tensor], inputs: Tensor) -> Tensor:
        """The first residual state (B, T, D) from the inputs."""
        raise NotImplementedError

    def input_limits(self, params: dict[str, Tensor]) -> dict[str, Any]:
        """What a canonical model of this family accepts (positions, vocab, classes): glmc.api checks batches."""
        raise NotImplementedError

    def hf_input_limits(self, hf_config: Any) -> dict[str, Any]:
        """input_limits read from a Hugging Face config."""
        raise NotImplementedError

    def input_properties(self, config: CanonicalConfig, params: dict[str, Tensor]) -> Iterator[tuple[str, Any]]:
        """(what, value) pairs two models must share to be aligned, e.g. ("has {} positions", 64)."""
        raise NotImplementedError

    def heads(self, config: CanonicalConfig) -> tuple[Role, ...]:
        """The head's roles (a family with a head per task picks by the config's pooling)."""
        return self.head_roles

    def head(self, config: CanonicalConfig, p: dict[str, Tensor], x: Tensor, record) -> Tensor:
        """Logits from the last residual state x (B, T, D), already normalised where the family's norm
        is "pre"; `record(name, tensor)` receives any state a head's linear map reads beyond "final"."""
        if config.pooling == "cls":
            x = x[:, 0]
        return F.linear(x, p["head.w"], p["head.b"])

    def model_problems(self, model: Any, prefix: str, checked: set[str]) -> list[str]:
        """What this family's model keys must satisfy together beyond their ranges, where one of `checked`
        is among them."""
        return []

    def hf_config_problems(self, hf_config: Any) -> list[str]:
        """What in a model folder's Hugging Face config this family's models cannot run with, read before
        any weight is: each names the config.json key and its value and says what to set instead."""
        return []

    def reads_model_keys(self) -> tuple[str, ...]:
        """Every ModelConfig key a model of this family depends on."""
        return (*COMMON_MODEL_KEYS, *self.model_keys)

    # ---- derived from the roles ----
    def block_kinds(self, form: str) -> tuple[BlockKind, BlockKind]:
        """The attention and MLP kinds of every layer, attention in circuit form where `form` is "circuit"."""
        if form not in ("factored", "circuit"):
            raise ValueError(f"unknown form {form!r}; known: factored, circuit")
        attention, mlp = block_kind(self.attention_kind), block_kind(self.mlp_kind)
        if form == "circuit":
            if not self.circuit_form or attention.circuit is None:
                raise ValueError(
                    f"the {self.name} family has no circuit form: under rotary positions the query/key circuit "
                    "W_q^T W_k is not what the model computes (interpolation stacks its rotary heads instead: "
                    "glmc.interpolation)"
                )
            attention = attention.circuit
        return attention, mlp

    def branch_block(self) -> BlockKind | None:
        """The kind each sublayer's output passes through before it joins the stream, None without one."""
        return None if self.branch_kind is None else block_kind(self.branch_kind)

    def kinds(self, form: str) -> tuple[BlockKind, ...]:
        """Every block kind of its layers: attention and MLP (block_kinds), then the branch-output kind."""
        branch = self.branch_block()
        return (*self.block_kinds(form), *(() if branch is None else (branch,)))

    def attention_block(self) -> BlockKind:
        """The attention kind of its layers in factored form."""
        return block_kind(self.attention_kind)

    def blocks(self, form: str) -> tuple[Role, ...]:
        """One layer's roles: its block kinds' in order, then a post-norm family's LayerNorms."""
        roles = tuple(role for kind in self.kinds(form) for role in kind.roles)
        return (*roles, *(POST_NORMS if self.norm == "post" else ()))

    def roles(self, config: CanonicalConfig) -> tuple[Role, ...]:
        return (*self.embed_roles, *self.blocks(config.form), *self.heads(config))

    def layout(self, config: CanonicalConfig) -> dict[str, Role]:
        """Role by canonical name ("blocks.{l}.q_w" for block tensors)."""
        return {role.name: role for role in self.roles(config)}

    def tensor_names(self, config: CanonicalConfig, layers: int) -> set[str]:
        names = {r.name for r in (*self.embed_roles, *self.heads(config))}
        return names | {r.at(l) for l in range(layers) for r in self.blocks(config.form)}

    def __repr__(self) -> str:
        return f"<model family {self.name}>"


class TokenRotaryFamily(Family):
    """A causal LM whose one embedding is its token table (rotary positions): grouped-query blocks of a layout
    of its own, no circuit form."""

    data_kind = "text"
    tasks = ("causal_lm",)
    attention_kind = "grouped"
    circuit_form = False
    embed_roles = (writer("embed.tokens", vocab_rows=True),)

    def embed(self, config: CanonicalConfig, p: dict[str, Tensor], inputs: Tensor) -> Tensor:
        return p["embed.tokens"][inputs]

    def input_limits(self, params) -> dict[str, Any]:
        return {"vocab": params["embed.tokens"].shape[0]}  # rotary positions have no table: any length

    def hf_input_limits(self, hf_config) -> dict[str, Any]:
        return {"vocab": hf_config.vocab_size}


def encoder_sizes(cfg: Any) -> dict[str, Any]:
    """model.*'s block sizes, activation and dropout as BERT-style Hugging Face configs name them."""
    return {
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_size,
        "hidden_act": cfg.hidden_act,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout,
    }


def role_of(layout: dict[str, Role], name: str) -> Role | None:
    return layout.get(role_key(name))


def residual_axis(layout: dict[str, Role], name: str, side: str) -> int | None:
    """The (first) axis over the residual width on which tensor `name` writes ("out") or reads ("in")."""
    role = role_of(layout, name)
    for acts in role.acts_on("residual") if role else ():
        if acts.side == side:
            return acts.axis
    return None


def layer_sizes(layout: dict[str, Role], params: dict[str, Tensor], layers: int) -> dict[str, list[int]]:
    """Per layer, the size of every layer space the tensors act on (heads, qk, vo, mlp, ...)."""
    sizes: dict[str, list[int]] = {}
    for kind in layer_space_order(a.space for role in layout.values() for a in role.acts):
        role = next((r for r in layout.values() if r.acts_on(kind)), None)
        if role is None:
            continue
        acts = role.acts_on(kind)[0]
        sizes[kind] = [params[role.at(l)].shape[acts.axis] - acts.extra for l in range(layers)]
    return sizes
