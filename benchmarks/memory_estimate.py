"""What one step of learned matching keeps in accelerator memory, estimated from a model's shapes.

learned_matching_memory(model, batch, seq) counts the bytes LearnedMatchingModule holds at the peak of a
training step, per DDP rank (`batch` is per rank), every tensor `bytes_per_float` bytes per entry. Not
counted: DDP's gradient bucket, the CUDA context and allocator cache, the data loader, kernel temporaries.
With P the canonical parameter count and n each latent space's size, in entries:

  endpoints 2 P; latents 3 sum n^2 (with AdamW's moments); latent_grads sum n^2; projections sum n^2
  plus the polar factor's saved SVD (2 D^2) or 2 * iters n^2 per Sinkhorn latent; stacked: B's rows the
  orthogonal residual map reads; transformed: one input kept per move of B's weights (a first move that
  reads B's tensor in place is free); aligned: T(B)'s moved tensors; interpolated: the path's weights
  (circuit pairs stack both models' heads); forward_weights: attention weights the forward copies into
  its layout; weight_grads and largest_aligned: the backward through the moves, one tensor at a time;
  activations: activation_entries (fused attention assumed: no T x T scores).

  total = endpoints + stacked + latents + projections + transformed
          + max(aligned + interpolated, interpolated + forward_weights + activations,
                weight_grads + latent_grads + largest_aligned)

Checked against PyTorch's profiler for two-layer GPT-2, Llama and ViT shapes: 0 to 13 per cent above.
"""

from __future__ import annotations

from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.base import layer_sizes
from glmc.models.families.roles import HEAD_PAIRS, role_key
from glmc.symmetry import SymmetrySpec

# Entries kept per position (activation_entries): two norms' inputs and outputs per layer; per query head
# q, k, v, output, log-sum-exp (grouped-query also repeats k/v and copies the output: v three times)
NORM_ACTIVATIONS = 4
QK_ACTIVATIONS = 1
V_ACTIVATIONS = {"full": 2, "grouped": 3}
LSE_ACTIVATIONS = 1
PLAIN_MLP_ACTIVATIONS = 2
GATED_MLP_ACTIVATIONS = 4
END_ACTIVATIONS = 2
LOSS_ACTIVATIONS = 3
BACKWARD_PLAIN_MLP = 1
BACKWARD_GATED_MLP = 2

PARTS = tuple(
    "endpoints stacked latents latent_grads projections transformed aligned interpolated forward_weights"
    " weight_grads largest_aligned activations".split()
)


def latent_spaces(
    spec: SymmetrySpec, residual: str = "orthogonal", heads: bool = True, mlp: bool = True
) -> dict[str, int]:
    """The spaces learned matching trains a latent for (glmc.matching.learned.LearnedMatcher: the
    residual unless residual="none", per layer heads and MLP units unless switched off), name -> size."""
    wanted = {"residual": residual != "none", "heads": heads, "mlp": mlp}
    return {s.name: s.size for s in spec if wanted.get(s.kind, False)}


def _pair_tensors(model: CanonicalTransformer) -> dict[str, str]:
    """Block tensor name -> the per-head pair (qk or vo) it belongs to, for the model's tensors."""
    layout = family_named(model.config.family).layout(model.config)
    out = {}
    for name in model.params():
        role = layout.get(role_key(name))
        pair = next((a.space for a in role.acts if a.space in HEAD_PAIRS), None) if role else None
        if pair is not None:
            out[name] = pair
    return out


def learned_matching_memory(
    model_a: CanonicalTransformer,
    batch: int,
    seq: int,
    bytes_per_float: int = 4,
    residual: str = "orthogonal",
    units: str = "permutation",
    heads: bool = True,
    mlp: bool = True,
    circuits: tuple[str, ...] | None = None,
    sinkhorn_iters: int = 20,
) -> dict[str, int]:
    """Bytes per part of one learned-matching step (module docstring) and their `total`.

    model_a: one factored endpoint; batch, seq: per-rank batch and tokens per input; residual, units,
    heads, mlp: the latents trained; circuits: pairs interpolated as circuits (None: qk and vo)."""
    circuits = _checked(model_a, batch, seq, bytes_per_float, residual, units, circuits)
    params = model_a.params()
    numel = {name: t.numel() for name, t in params.items()}
    spec = SymmetrySpec.from_model(model_a)
    latents = latent_spaces(spec, residual, heads, mlp)
    contractions, transformed = _moves(spec, latents, model_a)
    entries = {
        "endpoints": 2 * sum(numel.values()),
        "stacked": _stacked(spec, latents, residual, model_a),
        "latents": 3 * sum(n * n for n in latents.values()),
        "latent_grads": sum(n * n for n in latents.values()),
        "projections": _projected(spec, latents, residual, units, sinkhorn_iters),
        "transformed": transformed,
        **_merged(model_a, contractions, tuple(circuits)),
        "activations": sum(activation_entries(model_a, batch, seq, tuple(circuits))),
    }
    parts = {k: entries[k] * bytes_per_float for k in PARTS}
    held = sum(parts[k] for k in ("endpoints", "stacked", "latents", "projections", "transformed"))
    phases = (
        parts["aligned"] + parts["interpolated"],
        parts["interpolated"] + parts["forward_weights"] + parts["activations"],
        parts["weight_grads"] + parts["latent_grads"] + parts["largest_aligned"],
    )
    parts["total"] = held + max(phases)
    return parts


def _checked(
    model_a: CanonicalTransformer,
    batch: int,
    seq: int,
    bytes_per_float: int,
    residual: str,
    units: str,
    circuits: tuple[str, ...] | None,
) -> tuple[str, ...]:
    """learned_matching_memory's arguments checked; returns the circuit pairs (None: both)."""
    if model_a.config.form != "factored":
        raise ValueError("learned matching transforms factored heads: pass the model before .to_circuit()")
    if residual not in ("orthogonal", "permutation", "none"):
        raise ValueError(f"residual={residual!r} is not one of orthogonal, permutation, none")
    if units not in ("permutation", "sinkhorn"):
        raise ValueError(f"units={units!r} is not one of permutation, sinkhorn")
    if batch < 1 or seq < 1 or bytes_per_float < 1:
        raise ValueError(f"batch={batch}, seq={seq}, bytes_per_float={bytes_per_float}: all must be positive")
    circuits = HEAD_PAIRS if circuits is None else circuits
    bad = set(circuits) - set(HEAD_PAIRS)
    if bad:
        raise ValueError(f"circuits={tuple(circuits)}: only qk and vo are interpolated as circuits")
    return circuits


def _projected(spec: SymmetrySpec, latents: dict[str, int], residual: str, units: str, sinkhorn_iters: int) -> int:
    """projections: the dense matrices every step builds from the latents, and what they keep."""
    projected = 0
    for name, n in latents.items():
        projected += n * n
        if spec[name].kind == "residual" and residual == "orthogonal":
            projected += 2 * n * n  # polar: the SVD's U and V^T, saved for its backward
        elif spec[name].kind != "residual" and units == "sinkhorn":
            projected += 2 * sinkhorn_iters * n * n
    return projected


def _stacked(spec: SymmetrySpec, latents: dict[str, int], residual: str, model: CanonicalTransformer) -> int:
    """stacked: the rows the residual product reads, built once (LatentApplier)."""
    if "residual" not in latents or residual != "orthogonal":
        return 0
    params, stacked = model.params(), 0
    for ax in spec["residual"].acts_on:
        t = params[ax.param]
        size = t.shape[ax.axis]
        stacked += t.numel() // size * (size - ax.extra)
    return stacked


def _moves(spec: SymmetrySpec, latents: dict[str, int], model: CanonicalTransformer) -> tuple[dict[str, int], int]:
    """The moves of B's weights by the latents, in spec order: per tensor how many (those it has), and
    transformed, the entries they keep as inputs."""
    params = model.params()
    contractions: dict[str, int] = {}
    transformed = 0
    for space in spec:
        if space.name not in latents:
            continue
        for ax in space.acts_on:
            done = contractions.get(ax.param, 0)
            contractions[ax.param] = done + 1
            shape = tuple(params[ax.param].shape)
            in_place = done == 0 and (len(shape) <= 2 or ax.axis == len(shape) - 1)
            transformed += 0 if in_place else params[ax.param].numel()
    return contractions, transformed


def _merged(model: CanonicalTransformer, contractions: dict[str, int], circuits: tuple[str, ...]) -> dict[str, int]:
    """The parts the merge and its backward hold: aligned, interpolated (circuit pairs stack both
    models' heads), forward_weights, weight_grads and largest_aligned, in entries."""
    numel = {name: t.numel() for name, t in model.params().items()}
    pairs = _pair_tensors(model)
    merged = {name: numel[name] * (2 if pairs.get(name) in circuits else 1) for name in numel}
    grouped = family_named(model.config.family).attention_block().grouped
    copied = {f"blocks.{{l}}.{w}" for w in (("o_w",) if grouped else ("q_w", "k_w", "v_w", "o_w"))}
    return {
        "aligned": sum(numel[name] for name in contractions),
        "interpolated": sum(merged.values()),
        "forward_weights": sum(merged[name] for name in numel if role_key(name) in copied),
        "weight_grads": sum(merged[name] for name in contractions),
        "largest_aligned": max((numel[name] for name in contractions), default=0),
    }


def model_shapes(model: CanonicalTransformer) -> list[dict[str, int]]:
    """Per layer: width D, query heads H, key/value heads K, query/key and value head dims, MLP units F."""
    config = model.config
    family = family_named(config.family)
    sizes = layer_sizes(family.layout(config), model.params(), model.num_layers)
    out = []
    for layer in range(model.num_layers):
        groups = sizes["heads"][layer]
        per_group = sizes["qheads"][layer] if "qheads" in sizes else 1
        out.append(
            {
                "width": model.width,
                "query_heads": groups * per_group,
                "kv_heads": groups,
                "qk_dim": model.params()[f"blocks.{layer}.k_w"].shape[-2],  # also where no qk space acts
                "vo_dim": sizes["vo"][layer],
                "mlp": sizes["mlp"][layer],
            }
        )
    return out


def activation_entries(
    model: CanonicalTransformer, batch: int, seq: int, circuits: tuple[str, ...] = ()
) -> tuple[int, int]:
    """(kept, transient): the entries the forward keeps for the backward, and the larger of the loss's
    logits (3 B T V) and the last layer's backward (D + F, gated D + 2 F per position)."""
    family = family_named(model.config.family)
    gated = family.mlp_kind == "gated"
    v_saved = V_ACTIVATIONS["grouped" if family.attention_block().grouped else "full"]
    positions = batch * seq
    mlp_saved = GATED_MLP_ACTIVATIONS if gated else PLAIN_MLP_ACTIVATIONS
    per_position = END_ACTIVATIONS * model.width
    layers = model_shapes(model)
    for s in layers:
        dq = dk = s["qk_dim"] * (2 if "qk" in circuits else 1)
        dv = s["vo_dim"] * (2 if "vo" in circuits else 1)
        per_position += NORM_ACTIVATIONS * s["width"]
        per_position += s["query_heads"] * (QK_ACTIVATIONS * (dq + dk) + v_saved * dv + LSE_ACTIVATIONS)
        per_position += mlp_saved * s["mlp"]
    outputs = model.params()["head.w"].shape[0]
    loss = LOSS_ACTIVATIONS * positions * outputs if model.config.pooling == "none" else batch * outputs
    last = layers[-1] if layers else {"width": model.width, "mlp": 0}
    layer = positions * (last["width"] + (BACKWARD_GATED_MLP if gated else BACKWARD_PLAIN_MLP) * last["mlp"])
    return per_position * positions, max(loss, layer)
