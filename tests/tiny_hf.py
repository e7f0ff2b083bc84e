"""Tiny random Hugging Face models and inputs for tests; nothing is downloaded.

Weights are drawn 10x larger than the HF default (std 0.2) so attention is far from uniform and
activations leave GELU's near-linear range: otherwise non-symmetries barely change the logits.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, ViTConfig, ViTForImageClassification


def randomize_layernorms(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """LayerNorms initialise to gain 1, offset 0, which would hide folding bugs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm) and m.elementwise_affine:
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
    return model


def tiny_vit(seed=0, hidden=32, heads=4, mlp=64, act="gelu", qkv_bias=True, channels=1, image=8, patch=2, layers=2):
    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=image,
        patch_size=patch,
        num_channels=channels,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=mlp,
        hidden_act=act,
        qkv_bias=qkv_bias,
        num_labels=10,
        attn_implementation="eager",
        initializer_range=0.2,
    )
    return randomize_layernorms(ViTForImageClassification(config), seed).eval()


def tiny_gpt2(seed=0, hidden=32, heads=4, mlp=None, act="gelu_new", layers=2, **extra):
    torch.manual_seed(seed)
    config = GPT2Config(
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_inner=mlp,
        vocab_size=97,
        n_positions=16,
        activation_function=act,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.2,
        **extra,
    )
    return randomize_layernorms(GPT2LMHeadModel(config), seed).eval()


def inputs_for(model, batch=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    if isinstance(model, ViTForImageClassification):
        return torch.randn(batch, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)
    return torch.randint(0, cfg.vocab_size, (batch, 11), generator=g)  # shorter than n_positions


def tiny_encoder(family="bert", head="mlm", seed=0, hidden=32, heads=4, mlp=64, act="gelu", layers=2, labels=3):
    """A tiny BERT or RoBERTa (masked-LM or sequence-classification head) built through its family, with
    weights drawn as above and randomised LayerNorms."""
    from types import SimpleNamespace

    from glmc.models.families import family_named

    torch.manual_seed(seed)
    cfg = SimpleNamespace(
        vocab_size=53,
        max_positions=16,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        mlp_size=mlp,
        hidden_act=act,
        dropout=0.0,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        num_labels=labels,
        head=head,
    )
    model = family_named(family).build(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.2)
            elif "LayerNorm" not in name and "layer_norm" not in name:
                p.normal_(0.0, 0.1)
    return randomize_layernorms(model, seed).eval()


def tiny_llama(
    seed=0,
    hidden=32,
    heads=4,
    kv_heads=2,
    mlp=48,
    layers=2,
    tied=False,
    kind="llama",
    bias=False,
    window=None,
    full=0,
    rope=None,
):
    """A tiny Llama (or Mistral / Qwen2) with grouped-query attention, weights as above and random RMSNorm
    gains (they initialise to 1, which would hide folding bugs). `window`: a sliding window (Mistral: in
    every layer; Qwen2: in the layers from `full` on); `rope`: rope_parameters beyond the base (a scaled
    rotary type)."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    sizes = (hidden, heads, kv_heads, mlp, layers)
    rope = {"rope_type": "default", "rope_theta": 100.0, **(rope or {})}
    if kind == "qwen2":  # q, k, v biases, none on o_proj
        sliding = dict(use_sliding_window=window is not None, sliding_window=window, max_window_layers=full)
        classes, extra = (Qwen2Config, Qwen2ForCausalLM), sliding
    elif kind == "mistral":
        classes, extra = (MistralConfig, MistralForCausalLM), dict(sliding_window=window)
    else:
        classes, extra = (LlamaConfig, LlamaForCausalLM), dict(attention_bias=bias, mlp_bias=bias)
    return _causal_lm(classes, seed, 1.0, *sizes, tie_word_embeddings=tied, rope_parameters=rope, **extra)


def _draw(model: torch.nn.Module, seed: int, norm_gain: float | None) -> None:
    """Weights as above; `norm_gain`: RMSNorm weights drawn around it (1: Llama's gain; 0: Gemma's, which
    stores the gain less one); None leaves norms to randomize_layernorms."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                if norm_gain is not None:
                    p.copy_(norm_gain + 0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 2:
                p.normal_(0.0, 0.2, generator=g)
            else:
                p.normal_(0.0, 0.1, generator=g)


def _causal_lm(classes, seed, norm_gain, hidden, heads, kv_heads, mlp, layers, **settings):
    """A tiny causal LM of `classes` (config class, model class): 61 tokens, 32 positions, the default
    rotary at base 100, untied head, no bos/eos token and eager attention unless `settings` say otherwise;
    weights drawn by _draw around `norm_gain`."""
    config_class, model_class = classes
    torch.manual_seed(seed)
    config = config_class(
        **{
            "vocab_size": 61,
            "hidden_size": hidden,
            "intermediate_size": mlp,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "max_position_embeddings": 32,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
            "bos_token_id": None,
            "eos_token_id": None,
            "attn_implementation": "eager",
            **settings,
        }
    )
    model = model_class(config)
    _draw(model, seed, norm_gain=norm_gain)
    return model.eval()


def tiny_gemma(
    seed=0, hidden=16, heads=4, kv_heads=2, head_dim=8, mlp=24, layers=2, tied=True, act="gelu_pytorch_tanh", **extra
):
    """A tiny Gemma: head_dim other than hidden / heads, tied head (Gemma's default), RMSNorm weights
    around 0 (gains around 1)."""
    from transformers import GemmaConfig, GemmaForCausalLM

    sizes = (hidden, heads, kv_heads, mlp, layers)
    extra = dict(head_dim=head_dim, hidden_act=act, tie_word_embeddings=tied, pad_token_id=None, **extra)
    return _causal_lm((GemmaConfig, GemmaForCausalLM), seed, 0.0, *sizes, **extra)


def tiny_opt(seed=0, hidden=16, heads=4, mlp=32, layers=2, act="relu", **extra):
    """A tiny pre-LN OPT (16 positions, q/k/v/out biases, tied head) with randomised LayerNorms."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    config = OPTConfig(
        vocab_size=61,
        hidden_size=hidden,
        ffn_dim=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=16,
        activation_function=act,
        dropout=0.0,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",
        **extra,
    )
    model = OPTForCausalLM(config)
    _draw(model, seed, norm_gain=None)
    return randomize_layernorms(model, seed).eval()


def tiny_gpt_neox(seed=0, hidden=32, heads=2, mlp=48, layers=2, rotary_pct=0.25, parallel=True, act="gelu", rope=None):
    """A tiny GPT-NeoX (Pythia's layout): rotary on the first rotary_pct of each head, a parallel or a
    sequential residual, weights as above and randomised LayerNorms. `rope`: rope_parameters beyond the
    base and the rotary share (a scaled rotary type)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    config = GPTNeoXConfig(
        vocab_size=53,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=mlp,
        hidden_act=act,
        max_position_embeddings=32,
        use_parallel_residual=parallel,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 100.0,
            "partial_rotary_factor": rotary_pct,
            **(rope or {}),
        },
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",
    )
    model = GPTNeoXForCausalLM(config)
    _draw(model, seed, norm_gain=None)
    return randomize_layernorms(model, seed).eval()


def tiny_qwen3(seed=0, hidden=32, heads=4, kv_heads=2, mlp=48, layers=2, window=None, full=0, bias=False):
    """A tiny Qwen3 (grouped-query attention with RMSNorms on each head's queries and keys), weights and
    every norm's gain drawn as tiny_llama's; `window`: sliding windows in the layers from `full` on."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sliding = dict(use_sliding_window=window is not None, sliding_window=window, max_window_layers=full)
    sizes = (hidden, heads, kv_heads, mlp, layers)
    extra = dict(head_dim=hidden // heads, attention_bias=bias, **sliding)
    return _causal_lm((Qwen3Config, Qwen3ForCausalLM), seed, 1.0, *sizes, **extra)


def tiny_gemma2(seed=0, hidden=16, heads=4, kv_heads=2, head_dim=8, mlp=24, layers=2, window=4, bias=False):
    """A tiny Gemma 2: sandwich norms (gains around 1, stored less one), soft caps small enough to bend
    the scores and logits, a query scale of its own and sliding windows in every other layer (from the
    first) shorter than inputs_for's sequences."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    sizes = (hidden, heads, kv_heads, mlp, layers)
    caps = dict(attn_logit_softcapping=4.0, final_logit_softcapping=5.0)
    extra = dict(head_dim=head_dim, query_pre_attn_scalar=12, sliding_window=window, attention_bias=bias, **caps)
    return _causal_lm(
        (Gemma2Config, Gemma2ForCausalLM), seed, 0.0, *sizes, tie_word_embeddings=True, pad_token_id=None, **extra
    )


def tiny_mixtral(seed=0, hidden=32, heads=4, kv_heads=2, mlp=16, experts=4, top_k=2, layers=2, window=None):
    """A tiny Mixtral (grouped-query attention, a mixture of `experts` SwiGLU experts, `top_k` per token),
    weights and every norm's gain drawn as tiny_llama's (random routers: no ties between experts);
    `window`: a sliding window in every layer."""
    from transformers import MixtralConfig, MixtralForCausalLM

    sizes = (hidden, heads, kv_heads, mlp, layers)
    extra = dict(head_dim=hidden // heads, num_local_experts=experts, num_experts_per_tok=top_k)
    return _causal_lm((MixtralConfig, MixtralForCausalLM), seed, 1.0, *sizes, sliding_window=window, **extra)


def tiny_olmo2(seed=0, hidden=32, heads=4, kv_heads=2, mlp=48, layers=2, bias=False):
    """A tiny OLMo-2 (norms only after the sublayers, one norm over all heads' queries and one over all
    keys), weights and every norm's gain drawn as tiny_llama's."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    sizes = (hidden, heads, kv_heads, mlp, layers)
    return _causal_lm((Olmo2Config, Olmo2ForCausalLM), seed, 1.0, *sizes, attention_bias=bias, pad_token_id=None)


def tiny_qwen2_moe(seed=0, hidden=32, heads=4, kv_heads=2, mlp=16, experts=4, top_k=2, layers=2, norm=False):
    """A tiny Qwen2-MoE (Qwen2's attention with biases, `experts` SwiGLU experts, `top_k` per token, a shared
    expert of 24 units behind its sigmoid gate), weights and norm gains drawn as tiny_llama's; `norm`:
    norm_topk_prob. Sliding windows in every other layer (window 4)."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    sizes = (hidden, heads, kv_heads, mlp, layers)
    moe = dict(moe_intermediate_size=mlp, shared_expert_intermediate_size=24, num_experts=experts)
    moe |= dict(num_experts_per_tok=top_k, norm_topk_prob=norm)
    sliding = dict(use_sliding_window=True, sliding_window=4, max_window_layers=layers)
    return _causal_lm((Qwen2MoeConfig, Qwen2MoeForCausalLM), seed, 1.0, *sizes, **moe, **sliding)


def tiny_gemma3(seed=0, hidden=16, heads=4, kv_heads=2, head_dim=8, mlp=24, layers=2, window=4, scaling=None):
    """A tiny Gemma 3 text model: Gemma 2's sandwich norms, RMSNorms on each head's queries and keys (gains
    around 1, stored less one), sliding windows in every other layer (from the first) with a rotary base of
    their own, `scaling`: a rotary scaling of the global layers."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    full = {"rope_type": "default", "rope_theta": 1000.0, **(scaling or {})}
    rope = {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    sizes = (hidden, heads, kv_heads, mlp, layers)
    extra = dict(head_dim=head_dim, query_pre_attn_scalar=12, sliding_window=window, layer_types=types)
    extra |= dict(rope_parameters=rope, tie_word_embeddings=True, pad_token_id=None)
    return _causal_lm((Gemma3TextConfig, Gemma3ForCausalLM), seed, 0.0, *sizes, **extra)


def tiny_qwen3_moe(seed=0, hidden=32, heads=4, kv_heads=2, mlp=16, experts=4, top_k=2, layers=2, norm=True):
    """A tiny Qwen3-MoE (RMSNorms on each head's queries and keys, `experts` SwiGLU experts, `top_k` per
    token; `norm`: norm_topk_prob), weights and every norm's gain drawn as tiny_llama's; a sliding window of 4
    in every layer."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    sizes = (hidden, heads, kv_heads, mlp, layers)
    moe = dict(moe_intermediate_size=mlp, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm)
    sliding = dict(use_sliding_window=True, sliding_window=4)
    extra = dict(head_dim=hidden // heads, **moe, **sliding)
    return _causal_lm((Qwen3MoeConfig, Qwen3MoeForCausalLM), seed, 1.0, *sizes, **extra)


def tiny_olmoe(seed=0, hidden=32, heads=4, kv_heads=2, mlp=16, experts=4, top_k=2, layers=2, norm=False):
    """A tiny OLMoE (one RMSNorm over all heads' queries and one over all keys, `experts` SwiGLU experts,
    `top_k` per token; `norm`: norm_topk_prob), weights and every norm's gain drawn as tiny_llama's."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    sizes = (hidden, heads, kv_heads, mlp, layers)
    moe = dict(num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm)
    return _causal_lm((OlmoeConfig, OlmoeForCausalLM), seed, 1.0, *sizes, pad_token_id=None, **moe)
