"""Weight matching's distance over the MLP matrices, kept from one iteration to the next.

Late in a search only the residual map R moves; rather than rotating B's MLP matrices again, the
distance is expanded as a quadratic in Delta = R - R_ref (readers P W_in R^T, writers R W_out P^T):

    ||A - T(B)||^2 = d2_ref - 2 <K, Delta> + <Delta G, Delta>,   K = M - R_ref G,

M = A_in^T P B_in + A_out P B_out^T (the residual step's cross-covariances), G = B_in^T B_in +
B_out B_out^T, d2_ref the distance at R_ref. Exact; its float32 error is negligible next to d2_ref.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

Params = dict[str, Tensor]


def mlp_matrices(layer: int) -> tuple[str, str]:
    """The names of a layer's MLP reader and writer."""
    return f"blocks.{layer}.in_w", f"blocks.{layer}.out_w"


@dataclass
class _Reference:
    r: Tensor  # float64: the residual map the distance was computed at
    d2: float
    k: Tensor | None = None  # built on the first expansion


class MlpDistance:
    """Per layer, the squared distance between A's MLP matrices and B's transformed ones."""

    def __init__(self, pa: Params, pb: Params) -> None:
        self.pa, self.pb = pa, pb
        self.refs: dict[int, _Reference] = {}
        self.grams: dict[int, Tensor] = {}
        self._map: tuple[Tensor, Tensor] | None = None  # the last map passed to `direct`, in float64

    def direct(self, layer: int, r: Tensor, transformed: Params) -> float:
        """The distance from B's matrices as transformed at map r (also the new reference; layers
        given the same r share it)."""
        d2 = sum(float((self.pa[n] - transformed[n]).double().pow(2).sum()) for n in mlp_matrices(layer))
        if self._map is None or self._map[0] is not r:
            self._map = (r, r.double())
        self.refs[layer] = _Reference(self._map[1], d2)
        return d2

    def expanded(self, layer: int, r: Tensor, cross: Tensor) -> float:
        """The distance at map r, the layer's permutation unchanged since its reference; `cross` is
        that permutation's M (unscaled)."""
        return self.expanded_total(r, {layer: cross})

    def expanded_total(self, r: Tensor, crosses: dict[int, Tensor]) -> float:
        """The sum of `expanded` over the layers in `crosses` (layer -> M): the layers that share a
        reference share one product, with their K and G summed."""
        groups: dict[int, list[int]] = {}
        for layer in crosses:
            groups.setdefault(id(self.refs[layer].r), []).append(layer)
        total, r64 = 0.0, r.double()
        for members in groups.values():
            for layer in members:
                ref = self.refs[layer]
                if ref.k is None:
                    ref.k = crosses[layer].double() - ref.r @ self.gram(layer).double()
            delta = r64 - self.refs[members[0]].r
            k = sum(self.refs[layer].k for layer in members)
            gram = sum(self.gram(layer) for layer in members)
            # the quadratic term is of the order of |Delta|^2: float32 is exact enough for it
            quadratic = float(((delta.float() @ gram) * delta.float()).sum())
            total += sum(self.refs[layer].d2 for layer in members) - 2 * float((k * delta).sum()) + quadratic
        return total

    def gram(self, layer: int) -> Tensor:
        if layer not in self.grams:
            reader, writer = (self.pb[n] for n in mlp_matrices(layer))
            self.grams[layer] = reader.T @ reader + writer @ writer.T
        return self.grams[layer]
