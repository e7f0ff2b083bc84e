"""The pairwise matchers on a tiny ViT pair and a tiny GPT-2 pair: the loss along each aligned path.

`python tests/pinned_alignments.py` writes tests/data/pinned_alignments.json; test_pinned_alignments
recomputes the same numbers and compares. A change of structure must leave them as they are; a change
that means to alter a method's result regenerates the file in the same commit and says why.

The models are float64, so the numbers do not depend on the CPU's vector width or thread count.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import glmc  # noqa: E402

from tiny_hf import tiny_gpt2, tiny_vit  # noqa: E402

PINNED = Path(__file__).resolve().parent / "data" / "pinned_alignments.json"
LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)
# the pairwise methods of distinct kinds (activation_orth, learned_perm and learned_sinkhorn are variants
# of activation and learned), with few steps so the test stays cheap
METHODS = {
    "vanilla": {},
    "canonical": {},
    "weight_perm": {},
    "weight": {},
    "activation": {},
    "rotation": {},
    "learned": {"max_steps": 3},
}


def _pair(kind: str):
    if kind == "vit":
        models = [tiny_vit(seed=s).double() for s in (0, 1)]
        g = torch.Generator().manual_seed(7)
        inputs = torch.randn(8, 1, 8, 8, generator=g, dtype=torch.float64)
        targets = torch.randint(0, 10, (8,), generator=g)
        return models, inputs, targets, "classification"
    models = [tiny_gpt2(seed=s).double() for s in (0, 1)]
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 97, (8, 12), generator=g)
    return models, tokens[:, :-1], tokens[:, 1:], "causal_lm"


def compute(kind: str) -> dict[str, list[float]]:
    """method -> the loss at each of LAMBDAS along A's path to the aligned B."""
    (hf_a, hf_b), inputs, targets, task = _pair(kind)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=4)
    out = {}
    for method, options in METHODS.items():
        torch.manual_seed(0)
        alignment = glmc.align(hf_a, hf_b, method, data=loader, trainer={"accelerator": "cpu"}, **options)
        path = glmc.evaluate_path(alignment, None, loader, LAMBDAS, task=task, progress=False)
        out[method] = [float(x) for x in path["loss"]]
    return out


def main() -> None:
    PINNED.parent.mkdir(exist_ok=True)
    results = {kind: compute(kind) for kind in ("vit", "gpt2")}
    PINNED.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
