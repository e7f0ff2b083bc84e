"""Embedding a model into a wider residual stream, more heads, larger head dims and more MLP units is exact."""

import dataclasses

import pytest
import torch

from glmc.matching.weight import WeightMatcher
from glmc.models import relative_deviation, to_canonical
from glmc.symmetry.embed_width import embed_width, layer_sizes, match_widths
from glmc.symmetry.groups import random_orthogonal

from families import FAMILIES
from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_vit

pytestmark = pytest.mark.numeric


def narrow_model(fam, eps=None, seed=0, act=None):
    extra = {"act": act} if act else {}
    hf = FAMILIES[fam](seed=seed, hidden=16, heads=2, mlp=32, **extra)
    model = to_canonical(hf)
    if eps is not None:  # a large eps makes a wrong eps rescaling visible
        model.config.norm_eps = eps
    return model, inputs_for(hf)


def deviation(name, reference, new, x):
    with torch.no_grad():
        dev = relative_deviation(new(x), reference(x))
    print(f"\n  {name}: max relative logit deviation {dev:.2e}")
    return dev


def assert_preserved(name, reference, new, x):
    """The embedded model computes the reference's logits up to float32 round-off."""
    with torch.no_grad():
        dev = assert_close_rel(new(x), reference(x), FORWARD, f"{name}: logits")
    print(f"\n  {name}: relative logit deviation {dev:.2e}")


CASES = {
    "residual": {},
    "residual+heads+dims+mlp": {"heads": 4, "qk_dim": 12, "vo_dim": 10, "mlp": 48},
    "per-layer sizes": {"heads": [3, 5], "qk_dim": [8, 11], "vo_dim": [9, 8], "mlp": [32, 40]},
}


@pytest.mark.parametrize("eps", [None, 0.5], ids=["hf-eps", "eps0.5"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fam", list(FAMILIES))
def test_embedding_preserves_logits(fam, case, eps):
    model, x = narrow_model(fam, eps)
    new = embed_width(model, 32, generator=torch.Generator().manual_seed(0), **CASES[case])
    assert new.width == 32 and new.config.norm_dim == 32
    sizes = layer_sizes(new)
    for key, value in CASES[case].items():
        assert sizes[key] == (value if isinstance(value, list) else [value, value])
    assert_preserved(f"{fam} {case} eps={model.config.norm_eps}", model, new, x)


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_norm_dim_and_eps_rescaling(fam):
    model, x = narrow_model(fam, eps=0.5)
    new = embed_width(model, 40, heads=3, mlp=40, generator=torch.Generator().manual_seed(1))
    assert new.config.norm_dim == 40 and new.config.norm_eps == pytest.approx(0.5 * 16 / 40)
    assert model.config.norm_dim == 16 and model.config.norm_eps == 0.5  # the input is untouched
    # keeping eps (only the weights rescaled) is visibly wrong at this eps
    wrong = type(new)(dataclasses.replace(new.config, norm_eps=0.5), new.params())
    assert deviation(f"{fam} eps kept (should change)", model, wrong, x) > 1e-3
    # and without the reader scale sqrt(n / N) as well
    unscaled = embed_width(model, 40, generator=torch.Generator().manual_seed(1), norm_dim=16)
    assert unscaled.config.norm_dim == 16
    assert_preserved(f"{fam} norm_dim kept", model, unscaled, x)
    wrong_norm = type(unscaled)(dataclasses.replace(unscaled.config, norm_dim=40), unscaled.params())
    assert deviation(f"{fam} norm_dim changed without rescaling (should change)", model, wrong_norm, x) > 1e-3


def test_given_residual_map_is_used():
    model, x = narrow_model("gpt2")
    u = random_orthogonal(24, 16, torch.Generator().manual_seed(2))
    new = embed_width(model, 24, residual_map=u)
    assert_close_rel(new.params()["embed.pos"], model.params()["embed.pos"] @ u.T, FEW_OPS, "embedded positions")
    assert_preserved("gpt2 given residual map", model, new, x)


def test_same_width_only_pads():
    model, x = narrow_model("vit")
    new = embed_width(model, 16, residual_map=torch.eye(16), mlp=64)
    assert new.config == model.config
    p, q = model.params(), new.params()
    assert torch.equal(q["embed.pos"], p["embed.pos"]) and torch.equal(q["blocks.0.in_w"][:32], p["blocks.0.in_w"])
    assert_preserved("vit same width, mlp padded", model, new, x)


@pytest.mark.parametrize("act", ["sigmoid", "relu", "silu"])
def test_padding_with_activations_nonzero_or_zero_at_zero(act):
    model, x = narrow_model("vit", act=act, seed=2)
    new = embed_width(model, 32, heads=3, mlp=64, generator=torch.Generator().manual_seed(3))
    assert_preserved(f"vit {act} mlp padded", model, new, x)


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_circuit_form(fam):
    model, x = narrow_model(fam, eps=0.5)
    circuit = model.to_circuit()
    new = embed_width(circuit, 32, heads=4, mlp=48, generator=torch.Generator().manual_seed(4))
    assert new.config.form == "circuit" and new.params()["blocks.0.qk"].shape == (4, 33, 33)
    assert_preserved(f"{fam} circuit form embedded", model, new, x)
    with pytest.raises(ValueError, match="qk_dim"):
        embed_width(circuit, 32, qk_dim=12)


@pytest.mark.parametrize("form", ["factored", "circuit"])
@pytest.mark.parametrize("fam", list(FAMILIES))
def test_stream_scale_is_exact_and_moves_eps_by_its_square(fam, form):
    model, x = narrow_model(fam, eps=0.5)
    if form == "circuit":
        model = model.to_circuit()
    g = torch.Generator().manual_seed(2)
    plain = embed_width(model, 64, generator=g)
    scaled = embed_width(model, 64, generator=torch.Generator().manual_seed(2), stream_scale=2.0)
    assert scaled.config.norm_eps == pytest.approx(0.5 * 4 * 16 / 64)  # eps * s^2 * n / N: eps again
    assert_preserved(f"{fam} {form} stream x2", model, scaled, x)
    # writers doubled, readers the same: the stream is twice the size for every input
    assert torch.equal(scaled.params()["blocks.0.in_w"], plain.params()["blocks.0.in_w"])
    assert torch.allclose(scaled.params()["blocks.0.out_w"], 2 * plain.params()["blocks.0.out_w"])
    with pytest.raises(ValueError, match="stream_scale"):
        embed_width(model, 64, stream_scale=0.0)


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_match_widths_rms_stream_keeps_eps_and_function(fam):
    narrow, x = narrow_model(fam, eps=0.5)
    wide = wide_model(fam)
    kept = match_widths(wide, narrow, torch.Generator().manual_seed(3))
    rms = match_widths(wide, narrow, torch.Generator().manual_seed(3), stream="rms")
    assert rms.config.norm_eps == narrow.config.norm_eps == 0.5
    assert_preserved(f"{fam} match_widths stream=rms", narrow, rms, x)
    # the stream's root mean square over N dimensions equals the narrow one's over n
    emb = "embed.tokens" if fam == "gpt2" else "embed.patch_w"
    n, big = narrow.width, wide.width
    assert float(rms.params()[emb].norm()) == pytest.approx(
        float(kept.params()[emb].norm()) * (big / n) ** 0.5, rel=1e-5
    )
    with pytest.raises(ValueError, match="stream"):
        match_widths(wide, narrow, stream="wide")


def wide_model(fam, seed=5):
    return to_canonical(FAMILIES[fam](seed=seed, hidden=32, heads=4, mlp=64))


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_match_widths_then_weight_matching(fam):
    narrow, x = narrow_model(fam)
    wide = wide_model(fam)
    embedded = match_widths(wide, narrow, generator=torch.Generator().manual_seed(6))
    pw, pe = wide.params(), embedded.params()
    assert list(pw) == list(pe) and all(pw[k].shape == pe[k].shape for k in pw)
    assert embedded.config.norm_dim == wide.config.norm_dim == 32
    assert embedded.config.norm_eps == pytest.approx(narrow.config.norm_eps * 16 / 32)
    assert_preserved(f"{fam} match_widths", narrow, embedded, x)

    alignment = WeightMatcher().match(wide, embedded)
    d = alignment.diagnostics
    assert d["final_distance"] <= d["objective"][0]
    assert_preserved(f"{fam} weight-matched to the wide model", narrow, alignment.model, x)
    mid = alignment.interpolate(0.5)  # equal shapes: the path is defined
    assert torch.isfinite(mid(x)).all()


def test_bad_arguments_name_themselves():
    model, _ = narrow_model("vit")
    g = torch.Generator().manual_seed(0)
    cases = {
        "width": dict(width=8),
        "heads": dict(width=32, heads=1),
        "mlp": dict(width=32, mlp=16),
        "qk_dim": dict(width=32, qk_dim=4),
        "vo_dim": dict(width=32, vo_dim=[8, 2]),
        "norm_dim": dict(width=32, norm_dim=0),
        "residual_map": dict(width=32, residual_map=torch.randn(32, 8)),
    }
    for name, kwargs in cases.items():
        with pytest.raises(ValueError, match=name):
            embed_width(model, generator=g, **kwargs)
    with pytest.raises(ValueError, match="heads.*2 layers"):
        embed_width(model, 32, heads=[4])
    with pytest.raises(ValueError, match="orthonormal"):
        embed_width(model, 32, residual_map=torch.randn(32, 16))


def test_match_widths_rejects_mismatches():
    narrow, _ = narrow_model("vit")
    wide = wide_model("vit")
    with pytest.raises(ValueError, match="width"):
        match_widths(narrow, wide)
    with pytest.raises(ValueError, match="family"):
        match_widths(wide_model("gpt2"), narrow)
    with pytest.raises(ValueError, match="layers"):
        match_widths(to_canonical(tiny_vit(hidden=32, heads=4, mlp=64, layers=3)), narrow)
    with pytest.raises(ValueError, match="heads"):
        match_widths(to_canonical(tiny_vit(hidden=32, heads=1, mlp=64)), narrow)
    with pytest.raises(ValueError, match="mlp"):
        match_widths(to_canonical(tiny_vit(hidden=32, heads=4, mlp=16)), narrow)
    with pytest.raises(ValueError, match="embed.pos"):
        match_widths(to_canonical(tiny_vit(hidden=32, heads=4, mlp=64, image=12)), narrow)
    gpt2 = wide_model("gpt2")
    fewer_tokens = {k: v[:50] if k in ("embed.tokens", "head.w", "head.b") else v for k, v in gpt2.params().items()}
    with pytest.raises(ValueError, match="embed.tokens"):
        match_widths(type(gpt2)(gpt2.config, fewer_tokens), narrow_model("gpt2")[0])
