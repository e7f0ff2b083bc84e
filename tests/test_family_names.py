"""Only the families package names a model family or a Hugging Face model class.

Everything else reads roles (glmc.models.families.roles) and asks the registry, so that a new family is
one module, one registry line and one model YAML. The allow-list holds what must stay: the config choices and the GPT-2
tokenizer, a kind of data rather than of model.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from glmc.models.families import family_named, family_names

SRC = Path(__file__).resolve().parents[1] / "src" / "glmc"
FAMILIES = SRC / "models" / "families"
# file -> the names it may mention, and why
ALLOWED = {
    "choices.py": {"gpt2"},  # the config's choice of tokenizer
    "data/text.py": {"gpt2"},  # data.tokenizer=gpt2, the byte-level BPE tokenizer
    "data/bookcorpus.py": {"gpt2"},  # the same tokenizer
}


def _hf_class_pattern() -> re.Pattern:
    """Class names that start like a family's HF classes (ViT..., GPT2...) followed by a capital."""
    classes = [c for name in family_names() for c in family_named(name).hf_classes]
    stems = {re.match(r"(.+?)(For|LM|Model)", c).group(1) for c in classes}
    return re.compile(r"\b(?:" + "|".join(sorted(stems)) + r")[A-Z]\w*")


def mentions(path: Path) -> set[str]:
    """Family names used as string constants and HF model or config classes named anywhere in the code
    (docstrings and comments are prose and may name them)."""
    hf = _hf_class_pattern()
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found |= {name for name in family_names() if node.value == name}
            found |= {m.group(0) for m in hf.finditer(node.value)}
        elif isinstance(node, ast.Name):
            found |= {m.group(0) for m in hf.finditer(node.id)}
        elif isinstance(node, ast.alias):
            found |= {m.group(0) for m in hf.finditer(node.name)}
    return found


def test_only_the_families_name_a_family_or_an_hf_class():
    offenders = {}
    for path in sorted(SRC.rglob("*.py")):
        if FAMILIES in path.parents:
            continue
        rel = path.relative_to(SRC).as_posix()
        bad = mentions(path) - ALLOWED.get(rel, set())
        if bad:
            offenders[rel] = sorted(bad)
    assert not offenders, f"family names or HF classes outside glmc.models.families: {offenders}"


def test_the_check_sees_names(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('from transformers import GPT2LMHeadModel\nif family == "vit":\n    cfg = ViTConfig()\n')
    assert mentions(sample) == {"GPT2LMHeadModel", "vit", "ViTConfig"}
    assert mentions(FAMILIES / "vit.py") >= {"ViTForImageClassification", "ViTConfig"}
