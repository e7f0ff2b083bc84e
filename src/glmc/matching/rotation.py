"""Rotation matching (paper 002 §4.2): per-head orthogonal maps plus rescaling, in closed form.

Scores and head outputs are unchanged by q -> a R q, k -> R k / a and v -> a R v, W_o -> W_o R^T / a
(`OrthogonalScale` on qk.{l}, vo.{l}). With X the writer and Y the reader of a pair (head dim first),
per head: min_{R, a} ||X_A - a R X_B||^2 + ||Y_A - R Y_B / a||^2. R is the Procrustes solution at a = 1
(Theorem 4.1), then a the best positive root of the quartic (Eq. 11-12)
a^4 |X_B|^2 - a^3 <X_A, R X_B> + a <Y_A, R Y_B> - |Y_B|^2 = 0: sequential, not the joint optimum.

Weight matching first permutes the MLP units (optionally heads and the residual map; paper 002 leaves
the residual unaligned). The pairs are interpolated factored (qk = vo = none): as circuits the per-head
maps would not matter. Rotary models: qk gets a RotaryScale per frequency pair (glmc.matching.engine.rotary_pairs),
vo one orthogonal map and scale per key/value group; `head_permutation` leaves rotary qk in place.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, Matcher, circuit_pairs, require_factored
from glmc.matching.engine.in_head import closed_form_rotations, optimal_scales
from glmc.matching.engine.rotary_pairs import rotary_scales
from glmc.matching.weight import used_tokens, weight_matching
from glmc.models.blocks import full
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.roles import Role, pair_factors
from glmc.ranges import check_settings
from glmc.settings.methods import RotationMatcherConfig
from glmc.symmetry import OrthogonalScale, RotaryScale, SymmetrySpec, Transform, apply, apply_params

Params = dict[str, Tensor]
PAIRS = ("qk", "vo")


def factored_distance(pa: Params, pb: Params) -> float:
    """sqrt(sum ||theta_A - theta_B||^2 / sum ||theta_A||^2) over all parameters as they are (for
    factored models: per-head weights compared directly, not as circuits)."""
    diff = norm = 0.0
    for name, a in pa.items():
        a = a.detach().double()
        diff += float((a - pb[name].detach().double()).pow(2).sum())
        norm += float(a.pow(2).sum())
    return (diff / norm) ** 0.5


def head_transforms(
    pa: Params,
    pb: Params,
    rescale: bool = True,
    group: str = "orthogonal",
    roles: tuple[Role, ...] = full.ROLES,
    rotary: bool = False,
    rotary_dims: int | None = None,
) -> Transform:
    """OrthogonalScale elements for every qk.{l} and vo.{l} moving pb's heads onto pa's (float64; scales 1
    without rescale; group="permutation": in-head permutations). `roles`: the block layout. `rotary`: qk
    gets a RotaryScale per frequency pair (none for permutations); `rotary_dims`: partial rotary. Only the
    pairs the roles act on (a norm on queries and keys leaves no qk space)."""
    layers = sorted({int(n.split(".")[1]) for n in pa if n.startswith("blocks.")})
    pairs = [pair for pair in PAIRS if any(role.acts_on(pair) for role in roles)]
    out = Transform()
    for layer in layers:
        for pair in pairs:
            (xa, ya), (xb, yb) = pair_factors(pa, layer, pair, roles), pair_factors(pb, layer, pair, roles)
            if pair == "qk" and rotary:
                if group == "orthogonal":
                    out[f"{pair}.{layer}"] = rotary_scales(xa, ya, xb, yb, rescale=rescale, rotary_dims=rotary_dims)
                continue
            r = closed_form_rotations(xa, ya, xb, yb, group)
            s = optimal_scales(xa, ya, xb, yb, r) if rescale else torch.ones(len(r), dtype=torch.float64)
            out[f"{pair}.{layer}"] = OrthogonalScale(r, s)
    return out


def element_scales(g) -> Tensor:
    """The scales of a per-head element: OrthogonalScale's per head, RotaryScale's per frequency pair."""
    if isinstance(g, RotaryScale):
        return torch.hypot(g.real, g.imag).flatten().double()
    return g.scales.double()


class RotationMatcher(Matcher):
    """`rotation`: paper 002's matching, MLP permutations then closed-form per-head rotations and
    (rescale=True) per-head scales. residual: none (paper 002) | orthogonal | permutation; heads,
    mlp: permutation | none; qk / vo: circuit | none (how the pairs are interpolated)."""

    def __init__(
        self,
        name: str = "rotation",
        residual: str = "none",
        heads: str = "none",
        mlp: str = "permutation",
        rescale: bool = True,
        qk: str = "none",
        vo: str = "none",
        max_iter: int = 15,
        tol: float = 1e-6,
        vocabulary: str = "train",
    ):
        check_settings(RotationMatcherConfig, f"matcher.{name}", locals())  # the ranges glmc.settings declares
        self.name, self.residual, self.heads, self.mlp = name, str(residual), str(heads), str(mlp)
        self.vocabulary, self.rescale, self.max_iter, self.tol = str(vocabulary), rescale, max_iter, tol
        self.circuits = circuit_pairs(str(qk), str(vo))

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        require_factored(self.name, a, b)
        start = time.perf_counter()
        roles = family_named(b.config.family).blocks("factored")
        rotary = b.config.rope_theta is not None
        rotary_dims = b.config.rotary_dims
        tokens = used_tokens(b, context) if self.vocabulary == "train" else None
        heads, mlp = self.heads != "none", self.mlp != "none"
        units, weight_diag = weight_matching(a, b, self.residual, heads, mlp, self.max_iter, self.tol, tokens=tokens)
        # grouped models get weight matching's own per-group maps: solved again below, with this rescale
        units = Transform({k: g for k, g in units.items() if k.split(".")[0] not in PAIRS})
        spec = SymmetrySpec.from_model(b)
        pa = {k: v.detach().double() for k, v in a.params().items()}
        pb = {k: v.detach().double() for k, v in b.params().items()}
        pb_units = apply_params(units, spec, pb)
        # heads.{l} act before qk.{l} and vo.{l} in spec order: solve on the permuted model
        per_head = head_transforms(pa, pb_units, self.rescale, roles=roles, rotary=rotary, rotary_dims=rotary_dims)
        rotated = per_head
        if self.rescale:
            rotated = head_transforms(pa, pb_units, False, roles=roles, rotary=rotary, rotary_dims=rotary_dims)
        pb_rotated = apply_params(rotated, spec, pb_units)
        pb_final = apply_params(per_head, spec, pb_units) if self.rescale else pb_rotated
        transform = Transform({**units, **per_head.to(dtype=torch.float32)})
        scales = torch.cat([element_scales(g) for g in per_head.values()])
        diagnostics: dict[str, Any] = {
            "distance_identity": factored_distance(pa, pb),
            "distance_permutation": factored_distance(pa, pb_units),
            "distance_rotation": factored_distance(pa, pb_rotated),
            "distance_rescaled": factored_distance(pa, pb_final),
            "scale_min": float(scales.min()),
            "scale_max": float(scales.max()),
            "weight_iterations": weight_diag["iterations"],
            "weight_objective": weight_diag["objective"],
        }
        if tokens is not None:
            diagnostics["vocabulary_rows"] = int(tokens.numel())
        model = apply(transform, b)
        diagnostics["seconds"] = time.perf_counter() - start
        # paper 002's ablations: no per-head step, in-head permutations instead, rotation without rescaling
        variants = {"permutation_only": Alignment(reference=a, model=apply(units, b), circuits=self.circuits)}
        # rotary models: value dims only (qk admits no permutation)
        permuted = head_transforms(pa, pb_units, False, "permutation", roles, rotary)
        in_head = Transform({**units, **permuted.to(dtype=torch.float32)})
        variants["head_permutation"] = Alignment(reference=a, model=apply(in_head, b), circuits=self.circuits)
        if self.rescale:
            no_rescale = Transform({**units, **rotated.to(dtype=torch.float32)})
            variants["no_rescale"] = Alignment(reference=a, model=apply(no_rescale, b), circuits=self.circuits)
        return Alignment(a, model, transform, self.circuits, diagnostics, variants=variants)
