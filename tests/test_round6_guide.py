"""What a newcomer following docs/adding-a-family.md meets: the family kit's symmetry tests on a model with
one query head per key/value head (no qheads space of size 1, matchers that do without it), a docs word
bound that new registry entries do not count toward, export's head-bias refusal naming the family, and a
guide that names what a family's tests and conversion need."""

from __future__ import annotations

import ast
import dataclasses
import re
from functools import partial
from pathlib import Path

import pytest
import torch

from glmc.interpolation import interpolate
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.canonical import CanonicalConfig
from glmc.models.export import export_hf, head_bias_offset
from glmc.symmetry import SymmetrySpec, Transform, apply
from glmc.symmetry.embed_width import embed_width, layer_sizes

from family_checks import (
    GATED_MLP,
    MULTI_HEAD,
    ROTARY_QK,
    STREAM,
    VO,
    alignment_tests,
    canonical_fixture,
    symmetry_tests,
)
from numeric import FORWARD, assert_close_rel
from tiny_hf import tiny_gpt_neox, tiny_llama

# a Llama whose key/value heads equal its query heads: grouped attention with groups of one
ONE_PER_GROUP = dict(heads=4, kv_heads=4, hidden=16, mlp=24, layers=1)
CASES = STREAM | MULTI_HEAD | ROTARY_QK | VO | GATED_MLP

canonical = canonical_fixture(tiny_llama, **ONE_PER_GROUP)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)
pair, test_alignment_keeps_b = alignment_tests(
    partial(tiny_llama, **ONE_PER_GROUP), mapped={"heads", "vo"}, unmapped={"qheads"}
)


def test_no_query_heads_space_of_size_one(canonical):
    model, _ = canonical
    spec = SymmetrySpec.from_model(model)
    assert not spec.names("qheads")
    # asking for query-head permutations samples nothing rather than an identity
    assert not Transform.sample(spec, {"qheads": "permutation"}, torch.Generator().manual_seed(0))


def test_grouped_query_model_keeps_its_query_heads_space():
    model = to_canonical(tiny_llama(heads=4, kv_heads=2, hidden=16, mlp=24, layers=1))
    assert [s.size for s in SymmetrySpec.from_model(model) if s.kind == "qheads"] == [2]


def test_weight_matching_recovers_heads_without_a_query_heads_space(canonical):
    model, x = canonical
    classes = {"heads": "permutation", "vo": "orthogonal_scale", "mlp": "permutation"}
    b = apply(Transform.sample(SymmetrySpec.from_model(model), classes, torch.Generator().manual_seed(3)), model)
    transform, _ = weight_matching(model, b, dtype=torch.float64)
    assert "heads.0" in transform and "qheads.0" not in transform
    with torch.no_grad():
        assert_close_rel(apply(transform, b)(x), b(x), FORWARD, "aligned B vs B")


def test_width_embedding_grows_one_query_head_per_group(canonical):
    """embed_width still pads the query-head axis that no space is built for."""
    model, x = canonical
    wide = embed_width(model, model.width + 4, qheads=3)
    assert layer_sizes(wide)["qheads"] == [3] and [
        s.size for s in SymmetrySpec.from_model(wide).spaces.values() if s.kind == "qheads"
    ] == [3]
    with torch.no_grad():
        assert_close_rel(wide(x), model(x), FORWARD, "embedded vs original logits")


def test_a_new_family_adds_no_counted_doc_words():
    """The entries a new family adds to the lists that test_docs_match_registries checks (README's family
    sentence, design.md's registry row, architectures.md's table) are not counted toward the word bound;
    a sentence of prose is."""
    from test_docs_match_registries import ROOT, counted_words

    row = (
        "| `newf` | NewFForCausalLM (`newf`) | orthogonal, permutation | as GPT-NeoX | as GPT-NeoX | permutation | — |"
    )
    edits = {
        "README.md": lambda t: t.replace("`gpt_neox`:", "`gpt_neox`, `newf`:", 1),
        "docs/design.md": lambda t: t.replace("`gpt_neox` (", "`gpt_neox`, `newf` (", 1),
        "docs/architectures.md": lambda t: t.replace("\n| `opt` |", f"\n{row}\n| `opt` |", 1),
    }
    for page, edit in edits.items():
        text = (ROOT / page).read_text(encoding="utf-8")
        grown = edit(text)
        assert grown != text and "newf" in grown, page
        assert counted_words(page, grown) == counted_words(page, text), page
        prose = grown + "\nA new family explained in eight more words.\n"
        assert counted_words(page, prose) == counted_words(page, text) + 8, page


def test_head_bias_offset_names_the_family_that_lacks_a_head_bias():
    w, b = torch.randn(12, 4, generator=torch.Generator().manual_seed(0)).double(), torch.linspace(-1, 1, 12).double()
    with pytest.raises(ValueError, match=r"a gptj model's output head has no bias.*no gptj equivalent") as err:
        head_bias_offset(w, b, "gptj")
    assert "GPT-2" not in str(err.value) and "merge.export=false" in str(err.value)
    beta = head_bias_offset(w, w @ torch.ones(4, dtype=w.dtype), "gptj")  # in the column space: carried
    assert torch.allclose(w @ beta, w @ torch.ones(4, dtype=w.dtype))


def test_a_merged_gpt_neox_export_is_refused_naming_gpt_neox(tmp_path):
    a, b = to_canonical(tiny_gpt_neox(seed=0, layers=1)), to_canonical(tiny_gpt_neox(seed=1, layers=1))
    merged = interpolate([a, b], [0.5, 0.5])  # vocabulary 53 > width 32: the mean head bias leaves head.w's span
    with pytest.raises(ValueError, match="a gpt_neox model's output head has no bias") as err:
        export_hf(merged, a.source, tmp_path / "out")
    assert "GPT-2" not in str(err.value)


GUIDE = Path(__file__).resolve().parents[1] / "docs" / "adding-a-family.md"
TESTS = Path(__file__).resolve().parent


def test_the_guide_names_every_helper_and_group_of_the_family_kit():
    """Each function and (space, class) group a family's test module can take from tests/family_checks.py."""
    tree = ast.parse((TESTS / "family_checks.py").read_text())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    groups = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if t.id.isupper()}
    guide = GUIDE.read_text()
    missing = sorted(name for name in functions | groups if f"`{name}" not in guide)
    assert not missing, f"docs/adding-a-family.md does not name these of tests/family_checks.py: {missing}"


def test_the_guide_names_every_test_module_run_over_every_family():
    """A new family joins these modules' runs: the guide says what each needs of it."""
    over_all = re.compile(r'parametrize\("family", \[?[^\n]*\bfamily_names\(\)')
    runs = sorted(p.name for p in TESTS.glob("test_*.py") if over_all.search(p.read_text()))
    assert {"test_lean_endpoints.py", "test_model_keys.py", "test_pretrained_endpoints.py"} <= set(runs)
    guide = GUIDE.read_text()
    missing = [name for name in runs if f"tests/{name}" not in guide]
    assert not missing, f"docs/adding-a-family.md does not name these tests run over every family: {missing}"


def test_the_guides_canonical_settings_are_config_fields():
    """The CanonicalConfig settings the guide lists exist, GPT-NeoX's parallel residual and odd rotary counts
    among them; rotary pairs that differ from the canonical ones are a row order, not a block kind."""
    guide = " ".join(GUIDE.read_text().split())
    paragraph = re.search(r"The shared blocks' settings travel in `CanonicalConfig`(.*?)The canonical rotary", guide)
    assert paragraph, "docs/adding-a-family.md lost its paragraph on CanonicalConfig's settings"
    listed = set(re.findall(r"`(\w+)`", paragraph.group(1)))
    fields = {f.name for f in dataclasses.fields(CanonicalConfig)}
    assert listed <= fields, f"not CanonicalConfig fields: {sorted(listed - fields)}"
    assert {"parallel_residual", "rotary_freq_dim", "rotary_dims", "rope_theta"} <= listed
    assert "GPT-J" in guide and "needs no new block" in guide
