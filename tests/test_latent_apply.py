"""LatentApplier against apply_dense on the straight-through matrices: same params, same gradients."""

from __future__ import annotations

import pytest
import torch

from glmc.interpolation import merge_params
from glmc.matching.engine.projections import polar, sinkhorn, straight_through_permutation
from glmc.matching.latent_apply import LatentApplier
from glmc.models import canonical_forward, to_canonical
from glmc.symmetry import Permutation, SymmetrySpec, apply_dense

from numeric import FEW_OPS, assert_close_rel, assert_params_close_rel
from tiny_hf import tiny_gpt2, tiny_llama, tiny_vit

MODELS = {
    "vit": lambda seed: tiny_vit(seed, hidden=16, heads=2, mlp=32),
    "gpt2": lambda seed: tiny_gpt2(seed, hidden=16, heads=4, mlp=40),
    "llama": lambda seed: tiny_llama(seed, hidden=16, heads=4, kv_heads=2, mlp=24),
}


def latents(spec, residual: str, units: str, seed: int = 0) -> tuple[dict, dict]:
    """Random latents near a random element, and their kinds."""
    g = torch.Generator().manual_seed(seed)
    out, kinds = {}, {}
    for s in spec:
        if s.kind not in ("residual", "heads", "mlp"):
            continue
        kind = residual if s.kind == "residual" else units
        base = Permutation.sample(s.size, g).dense() if kind != "orthogonal" else torch.eye(s.size)
        out[s.name] = (base + 0.3 * torch.randn(s.size, s.size, generator=g)).requires_grad_()
        kinds[s.name] = kind
    return out, kinds


def dense_matrix(z, kind):
    if kind == "orthogonal":
        return polar(z)
    return straight_through_permutation(z) if kind == "permutation" else sinkhorn(z, 5)


def element(z, kind):
    return (z, Permutation.project(z).perm) if kind == "permutation" else dense_matrix(z, kind)


@pytest.mark.numeric
@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize(
    "residual,units", [("orthogonal", "permutation"), ("permutation", "permutation"), ("orthogonal", "sinkhorn")]
)
def test_same_params_and_gradients_as_apply_dense(family, residual, units):
    a, model = to_canonical(MODELS[family](0)), to_canonical(MODELS[family](1))
    spec, params = SymmetrySpec.from_model(model), model.params()
    zs, kinds = latents(spec, residual, units)
    inputs = torch.randint(0, 10, (2, 6)) if family != "vit" else torch.randn(2, 1, 8, 8)

    def run(fast: bool):
        for z in zs.values():
            z.grad = None
        if fast:
            out = LatentApplier(spec, params, list(zs))({n: element(z, kinds[n]) for n, z in zs.items()})
        else:
            out = apply_dense({n: dense_matrix(z, kinds[n]) for n, z in zs.items()}, spec, params)
        # on the path's midpoint: B's own function does not depend on its symmetries, the merge does
        merged = merge_params([a.params(), out], [0.5, 0.5])
        canonical_forward(model.config, merged, inputs).pow(2).mean().backward()
        return {k: v.detach() for k, v in out.items()}, {n: z.grad.clone() for n, z in zs.items()}

    fast_params, fast_grads = run(True)
    dense_params, dense_grads = run(False)
    assert_params_close_rel(fast_params, dense_params, FEW_OPS)
    for name in zs:
        assert_close_rel(fast_grads[name], dense_grads[name], FEW_OPS, what=name)
    # the gradients are not trivially zero: the latents do steer the output
    assert all(g.abs().max() > 0 for g in fast_grads.values())


def test_project_skips_the_solver_only_where_row_maxima_are_distinct():
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(50, generator=g)
    dominant = torch.rand(50, 50, generator=g) + 5 * torch.eye(50)[perm]
    assert torch.equal(Permutation.project(dominant).perm, perm)
    # two rows prefer the same column: the solver decides, and gives the optimum, not the row maxima
    s = torch.tensor([[3.0, 2.9, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert Permutation.project(s).perm.tolist() == [1, 0, 2]
    with pytest.raises(ValueError):
        Permutation.project(torch.tensor([[float("nan"), 0.0], [0.0, 1.0]]))
