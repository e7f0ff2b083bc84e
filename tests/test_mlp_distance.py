"""Weight matching's MLP distance expanded in the residual map's move equals the distance computed
directly, for small moves and large ones (the expansion is exact, not a first-order guess)."""

from __future__ import annotations

import pytest
import torch

from glmc.matching.engine.mlp_distance import MlpDistance, mlp_matrices
from glmc.models import to_canonical
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply_params

from tiny_hf import tiny_gpt2

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("step", [1e-6, 1e-3, 0.3])
def test_expanded_distance_equals_the_direct_one(step):
    a, b = to_canonical(tiny_gpt2(seed=0, mlp=96)), to_canonical(tiny_gpt2(seed=1, mlp=96))
    pa = {k: v.detach() for k, v in a.params().items()}
    pb = {k: v.detach() for k, v in b.params().items()}
    spec = SymmetrySpec.from_model(b).restricted_to(set(mlp_matrices(0)))
    g = torch.Generator().manual_seed(0)
    perm = Permutation.sample(spec["mlp.0"].size, generator=g)
    r = Orthogonal.sample(a.width, generator=g).matrix
    skew = step * torch.randn(a.width, a.width, generator=g)
    r2 = torch.linalg.matrix_exp(skew - skew.T) @ r

    def transformed(m: torch.Tensor) -> dict[str, torch.Tensor]:
        t = Transform({"residual": Orthogonal(m), "mlp.0": perm})
        return apply_params(t, spec, {n: pb[n] for n in mlp_matrices(0)})

    distance = MlpDistance(pa, pb)
    distance.direct(0, r, transformed(r))
    # M = A_in^T P B_in + A_out P B_out^T, with P applied to B alone
    moved = apply_params(Transform({"mlp.0": perm}), spec, {n: pb[n] for n in mlp_matrices(0)})
    reader, writer = mlp_matrices(0)
    cross = pa[reader].T @ moved[reader] + pa[writer] @ moved[writer].T
    expanded = distance.expanded(0, r2, cross)
    direct = MlpDistance(pa, pb).direct(0, r2, transformed(r2))
    scale = sum(float(pa[n].double().pow(2).sum()) for n in mlp_matrices(0))
    assert abs(expanded - direct) <= 1e-5 * scale
    assert abs(expanded - distance.refs[0].d2) > 0  # the move changed it


def test_layers_sharing_a_reference_sum_to_their_own_expansions():
    a, b = to_canonical(tiny_gpt2(seed=0, mlp=96)), to_canonical(tiny_gpt2(seed=1, mlp=96))
    pa = {k: v.detach() for k, v in a.params().items()}
    pb = {k: v.detach() for k, v in b.params().items()}
    g = torch.Generator().manual_seed(1)
    r = Orthogonal.sample(a.width, generator=g).matrix
    skew = 1e-3 * torch.randn(a.width, a.width, generator=g)
    r2 = torch.linalg.matrix_exp(skew - skew.T) @ r
    layers = range(a.num_layers)
    assert len(layers) >= 2
    crosses, alone = {}, []
    grouped = MlpDistance(pa, pb)
    for layer in layers:
        names = mlp_matrices(layer)
        spec = SymmetrySpec.from_model(b).restricted_to(set(names))
        perm = Permutation.sample(spec[f"mlp.{layer}"].size, generator=g)
        t = Transform({"residual": Orthogonal(r), f"mlp.{layer}": perm})
        grouped.direct(layer, r, apply_params(t, spec, {n: pb[n] for n in names}))
        single = MlpDistance(pa, pb)
        single.direct(layer, r, apply_params(t, spec, {n: pb[n] for n in names}))
        moved = apply_params(Transform({f"mlp.{layer}": perm}), spec, {n: pb[n] for n in names})
        crosses[layer] = pa[names[0]].T @ moved[names[0]] + pa[names[1]] @ moved[names[1]].T
        alone.append(single.expanded(layer, r2, crosses[layer]))
    assert len({id(grouped.refs[layer].r) for layer in layers}) == 1  # one reference for the group
    total = grouped.expanded_total(r2, crosses)
    assert total == pytest.approx(sum(alone), rel=1e-9)
