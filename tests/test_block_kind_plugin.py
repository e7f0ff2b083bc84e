"""A block kind defined outside glmc joins by register_kind, and what it declares reaches the canonical
forward and the matchers with no edit to them: its settings (CanonicalConfig.block_settings), its
weight-matching step, the spaces learned matching keeps and its activation hook.

The kind is this module's KIND: GPT-2's plain MLP scaled by a setting of its own, whose step and hook set
every layer's MLP units in reverse order (an order neither matcher's own MLP assignment picks here)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from glmc.matching.activation import ActivationMatcher
from glmc.matching.base import MatchContext
from glmc.matching.learned import LearnedMatcher
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.blocks import ActivationHook, BlockKind, plain, registry
from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.families import family_named
from glmc.symmetry import Permutation, SymmetrySpec, Transform, apply

from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gpt2


def reversed_units(spec, layer: int) -> Permutation:
    return Permutation(torch.arange(spec[f"mlp.{layer}"].size - 1, -1, -1))


class ReverseUnits:
    """The kind's weight-matching step: every layer's MLP units reversed."""

    name = "toy"

    def __init__(self, problem):
        self.problem = problem

    def __call__(self, state, it: int) -> None:
        for l in self.problem.layers:
            state.perms[f"mlp.{l}"] = reversed_units(self.problem.spec, l).to(device=self.problem.device)


def weight_step(problem, options):
    return None if options.get("toy") == "off" else ReverseUnits(problem)


def activation_match(moments, spec, l, transform, correlation) -> None:
    transform[f"mlp.{l}"] = reversed_units(spec, l)
    correlation[f"toy.{l}"] = (0.0, float(moments[f"blocks.{l}.mlp_act"].n))


def scaled_mlp(config, p, pre, h, act, rec):
    return plain.mlp(config, p, pre, h, act, rec) * KIND.settings_of(config).toy_scale


KIND = BlockKind(
    "toy_mlp",
    "mlp",
    scaled_mlp,
    plain.ROLES,
    weight_step=weight_step,
    kept_spaces=("mlp",),
    activation=ActivationHook(("mlp_act",), activation_match),
    settings={"toy_scale": 1.0},
)


@pytest.fixture
def toy_gpt2(monkeypatch):
    """GPT-2 with the toy kind as its MLP, registered for this test only."""
    monkeypatch.setattr(registry, "MODULES", dict(registry.MODULES))
    registry.register_kind("toy_mlp", __name__)
    monkeypatch.setattr(family_named("gpt2"), "mlp_kind", "toy_mlp")
    yield
    registry.block_kind.cache_clear()


def test_a_kind_registered_from_outside_brings_its_settings_step_kept_spaces_and_hook(toy_gpt2, tmp_path):
    hf = [tiny_gpt2(seed, hidden=16, heads=2, mlp=24) for seed in (0, 1)]
    a, b = (to_canonical(m) for m in hf)
    x = inputs_for(hf[0])
    spec = SymmetrySpec.from_model(b)
    reverse = [reversed_units(spec, l).perm for l in range(2)]
    with torch.no_grad():  # the config's block_settings reach the kind's forward; an undeclared key is refused
        scaled = CanonicalTransformer(dataclasses.replace(a.config, block_settings={"toy_scale": 2.0}), a.params())
        assert not torch.allclose(scaled(x), a(x))
    with pytest.raises(ValueError, match="'toy_scal', which no block kind of the gpt2 family declares"):
        dataclasses.replace(a.config, block_settings={"toy_scal": 2.0})
    # a config written before block_settings held every kind's settings as its own keys: the family's kinds' are read
    older = {k: v for k, v in a.config.to_dict().items() if k != "block_settings"}
    legacy = CanonicalConfig.from_dict({**older, "toy_scale": 2.0, "experts_top_k": None})
    assert legacy.block_settings == {"toy_scale": 2.0}

    transform, diagnostics = weight_matching(a, b, max_iter=2)  # the kind's step runs after the MLP units'
    assert "toy" in diagnostics["seconds_by_step"]
    assert all(torch.equal(transform[f"mlp.{l}"].perm.cpu(), reverse[l]) for l in range(2))
    transform, diagnostics = weight_matching(a, b, max_iter=2, options={"toy": "off"})  # the options reach it
    assert "toy" not in diagnostics["seconds_by_step"] and not torch.equal(transform["mlp.0"].perm, reverse[0])

    # learned matching without an MLP latent keeps the kind's spaces as weight matching found them
    learned = LearnedMatcher(residual="orthogonal", mlp="none", weight_max_iter=2)
    latents = {s.name: learned.kinds[s.kind] for s in spec if learned.kinds.get(s.kind, "none") != "none"}
    begun = learned.begin(a, b, spec, latents, MatchContext())
    assert "mlp.0" not in latents and torch.equal(begun.fixed["mlp.1"].perm, reverse[1])

    batches = [(x[:, :-1], x[:, 1:])]  # activation matching records the hook's states and calls it
    alignment = ActivationMatcher(batches=1).match(a, b, MatchContext(data=batches, run_dir=tmp_path))
    assert alignment.diagnostics["mean_correlation"]["toy.1"] == [0.0, float(x[:, 1:].numel())]
    assert torch.equal(alignment.transform["mlp.1"].perm, reverse[1])


def _own_space(acts):
    return dataclasses.replace(acts, space="toy_units") if acts.space == "mlp" else acts


# the plain MLP whose units are a space of the kind's own naming: the spec lists it, default permutations
OWN_SPACE_KIND = BlockKind(
    "toy_units_mlp",
    "mlp",
    plain.mlp,
    tuple(dataclasses.replace(r, acts=tuple(_own_space(a) for a in r.acts)) for r in plain.ROLES),
)


def test_a_kind_with_a_space_of_its_own_gets_it_in_the_spec_and_its_elements_keep_the_function(monkeypatch):
    monkeypatch.setattr(registry, "MODULES", dict(registry.MODULES))
    monkeypatch.setattr(sys.modules[__name__], "KIND", OWN_SPACE_KIND)
    registry.register_kind("toy_units_mlp", __name__)
    monkeypatch.setattr(family_named("gpt2"), "mlp_kind", "toy_units_mlp")
    try:
        hf = tiny_gpt2(0, hidden=16, heads=2, mlp=24)
        b, x = to_canonical(hf), inputs_for(hf)
        spec = SymmetrySpec.from_model(b)
        names = list(spec.spaces)
        assert "mlp.0" not in names and names.index("heads.0") < names.index("toy_units.0") < names.index("heads.1")
        assert spec["toy_units.1"].size == 24 and spec["toy_units.1"].classes == ("permutation",)
        g = torch.Generator().manual_seed(0)
        moved = Transform({f"toy_units.{l}": Permutation(torch.randperm(24, generator=g)) for l in range(2)})
        with torch.no_grad():
            assert_close_rel(apply(moved, b)(x), b(x), FORWARD, "a random element of the kind's own space")
            assert not torch.equal(apply(moved, b).params()["blocks.0.in_w"], b.params()["blocks.0.in_w"])
    finally:
        registry.block_kind.cache_clear()
