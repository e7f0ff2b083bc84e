"""Weight matching's share of a task head's hidden state (HEAD_HIDDEN: BERT's masked-LM transform or
pooler, D units written by head.dense_w and read by head.w).

The residual map acts only on the head's first map, so the other tensors' cross-covariance is computed
once. Per iteration the hidden units are assigned on the exact inner product at the current residual
map (a block coordinate descent step: the objective cannot rise), and the first map, rows in the
current hidden order, enters the residual map's cross-covariance like any other reader.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.models.families.roles import HEAD_HIDDEN
from glmc.symmetry import Permutation, SymmetrySpec, Transform, apply_params
from glmc.symmetry.groups import Element

Params = dict[str, Tensor]


class HiddenHead:
    """The head's tensors of A and B (`pa`, `pb`: any superset of them), split into the readers of the
    stream (the residual map acts on them too) and the rest."""

    def __init__(self, spec: SymmetrySpec, pa: Params, pb: Params):
        space = spec[HEAD_HIDDEN]
        self.size = space.size
        self.axis = {ax.param: ax.axis for ax in space.acts_on}
        on_stream = {ax.param for ax in spec["residual"].acts_on} if "residual" in spec.spaces else set()
        self.readers = [name for name in self.axis if name in on_stream]
        self.spec_readers = spec.restricted_to(set(self.readers))
        self.pa = {name: pa[name] for name in self.axis}
        self.pb = {name: pb[name] for name in self.axis}
        self.device = next(iter(self.pa.values())).device
        rest = [name for name in self.axis if name not in on_stream]
        # float64: the distance is |A|^2 + |B|^2 - 2 <A, B>, which cancels when the head is matched
        self.cross = sum((self._rows(self.pa, n) @ self._rows(self.pb, n).T for n in rest), self._zeros())
        self.rest_aa = sum(float(self.pa[n].double().pow(2).sum()) for n in rest)
        self.rest_bb = sum(float(self.pb[n].double().pow(2).sum()) for n in rest)
        self.norm = sum(float(a.double().pow(2).sum()) for a in self.pa.values())  # ||A||^2 over the head

    def _zeros(self) -> Tensor:
        return torch.zeros(self.size, self.size, dtype=torch.float64, device=self.device)

    def _rows(self, p: Params, name: str) -> Tensor:
        """Tensor `name` of `p` as (hidden units, rest), in float64."""
        t = p[name]
        return t.movedim(self.axis[name], 0).reshape(self.size, -1).double()

    def _readers_at(self, residual: Element | None) -> Params:
        """B's readers of the stream under the residual map (as they are without one)."""
        readers = {n: self.pb[n] for n in self.readers}
        return readers if residual is None else apply_params(Transform(residual=residual), self.spec_readers, readers)

    def solve(self, residual: Element | None) -> Permutation:
        """The hidden permutation minimising the head's share of the distance at this residual map."""
        moved = self._readers_at(residual)
        similarity = sum((self._rows(self.pa, n) @ self._rows(moved, n).T for n in self.readers), self.cross)
        return Permutation.project(similarity)

    def squared_difference(self, residual: Element | None, hidden: Permutation) -> float:
        """||head_A - T(head_B)||^2 for the residual map and hidden permutation of T."""
        perm = hidden.perm
        rows = torch.arange(self.size, device=perm.device)
        diff = self.rest_aa + self.rest_bb - 2 * float(self.cross[rows, perm].sum())
        moved = apply_params(Transform({HEAD_HIDDEN: hidden}), self.spec_readers, self._readers_at(residual))
        for name in self.readers:
            diff += float((self.pa[name].double() - moved[name].double()).pow(2).sum())
        return max(diff, 0.0)

    def residual_cross(self, hidden: Permutation, width: int, raw: bool) -> Tensor:
        """The readers' share of the residual map's cross-covariance, B's hidden units in the order of
        `hidden`: sum A M^T over the (D, n) blocks, the residual axis first, each divided by n unless `raw`."""
        moved = apply_params(Transform({HEAD_HIDDEN: hidden}), self.spec_readers, {n: self.pb[n] for n in self.readers})
        c = torch.zeros(width, width, dtype=torch.float64, device=self.device)
        for name in self.readers:
            axis = next(ax.axis for ax in self.spec_readers["residual"].acts_on if ax.param == name)
            a, b = (t.movedim(axis, 0).reshape(width, -1).double() for t in (self.pa[name], moved[name]))
            c += a @ b.T if raw else a @ b.T / a.shape[1]
        return c
