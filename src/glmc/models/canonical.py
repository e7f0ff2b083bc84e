"""The canonical Transformer: plain tensors and one functional forward, pre-norm or post-norm.

Pre-norm families normalise the stream with a parameter-free RMS norm before every reader (orthogonal
residual maps are symmetries); post-norm families (BERT) keep each sublayer's LayerNorm (blocks.{l}.ln1_*,
ln2_*), so only permutations are. Names and shapes (D width, H heads, dh/dv head dims, F MLP width):

  embed.*, head.*                                                    the family's (models/families/)
  blocks.{l}.q_w, k_w (H, dh, D), q_b, k_b (H, dh)                   factored attention
  blocks.{l}.v_w (H, dv, D), v_b (H, dv), o_w (H, D, dv)
  blocks.{l}.qk (H, D+1, D+1), ov (H, D, D+1)                        circuit attention
  blocks.{l}.o_b (D), in_w (F, D), in_b (F), out_w (D, F), out_b (D)

The 1/sqrt(dh) scale is folded into q; sizes are read from the tensors, so layers may differ in H and F.
Each sublayer is a block kind of the family (glmc.models.blocks: its forward and its tensors' roles), so
grouped-query and other attention kinds lay out their tensors as their own module says.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glmc.models.blocks.registry import BlockKind, block_kind, kind_names
from glmc.models.families.registry import family_named, family_names

Recorder = Callable[[str, Tensor], None]

# Hugging Face activation names -> canonical names.
_TANH_GELUS = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate", "gelu_tanh")
_ACTIVATION_ALIASES = {
    **dict.fromkeys(("gelu", "gelu_python"), "gelu"),
    **dict.fromkeys(_TANH_GELUS, "gelu_tanh"),
    **{name: name for name in ("quick_gelu", "relu", "leaky_relu", "silu", "mish", "tanh", "sigmoid")},
    "swish": "silu",
}

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "leaky_relu": F.leaky_relu,  # slope 0.01, as torch.nn.LeakyReLU in HF's ACT2FN
    "silu": F.silu,
    "mish": F.mish,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}

# Positively homogeneous, f(a x) = a f(x) for a > 0: the MLP admits semi-permutations.
RELU_FAMILY = frozenset({"relu", "leaky_relu"})


def canonical_activation(name: str) -> str:
    """Map a Hugging Face activation name to the canonical one."""
    if name not in _ACTIVATION_ALIASES:
        raise ValueError(f"unsupported activation {name!r}; known: {sorted(_ACTIVATION_ALIASES)}")
    return _ACTIVATION_ALIASES[name]


@dataclass
class CanonicalConfig:
    family: str  # a name in glmc.models.families
    activation: str  # canonical name, see canonical_activation
    norm_eps: float
    norm_dim: int  # RMS reference width: the width at conversion, kept when the model is widened
    causal: bool
    pooling: str  # "cls": logits from position 0; "none": logits at every position
    form: str = "factored"  # "factored" | "circuit"
    patch_size: int | None = None
    num_channels: int | None = None
    pad_token_id: int | None = None  # RoBERTa: positions count the tokens that are not padding
    rope_theta: float | None = None  # rotary position embeddings' base (Llama); None: no rotary
    rope_dim: int | None = None  # the head dim the rotary frequencies belong to (stacked heads hold several)
    # causal sliding-window attention (Mistral, Qwen2): i attends to j when 0 <= i - j < window; None: all layers
    sliding_window: int | None = None
    sliding_layers: list[int] | None = None
    # partial rotary (GPT-NeoX): only the first rotary_dims dims of each rope_dim block rotate; None: all
    rotary_dims: int | None = None
    # the n of the frequencies theta^(-2i/n) where it is not the rotating dims (an odd GPT-NeoX count)
    rotary_freq_dim: int | None = None
    # Hugging Face's rotary scaling (rope_type and its parameters: rotary.rotary_frequencies); None: unscaled
    rope_scaling: dict | None = None
    # GPT-NeoX's parallel residual: x + attn(norm(x)) + mlp(norm(x))
    parallel_residual: bool = False
    # Gemma 2's tanh caps: attention scores become cap * tanh(score / cap), and so do the logits; None: none
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    # the rotary base of the sliding-window layers, which rotate unscaled (Gemma 3); None: as the others
    rope_local_theta: float | None = None
    # the settings of the family's block kinds (BlockKind.settings: each kind reads its own keys, with the
    # defaults it declares); keys no kind of the family declares are refused
    block_settings: dict = field(default_factory=dict)

    def __post_init__(self):
        self.activation = canonical_activation(self.activation)
        if self.family not in family_names():
            raise ValueError(f"unknown family {self.family!r}; known: {', '.join(family_names())}")
        if self.pooling not in ("cls", "none"):
            raise ValueError(f"unknown pooling {self.pooling!r}")
        if self.form not in ("factored", "circuit"):
            raise ValueError(f"unknown form {self.form!r}")
        if self.sliding_window is not None and (not self.causal or self.sliding_window < 1):
            raise ValueError(f"sliding_window={self.sliding_window}: a window needs causal attention and size >= 1")
        self.block_settings = dict(self.block_settings)  # a copy: replace() shares nothing with the original
        declared = _settings(family_named(self.family).kinds("factored"))
        unknown = sorted(set(self.block_settings) - declared)
        if unknown:
            raise ValueError(
                f"block_settings has {unknown[0]!r}, which no block kind of the {self.family} family declares "
                f"(they declare: {', '.join(sorted(declared)) or 'none'}): remove it"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CanonicalConfig:
        """The config `to_dict` wrote. Written before block_settings, it holds block kinds' settings as keys
        of its own: those of its family's kinds move into block_settings, other kinds' (stored for every
        family) are dropped."""
        fields = {f.name for f in dataclasses.fields(cls)}
        older = {k: v for k, v in d.items() if k not in fields}
        if not older:
            return cls(**d)
        ours = _settings(family_named(d["family"]).kinds("factored")) if d.get("family") in family_names() else set()
        known = _settings(block_kind(name) for name in kind_names())
        unknown = sorted(set(older) - known)
        if unknown:
            raise ValueError(f"canonical config has {unknown}, no setting of CanonicalConfig or a kind: remove them")
        current = {k: v for k, v in d.items() if k in fields}
        current["block_settings"] = {**{k: v for k, v in older.items() if k in ours}, **d.get("block_settings", {})}
        return cls(**current)


def _settings(kinds: Iterable[BlockKind]) -> set[str]:
    """The setting names these block kinds declare."""
    return {key for kind in kinds for key in kind.settings}


def rms_norm(x: Tensor, norm_dim: int, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / norm_dim + eps)


DEVIATION_CHUNK = 1 << 22  # elements compared at a time: large logits are never copied whole in float64


def relative_deviation(a: Tensor, b: Tensor) -> float:
    """max|a - b| / max|b|: the worst logit error relative to the logit scale of b, in float64, a chunk of
    DEVIATION_CHUNK elements at a time (the same maxima as on the whole tensors: a language model's logits
    over a large vocabulary are never held again in float64)."""
    a, b = a.detach(), b.detach()
    if a.shape != b.shape or a.numel() <= DEVIATION_CHUNK:  # broadcast shapes: as a whole
        a, b = a.double(), b.double()
        return ((a - b).abs().max() / b.abs().max()).item()
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    error = scale = torch.zeros((), dtype=torch.float64, device=a.device)
    for start in range(0, flat_a.numel(), DEVIATION_CHUNK):
        part_a = flat_a[start : start + DEVIATION_CHUNK].double()
        part_b = flat_b[start : start + DEVIATION_CHUNK].double()
        error = torch.maximum(error, (part_a - part_b).abs().max())  # NaN propagates, as .max() does
        scale = torch.maximum(scale, part_b.abs().max())
    return (error / scale).item()


def num_layers(params: dict[str, Tensor]) -> int:
    layers = {int(m.group(1)) for k in params if (m := re.match(r"blocks\.(\d+)\.", k))}
    return len(layers)


def canonical_forward(
    config: CanonicalConfig,
    params: dict[str, Tensor],
    inputs: Tensor,
    record: Recorder | None = None,
    head: bool = True,
) -> Tensor:
    """Logits of the canonical model; differentiable with respect to every tensor in params. `head=False`:
    the state the head reads instead (its logits are then family.head's of any of its examples).

    `record(name, tensor)` receives the states activation-based methods read: "embed", per layer
    "blocks.{l}." + attn_in, heads (per-head outputs before o_w, factored form), attn_out, mlp_in, mlp_act,
    mlp_out, and "final" (the normalised stream the head reads); a parallel residual's mlp_in is attn_in.
    A sublayer reads the normalised stream, or the raw one where the family has no pre-norms, and its
    output joins the stream through the family's branch kind where it has one (blocks.sandwich)."""
    p = params
    act = ACTIVATIONS[config.activation]
    norm = lambda x: rms_norm(x, config.norm_dim, config.norm_eps)  # noqa: E731
    rec = record or (lambda name, t: None)

    family = family_named(config.family)
    attention, mlp = (kind.forward for kind in family.block_kinds(config.form))
    x = family.embed(config, p, inputs)
    rec("embed", x)
    if family.norm == "post":
        x = _post_norm_blocks(config, p, x, act, attention, mlp, record, rec)
        return family.head(config, p, x, rec) if head else x
    read = norm if family.pre_norms else (lambda x: x)
    branch = _branch_output(family)
    for layer in range(num_layers(p)):
        pre = f"blocks.{layer}."
        h = read(x)
        rec(pre + "attn_in", h)
        x = x + branch(config, p, pre, "attn", attention(config, p, pre, h, record) + p[pre + "o_b"])
        rec(pre + "attn_out", x)
        if not config.parallel_residual:  # parallel: the MLP reads the block's input, as attention did
            h = read(x)
        rec(pre + "mlp_in", h)
        x = x + branch(config, p, pre, "mlp", mlp(config, p, pre, h, act, rec))
        rec(pre + "mlp_out", x)
    x = norm(x)
    rec("final", x)
    return family.head(config, p, x, rec) if head else x


def _branch_output(family) -> Callable:
    """What a sublayer's output (attention's with o_b) passes through before it joins the stream:
    `(config, params, pre, sublayer, y)`, sublayer "attn" or "mlp", from the family's branch kind (identity
    without one)."""
    kind = family.branch_block()
    return kind.forward if kind is not None else lambda config, p, pre, sublayer, y: y


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over the last axis with this gain and offset (the post-norm families' own norm)."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _post_norm_blocks(config, p, x, act, attention, mlp, record, rec) -> Tensor:
    """Post-norm blocks, x = LN(x + attn(x)), x = LN(x + mlp(x)), recorded under the pre-norm names."""
    for layer in range(num_layers(p)):
        pre = f"blocks.{layer}."
        rec(pre + "attn_in", x)
        h = x + attention(config, p, pre, x, record) + p[pre + "o_b"]
        x = layer_norm(h, p[pre + "ln1_w"], p[pre + "ln1_b"], config.norm_eps)
        rec(pre + "attn_out", x)
        rec(pre + "mlp_in", x)
        h = x + mlp(config, p, pre, x, act, rec)
        x = layer_norm(h, p[pre + "ln2_w"], p[pre + "ln2_b"], config.norm_eps)
        rec(pre + "mlp_out", x)
    rec("final", x)
    return x


def _head_circuits(params: dict[str, Tensor], pre: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """One block's QK and OV circuits, multiplied in float64 to match the factored form in float32."""
    get = lambda n: params[pre + n].double()
    aug = lambda n: torch.cat([get(n + "_w"), get(n + "_b")[..., None]], -1)
    return (aug("q").transpose(1, 2) @ aug("k")).to(dtype), (get("o_w") @ aug("v")).to(dtype)


def circuit_params(params: dict[str, Tensor]) -> dict[str, Tensor]:
    """Factored -> circuit form: QK = [W_q|b_q]^T [W_k|b_k], OV = W_o [W_v|b_v] per head."""
    out = {}
    for name, t in params.items():
        m = re.match(r"(blocks\.\d+\.)(q_w|q_b|k_w|k_b|v_w|v_b|o_w)$", name)
        if not m:
            out[name] = t
            continue
        pre = m.group(1)
        if pre + "qk" not in out:
            out[pre + "qk"], out[pre + "ov"] = _head_circuits(params, pre, t.dtype)
    return out


class CanonicalTransformer(nn.Module):
    """Module wrapper around canonical_forward; its state_dict holds exactly the canonical params.
    `source`: the model it was converted from (vanilla averaging reads it); None for derived models."""

    source: nn.Module | None = None

    def __init__(self, config: CanonicalConfig, params: dict[str, Tensor], copy: bool = True):
        """`copy=False`: the module takes the tensors themselves (a converter's or a transform's new ones: a
        large model is then never held twice); with the default, the caller's tensors are left untouched."""
        super().__init__()
        self.config = config
        self._check(params)
        groups = {"embed": {}, "head": {}}
        blocks: dict[int, dict] = {}
        for name, t in params.items():
            parts = name.split(".")
            t = nn.Parameter(t.detach().clone() if copy else t.detach())
            if parts[0] == "blocks":
                blocks.setdefault(int(parts[1]), {})[parts[2]] = t
            else:
                groups[parts[0]][parts[1]] = t
        # lists of pairs keep the given order (ParameterDict sorts plain dicts)
        self.embed = nn.ParameterDict(list(groups["embed"].items()))
        self.blocks = nn.ModuleList(nn.ParameterDict(list(blocks[i].items())) for i in range(len(blocks)))
        self.head = nn.ParameterDict(list(groups["head"].items()))

    def _check(self, params):
        family = family_named(self.config.family)
        expected = family.tensor_names(self.config, num_layers(params))
        if set(params) != expected:
            raise ValueError(
                f"canonical params do not match the {self.config.form} {self.config.family} layout: "
                f"missing {sorted(expected - set(params))}, unexpected {sorted(set(params) - expected)}"
            )

    def params(self) -> dict[str, Tensor]:
        """The canonical tensors keyed by state_dict name (shared with the module, not copies)."""
        return dict(self.named_parameters())

    def with_source(self, model: nn.Module | None) -> CanonicalTransformer:
        self.__dict__["source"] = model  # a plain attribute, not a submodule: outside the state_dict
        return self

    @property
    def task(self) -> str:
        """classification (logits of the class token), causal_lm or masked_lm (logits at every position)."""
        if self.config.pooling == "cls":
            return "classification"
        return "causal_lm" if self.config.causal else "masked_lm"

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def width(self) -> int:
        """The residual width, read where the first embedding tensor writes into the stream."""
        role = family_named(self.config.family).embed_roles[0]
        acts = role.acts_on("residual")[0]
        return self.embed[role.name.split(".", 1)[1]].shape[acts.axis]

    def forward(self, inputs: Tensor) -> Tensor:
        return canonical_forward(self.config, self.params(), inputs)

    def clone(self) -> CanonicalTransformer:
        return CanonicalTransformer(dataclasses.replace(self.config), self.params())

    @torch.no_grad()
    def to_circuit(self) -> CanonicalTransformer:
        if self.config.form == "circuit":
            return self.clone()
        family_named(self.config.family).blocks("circuit")  # families without a circuit form refuse here
        config = dataclasses.replace(self.config, form="circuit")
        return CanonicalTransformer(config, circuit_params(self.params()))
