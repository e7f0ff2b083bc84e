"""The BERT family: Hugging Face BertForMaskedLM / BertForSequenceClassification <-> canonical Transformer.

Post-norm encoders keep their LayerNorms as canonical tensors: the stream is a LayerNorm's output, so
only permutations of it are symmetries. Embedding: embed.tokens, embed.pos, embed.types (row 0 added)
and the embedding LayerNorm embed.norm_w, norm_b. Heads by the config's pooling: masked-LM ("none":
head.dense_*, activation, head.norm_*, head.w, head.b, untied) or classification ("cls": the pooler
head.dense_*, tanh, head.w, head.b). RoBERTa (roberta.py) shares this layout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

from glmc.models.canonical import ACTIVATIONS, CanonicalConfig, CanonicalTransformer, layer_norm
from glmc.models.export import check_model, check_template, fresh, set_modules, set_param, set_qkv
from glmc.models.families.base import Family, encoder_sizes
from glmc.models.families.fold import StoredAs, common_eps
from glmc.models.families.roles import HEAD_HIDDEN, Acts, Role, writer

# model.head -> the data task it trains on
TASK_HEADS = {"mlm": "masked_lm", "classification": "classification"}


def _head(name: str, *acts: Acts, reads: str | None = None, bias: str | None = None) -> Role:
    return Role(name, "head", acts, reads=reads, bias=bias)


# the head's first map writes its own hidden state; the activation (and the masked-LM head's LayerNorm)
# commute with permutations of it, so HEAD_HIDDEN is a symmetry space, read by the output map
_DENSE = (
    _head("head.dense_w", Acts("residual", 1, "in"), Acts(HEAD_HIDDEN, 0, "out"), reads="final", bias="head.dense_b"),
    _head("head.dense_b", Acts(HEAD_HIDDEN, 0, "out")),
)
_OUT = (_head("head.w", Acts(HEAD_HIDDEN, 1, "in"), reads="head.hidden", bias="head.b"), _head("head.b"))
_NORM = (_head("head.norm_w", Acts(HEAD_HIDDEN, 0, "out")), _head("head.norm_b", Acts(HEAD_HIDDEN, 0, "out")))
MLM_HEAD = (*_DENSE, *_NORM, *_OUT)
CLASSIFICATION_HEAD = (*_DENSE, *_OUT)


class BertFamily(Family):
    name = "bert"
    model_types = ("bert",)
    hf_classes = ("BertForMaskedLM", "BertForSequenceClassification")
    data_kind = "text"
    tasks = tuple(TASK_HEADS.values())
    shared_model_keys = ("vocab_size", "max_positions", "head", "num_labels", "type_vocab_size")
    model_keys = ("vocab_size", "max_positions", "head", "num_labels", "type_vocab_size")
    residual_classes = ("permutation",)
    norm = "post"
    task_heads = TASK_HEADS
    embed_roles = (
        writer("embed.tokens", 1, vocab_rows=True),
        writer("embed.pos", 1),
        writer("embed.types", 1),
        writer("embed.norm_w", 0),
        writer("embed.norm_b", 0),
    )

    # ---- what RoBERTa changes ----
    def base(self, hf: nn.Module) -> nn.Module:
        return hf.bert

    def mlm_modules(self, hf: nn.Module) -> tuple[nn.Linear, nn.LayerNorm, nn.Linear]:
        t = hf.cls.predictions.transform
        return t.dense, t.LayerNorm, hf.cls.predictions.decoder

    def classifier_modules(self, hf: nn.Module) -> tuple[nn.Linear, nn.Linear]:
        return hf.bert.pooler.dense, hf.classifier

    def mlm_activation(self, config: CanonicalConfig) -> str:
        return config.activation  # BERT's transform uses hidden_act

    def position_table(self, hf: nn.Module) -> Tensor:
        return self.base(hf).embeddings.position_embeddings.weight

    def write_positions(self, hf: nn.Module, pos: Tensor) -> None:
        set_param(self.position_table(hf), pos, "embed.pos")

    def positions(self, config: CanonicalConfig, inputs: Tensor) -> Tensor:
        return torch.arange(inputs.shape[1], device=inputs.device)

    def pad_token_id(self, hf_config: Any) -> int | None:
        return None

    def hf_class(self, head: str) -> type:
        return BertForMaskedLM if head == "mlm" else BertForSequenceClassification

    def hf_config(self, cfg: Any, **common) -> Any:
        return BertConfig(**common, max_position_embeddings=cfg.max_positions, pad_token_id=0)

    # ---- building and conversion ----
    def build(self, cfg) -> nn.Module:
        if cfg.head not in TASK_HEADS:
            raise ValueError(f"model.head={cfg.head!r} is not one of {', '.join(TASK_HEADS)}")
        config = self.hf_config(
            cfg,
            vocab_size=cfg.vocab_size,
            **encoder_sizes(cfg),
            type_vocab_size=cfg.type_vocab_size,
            layer_norm_eps=cfg.layer_norm_eps,
            num_labels=cfg.num_labels,
        )
        return self.hf_class(cfg.head)(config)

    def head_of(self, hf: nn.Module) -> str:
        """ "mlm" or "classification", from the HF class (TypeError for another one)."""
        name = type(hf).__name__
        if name not in self.hf_classes:
            raise TypeError(f"the {self.name} family converts {', '.join(self.hf_classes)}, not {name}")
        return "mlm" if name.endswith("MaskedLM") else "classification"

    @torch.no_grad()
    def to_canonical(self, hf: nn.Module) -> CanonicalTransformer:
        cfg, base = hf.config, self.base(hf)
        head = self.head_of(hf)
        if cfg.is_decoder or getattr(cfg, "add_cross_attention", False):
            raise NotImplementedError(f"{type(hf).__name__} as a decoder or with cross-attention")
        if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
            raise NotImplementedError(f"position_embedding_type={cfg.position_embedding_type!r}")
        emb, D, H = base.embeddings, cfg.hidden_size, cfg.num_attention_heads
        dh, dtype = D // H, emb.word_embeddings.weight.dtype
        g = lambda t: t.detach().double()  # noqa: E731  convert in float64, cast back per tensor (StoredAs)
        p = StoredAs(dtype)
        p |= {
            "embed.tokens": g(emb.word_embeddings.weight),
            "embed.pos": g(self.position_table(hf)),
            "embed.types": g(emb.token_type_embeddings.weight),
            "embed.norm_w": g(emb.LayerNorm.weight),
            "embed.norm_b": g(emb.LayerNorm.bias),
        }
        norms = [emb.LayerNorm]
        for i, layer in enumerate(base.encoder.layer):
            att, pre = layer.attention.self, f"blocks.{i}."
            for name, lin, scale in (("q", att.query, dh**-0.5), ("k", att.key, 1.0), ("v", att.value, 1.0)):
                p[pre + name + "_w"] = (scale * g(lin.weight)).reshape(H, dh, D)
                p[pre + name + "_b"] = (scale * g(lin.bias)).reshape(H, dh)
            out = layer.attention.output
            p[pre + "o_w"] = g(out.dense.weight).reshape(D, H, dh).permute(1, 0, 2)
            p[pre + "o_b"] = g(out.dense.bias)
            p[pre + "ln1_w"], p[pre + "ln1_b"] = g(out.LayerNorm.weight), g(out.LayerNorm.bias)
            p[pre + "in_w"], p[pre + "in_b"] = g(layer.intermediate.dense.weight), g(layer.intermediate.dense.bias)
            p[pre + "out_w"], p[pre + "out_b"] = g(layer.output.dense.weight), g(layer.output.dense.bias)
            p[pre + "ln2_w"], p[pre + "ln2_b"] = g(layer.output.LayerNorm.weight), g(layer.output.LayerNorm.bias)
            norms += [out.LayerNorm, layer.output.LayerNorm]
        if head == "mlm":
            dense, norm, decoder = self.mlm_modules(hf)
            p["head.norm_w"], p["head.norm_b"] = g(norm.weight), g(norm.bias)
            norms.append(norm)
        else:
            dense, decoder = self.classifier_modules(hf)
        p["head.dense_w"], p["head.dense_b"] = g(dense.weight), g(dense.bias)
        p["head.w"], p["head.b"] = g(decoder.weight), g(decoder.bias)
        config = CanonicalConfig(
            family=self.name,
            activation=cfg.hidden_act,
            norm_eps=common_eps(norms),
            norm_dim=D,
            causal=False,
            pooling="none" if head == "mlm" else "cls",
            pad_token_id=self.pad_token_id(cfg),
        )
        return CanonicalTransformer(config, dict(p), copy=False)

    @torch.no_grad()
    def to_hf(self, model: CanonicalTransformer, template: nn.Module) -> nn.Module:
        params = check_model(model, self.name)
        p = lambda n: params[n].double()  # noqa: E731
        cfg, head = template.config, self.head_of(template)
        if head != ("mlm" if model.config.pooling == "none" else "classification"):
            raise ValueError(f"a {model.task} model cannot be written into a {type(template).__name__} template")
        H = cfg.num_attention_heads
        dh = model.width // H
        check_template(model, cfg.hidden_act, "hidden_size", cfg.hidden_size, (cfg.num_hidden_layers, H, dh))
        # head.w differs from the token embedding after any merge: the masked-LM decoder must not be tied
        hf = fresh(template, layer_norm_eps=model.config.norm_eps, tie_word_embeddings=False)
        base = self.base(hf)
        emb = base.embeddings
        set_param(emb.word_embeddings.weight, p("embed.tokens"), "embed.tokens")
        self.write_positions(hf, p("embed.pos"))
        set_param(emb.token_type_embeddings.weight, p("embed.types"), "embed.types")
        set_modules(p, {"embed.norm_": emb.LayerNorm})
        for i, layer in enumerate(base.encoder.layer):
            att, out, pre = layer.attention.self, layer.attention.output, f"blocks.{i}."
            set_qkv(p, pre, ((att.query, dh**-0.5), (att.key, 1.0), (att.value, 1.0)))
            set_param(out.dense.weight, p(pre + "o_w").permute(1, 0, 2).flatten(1), pre + "o_w")
            set_param(out.dense.bias, p(pre + "o_b"), pre + "o_b")
            ffn = {pre + "in_": layer.intermediate.dense, pre + "out_": layer.output.dense}
            set_modules(p, {pre + "ln1_": out.LayerNorm, **ffn, pre + "ln2_": layer.output.LayerNorm})
        if head == "mlm":
            dense, norm, decoder = self.mlm_modules(hf)
            if decoder.weight is emb.word_embeddings.weight:
                raise ValueError(f"the exported {type(hf).__name__} still ties its decoder to the token embedding")
            set_modules(p, {"head.norm_": norm})
        else:
            dense, decoder = self.classifier_modules(hf)
        set_modules(p, {"head.dense_": dense, "head.": decoder})
        return hf

    # ---- the forward's family parts ----
    def heads(self, config: CanonicalConfig) -> tuple[Role, ...]:
        return CLASSIFICATION_HEAD if config.pooling == "cls" else MLM_HEAD

    def embed(self, config: CanonicalConfig, p: dict[str, Tensor], inputs: Tensor) -> Tensor:
        limit = self.input_limits(p)["positions"]
        if inputs.shape[1] > limit:
            raise ValueError(f"{inputs.shape[1]} tokens but the model has {limit} positions")
        x = p["embed.tokens"][inputs] + p["embed.pos"][self.positions(config, inputs)] + p["embed.types"][0]
        return layer_norm(x, p["embed.norm_w"], p["embed.norm_b"], config.norm_eps)

    def head(self, config: CanonicalConfig, p: dict[str, Tensor], x: Tensor, record) -> Tensor:
        if config.pooling == "cls":
            h = torch.tanh(F.linear(x[:, 0], p["head.dense_w"], p["head.dense_b"]))
        else:
            h = ACTIVATIONS[self.mlm_activation(config)](F.linear(x, p["head.dense_w"], p["head.dense_b"]))
            h = layer_norm(h, p["head.norm_w"], p["head.norm_b"], config.norm_eps)
        record("head.hidden", h)
        return F.linear(h, p["head.w"], p["head.b"])

    # ---- the input side ----
    def input_limits(self, params) -> dict[str, Any]:
        limits = {"positions": params["embed.pos"].shape[0], "vocab": params["embed.tokens"].shape[0]}
        if "head.norm_w" not in params:
            limits["classes"] = params["head.w"].shape[0]
        return limits

    def hf_input_limits(self, hf_config) -> dict[str, Any]:
        return {"positions": hf_config.max_position_embeddings, "vocab": hf_config.vocab_size}

    def input_properties(self, config, params):
        yield "has {} positions", params["embed.pos"].shape[0]
        yield "has a vocabulary of {} tokens", params["embed.tokens"].shape[0]
        yield "has {} token types", params["embed.types"].shape[0]
        yield "has {} outputs", params["head.w"].shape[0]


FAMILY = BertFamily()
