"""The symmetry audit (glmc.symmetries): over every registered family no candidate map that keeps the function
is left out of glmc's group and every declared class keeps it; a class removed from a kind's declaration is
found as a hole, named; a class declared where it changes the function is found as a bug; the command line
reads a save_pretrained folder and exits non-zero on a hole; docs/architectures.md lists each family's group
as the audit prints it."""

from __future__ import annotations

import dataclasses
import re
from functools import cache
from pathlib import Path

import pytest

import glmc
from glmc.models.blocks import moe, registry, sandwich
from glmc.models.families import family_names
from glmc.models.families.roles import Acts
from glmc.symmetries import main
from glmc.symmetry.audit import NOT_SYMMETRY, NOT_USED, USED

import tiny_hf

pytestmark = pytest.mark.numeric

DOCS = Path(__file__).resolve().parents[1] / "docs" / "architectures.md"

# a tiny model of each registered family: a family added without one here fails the first test
BUILDERS = {
    "vit": tiny_hf.tiny_vit,
    "gpt2": tiny_hf.tiny_gpt2,
    "bert": lambda: tiny_hf.tiny_encoder("bert"),
    "roberta": lambda: tiny_hf.tiny_encoder("roberta"),
    "llama": tiny_hf.tiny_llama,
    "gemma": tiny_hf.tiny_gemma,
    "gemma2": tiny_hf.tiny_gemma2,
    "gemma3": tiny_hf.tiny_gemma3,
    "qwen3": tiny_hf.tiny_qwen3,
    "olmo2": tiny_hf.tiny_olmo2,
    "mixtral": tiny_hf.tiny_mixtral,
    "qwen2_moe": tiny_hf.tiny_qwen2_moe,
    "qwen3_moe": tiny_hf.tiny_qwen3_moe,
    "olmoe": tiny_hf.tiny_olmoe,
    "opt": tiny_hf.tiny_opt,
    "gpt_neox": tiny_hf.tiny_gpt_neox,
}


@cache
def model(family: str):
    return glmc.to_canonical(BUILDERS[family]())


def test_every_registered_family_has_a_tiny_model_here():
    assert set(BUILDERS) == set(family_names())


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_the_audit_finds_no_hole_and_no_bug(family):
    audit = glmc.symmetries(model(family))
    assert audit.family == family
    assert audit.ok, str(audit)
    # the stream is always audited, and a generator keeps the logits to float64 round-off
    assert {f.what for f in audit.candidates} >= {"stream permutations", "stream sign flips", "stream rotations"}
    assert all(f.deviation < 1e-8 for f in audit.generators)


@pytest.fixture
def redeclared(monkeypatch):
    """Replaces a kind's declaration for one test: redeclare(module, **changes)."""

    def redeclare(module, **changes):
        monkeypatch.setattr(module, "KIND", dataclasses.replace(module.KIND, **changes))
        registry.block_kind.cache_clear()

    yield redeclare
    monkeypatch.undo()
    registry.block_kind.cache_clear()


def test_a_residual_class_removed_from_the_sandwich_norms_is_a_hole_named(redeclared):
    redeclared(sandwich, residual_classes=frozenset({"permutation"}))
    audit = glmc.symmetries(model("olmo2"))
    holes = {f.what: f.cls for f in audit.holes}
    assert holes == {"stream sign flips": "sign_flips", "stream signed permutations": "signed_permutation"}
    assert "hole: stream sign flips (residual, sign_flips)" in str(audit)


def test_expert_scales_removed_from_the_mixture_are_a_hole_named(redeclared):
    roles = tuple(dataclasses.replace(r, acts=tuple(a for a in r.acts if a.space != "expert_scale")) for r in moe.ROLES)
    redeclared(moe, roles=roles)
    holes = [f.what for f in glmc.symmetries(model("mixtral")).holes]
    assert holes == ["expert up/down scales"]


def test_a_declared_class_that_changes_the_function_is_a_bug(redeclared):
    # each expert's scale declared on its gate rows too: SiLU(c z) is not c SiLU(z)
    scaled_gate = Acts("expert_scale", 1, "out", head_axis=0)
    roles = tuple(
        dataclasses.replace(r, acts=(*r.acts, scaled_gate)) if r.name.endswith("expert_gate_w") else r
        for r in moe.ROLES
    )
    redeclared(moe, roles=roles)
    audit = glmc.symmetries(model("mixtral"))
    assert [f.what for f in audit.bugs] == ["expert_scale: diagonal"]
    assert not audit.ok and "bug: expert_scale: diagonal is declared but changes the function" in str(audit)


def test_the_command_line_reads_a_folder_and_exits_non_zero_on_a_hole(tmp_path, capsys, redeclared):
    folder = tmp_path / "olmo2"
    tiny_hf.tiny_olmo2().save_pretrained(folder)
    assert main([str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "symmetry audit of a olmo2 model" in printed and "no hole" in printed
    redeclared(sandwich, residual_classes=frozenset({"permutation"}))
    assert main([str(folder)]) == 1
    assert "hole: stream sign flips" in capsys.readouterr().out


def test_a_folder_that_is_not_there_is_named(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main([str(missing)]) == 2
    assert f"error: {missing}: no such folder" in capsys.readouterr().err


def _documented_groups() -> dict[str, str]:
    """family -> its group as the table in docs/architectures.md writes it."""
    text = DOCS.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \|$", text.split("<!-- audit groups -->")[1], re.M)
    return dict(rows)


def test_the_docs_list_each_familys_group_as_the_audit_prints_it():
    documented = _documented_groups()
    assert set(documented) == set(BUILDERS)
    for family in BUILDERS:
        assert documented[family] == glmc.symmetries(model(family)).group_line(), family


def test_statuses_are_the_three_the_docs_name():
    assert (USED, NOT_USED, NOT_SYMMETRY) == ("symmetry used", "symmetry not used", "not a symmetry")
