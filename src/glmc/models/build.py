"""Build the Hugging Face models we train from a ModelConfig; nothing is downloaded."""

from __future__ import annotations

from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, ViTConfig, ViTForImageClassification

from glmc.config import ModelConfig


def build_vit(cfg: ModelConfig) -> ViTForImageClassification:
    config = ViTConfig(
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        num_channels=cfg.num_channels,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.mlp_size,
        hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
        layer_norm_eps=cfg.layer_norm_eps,
        qkv_bias=cfg.qkv_bias,
        num_labels=cfg.num_labels,
    )
    return ViTForImageClassification(config)


def build_gpt2(cfg: ModelConfig) -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.max_positions,
        n_embd=cfg.hidden_size,
        n_layer=cfg.num_layers,
        n_head=cfg.num_heads,
        n_inner=cfg.mlp_size,
        activation_function=cfg.hidden_act,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_eps,
        # GPT-2's BOS/EOS id 50256 exists only in its own vocabulary; a character vocabulary has none
        bos_token_id=50256 if cfg.vocab_size > 50256 else None,
        eos_token_id=50256 if cfg.vocab_size > 50256 else None,
    )
    return GPT2LMHeadModel(config)


BUILDERS = {"vit": build_vit, "gpt2": build_gpt2}


def build_model(cfg: ModelConfig) -> nn.Module:
    if cfg.family not in BUILDERS:
        raise ValueError(f"model.family={cfg.family!r} is not one of {sorted(BUILDERS)}")
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"model.hidden_size={cfg.hidden_size} is not divisible by model.num_heads={cfg.num_heads}")
    return BUILDERS[cfg.family](cfg)
