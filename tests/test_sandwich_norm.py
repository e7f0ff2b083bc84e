"""The sandwich-norm block (glmc.models.blocks.sandwich: a norm with a gain on each sublayer's output, Gemma 2,
Gemma 3 and OLMo-2): a random residual permutation keeps the logits and carries the gains along, a random rotation
changes them; the family's residual classes narrow to permutation, and symmetry=orthogonal is refused by
name, by the run config check and by glmc.align."""

import dataclasses

import pytest
import torch

import glmc
from glmc.models import to_canonical
from glmc.models.blocks import block_kind
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply
from glmc.symmetry.embed_width import embed_width
from glmc.symmetry.groups import random_orthogonal

from conftest import compose_config
from tiny_hf import inputs_for, tiny_gemma2, tiny_gemma3, tiny_olmo2

pytestmark = pytest.mark.numeric

KEEPS, CHANGES = 1e-5, 1e-3
BUILDERS = {"gemma2": tiny_gemma2, "gemma3": tiny_gemma3, "olmo2": tiny_olmo2}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def model(request):
    """A tiny model of the family in float64 (1e-5 far above rounding), with inputs."""
    hf = BUILDERS[request.param]()
    model = to_canonical(hf)
    return CanonicalTransformer(model.config, {k: v.double() for k, v in model.params().items()}), inputs_for(hf)


def deviation(a: CanonicalTransformer, b: CanonicalTransformer, x) -> float:
    with torch.no_grad():
        return relative_deviation(a(x), b(x))


def test_a_residual_permutation_keeps_logits_and_permutes_the_gains(model):
    model, x = model
    perm = Permutation.sample(model.width, torch.Generator().manual_seed(0))
    new = apply(Transform({"residual": perm}), model)
    assert deviation(new, model, x) < KEEPS
    for name in ("blocks.0.attn_post", "blocks.1.mlp_post"):
        assert torch.equal(new.params()[name], model.params()[name][perm.perm]), name


def test_a_residual_rotation_changes_logits(model):
    """A rotation keeps every pre-norm and linear map; only the gains after the branches tell it apart."""
    model, x = model
    rotation = Orthogonal(
        random_orthogonal(model.width, model.width, torch.Generator().manual_seed(1), dtype=torch.float64)
    )
    assert deviation(apply(Transform({"residual": rotation}), model, strict=False), model, x) > CHANGES
    # with every gain equal the same rotation keeps the logits: the gains are what removes it
    flat = {k: (torch.full_like(v, 1.3) if k.endswith("_post") else v) for k, v in model.params().items()}
    flat_model = CanonicalTransformer(dataclasses.replace(model.config), flat)
    rotated = apply(Transform({"residual": rotation}), flat_model, strict=False).params()
    rotated = {k: flat[k] if k.endswith("_post") else v for k, v in rotated.items()}  # a scalar gain stays
    assert deviation(CanonicalTransformer(flat_model.config, rotated), flat_model, x) < KEEPS


def test_the_residual_space_offers_signed_permutations_only(model):
    model, _ = model
    spec = SymmetrySpec.from_model(model)
    assert spec["residual"].classes == ("signed_permutation", "permutation")
    assert block_kind("sandwich").residual_classes == {"signed_permutation", "permutation"}
    # the gains move with the stream's coordinates and keep their signs
    posts = {ax.param for ax in spec["residual"].acts_on if ax.gain}
    assert posts == {f"blocks.{l}.{s}_post" for l in range(model.num_layers) for s in ("attn", "mlp")}
    with pytest.raises(ValueError, match="orthogonal is not a symmetry of residual"):
        apply(Transform({"residual": Orthogonal(torch.eye(model.width, dtype=torch.float64))}), model)


def test_width_embedding_keeps_the_stream_and_widens_the_mlp(model):
    model, x = model
    wide = embed_width(model, model.width, mlp=64)
    assert wide.params()["blocks.0.in_w"].shape[0] == 64 and deviation(wide, model, x) < KEEPS
    assert torch.equal(wide.params()["blocks.0.attn_post"], model.params()["blocks.0.attn_post"])
    with pytest.raises(ValueError, match="stream admits permutations only"):
        embed_width(model, model.width + 2)


def test_symmetry_orthogonal_is_refused_by_name():
    with pytest.raises(ConfigError, match="matcher.weight.residual=orthogonal: not a symmetry .* permutation only"):
        validate_config(compose_config("experiment=llama_text", "model=gemma2_text", "symmetry=orthogonal"))
    a, b = tiny_gemma2(seed=0, layers=1), tiny_gemma2(seed=1, layers=1)
    with pytest.raises(ValueError, match="residual=orthogonal is not a symmetry of the gemma2 family"):
        glmc.align(a, b, "weight", residual="orthogonal")
