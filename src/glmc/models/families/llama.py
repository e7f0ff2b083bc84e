"""The Llama family: Hugging Face LlamaForCausalLM (and Mistral's and Qwen2's, of the same layout) <->
canonical Transformer.

RMSNorm has no mean subtraction and no offset: its gains fold into the readers, the stream needs no
centring and every orthogonal residual map is a symmetry. Blocks are gated and grouped-query
(blocks.grouped, blocks.gated) with rotate-half rotary positions; biases the HF layout lacks are zeros here (an
export refuses non-zero ones). Sliding windows convert as CanonicalConfig.sliding_window (and
sliding_layers). Gemma (gemma.py) changes the norm's gain offset and the embedding scale.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.export import check_model, check_template, fresh, set_linear, set_param
from glmc.models.families.base import TokenRotaryFamily, layer_sizes
from glmc.models.families.fold import StoredAs, bias64, by_rows
from glmc.models.families.roles import linear_head
from glmc.models.rotary import SCALED_TYPES
from glmc.ranges import finite_number

# the rotary types the canonical form computes, as a Hugging Face config's rope_type names them
ROTARY_TYPES = ("default", *SCALED_TYPES)


def unread_rope_type(config: dict[str, Any]) -> tuple[str, Any] | None:
    """(the key, e.g. "rope_scaling.rope_type", and its value) where a saved config.json names a rotary type
    other than ROTARY_TYPES, else None (read before transformers, which fails only when building)."""
    for name in ("rope_parameters", "rope_scaling"):
        params = config.get(name)
        if not isinstance(params, dict):
            continue
        # Gemma 3 keeps one set per layer type: {"full_attention": {...}, "sliding_attention": {...}}
        entries = [(f"{name}.{key}", value) for key, value in params.items() if isinstance(value, dict)]
        for where, entry in entries or [(name, params)]:
            for field in ("rope_type", "type"):
                if field in entry and entry[field] not in ROTARY_TYPES:
                    return f"{where}.{field}", entry[field]
    return None


def rope_parameters(cfg: Any, layer_type: str = "full_attention") -> dict:
    """A Hugging Face config's rotary parameters, those of `layer_type` where it keeps one set per layer
    type (Gemma 3: "full_attention", "sliding_attention")."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    return dict(params.get(layer_type) or {}) if layer_type in params else params


def rope_theta(cfg: Any) -> float:
    """The rotary base of a Hugging Face config; NotImplementedError for rotary types not computed here."""
    params = rope_parameters(cfg)
    rope_scaling(cfg)
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None:
        raise ValueError(f"a {cfg.model_type} config without a rotary base (rope_theta)")
    return float(theta)


def rope_scaling(cfg: Any) -> dict | None:
    """A Hugging Face config's rotary scaling as CanonicalConfig.rope_scaling (None: the default rotary);
    NotImplementedError for types other than glmc.models.rotary.SCALED_TYPES."""
    params = rope_parameters(cfg)
    kind = params.pop("rope_type", params.pop("type", "default"))
    if kind == "default":
        return None
    if kind not in SCALED_TYPES:
        raise NotImplementedError(
            f"rotary embeddings of type {kind!r}: the default rotary and {', '.join(SCALED_TYPES)} convert"
        )
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor", "type")}
    if kind in ("dynamic", "yarn"):
        scaling["max_position_embeddings"] = cfg.max_position_embeddings
    return {"rope_type": kind, **scaling}


def sliding_window(cfg: Any) -> tuple[int | None, list[int] | None]:
    """(window, the layers that use it, None for all) of a Hugging Face config; (None, None) without one
    (Mistral, Mixtral, Qwen3-MoE: every layer; Qwen2, Qwen3: those its layer_types mark "sliding_attention")."""
    if cfg.model_type in ("mistral", "mixtral", "qwen3_moe"):  # their models read no layer_types
        return getattr(cfg, "sliding_window", None), None
    if cfg.model_type not in ("qwen2", "qwen3", "qwen2_moe", "gemma2", "gemma3_text"):
        return None, None
    layer_types = list(getattr(cfg, "layer_types", None) or ())
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise NotImplementedError(f"{cfg.model_type} with attention layer types {unknown}")
    layers = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    if not layers:
        return None, None
    if cfg.sliding_window is None:
        raise ValueError(
            f"a {cfg.model_type} config whose layers {layers} use sliding attention without a sliding_window"
        )
    return cfg.sliding_window, None if len(layers) == cfg.num_hidden_layers else layers


def check_supported(cfg: Any) -> None:
    """Refuse what the canonical form does not compute: scaled rotary variants, attention that is not causal."""
    if getattr(cfg, "use_bidirectional_attention", None):
        raise NotImplementedError(
            f"{cfg.model_type} with use_bidirectional_attention=True: the canonical form of this family is causal"
        )
    sliding_window(cfg)
    rope_theta(cfg)


@torch.no_grad()
def llama_to_canonical(model: nn.Module, family: LlamaFamily | None = None) -> CanonicalTransformer:
    """`family`: the family whose details (norm gain, embedding scale) the model has; Llama's by default."""
    family = family or FAMILY
    cfg, inner = model.config, model.model
    check_supported(cfg)
    dtype = inner.embed_tokens.weight.dtype
    g = lambda t: t.detach().double()  # noqa: E731  fold in float64, cast back per tensor (1B models: memory)
    D, H, K = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    G = H // K

    p = StoredAs(dtype)
    scale = family.embed_scale(inner)
    p["embed.tokens"] = by_rows(lambda w: w * scale, inner.embed_tokens.weight, dtype)
    for i, layer in enumerate(inner.layers):
        attn, mlp, pre = layer.self_attn, layer.mlp, f"blocks.{i}."
        dh = attn.head_dim
        gamma = family.reader_gain(layer, "attn", g)
        for name, lin, scale, shape in (
            ("q", attn.q_proj, family.query_scale(attn), (K, G, dh)),
            ("k", attn.k_proj, 1.0, (K, dh)),
            ("v", attn.v_proj, 1.0, (K, dh)),
        ):
            p[pre + name + "_w"] = (scale * g(lin.weight) * gamma).reshape(*shape, D)
            p[pre + name + "_b"] = (scale * bias64(lin, lin.out_features)).reshape(shape)
        # o_proj weight (D, H * dh): column block h is query head h = k * G + g
        p[pre + "o_w"] = g(attn.o_proj.weight).reshape(D, K, G, dh).permute(1, 2, 0, 3)
        p[pre + "o_b"] = bias64(attn.o_proj, D)
        for name, t in family.head_norms(attn, g).items():
            p[pre + name] = t
        for name, t in family.branch_norms(layer, g).items():
            p[pre + name] = t
        gamma = family.reader_gain(layer, "mlp", g)
        for name, t in family.mlp_params(mlp, g, gamma).items():
            p[pre + name] = t
    gain = family.norm_offset + g(inner.norm.weight)
    p["head.w"] = by_rows(lambda w: w * gain, model.lm_head.weight, dtype)

    window, window_layers = sliding_window(cfg)
    config = CanonicalConfig(
        family=family.name,
        activation=family.activation(cfg),
        norm_eps=cfg.rms_norm_eps,
        norm_dim=D,
        causal=True,
        pooling="none",
        rope_theta=rope_theta(cfg),
        rope_dim=inner.layers[0].self_attn.head_dim,
        rope_scaling=rope_scaling(cfg),
        sliding_window=window,
        sliding_layers=window_layers,
        **family.config_extras(cfg),
    )
    return CanonicalTransformer(config, dict(p), copy=False)


def llama_from_canonical(
    model: CanonicalTransformer, template: nn.Module, family: LlamaFamily | None = None
) -> nn.Module:
    family = family or FAMILY
    params = check_model(model, family.name)
    p = lambda n: params[n].double()  # noqa: E731
    cfg = template.config
    check_supported(cfg)
    window = (model.config.sliding_window, model.config.sliding_layers)
    if sliding_window(cfg) != window:
        raise ValueError(
            f"the template's sliding window (size, layers) {sliding_window(cfg)} is not the model's {window}"
        )
    check_template(model, family.activation(cfg), "hidden_size", cfg.hidden_size)
    if rope_theta(cfg) != model.config.rope_theta:
        raise ValueError(f"the template's rotary base {rope_theta(cfg)} is not the model's {model.config.rope_theta}")
    if rope_scaling(cfg) != model.config.rope_scaling:
        raise ValueError(
            f"the template's rotary scaling {rope_scaling(cfg)} is not the model's {model.config.rope_scaling}"
        )
    _check_heads(model, cfg, family)
    hf = fresh(template, rms_norm_eps=model.config.norm_eps, tie_word_embeddings=False)
    inner, D = hf.model, model.width
    set_param(inner.embed_tokens.weight, p("embed.tokens") / family.embed_scale(inner), "embed.tokens")
    identity_gain = 1.0 - family.norm_offset
    for i, layer in enumerate(inner.layers):
        attn, mlp, pre = layer.self_attn, layer.mlp, f"blocks.{i}."
        q_scale = family.query_scale(attn)
        for name, lin, scale in (("q", attn.q_proj, q_scale), ("k", attn.k_proj, 1.0), ("v", attn.v_proj, 1.0)):
            w = p(pre + name + "_w")
            set_linear(lin, w.reshape(-1, D) / scale, p(pre + name + "_b").flatten() / scale, pre + name)
        family.set_head_norms(attn, p, pre)
        set_linear(attn.o_proj, p(pre + "o_w").permute(2, 0, 1, 3).reshape(D, -1), p(pre + "o_b"), pre + "o")
        family.set_layer_norms(layer, p, pre, identity_gain)
        family.set_mlp(mlp, p, pre)
    inner.norm.weight.fill_(identity_gain)
    if hf.lm_head.weight is inner.embed_tokens.weight:
        raise ValueError("the exported model still ties lm_head to embed_tokens: cannot write a separate head")
    set_param(hf.lm_head.weight, p("head.w"), "head.w")
    return hf


def _check_heads(model: CanonicalTransformer, cfg: Any, family: LlamaFamily) -> None:
    layout, params = family.layout(model.config), model.params()
    sizes = layer_sizes(layout, params, model.num_layers)
    if model.num_layers != cfg.num_hidden_layers:
        raise ValueError(f"the model has {model.num_layers} layers, the template {cfg.num_hidden_layers}")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads
    expected = (kv, cfg.num_attention_heads // kv, head_dim, head_dim, cfg.intermediate_size)
    for layer in range(model.num_layers):
        qk = params[f"blocks.{layer}.k_w"].shape[1]  # read off k_w: a block may have no qk space
        got = (sizes["heads"][layer], sizes["qheads"][layer], qk, sizes["vo"][layer], family.mlp_units(sizes, layer))
        if got != expected:
            raise ValueError(
                f"layer {layer} has (key/value heads, query heads per group, qk dim, vo dim, MLP units) {got} but "
                f"the template has {expected}"
            )


class LlamaFamily(TokenRotaryFamily):
    name = "llama"
    model_types = ("llama", "mistral", "qwen2")
    hf_classes = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
    shared_model_keys = ("vocab_size", "max_positions")
    own_model_keys = ("num_kv_heads", "tie_embeddings", "rope_theta")
    model_keys = ("vocab_size", "max_positions", "num_kv_heads", "tie_embeddings", "rope_theta")
    mlp_kind = "gated"
    mean_zero_stream = False
    # an RMS-normalised stream: signed permutations are a class of their own (symmetry.residual=signed_permutation)
    residual_classes = ("orthogonal", "signed_permutation", "permutation")
    head_roles = linear_head(bias=False, vocab_rows=True)
    # an RMSNorm's gain is norm_offset + its weight (Gemma stores the gain less one)
    norm_offset = 0.0

    def model_problems(self, model: Any, prefix: str, checked: set[str]) -> list[str]:
        """Key/value heads that are not a divisor of the query heads."""
        kv, heads = model.num_kv_heads, model.num_heads
        if kv is None or not {"num_kv_heads", "num_heads"} & checked:
            return []
        if finite_number(kv) and kv >= 1 and finite_number(heads) and heads % kv == 0:
            return []
        return [
            f"{prefix}.num_kv_heads={kv}: key/value heads must be at least 1 and divide {prefix}.num_heads="
            f"{heads}; choose a divisor of {heads} (null: one per query head)"
        ]

    def embed_scale(self, inner: nn.Module) -> float:
        """The factor the HF model multiplies its token embeddings by (Gemma: sqrt(hidden_size))."""
        return 1.0

    def query_scale(self, attn: nn.Module) -> float:
        """The factor folded into q_w and q_b: the attention's 1/sqrt(dh) (1 where a query norm follows)."""
        return attn.scaling

    def head_norms(self, attn: nn.Module, g) -> dict[str, Tensor]:
        """A layer's canonical tensors beyond the grouped block's (query/key norm gains), in float64 by `g`."""
        return {}

    def set_head_norms(self, attn: nn.Module, p, pre: str) -> None:
        """Export head_norms' tensors (read by `p(name)`, float64) into the attention module."""

    def activation(self, cfg: Any) -> str:
        """The MLP's activation as the Hugging Face config names it."""
        return cfg.hidden_act

    def reader_gain(self, layer: nn.Module, sublayer: str, g) -> Tensor | float:
        """The gain of the norm before sublayer "attn" or "mlp" (float64 by `g`), folded into its readers."""
        norm = layer.input_layernorm if sublayer == "attn" else layer.post_attention_layernorm
        return self.norm_offset + g(norm.weight)

    def branch_norms(self, layer: nn.Module, g) -> dict[str, Tensor]:
        """A layer's gains of the norms on its sublayers' outputs (blocks.sandwich), float64 by `g`."""
        return {}

    def set_layer_norms(self, layer: nn.Module, p, pre: str, identity_gain: float) -> None:
        """Export: the pre-norms' gains to the identity (folded into the readers), the branch norms' from
        `p(name)` (float64)."""
        layer.input_layernorm.weight.fill_(identity_gain)
        layer.post_attention_layernorm.weight.fill_(identity_gain)

    def mlp_params(self, mlp: nn.Module, g, gamma: Tensor) -> dict[str, Tensor]:
        """A layer's MLP tensors (float64 by `g`), the pre-norm's gain `gamma` folded into the readers."""
        units, width = mlp.gate_proj.out_features, mlp.down_proj.out_features
        return {
            "gate_w": g(mlp.gate_proj.weight) * gamma,
            "gate_b": bias64(mlp.gate_proj, units),
            "in_w": g(mlp.up_proj.weight) * gamma,
            "in_b": bias64(mlp.up_proj, units),
            "out_w": g(mlp.down_proj.weight),
            "out_b": bias64(mlp.down_proj, width),
        }

    def set_mlp(self, mlp: nn.Module, p, pre: str) -> None:
        """Export mlp_params' tensors (read by `p(name)`, float64) into the MLP module."""
        set_linear(mlp.gate_proj, p(pre + "gate_w"), p(pre + "gate_b"), pre + "gate")
        set_linear(mlp.up_proj, p(pre + "in_w"), p(pre + "in_b"), pre + "in")
        set_linear(mlp.down_proj, p(pre + "out_w"), p(pre + "out_b"), pre + "out")

    def mlp_units(self, sizes: dict[str, list[int]], layer: int) -> int:
        """A layer's MLP units (layer_sizes), compared with the template's intermediate_size."""
        return sizes["mlp"][layer]

    def config_extras(self, cfg: Any) -> dict[str, Any]:
        """CanonicalConfig fields beyond Llama's, read from the Hugging Face config."""
        return {}

    def build_extras(self, cfg: Any) -> dict[str, Any]:
        """Hugging Face config fields beyond Llama's, from the model config (its model_keys beyond Llama's)."""
        return {}

    # the Hugging Face config and model classes `build` makes (a subclass family names its own)
    config_class: Any = LlamaConfig
    model_class: Any = LlamaForCausalLM

    def build(self, cfg) -> nn.Module:
        kv_heads = cfg.num_kv_heads or cfg.num_heads
        if cfg.num_heads % kv_heads:
            raise ValueError(f"model.num_heads={cfg.num_heads} is not a multiple of model.num_kv_heads={kv_heads}")
        config = self.config_class(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.mlp_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=kv_heads,
            head_dim=cfg.hidden_size // cfg.num_heads,
            hidden_act=cfg.hidden_act,
            max_position_embeddings=cfg.max_positions,
            rms_norm_eps=cfg.layer_norm_eps,
            tie_word_embeddings=cfg.tie_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            attention_dropout=cfg.dropout,
            # a character vocabulary has no special ids; a padding id would also freeze its embedding row
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
            **self.build_extras(cfg),
        )
        return self.model_class(config)

    def to_canonical(self, hf_model) -> CanonicalTransformer:
        return llama_to_canonical(hf_model, self)

    def to_hf(self, model, template) -> nn.Module:
        return llama_from_canonical(model, template, self)

    def head(self, config: CanonicalConfig, p: dict[str, Tensor], x: Tensor, record) -> Tensor:
        return F.linear(x, p["head.w"])

    def input_properties(self, config, params):
        yield "has a vocabulary of {} tokens", params["embed.tokens"].shape[0]
        yield "has {} outputs", params["head.w"].shape[0]
        yield "has rotary base {}", config.rope_theta
        yield "has rotary scaling {}", config.rope_scaling
        yield "has a sliding window (size, layers) {}", (config.sliding_window, config.sliding_layers)


FAMILY = LlamaFamily()
