"""Group elements, one small dataclass of tensors per symmetry class (paper 001 Table 1).

`forward()` is the matrix applied where a parameter writes into the element's space, `contra()` (its
inverse transpose) where one reads from it; permutations and semi-permutations gather instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor


class Element:
    kind: ClassVar[str]

    def to(self, device=None, dtype=None) -> Element:
        """Moved copy; index tensors keep their integer dtype."""

        def move(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)

        return dataclasses.replace(self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)})


def random_orthogonal(m: int, n: int, generator=None, batch: tuple = (), dtype=torch.float32) -> Tensor:
    """Haar-random (..., m, n) matrices with orthonormal columns, m >= n."""
    if m < n:
        raise ValueError(f"orthonormal columns need m >= n, got {m} x {n}")
    g = torch.randn(*batch, m, n, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    # sign fix makes the distribution Haar rather than biased by the QR convention
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q.to(dtype)


@dataclass
class Permutation(Element):
    """New unit i is old unit perm[i] (matrix P with P[i, perm[i]] = 1). A (heads, n) perm holds one
    permutation per head (the query heads of each key/value group)."""

    perm: Tensor
    kind: ClassVar[str] = "permutation"

    @property
    def size(self) -> int:
        return self.perm.shape[-1]

    @property
    def heads(self) -> int | None:
        return self.perm.shape[0] if self.perm.dim() == 2 else None

    @classmethod
    def identity(cls, n: int, heads: int | None = None) -> Permutation:
        return cls(torch.arange(n) if heads is None else torch.arange(n).repeat(heads, 1))

    @classmethod
    def sample(cls, n: int, generator=None, heads: int | None = None) -> Permutation:
        if heads is None:
            return cls(torch.randperm(n, generator=generator))
        return cls(torch.stack([torch.randperm(n, generator=generator) for _ in range(heads)]))

    @classmethod
    def project(cls, similarity: Tensor) -> Permutation:
        """The permutation maximising sum_i similarity[i, perm[i]] (Hungarian algorithm), the rows' maxima
        where they fall in distinct columns (no assignment can exceed their sum)."""
        s = similarity.detach()
        shortcut = cls.from_row_maxima(s)
        if shortcut is not None:
            return shortcut
        _, cols = linear_sum_assignment(s.cpu().double().numpy(), maximize=True)
        return cls(torch.as_tensor(cols, device=similarity.device))

    @classmethod
    def from_row_maxima(cls, similarity: Tensor) -> Permutation | None:
        """The columns of the rows' largest entries where they are all different (then the optimal
        assignment), else None. A finite (n, m) matrix with n <= m only."""
        s = similarity.detach()
        if s.dim() != 2 or not 0 < s.shape[0] <= s.shape[1]:
            return None
        best = s.argmax(1)
        if len(torch.unique(best)) != len(best) or not bool(torch.isfinite(s).all()):
            return None
        return cls(best)

    def dense(self, dtype=torch.float32) -> Tensor:
        """P, or (heads, n, n) for one permutation per head."""
        return torch.eye(self.size, dtype=dtype, device=self.perm.device)[self.perm]

    def inverse(self) -> Permutation:
        return Permutation(torch.argsort(self.perm, dim=-1))


@dataclass
class SignedPermutation(Element):
    """New unit i is old unit perm[i] times signs[i] (matrix M with M[i, perm[i]] = signs[i] = +-1): the
    orthogonal maps that keep an elementwise gain's coordinates apart. Writers and readers both gather and
    flip (M is its own inverse transpose); a gain (Axis.gain) is gathered only, as a sign commutes with it."""

    perm: Tensor
    signs: Tensor
    kind: ClassVar[str] = "signed_permutation"

    @property
    def size(self) -> int:
        return self.perm.shape[-1]

    @classmethod
    def identity(cls, n: int) -> SignedPermutation:
        return cls(torch.arange(n), torch.ones(n))

    @classmethod
    def sample(cls, n: int, generator=None, dtype=torch.float32) -> SignedPermutation:
        signs = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0).to(dtype)
        return cls(torch.randperm(n, generator=generator), signs)

    @classmethod
    def project(cls, signed: Tensor, unsigned: Tensor | float = 0.0) -> SignedPermutation:
        """The signed permutation maximising sum_i signs[i] signed[i, perm[i]] + unsigned[i, perm[i]]: each
        pair's best sign is that of its signed entry, so the assignment runs on |signed| + unsigned and the
        signs are read off the matched entries (exact: the sign of a pair does not affect any other)."""
        signed = signed.detach()
        perm = Permutation.project(signed.abs() + unsigned).perm
        matched = signed[torch.arange(len(perm), device=signed.device), perm.to(signed.device)]
        return cls(perm.to(signed.device), torch.where(matched < 0, -1.0, 1.0).to(signed.device, signed.dtype))

    def dense(self, dtype=torch.float32) -> Tensor:
        return torch.eye(self.size, dtype=dtype, device=self.perm.device)[self.perm] * self.signs.to(dtype)[:, None]

    def forward(self) -> Tensor:
        return self.dense(self.signs.dtype)

    def contra(self) -> Tensor:
        return self.forward()

    def inverse(self) -> SignedPermutation:
        back = torch.argsort(self.perm)
        return SignedPermutation(back, self.signs[back])


@dataclass
class SemiPermutation(Element):
    """n old units -> m >= n new units: new unit k copies old unit src[k] with share weight[k] (paper 001
    §3.1: S[k, src[k]] = weight[k], every old unit's shares positive and summing to 1)."""

    src: Tensor
    weight: Tensor
    kind: ClassVar[str] = "semi_permutation"

    def __post_init__(self):
        n = int(self.src.max()) + 1 if len(self.src) else 0
        totals = torch.zeros(n, dtype=torch.float64, device=self.src.device)
        totals.index_add_(0, self.src, self.weight.double())
        if (self.weight <= 0).any() or not torch.allclose(totals, torch.ones_like(totals), atol=1e-5):
            raise ValueError("semi-permutation shares must be positive and sum to 1 for every old unit")

    @property
    def size(self) -> int:
        return int(self.src.max()) + 1

    @property
    def out_size(self) -> int:
        return len(self.src)

    @classmethod
    def identity(cls, n: int) -> SemiPermutation:
        return cls(torch.arange(n), torch.ones(n))

    @classmethod
    def sample(cls, n: int, m: int, generator=None, dtype=torch.float32) -> SemiPermutation:
        if m < n:
            raise ValueError(f"a semi-permutation maps n to m >= n units, got {n} -> {m}")
        src = torch.cat([torch.arange(n), torch.randint(0, n, (m - n,), generator=generator)])
        src = src[torch.randperm(m, generator=generator)]
        raw = torch.rand(m, generator=generator, dtype=torch.float64) + 0.5
        totals = torch.zeros(n, dtype=torch.float64).index_add_(0, src, raw)
        return cls(src, (raw / totals[src]).to(dtype))

    def dense(self) -> Tensor:
        s = torch.zeros(self.out_size, self.size, dtype=self.weight.dtype, device=self.weight.device)
        s[torch.arange(self.out_size), self.src] = self.weight
        return s


@dataclass
class Orthogonal(Element):
    """m x n matrix with orthonormal columns (m >= n; m > n widens the space)."""

    matrix: Tensor
    kind: ClassVar[str] = "orthogonal"

    @property
    def size(self) -> int:
        return self.matrix.shape[1]

    @classmethod
    def identity(cls, n: int) -> Orthogonal:
        return cls(torch.eye(n))

    @classmethod
    def sample(cls, n: int, generator=None, m: int | None = None, dtype=torch.float32) -> Orthogonal:
        return cls(random_orthogonal(m or n, n, generator, dtype=dtype))

    @classmethod
    def project(cls, matrix: Tensor) -> Orthogonal:
        """Nearest matrix with orthonormal columns in Frobenius norm (polar factor U V^T)."""
        u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
        return cls(u @ vh)

    def forward(self) -> Tensor:
        return self.matrix

    def contra(self) -> Tensor:
        # O^T O = I, so readers W -> W O^T undo writers x -> O x even when O is rectangular
        return self.matrix


@dataclass
class Invertible(Element):
    """One invertible d x d matrix per head, (H, d, d)."""

    matrices: Tensor
    kind: ClassVar[str] = "invertible"

    @property
    def heads(self) -> int:
        return self.matrices.shape[0]

    @property
    def size(self) -> int:
        return self.matrices.shape[-1]

    @classmethod
    def identity(cls, heads: int, d: int) -> Invertible:
        return cls(torch.eye(d).expand(heads, d, d).clone())

    @classmethod
    def sample(cls, heads: int, d: int, generator=None, dtype=torch.float32) -> Invertible:
        # U diag(s) V with singular values in [e^-1, e]: random but well conditioned
        u = random_orthogonal(d, d, generator, (heads,), torch.float64)
        v = random_orthogonal(d, d, generator, (heads,), torch.float64)
        s = torch.exp(2 * torch.rand(heads, 1, d, generator=generator, dtype=torch.float64) - 1)
        return cls(((u * s) @ v).to(dtype))

    def forward(self) -> Tensor:
        return self.matrices

    def contra(self) -> Tensor:
        return torch.linalg.inv(self.matrices).transpose(-1, -2)


@dataclass
class OrthogonalScale(Element):
    """Per head an orthogonal matrix times a positive scalar, s R (rotation + rescaling, paper 002)."""

    rotations: Tensor
    scales: Tensor
    kind: ClassVar[str] = "orthogonal_scale"

    @property
    def heads(self) -> int:
        return self.rotations.shape[0]

    @property
    def size(self) -> int:
        return self.rotations.shape[-1]

    @classmethod
    def identity(cls, heads: int, d: int) -> OrthogonalScale:
        return cls(torch.eye(d).expand(heads, d, d).clone(), torch.ones(heads))

    @classmethod
    def sample(cls, heads: int, d: int, generator=None, dtype=torch.float32) -> OrthogonalScale:
        rotations = random_orthogonal(d, d, generator, (heads,), dtype)
        scales = torch.exp(2 * torch.rand(heads, generator=generator, dtype=torch.float64) - 1)
        return cls(rotations, scales.to(dtype))

    def forward(self) -> Tensor:
        return self.scales[:, None, None] * self.rotations

    def contra(self) -> Tensor:
        return self.rotations / self.scales[:, None, None]


@dataclass
class Diagonal(Element):
    """Per unit a non-zero scale s: writers get diag(s), readers diag(1/s) (a gated MLP's linear branch).
    (heads, n) scales hold one diagonal per head or expert (each expert's units)."""

    scales: Tensor
    kind: ClassVar[str] = "diagonal"

    @property
    def size(self) -> int:
        return self.scales.shape[-1]

    @property
    def heads(self) -> int | None:
        return self.scales.shape[0] if self.scales.dim() == 2 else None

    @classmethod
    def identity(cls, n: int, heads: int | None = None) -> Diagonal:
        return cls(torch.ones(n) if heads is None else torch.ones(heads, n))

    @classmethod
    def sample(cls, n: int, generator=None, dtype=torch.float32, heads: int | None = None) -> Diagonal:
        shape = (n,) if heads is None else (heads, n)
        magnitude = torch.exp(2 * torch.rand(shape, generator=generator, dtype=torch.float64) - 1)
        sign = torch.where(torch.rand(shape, generator=generator) < 0.5, -1.0, 1.0).double()
        return cls((magnitude if cls.positive else sign * magnitude).to(dtype))

    positive: ClassVar[bool] = False

    def forward(self) -> Tensor:
        return torch.diag_embed(self.scales)

    def contra(self) -> Tensor:
        return torch.diag_embed(1 / self.scales)


@dataclass
class PositiveDiagonal(Diagonal):
    """Per unit a positive scale: the units of a positively homogeneous activation (ReLU(a z) = a ReLU(z) for
    a > 0) scaled against their readers."""

    kind: ClassVar[str] = "positive_diagonal"
    positive: ClassVar[bool] = True


@dataclass
class RotaryScale(Element):
    """Per head and rotary pair (i, i + r/2) a rotation-scaling [[a, -b], [b, a]] (`real` a, `imag` b,
    (heads, r/2)): the maps commuting with every position's rotation. Under partial rotary `passthrough`
    (heads, d - r, d - r) is any invertible map of the unrotated dims (empty where every dim rotates)."""

    real: Tensor
    imag: Tensor
    passthrough: Tensor | None = None
    kind: ClassVar[str] = "rotary_scale"

    def __post_init__(self):
        if self.passthrough is None:
            self.passthrough = self.real.new_zeros(self.real.shape[0], 0, 0)

    @property
    def heads(self) -> int:
        return self.real.shape[0]

    @property
    def rotary_dims(self) -> int:
        return 2 * self.real.shape[-1]

    @property
    def size(self) -> int:
        return self.rotary_dims + self.passthrough.shape[-1]

    @classmethod
    def identity(cls, heads: int, d: int, rotary_dims: int | None = None) -> RotaryScale:
        r = d if rotary_dims is None else rotary_dims
        passthrough = torch.eye(d - r).expand(heads, d - r, d - r).clone()
        return cls(torch.ones(heads, r // 2), torch.zeros(heads, r // 2), passthrough)

    @classmethod
    def sample(
        cls, heads: int, d: int, generator=None, dtype=torch.float32, rotary_dims: int | None = None
    ) -> RotaryScale:
        r = d if rotary_dims is None else rotary_dims
        angle = 2 * torch.pi * torch.rand(heads, r // 2, generator=generator, dtype=torch.float64)
        scale = torch.exp(2 * torch.rand(heads, r // 2, generator=generator, dtype=torch.float64) - 1)
        passthrough = Invertible.sample(heads, d - r, generator, dtype).matrices if r < d else None
        return cls((scale * angle.cos()).to(dtype), (scale * angle.sin()).to(dtype), passthrough)

    @classmethod
    def from_complex(cls, z: Tensor, passthrough: Tensor | None = None) -> RotaryScale:
        return cls(z.real.contiguous(), z.imag.contiguous(), passthrough)

    def _pairs(self) -> Tensor:
        heads, half = self.real.shape
        m = self.real.new_zeros(heads, 2 * half, 2 * half)
        i = torch.arange(half, device=self.real.device)
        m[:, i, i] = self.real
        m[:, i + half, i + half] = self.real
        m[:, i, i + half] = -self.imag
        m[:, i + half, i] = self.imag
        return m

    def _with_passthrough(self, pairs: Tensor, passthrough: Tensor) -> Tensor:
        if passthrough.shape[-1] == 0:
            return pairs
        return torch.stack([torch.block_diag(a, b) for a, b in zip(pairs, passthrough.to(pairs.dtype))])

    def forward(self) -> Tensor:
        return self._with_passthrough(self._pairs(), self.passthrough)

    def contra(self) -> Tensor:
        norm = self.real.pow(2) + self.imag.pow(2)
        pairs = self._pairs() / torch.cat([norm, norm], -1)[:, :, None]
        if self.passthrough.shape[-1] == 0:
            return pairs
        return self._with_passthrough(pairs, torch.linalg.inv(self.passthrough).transpose(-1, -2))


CLASSES = {
    c.kind: c
    for c in (
        Permutation,
        SignedPermutation,
        SemiPermutation,
        Orthogonal,
        Invertible,
        OrthogonalScale,
        Diagonal,
        PositiveDiagonal,
        RotaryScale,
    )
}
