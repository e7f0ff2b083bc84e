"""Merges of factored canonical models of identical shapes, with non-negative `weights` (default uniform):
fisher_merge (Matena & Raffel, 2022): theta = sum_i w_i F_i theta_i / sum_i w_i F_i, F_i the diagonal Fisher;
regmean_merge (Jin et al., 2023): each linear map W = (sum_i w_i W_i G_i) (sum_i w_i G_i)^-1, G_i = X_i^T X_i
  of its inputs [x; 1] (off-diagonals scaled by alpha); other tensors are averaged.
For per-model data, combine each model's fisher_information or gram_matrices."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from glmc.interpolation import interpolate
from glmc.metrics import IGNORE_INDEX, is_token_task, loss_and_correct
from glmc.models.canonical import CanonicalTransformer, canonical_forward
from glmc.models.families import family_named
from glmc.models.families.base import role_of
from glmc.models.families.roles import layer_of

MERGE_KINDS = ("average", "fisher", "regmean")


def _check_models(models: Sequence[torch.nn.Module], method: str) -> list[CanonicalTransformer]:
    models = list(models)
    if not models:
        raise ValueError(f"{method}: no models to merge")
    for i, m in enumerate(models):
        if not isinstance(m, CanonicalTransformer):
            raise TypeError(f"{method} merges canonical models (glmc.to_canonical); model {i} is {type(m).__name__}")
        if m.config.form != "factored":
            raise ValueError(
                f"{method} merges factored canonical models; model {i} is in circuit form (merge before .to_circuit())"
            )
    first, ref = models[0].config, models[0].params()
    for i, m in enumerate(models[1:], 1):
        for key in ("family", "activation", "causal", "pooling", "norm_dim", "norm_eps", "patch_size"):
            if getattr(m.config, key) != getattr(first, key):
                raise ValueError(
                    f"{method}: model {i} has {key}={getattr(m.config, key)!r} but model 0 has {getattr(first, key)!r}"
                )
        params = m.params()
        if params.keys() != ref.keys():
            raise ValueError(f"{method}: model {i} has other parameters than model 0: {sorted(set(params) ^ set(ref))}")
        for name, t in params.items():
            if t.shape != ref[name].shape:
                raise ValueError(
                    f"{method}: {name} has shape {tuple(t.shape)} in model {i} but {tuple(ref[name].shape)} in "
                    "model 0; merging needs models of identical shapes (circuit merges stack heads)"
                )
    return models


def _normalised_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0 / n] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise ValueError(f"{n} models but {len(weights)} weights")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights {weights} must be non-negative with a positive sum")
    total = sum(weights)
    return [w / total for w in weights]


def _batches(batches: Iterable, max_batches: int | None, method: str):
    if batches is None:
        raise ValueError(f"{method} needs training batches (inputs, targets)")
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches={max_batches} must be positive")
    return itertools.islice(iter(batches), max_batches)


def _device(model: CanonicalTransformer) -> torch.device:
    return next(iter(model.params().values())).device


def fisher_information(
    models: Sequence[CanonicalTransformer],
    batches: Iterable,
    task: str | None = None,
    max_batches: int | None = None,
) -> list[dict[str, Tensor]]:
    """Diagonal empirical Fisher of each model at its own parameters (float64, keyed like params()): the
    mean over batches of the squared gradient of the batch's mean log-likelihood (cheaper than per
    example, which it approximates: prefer small batches). IGNORE_INDEX targets are not counted."""
    models = _check_models(models, "fisher")
    task = task or models[0].task
    fishers = [{k: torch.zeros_like(v, dtype=torch.float64) for k, v in m.params().items()} for m in models]
    leaves = [{k: v.detach().clone().requires_grad_(True) for k, v in m.params().items()} for m in models]
    seen = 0
    for inputs, targets in _batches(batches, max_batches, "fisher"):
        for model, params, fisher in zip(models, leaves, fishers):
            device = _device(model)
            x, y = inputs.to(device), targets.to(device)
            with torch.enable_grad():
                logits = canonical_forward(model.config, params, x)
                loss, _, count = loss_and_correct(logits.float(), y, task)
                count = torch.as_tensor(count, device=device).clamp(min=1)
                grads = torch.autograd.grad(loss / count, list(params.values()), allow_unused=True)
            for name, g in zip(params, grads):
                if g is not None:
                    fisher[name] += g.double().square()
        seen += 1
    if seen == 0:
        raise ValueError("fisher: the batches are empty")
    for fisher in fishers:
        for t in fisher.values():
            t /= seen
    return fishers


def fisher_average(
    params: Sequence[dict[str, Tensor]],
    fishers: Sequence[dict[str, Tensor]],
    weights: Sequence[float] | None = None,
    eps: float = 1e-8,
) -> dict[str, Tensor]:
    """sum_i w_i (F_i + eps) theta_i / sum_i w_i (F_i + eps) per element, in params[0]'s dtype."""
    weights = _normalised_weights(weights, len(params))
    out = {}
    for name, ref in params[0].items():
        num = torch.zeros_like(ref, dtype=torch.float64)
        den = torch.zeros_like(ref, dtype=torch.float64)
        for w, p, f in zip(weights, params, fishers):
            wf = w * (f[name].to(num.device, torch.float64) + eps)
            num += wf * p[name].detach().double()
            den += wf
        out[name] = (num / den).to(ref.dtype)
    return out


def fisher_merge(
    models: Sequence[CanonicalTransformer],
    batches: Iterable,
    weights: Sequence[float] | None = None,
    task: str | None = None,
    eps: float = 1e-8,
    max_batches: int | None = None,
) -> CanonicalTransformer:
    """Fisher-weighted average of factored canonical models; `task` defaults to the models' own."""
    models = _check_models(models, "fisher")
    weights = _normalised_weights(weights, len(models))
    fishers = fisher_information(models, batches, task, max_batches)
    with torch.no_grad():
        merged = fisher_average([m.params() for m in models], fishers, weights, eps)
    return CanonicalTransformer(models[0].config, merged)


class LinearMap(NamedTuple):
    reads: str  # the recorded input (canonical_forward's names)
    weight: str
    bias: str | None  # None: the map has no bias (a Llama unembedding)
    heads_in: bool  # the input is the heads' outputs concatenated (the attention output map)


def linear_maps(model: CanonicalTransformer) -> dict[str, LinearMap]:
    """Every linear map of the model that its family's roles name, keyed by its weight's name."""
    layout = family_named(model.config.family).layout(model.config)
    maps = {}
    for name in model.params():
        role = role_of(layout, name)
        if role is not None and role.reads is not None:
            layer = layer_of(name)
            heads_in = any(a.space == "heads" and a.side == "in" for a in role.acts)
            bias = role.at(layer, role.bias) if role.bias is not None else None
            maps[name] = LinearMap(role.at(layer, role.reads), name, bias, heads_in)
    return maps


def augmented_matrix(params: dict[str, Tensor], linear: LinearMap) -> Tensor:
    """A map's [W | b] as an (out, in + 1) matrix (W alone without a bias). q/k/v (H, d, D) -> (H d, D);
    o_w (H, D, dv) -> (D, H dv), input index h dv + e; grouped-query weights (K, G, ...) count K G heads."""
    w = params[linear.weight]
    if linear.heads_in:
        w = w.flatten(0, w.dim() - 3)
        w = w.permute(1, 0, 2).reshape(w.shape[1], -1)
    else:
        w = w.reshape(-1, w.shape[-1])
    if linear.bias is None:
        return w
    return torch.cat([w, params[linear.bias].reshape(-1, 1)], dim=1)


def _split_matrix(matrix: Tensor, like: dict[str, Tensor], linear: LinearMap) -> dict[str, Tensor]:
    """Inverse of augmented_matrix, with the shapes and dtypes of `like`."""
    w_ref = like[linear.weight]
    w = matrix if linear.bias is None else matrix[:, :-1]
    if linear.heads_in:
        D, dv = w_ref.shape[-2:]
        w = w.reshape(D, -1, dv).permute(1, 0, 2)
    out = {linear.weight: w.reshape(w_ref.shape).to(w_ref.dtype)}
    if linear.bias is not None:
        b_ref = like[linear.bias]
        out[linear.bias] = matrix[:, -1].reshape(b_ref.shape).to(b_ref.dtype)
    return out


def _rows(name: str, t: Tensor, keep: Tensor | None, cls_only: bool) -> Tensor:
    """A recorded input as rows (tokens, features) + a constant-1 column, padding dropped."""
    if name.endswith("heads"):  # (B, H, T, dv) -> (B, T, H dv)
        t = t.permute(0, 2, 1, 3).flatten(2)
    if name == "final" and cls_only:
        t, keep = t[:, :1], None
    if keep is not None:
        t = t[keep]
    t = t.reshape(-1, t.shape[-1]).double()
    return torch.cat([t, t.new_ones(len(t), 1)], dim=1)


def gram_matrices(
    models: Sequence[CanonicalTransformer], batches: Iterable, max_batches: int | None = None
) -> list[dict[str, Tensor]]:
    """Per model, input name -> X^T X (float64) of its linear maps' inputs [x; 1], IGNORE_INDEX left out."""
    models = _check_models(models, "regmean")
    grams: list[dict[str, Tensor]] = [{} for _ in models]
    wanted = {linear.reads for linear in linear_maps(models[0]).values()}
    seen = 0
    for inputs, targets in _batches(batches, max_batches, "regmean"):
        for model, gram in zip(models, grams):
            device = _device(model)
            x = inputs.to(device)
            keep = targets.to(device) != IGNORE_INDEX if is_token_task(model.task) else None
            cls_only = model.config.pooling == "cls"

            def record(name, t, gram=gram, keep=keep, cls_only=cls_only):
                if name in wanted:
                    rows = _rows(name, t.detach(), keep, cls_only)
                    g = rows.T @ rows
                    gram[name] = gram[name] + g if name in gram else g

            with torch.no_grad():
                canonical_forward(model.config, model.params(), x, record)
        seen += 1
    if seen == 0:
        raise ValueError("regmean: the batches are empty")
    return grams


def regularised_gram(gram: Tensor, alpha: float) -> Tensor:
    """alpha G + (1 - alpha) diag(G): off-diagonal entries scaled by alpha."""
    return alpha * gram + (1 - alpha) * torch.diag_embed(gram.diagonal())


def regmean_linear(
    matrices: Sequence[Tensor],
    grams: Sequence[Tensor],
    weights: Sequence[float] | None = None,
    alpha: float = 0.9,
    rtol: float = 1e-10,
) -> Tensor:
    """W = (sum_i w_i W_i G_i) (sum_i w_i G_i)^+ (Gram off-diagonals scaled by alpha), in float64, cast to
    matrices[0]'s dtype. In directions no input reaches (eigenvalues below rtol times the largest) W is
    the weighted average of the W_i, so a model merged with itself is unchanged."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} must lie in [0, 1]")
    weights = _normalised_weights(weights, len(matrices))
    a = sum(w * regularised_gram(g.double(), alpha) for w, g in zip(weights, grams))
    b = sum(w * m.double() @ regularised_gram(g.double(), alpha) for w, m, g in zip(weights, matrices, grams))
    mean = sum(w * m.double() for w, m in zip(weights, matrices))
    values, vectors = torch.linalg.eigh((a + a.T) / 2)
    kept = values > rtol * values.abs().max().clamp(min=torch.finfo(torch.float64).tiny)
    u, s = vectors[:, kept], values[kept]
    solved = (b @ u) / s @ u.T
    out = solved + mean - (mean @ u) @ u.T
    return out.to(matrices[0].dtype)


def regmean_merge(
    models: Sequence[CanonicalTransformer],
    batches: Iterable,
    weights: Sequence[float] | None = None,
    alpha: float = 0.9,
    max_batches: int | None = None,
) -> CanonicalTransformer:
    """RegMean merge of factored canonical models: every linear map its family's roles name."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} must lie in [0, 1]")
    models = _check_models(models, "regmean")
    return regmean_from_grams(models, gram_matrices(models, batches, max_batches), weights, alpha)


def regmean_from_grams(
    models: Sequence[CanonicalTransformer],
    grams: Sequence[dict[str, Tensor]],
    weights: Sequence[float] | None = None,
    alpha: float = 0.9,
) -> CanonicalTransformer:
    """regmean_merge with given Gram matrices (gram_matrices' output), e.g. of each model's own data."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} must lie in [0, 1]")
    models = _check_models(models, "regmean")
    if len(grams) != len(models):
        raise ValueError(f"regmean: {len(models)} models but {len(grams)} sets of Gram matrices")
    weights = _normalised_weights(weights, len(models))
    params = [{k: v.detach() for k, v in m.params().items()} for m in models]
    merged: dict[str, Tensor] = {}
    with torch.no_grad():
        for linear in linear_maps(models[0]).values():
            mats = [augmented_matrix(p, linear) for p in params]
            # a map without a bias reads x, not [x; 1]: its Gram matrix without the constant's row and column
            keep = slice(None) if linear.bias is not None else slice(0, -1)
            gs = [g[linear.reads][keep, keep].to(mats[0].device) for g in grams]
            merged.update(_split_matrix(regmean_linear(mats, gs, weights, alpha), params[0], linear))
        for name, ref in params[0].items():
            if name not in merged:
                merged[name] = sum(w * p[name].double() for w, p in zip(weights, params)).to(ref.dtype)
    return CanonicalTransformer(models[0].config, {k: merged[k] for k in params[0]})


def _average(models, batches=None, weights=None):
    return interpolate(list(models), _normalised_weights(weights, len(models)))


def merged_model(kind: str, models: Sequence[torch.nn.Module], batches: Iterable | None = None, **options):
    """Merge `models` by `kind` ("average", "fisher" or "regmean"); options go to the method."""
    methods = {"average": _average, "fisher": fisher_merge, "regmean": regmean_merge}
    if kind not in methods:
        raise ValueError(f"unknown merge kind {kind!r}; allowed: {list(MERGE_KINDS)}")
    return methods[kind](models, batches, **options)
