"""The model families the symmetry and matcher tests run on, one tiny random builder each (tests/tiny_hf.py):
parametrize a test over `FAMILIES` and build its models with `FAMILIES[name](seed=...)`.

These are the pre-LN families, whose residual stream admits orthogonal maps; the post-norm (BERT,
RoBERTa) and rotary (Llama) families have test files of their own.
"""

from tiny_hf import tiny_gpt2, tiny_vit

FAMILIES = {"vit": tiny_vit, "gpt2": tiny_gpt2}
