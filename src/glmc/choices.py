"""String choices as enums, so a misspelled value fails at composition and names the key."""

from __future__ import annotations

from enum import StrEnum

from glmc.datasets import dataset_names
from glmc.models.families.registry import family_names

# the registries' names as choices: a new family or dataset is a choice without an edit here
Family = StrEnum("Family", [(name, name) for name in family_names()])
Dataset = StrEnum("Dataset", [(name, name) for name in dataset_names()])  # data.name


class TokenizerKind(StrEnum):
    char = "char"  # one id per character of the corpus
    gpt2 = "gpt2"  # GPT-2's byte-level BPE (50,257 ids)
    wordpiece = "wordpiece"  # BERT-style WordPiece trained on the corpus's training block (glmc.data.wordpiece)
    # the Hugging Face tokenizer saved in data.tokenizer_path (save_pretrained), read with AutoTokenizer, local
    # files only: what endpoints=pretrained encodes text with
    pretrained = "pretrained"


class Task(StrEnum):
    classification = "classification"
    causal_lm = "causal_lm"
    masked_lm = "masked_lm"  # BERT's objective: predict the masked tokens of a window


class LoggerKind(StrEnum):
    csv = "csv"
    wandb = "wandb"
    none = "none"


class LoggerMode(StrEnum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class ResidualClass(StrEnum):
    # the widest class the endpoints' family admits (glmc.symmetry.family_defaults): orthogonal for
    # pre-norm streams, permutation for post-norm ones
    auto = "auto"
    orthogonal = "orthogonal"
    # each coordinate moved and possibly negated: RMS-normalised streams (Llama-style), the widest class where
    # a norm with a gain touches the stream (sandwich norms: OLMo-2, Gemma 2 and 3)
    signed_permutation = "signed_permutation"
    permutation = "permutation"
    none = "none"


class UnitClass(StrEnum):
    permutation = "permutation"
    none = "none"


class HeadForm(StrEnum):
    circuit = "circuit"  # QK/OV circuits: the in-head invertible symmetries are absorbed
    none = "none"  # factored weights interpolated as they are


class LambdaScheme(StrEnum):
    fixed = "fixed"
    uniform_mid = "uniform_mid"
    uniform = "uniform"
    gaussian = "gaussian"
    arcsine = "arcsine"  # Beta(1/2, 1/2): most draws near the endpoints (ours, not in paper 001)


class LearnedInit(StrEnum):
    weight = "weight"
    identity = "identity"


class EmbedStream(StrEnum):
    keep = "keep"  # the embedded narrow stream keeps its size; eps rescaled by n / N
    rms = "rms"  # writers scaled by sqrt(N / n): the stream keeps its root mean square and eps stays


class EndpointSource(StrEnum):
    trained = "trained"  # trained here from `seeds` (or read from the endpoint cache)
    pretrained = "pretrained"  # Hugging Face model folders (endpoints.paths), loaded and never trained
    finetuned = "finetuned"  # children fine-tuned from one parent (pretrain.*) on each task of endpoints.tasks
    spawn = "spawn"  # children continued from one parent's state at each step of endpoints.steps


class SeedVary(StrEnum):
    both = "both"  # an endpoint's seed draws its initialisation, data order and dropout
    init = "init"  # the initialisation; data order and dropout from seed_fixed
    data = "data"  # data order and dropout; the initialisation from seed_fixed


class Pairing(StrEnum):
    disjoint = "disjoint"  # (s0, s1), (s2, s3), ...: independent pairs
    all = "all"  # every pair
    first = "first"  # (s0, s1), (s0, s2), ...: the first endpoint against each other one (e.g. wide vs narrow)
    universe = "universe"  # all endpoints at once: universe matching and the barrier over the simplex


class UnitLatent(StrEnum):
    permutation = "permutation"  # hard permutations with a straight-through gradient
    sinkhorn = "sinkhorn"  # soft permutations (paper 001 Appendix D)


class EvalPrecision(StrEnum):
    full = "32"
    bf16 = "bf16"
    fp16 = "16"


class EvalSplit(StrEnum):
    test = "test"
    train = "train"  # the training split in a fixed order, no augmentation


class ActivationResidual(StrEnum):
    """Which stream states fit activation matching's residual map (paper 003 §3.3)."""

    identity = "identity"  # no residual map: the stream keeps its coordinates (paper 003's best on MultiBERTs)
    first = "first"  # the embedding output
    last = "last"  # the final normalised stream
    all = "all"  # every layer's stream after attention and after the MLP
    separate = "separate"  # one permutation per state: not a symmetry, evaluated for comparison


class ResidualMap(StrEnum):
    permutation = "permutation"
    signed_permutation = "signed_permutation"  # assigned on |correlation|, each sign that of its matched entry
    orthogonal = "orthogonal"


class HeadAssignment(StrEnum):
    two_stage = "two_stage"  # heads on their best in-head costs, then dimensions inside (paper 003)
    monotonic = "monotonic"  # heads in place, dimensions permuted inside each
    ignore = "ignore"  # one permutation of all heads' features, across head boundaries: not a symmetry
    none = "none"


class MergeKind(StrEnum):
    fisher = "fisher"  # diagonal-Fisher-weighted average
    regmean = "regmean"  # per linear map, the least-squares merge on both models' inputs
