"""What one step of learned matching keeps in accelerator memory, estimated from a model's shapes.

learned_matching_memory(model, batch, seq) counts, in bytes, what LearnedMatchingModule holds at the
peak of a training step (glmc.matching.learned_module: project the latents, transform B's weights
densely, interpolate with A, forward and backward on a batch, AdamW on the latents). All tensors are
taken to have `bytes_per_float` bytes per entry (4: learned matching trains in float32). Every rank
of a DDP run holds all of it (`batch` is the per-rank batch). Not counted: DDP's gradient bucket (as
large as latent_grads), the CUDA context and the allocator's cache and fragmentation (leave a GiB or
two), the data loader, and temporaries of a single kernel. Written for pre-norm models, multi-head
(GPT-2, ViT) or grouped-query (Llama); post-norm ones (BERT) are counted alike, their LayerNorms as the
norms, their masked-LM head's dense layer and norm (a few D per position) left out.

The parts, in entries of `bytes_per_float` bytes, with P the canonical parameter count (heads untied
from the embeddings, biases the source lacks as zeros), n the size of each space that has a latent
(the residual width D; per layer the heads, or a grouped-query model's key/value groups; the MLP
units F), and B x T the batch:

  endpoints       2 P: both models' canonical tensors.
  latents         3 sum n^2: each n x n latent and AdamW's two moments.
  latent_grads    sum n^2: the latents' gradients (a projected matrix's gradient becomes its latent's),
                  made in the backward through the moves of B's weights.
  projections     sum n^2 for the projected matrices the contractions keep for the backward, plus
                  2 D^2 for the polar factor's saved SVD (U, V^T) of an orthogonal residual, or
                  2 * iters n^2 more per Sinkhorn latent (every normalisation keeps its input).
  stacked         with an orthogonal residual latent, B's tensors that the residual map acts on, stacked
                  once as rows of one matrix (glmc.matching.latent_apply), so that the map is one
                  product per step.
  transformed     one tensor per move of B's weights by a latent (the residual product, a permutation's
                  gather: each keeps its input for the latent's gradient), except a first move that
                  reads B's own tensor in place (a vector or matrix, or the space on the last axis):
                  in-place reads are part of the endpoints.
  aligned         T(B)'s tensors that a latent moves: built before the merge, freed after it.
  interpolated    the path's weights lam A + (1 - lam) T(B); a pair interpolated as circuits (GPT-2
                  and ViT heads by default) stacks both models' heads, so its q, k, v and o tensors
                  count twice.
  forward_weights the copies of the interpolated attention weights that the forward reads in its own
                  layout, kept for the backward: every layer's output projection o_w, and where the
                  heads are not grouped its q, k and v weights too (joined for one product).
  weight_grads    the gradients of the interpolated weights that depend on a latent. The backward
                  frees each interpolated weight as it makes its gradient, so they take the weights'
                  place, and in the backward through the moves the gradients of T(B)'s tensors take
                  theirs, one tensor at a time (counted: the largest aligned tensor, `largest_aligned`).
  activations     what the forward keeps for its backward, per layer and position
                      4 D                             the stream read by the two norms, and their outputs
                    + H (dq + dk + 2 dv + 1)          fused attention's q, k, v, output and log-sum-exp
                                                      (multi-head: the output projection reads it in place)
                    + H (dq + dk + 3 dv + 1)          grouped-query instead: key/value heads repeated to the
                                                      H query heads, and a copy of the output for its projection
                    + 2 F (plain) | 4 F (gated)       the MLP's pre-activation and activation; gated: gate
                                                      pre-activation, its activation, the up branch, the product
                  plus 2 D at the ends (the embedding's output, the final norm's output). On top of
                  these, the larger of two transients: a language model's loss, 3 B T V_out (the logits,
                  their shifted copy and the log-softmax; at the start of the backward the log-softmax
                  and its gradient and the logits' gradient: three B x T x vocabulary tensors live at
                  once; classification: B x classes), and the last layer's backward, (D + F) per
                  position for a plain MLP, (D + 2 F) for a gated one (the stream's gradient and the
                  MLP's gradients before the tensors they replace are freed). dq, dk, dv are the
                  interpolated head dimensions (twice the model's where the pair is a circuit). Assumes
                  a fused attention kernel (flash or memory-efficient, the GPU default), which keeps no
                  T x T scores; PyTorch's math fallback would add B H T^2 per layer.

Endpoints, latents, projections and transformed are held through the step; the rest peaks in one of
three phases, so

  total = endpoints + stacked + latents + projections + transformed
          + max(aligned + interpolated,                          the merge
                interpolated + forward_weights + activations,    the turn from forward to backward
                weight_grads + latent_grads + largest_aligned)   the backward through the moves

The second phase counts every interpolated weight, though the forward keeps no token or position
table (a lookup keeps the indices): an overestimate by those tables, largest where the loss's
vocabulary tensors are about as large. Checked against the peak of what a step allocates beyond the
endpoints and latents on the CPU (PyTorch's profiler; its fused attention keeps what the GPU kernels
keep), for two-layer GPT-2, Llama and ViT shapes of 0.5 to 6 million parameters and batches of 16 to
16,640 positions: the estimate is 0 to 13 per cent above the measurement.
"""

from __future__ import annotations

from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.base import layer_sizes
from glmc.models.families.roles import HEAD_PAIRS, role_key
from glmc.symmetry import SymmetrySpec

# The constants of the activation count (module docstring), entries per position: per layer
# NORM_ACTIVATIONS * D, per query head QK_ACTIVATIONS * (dq + dk) + V_ACTIVATIONS * dv + LSE_ACTIVATIONS,
# and PLAIN_MLP_ACTIVATIONS or GATED_MLP_ACTIVATIONS per MLP unit; END_ACTIVATIONS * D once; then the
# larger transient of LOSS_ACTIVATIONS * vocabulary (language models) and D + BACKWARD_MLP_* * F.
NORM_ACTIVATIONS = 4
QK_ACTIVATIONS = 1
# multi-head attention projects q, k, v in one product and its output projection reads the attention
# output in place (dv twice: v and the output); grouped-query attention repeats keys and values per
# query head and copies the output for its projection (three times)
V_ACTIVATIONS = {"full": 2, "grouped": 3}
LSE_ACTIVATIONS = 1
PLAIN_MLP_ACTIVATIONS = 2
GATED_MLP_ACTIVATIONS = 4
END_ACTIVATIONS = 2
LOSS_ACTIVATIONS = 3
BACKWARD_PLAIN_MLP = 1
BACKWARD_GATED_MLP = 2

PARTS = (
    "endpoints",
    "stacked",
    "latents",
    "latent_grads",
    "projections",
    "transformed",
    "aligned",
    "interpolated",
    "forward_weights",
    "weight_grads",
    "largest_aligned",
    "activations",
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

    model_a: one endpoint in factored form (the other has the same shapes). batch, seq: the training
    batch, per rank, and its tokens per input (ViT: patches + 1). residual: orthogonal | permutation |
    none; units: permutation | sinkhorn for the heads and MLP latents (heads / mlp switch them off);
    circuits: the attention pairs interpolated as circuits (None: ("qk", "vo"), the learned matcher's
    default; rotary heads stack the same way)."""
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
    grouped = family_named(model.config.family).attention_kind == "grouped"
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
                "qk_dim": sizes["qk"][layer],
                "vo_dim": sizes["vo"][layer],
                "mlp": sizes["mlp"][layer],
            }
        )
    return out


def activation_entries(
    model: CanonicalTransformer, batch: int, seq: int, circuits: tuple[str, ...] = ()
) -> tuple[int, int]:
    """(kept, transient): the entries the forward keeps for the backward, and the larger of the loss's
    and the last layer's backward transients (module docstring); `activations` is their sum."""
    family = family_named(model.config.family)
    gated = family.mlp_kind == "gated"
    v_saved = V_ACTIVATIONS[family.attention_kind]
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
