"""The files an exported folder holds by name: what save_pretrained writes for a tokenizer (fast or slow; never
code), and beside them the model's config, glmc's export record and the weights' index. Export copies the
tokenizer's; `overwrite=true` removes exactly these from a replaced run's export folders."""

from __future__ import annotations

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# an export's model card, README.md, is not among them: overwrite=true removes it only where it is glmc's
# (glmc.pipeline.previous_outputs), never a README.md the user put there
EXPORT_FILES = (
    "config.json",
    "generation_config.json",
    "glmc_export.json",
    "model.safetensors.index.json",
    *TOKENIZER_FILES,
    "chat_template.jinja",
)
