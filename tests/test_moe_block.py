"""The mixture-of-experts block (glmc.models.blocks.moe, blocks.moe_shared): every element of the group its
roles declare keeps the logits (expert order with the router's rows, each expert's units on their own, the
shared expert's units and scales, the residual classes); reordering experts without their router rows, or
one permutation for every expert's units, changes them; routing keeps the top k, renormalised or not."""

import dataclasses

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.blocks import moe
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.models.families import family_named
from glmc.symmetry import Permutation, SymmetrySpec, Transform, apply

from tiny_hf import inputs_for, tiny_mixtral

pytestmark = pytest.mark.numeric

KEEPS, CHANGES = 1e-5, 1e-3
EXPERT_TENSORS = ("expert_gate_w", "expert_in_w", "expert_out_w")


def double(model: CanonicalTransformer) -> CanonicalTransformer:
    return CanonicalTransformer(model.config, {k: v.double() for k, v in model.params().items()})


@pytest.fixture(scope="module")
def mixtral():
    """The canonical tiny Mixtral (4 experts, top 2) in float64, with inputs."""
    hf = tiny_mixtral()
    return double(to_canonical(hf)), inputs_for(hf)


def deviation(model, x, other) -> float:
    with torch.no_grad():
        return relative_deviation(other(x), model(x))


def test_the_spec_has_experts_and_a_unit_permutation_per_expert(mixtral):
    model, _ = mixtral
    spec = SymmetrySpec.from_model(model)
    experts, units = spec["experts.0"], spec["expert_units.0"]
    assert (experts.size, experts.heads, experts.classes) == (4, None, ("permutation",))
    assert (units.size, units.heads, units.classes) == (16, 4, ("permutation",))
    assert {a.param for a in experts.acts_on} == {f"blocks.0.{n}" for n in ("router_w", *EXPERT_TENSORS)}
    assert not spec.names("mlp") and not spec.names("mlp_scale")


@pytest.mark.parametrize(
    "classes",
    [
        {"residual": "orthogonal"},
        {"residual": "permutation"},
        {"experts": "permutation", "expert_units": "permutation"},
        {"residual": "orthogonal", "experts": "permutation", "expert_units": "permutation", "heads": "permutation"},
    ],
    ids=["orthogonal", "residual-permutation", "experts", "together"],
)
def test_every_admitted_element_keeps_logits(mixtral, classes):
    model, x = mixtral
    transform = Transform.sample(SymmetrySpec.from_model(model), classes, torch.Generator().manual_seed(1))
    new = apply(transform, model)
    assert not torch.equal(new.params()["blocks.1.expert_in_w"], model.params()["blocks.1.expert_in_w"])
    assert deviation(model, x, new) < KEEPS


def test_experts_without_their_router_rows_or_one_unit_order_for_all_change_logits(mixtral):
    model, x = mixtral
    p, swap = model.params(), torch.tensor([1, 0, 3, 2])
    moved = {**p, **{f"blocks.0.{n}": p[f"blocks.0.{n}"][swap] for n in EXPERT_TENSORS}}
    assert deviation(model, x, CanonicalTransformer(model.config, moved)) > CHANGES
    # the same unit permutation in every expert is an element (batched), but not a symmetry of expert 0 alone
    units = Permutation(torch.randperm(16, generator=torch.Generator().manual_seed(0)).repeat(4, 1))
    assert deviation(model, x, apply(Transform({"expert_units.0": units}), model)) < KEEPS
    alone = {**p, "blocks.0.expert_gate_w": p["blocks.0.expert_gate_w"].clone()}
    alone["blocks.0.expert_gate_w"][0] = alone["blocks.0.expert_gate_w"][0, units.perm[0]]
    assert deviation(model, x, CanonicalTransformer(model.config, alone)) > CHANGES


def test_routing_keeps_the_top_k_renormalised_or_as_the_softmax_gave_them():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    config = dataclasses.make_dataclass("C", [("experts_top_k", int), ("experts_renormalise", bool)])
    probs = torch.softmax(logits, -1)
    kept = moe.routing(config(2, False), logits)
    assert torch.allclose(kept, torch.cat([probs[:, :2], torch.zeros(1, 2)], 1))
    assert torch.allclose(moe.routing(config(2, True), logits), kept / kept.sum())


def test_a_shared_expert_keeps_its_gated_units_and_scales_and_the_experts_spaces(mixtral, monkeypatch):
    model, x = mixtral
    with torch.no_grad():
        routed = model(x)
    monkeypatch.setattr(family_named("mixtral"), "mlp_kind", "moe_shared")  # Mixtral's layers as a host
    gen = torch.Generator().manual_seed(3)
    p, width = dict(model.params()), model.width
    for l in range(model.num_layers):  # a gated shared expert of 8 units and its sigmoid gate
        for name, shape in (("gate_w", (8, width)), ("in_w", (8, width)), ("out_w", (width, 8))):
            p[f"blocks.{l}.{name}"] = 0.2 * torch.randn(shape, generator=gen, dtype=torch.float64)
        for name, size in (("gate_b", 8), ("in_b", 8), ("out_b", width)):
            p[f"blocks.{l}.{name}"] = 0.1 * torch.randn(size, generator=gen, dtype=torch.float64)
        p[f"blocks.{l}.shared_sigmoid_w"] = 0.2 * torch.randn(1, width, generator=gen, dtype=torch.float64)
    shared = CanonicalTransformer(model.config, p)
    with torch.no_grad():
        assert relative_deviation(shared(x), routed) > CHANGES  # the shared expert adds to the output
    spec = SymmetrySpec.from_model(shared)
    assert (spec["mlp.0"].size, spec["mlp_scale.0"].classes) == (8, ("diagonal",))
    classes = {"residual": "orthogonal", "mlp": "permutation", "mlp_scale": "diagonal", "experts": "permutation"}
    transform = Transform.sample(spec, {**classes, "expert_units": "permutation"}, torch.Generator().manual_seed(4))
    new = apply(transform, shared)
    assert not torch.equal(new.params()["blocks.0.in_w"], p["blocks.0.in_w"])
    assert deviation(shared, x, new) < KEEPS
