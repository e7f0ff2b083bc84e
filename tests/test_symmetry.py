"""Every symmetry class preserves the canonical model's function; non-symmetries do not."""

import pytest
import torch

from glmc.models import canonical_forward, relative_deviation, to_canonical
from glmc.symmetry import (
    Invertible,
    Orthogonal,
    OrthogonalScale,
    Permutation,
    SemiPermutation,
    SymmetrySpec,
    Transform,
    apply,
    apply_params,
)

from families import FAMILIES
from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gpt2

pytestmark = pytest.mark.numeric


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    hf = FAMILIES[request.param]()
    return request.param, to_canonical(hf), inputs_for(hf)


def deviation(name, model, new, x):
    with torch.no_grad():
        dev = relative_deviation(new(x), model(x))
    print(f"\n  {name}: max relative logit deviation {dev:.2e}")
    return dev


def assert_preserved(name, model, new, x):
    """The transformed model computes the model's logits up to float32 round-off."""
    with torch.no_grad():
        dev = assert_close_rel(new(x), model(x), FORWARD, f"{name}: logits")
    print(f"\n  {name}: relative logit deviation {dev:.2e}")


def sample(model, classes, seed=0, grow=0):
    gen = torch.Generator().manual_seed(seed)
    return Transform.sample(SymmetrySpec.from_model(model), classes, gen, grow=grow)


CASES = {
    "residual orthogonal": ({"residual": "orthogonal"}, 0),
    "residual rectangular (D+8)": ({"residual": "orthogonal"}, 8),
    "residual permutation": ({"residual": "permutation"}, 0),
    "heads permutation": ({"heads": "permutation"}, 0),
    "heads semi-permutation (H+2)": ({"heads": "semi_permutation"}, 2),
    "qk invertible": ({"qk": "invertible"}, 0),
    "vo invertible": ({"vo": "invertible"}, 0),
    "qk orthogonal_scale": ({"qk": "orthogonal_scale"}, 0),
    "vo orthogonal_scale": ({"vo": "orthogonal_scale"}, 0),
    "mlp permutation": ({"mlp": "permutation"}, 0),
    "all at once, widened": (
        {
            "residual": "orthogonal",
            "heads": "semi_permutation",
            "qk": "invertible",
            "vo": "orthogonal_scale",
            "mlp": "permutation",
        },
        2,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_symmetry_preserves_function(family, case):
    fam, model, x = family
    classes, grow = CASES[case]
    new = apply(sample(model, classes, grow=grow), model)
    assert_preserved(f"{fam} {case}", model, new, x)


@pytest.mark.parametrize("residual,grow", [("orthogonal", 0), ("orthogonal", 8), ("permutation", 0)])
def test_circuit_form_residual_and_head_permutation(family, residual, grow):
    fam, model, x = family
    circuit = model.to_circuit()
    new = apply(sample(circuit, {"residual": residual, "heads": "permutation"}, grow=grow), circuit)
    assert new.params()["blocks.0.qk"].shape[-1] == model.width + grow + 1
    assert_preserved(f"{fam} circuit residual {residual} (+{grow}) + heads permutation", model, new, x)


def test_circuit_heads_semi_permutation(family):
    fam, model, x = family
    circuit = model.to_circuit()
    new = apply(sample(circuit, {"heads": "semi_permutation"}, grow=2), circuit)
    assert_preserved(f"{fam} circuit heads semi-permutation (H+2)", model, new, x)


def test_widening_changes_shapes_not_norm(family):
    fam, model, x = family
    new = apply(sample(model, {"residual": "orthogonal", "heads": "semi_permutation"}, grow=2), model)
    heads = model.params()["blocks.0.q_w"].shape[0]
    assert new.width == model.width + 2 and new.config.norm_dim == model.config.norm_dim
    assert new.params()["blocks.0.q_w"].shape[0] == heads + 2


def relu_models():
    for fam, build in FAMILIES.items():
        hf = build(act="relu", seed=3)
        yield fam, to_canonical(hf), inputs_for(hf)


@pytest.mark.parametrize("fam,model,x", list(relu_models()), ids=list(FAMILIES))
def test_mlp_semi_permutation_with_relu(fam, model, x):
    assert "semi_permutation" in SymmetrySpec.from_model(model).classes_for("mlp.0")
    new = apply(sample(model, {"mlp": "semi_permutation"}, grow=16), model)
    assert new.params()["blocks.1.in_w"].shape[0] == model.params()["blocks.1.in_w"].shape[0] + 16
    assert_preserved(f"{fam} relu mlp semi-permutation (F+16)", model, new, x)


def test_mlp_semi_permutation_breaks_gelu(family):
    fam, model, x = family
    assert SymmetrySpec.from_model(model).classes_for("mlp.0") == ("permutation",)
    t = sample(model, {"mlp": "semi_permutation"}, grow=16)
    with pytest.raises(ValueError, match="not a symmetry"):
        apply(t, model)
    assert deviation(f"{fam} gelu mlp semi-permutation (should change)", model, apply(t, model, strict=False), x) > 1e-2


def test_full_width_qkv_permutation_is_not_a_symmetry(family):
    # permuting the rows of the stacked (H*dh, D) Q/K/V matrices mixes heads: not a symmetry
    fam, model, x = family
    p = {k: v.detach().clone() for k, v in model.params().items()}
    H, dh, D = p["blocks.0.q_w"].shape
    perm = torch.randperm(H * dh, generator=torch.Generator().manual_seed(0))
    for n in ("q", "k", "v"):
        p[f"blocks.0.{n}_w"] = p[f"blocks.0.{n}_w"].reshape(H * dh, D)[perm].reshape(H, dh, D)
        p[f"blocks.0.{n}_b"] = p[f"blocks.0.{n}_b"].reshape(H * dh)[perm].reshape(H, dh)
    p["blocks.0.o_w"] = (
        p["blocks.0.o_w"].permute(1, 0, 2).reshape(D, H * dh)[:, perm].reshape(D, H, dh).permute(1, 0, 2)
    )
    with torch.no_grad():
        dev = relative_deviation(canonical_forward(model.config, p, x), model(x))
    print(f"\n  {fam} full-width Q/K/V permutation (should change): {dev:.2e}")
    assert dev > 1e-2


def rotate_hf_gpt2(model, o):
    """Apply x -> O x to a GPT-2 that still has LayerNorms (writers O., readers .O^T)."""
    with torch.no_grad():
        tr = model.transformer
        tr.wte.weight.copy_(tr.wte.weight @ o.T)  # tied: also the unembedding
        tr.wpe.weight.copy_(tr.wpe.weight @ o.T)
        for block in tr.h:
            for reader in (block.attn.c_attn, block.mlp.c_fc):  # Conv1D: (in, out)
                reader.weight.copy_(o @ reader.weight)
            for writer in (block.attn.c_proj, block.mlp.c_proj):
                writer.weight.copy_(writer.weight @ o.T)
                writer.bias.copy_(o @ writer.bias)
    return model


@pytest.mark.parametrize("affine", [True, False], ids=["randomised-ln", "plain-ln"])
def test_orthogonal_map_needs_layernorm_conversion(affine):
    hf = tiny_gpt2(seed=4)
    if not affine:  # even a LayerNorm without gain and offset is not rotation invariant
        for m in hf.modules():
            if isinstance(m, torch.nn.LayerNorm):
                torch.nn.init.ones_(m.weight), torch.nn.init.zeros_(m.bias)
    x = inputs_for(hf)
    canonical = to_canonical(hf)
    o = Orthogonal.sample(32, torch.Generator().manual_seed(0)).matrix
    with torch.no_grad():
        ref = hf(x).logits
        dev_hf = relative_deviation(rotate_hf_gpt2(hf, o)(x).logits, ref)
        rotated = apply(Transform(residual=Orthogonal(o)), canonical)(x)
    dev_canonical = assert_close_rel(rotated, ref, FORWARD, "rotated canonical model vs HF logits")
    print(
        f"\n  gpt2 orthogonal map on the LayerNorm model (should change): {dev_hf:.2e}; canonical: {dev_canonical:.2e}"
    )
    assert dev_hf > 1e-2


def test_spec_is_derived_from_the_model(family):
    fam, model, _ = family
    spec = SymmetrySpec.from_model(model)
    assert spec.names() == ["residual"] + [f"{k}.{l}" for l in range(2) for k in ("heads", "qk", "vo", "mlp")]
    assert spec["residual"].size == model.width and spec["mlp.1"].size == model.params()["blocks.1.in_w"].shape[0]
    assert spec["qk.0"].heads == spec["heads.0"].size and spec.classes_for("qk.0") == ("invertible", "orthogonal_scale")
    # every parameter that carries the residual stream is listed exactly where it is
    listed = {a.param for a in spec["residual"].acts_on}
    assert listed == {k for k in model.params() if k != "head.b" and not k.endswith(("q_b", "k_b", "v_b", "in_b"))}

    circuit = SymmetrySpec.from_model(model.to_circuit())
    assert circuit.names("qk") == [] and circuit.absorbed == ("qk.0", "vo.0", "qk.1", "vo.1")
    with pytest.raises(KeyError, match="absorbed"):
        apply(Transform({"qk.0": Invertible.identity(4, 8)}), model.to_circuit())


def test_apply_leaves_input_untouched(family):
    _, model, _ = family
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply(sample(model, {"residual": "orthogonal", "heads": "permutation", "mlp": "permutation"}), model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_size_mismatch_is_reported(family):
    _, model, _ = family
    with pytest.raises(ValueError, match="mlp.0"):
        apply(Transform({"mlp.0": Permutation.identity(3)}), model)


def test_apply_params_is_differentiable(family):
    # learned matching: a rotation parametrised by a skew matrix, inside the autograd graph
    fam, model, x = family
    a = torch.zeros(model.width, model.width, requires_grad=True)
    with torch.no_grad():
        a += 0.1 * torch.randn(a.shape, generator=torch.Generator().manual_seed(0))
    o = torch.matrix_exp(a - a.T)
    spec = SymmetrySpec.from_model(model)
    frozen = {k: v.detach() for k, v in model.params().items()}
    params = apply_params(Transform(residual=Orthogonal(o)), spec, frozen)
    out = canonical_forward(model.config, params, x)
    out.square().mean().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0
    assert_close_rel(out, model(x), FORWARD, f"{fam}: differentiable apply vs model logits")


def test_group_elements():
    g = torch.Generator().manual_seed(0)
    s = SemiPermutation.sample(5, 9, g)
    dense = s.dense()
    assert torch.allclose(dense.sum(0), torch.ones(5)) and ((dense > 0).sum(1) == 1).all()
    o = Orthogonal.sample(6, g, m=10).matrix
    assert o.shape == (10, 6)
    assert_close_rel(o.T @ o, torch.eye(6), FEW_OPS, "O^T O of a sampled orthogonal matrix")
    p = Permutation.sample(7, g)
    v = torch.randn(7, generator=g)
    assert torch.equal(p.dense() @ v, v[p.perm]) and torch.equal(p.inverse().perm[p.perm], torch.arange(7))
    inv = Invertible.sample(3, 4, g)
    eye = torch.eye(4).expand(3, 4, 4)
    assert_close_rel(inv.forward().transpose(-1, -2) @ inv.contra(), eye, FEW_OPS, "invertible: forward^T contra")
    rs = OrthogonalScale.sample(3, 4, g)
    assert_close_rel(rs.forward().transpose(-1, -2) @ rs.contra(), eye, FEW_OPS, "orthogonal scale: forward^T contra")
    with pytest.raises(ValueError, match="sum to 1"):
        SemiPermutation(torch.tensor([0, 0, 1]), torch.tensor([0.5, 0.6, 1.0]))


def test_projections_onto_groups():
    g = torch.Generator().manual_seed(0)
    p = Permutation.sample(9, g)
    noisy = p.dense() + 0.3 * torch.rand(9, 9, generator=g)
    assert torch.equal(Permutation.project(noisy).perm, p.perm)
    o = Orthogonal.sample(6, g, m=8).matrix
    q = Orthogonal.project(o + 0.01 * torch.randn(8, 6, generator=g)).matrix
    assert_close_rel(q.T @ q, torch.eye(6), FEW_OPS, "projected onto the orthogonal matrices")
    assert (q - o).abs().max() < 0.05
