"""Structured config schema: conf/ is merged into these dataclasses, so a misspelled key or a value of the
wrong type fails at composition, naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from glmc.choices import (
    Dataset,
    EmbedStream,
    EndpointSource,
    EvalPrecision,
    EvalSplit,
    Family,
    LoggerKind,
    LoggerMode,
    MergeKind,
    Pairing,
    SeedVary,
    Task,
    TokenizerKind,
)
from glmc.ranges import setting
from glmc.settings.groups import SymmetryConfig, UniverseTraining
from glmc.settings.methods import METHODS, MULTI_METHODS, MatcherConfig


@dataclass
class ModelConfig:
    name: str = "vit_digits"
    family: Family = Family.vit
    hidden_size: int = setting(64, "count")
    num_layers: int = setting(4, "count")
    num_heads: int = setting(4, "count")
    mlp_size: int = setting(128, "count")
    hidden_act: str = "gelu"
    dropout: float = setting(0.0, "fraction")
    layer_norm_eps: float = setting(1e-6, "positive")
    # ViT only
    image_size: int = setting(8, "count")
    patch_size: int = setting(2, "count")
    num_channels: int = setting(1, "count")
    num_labels: int = setting(10, "count")
    qkv_bias: bool = True
    # text models (GPT-2, BERT, RoBERTa)
    vocab_size: int = setting(256, "count")
    max_positions: int = setting(128, "count")
    # BERT and RoBERTa only: the encoder's head ("mlm" or "classification") and its token types
    head: str = "mlm"
    type_vocab_size: int = setting(2, "count")
    # Llama only: key/value heads (None: one per query head), a tied unembedding, the rotary base (GPT-NeoX too)
    num_kv_heads: int | None = None
    tie_embeddings: bool = False
    rope_theta: float = setting(10000.0, "positive")
    # GPT-NeoX only: the share of each head's dims that rotate, and whether attention and MLP read one input
    rotary_pct: float = setting(0.25, "share")
    parallel_residual: bool = True
    # mixtures of experts (Mixtral) only: experts per MLP, and the experts each token is routed to
    num_experts: int = setting(8, "count")
    experts_per_token: int = setting(2, "count")


@dataclass
class DataConfig:
    name: Dataset = Dataset.digits
    root: str = "data"  # where real datasets live on disk (ignored by the embedded ones)
    task: Task = Task.classification
    batch_size: int = 64
    eval_batch_size: int = 512
    test_fraction: float = 0.2  # held-out share (digits: stratified; text: the last block)
    # text: the block before the test block; digits: a stratified share of the training images
    val_fraction: float = 0.05
    split_seed: int = setting(0, "seed")  # the train/test split is fixed independently of the endpoint seeds
    augment: bool = False
    download: bool = False  # real datasets only; the default run never touches the network
    num_workers: int = setting(0, "count0")
    limit_train: int | None = None  # keep the first N training examples (debugging)
    limit_test: int | None = None
    # digits only: resize the 8x8 images to image_size x image_size (bilinear) at load; None keeps 8x8
    image_size: int | None = None
    # text only
    tokenizer: TokenizerKind = TokenizerKind.char
    # a saved tokenizer's folder (gpt2: save_pretrained; wordpiece: its tokenizer.json instead of training one)
    tokenizer_path: str | None = None
    seq_len: int = setting(128, "count")  # tokens per window (bookcorpus: per example, padded with EOS)
    # your own UTF-8 text file (data=text_file); its content, not its place, is part of the cache key
    path: str | None = None
    # ids of a WordPiece tokenizer trained on the corpus (special tokens included)
    tokenizer_vocab: int = setting(1000, "count")
    # masked LM only: the share of a window's tokens masked, and the seed of the held-out windows' fixed masks
    mask_prob: float = 0.15
    mask_seed: int = setting(0, "seed")
    # pydoc_topics only: which of num_subsets topic-disjoint datasets of the task (0 .. num_subsets - 1)
    subset: int = 0
    num_subsets: int = 3


@dataclass
class TrainConfig:
    """Optimisation settings of the endpoints; part of the endpoint cache key."""

    max_epochs: int = 40
    lr: float = 3e-3
    weight_decay: float = setting(0.05, "nonnegative")
    warmup_fraction: float = setting(0.05, "fraction")
    label_smoothing: float = setting(0.0, "fraction")
    gradient_clip_val: float = setting(1.0, "nonnegative")
    accumulate_grad_batches: int = setting(1, "count")
    early_stopping_patience: int | None = None  # validations without a better val_loss before stopping
    # endpoints trained at once, each in its own process; 1: one after another. Not part of the cache key
    parallel_endpoints: int = setting(1, "count")
    # the seeds not cached yet train as one batched model (glmc.train.ensemble). Not part of the cache key
    ensemble: bool = False
    # snapshots along training (glmc.train.snapshots): null, every N optimizer steps, or a list of steps.
    # Not part of the cache key: they sit beside the endpoint, which is the same with them or without
    save_steps: Any = None


@dataclass
class PretrainConfig:
    """One model (the run's architecture with `head`, cached like any endpoint) pretrained before the
    endpoints, each fine-tuned from its encoder, as in paper 002."""

    enabled: bool = False
    seed: int = 0
    head: str = "mlm"  # the pretraining head (model.head of the pretrained model)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class TrainerConfig:
    """Where and how Lightning runs; not part of the cache key. The fields are `lightning.Trainer`
    arguments: glmc.train.trainer builds it with `instantiate`."""

    _target_: str = "lightning.pytorch.Trainer"
    accelerator: str = "cpu"
    devices: Any = 1
    strategy: str = "auto"
    num_nodes: int = 1
    # 32-true, bf16-mixed, 16-mixed (GPU) or auto (glmc.train.trainer.resolve_precision); weights stay float32
    precision: str = "32-true"
    enable_progress_bar: bool = True
    deterministic: bool = True
    log_every_n_steps: int = 10
    limit_train_batches: float | None = None
    # on the CPU, subnormal floats flushed to zero while a model trains: it ran the default run's training
    # 1.4-1.5x as fast (glmc.train.denormals); part of the cache key where it applies
    flush_denormals: bool = True


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.csv
    project: str = "glmc"
    entity: str | None = None
    mode: LoggerMode = LoggerMode.offline  # W&B stays offline unless the user sets online
    group: str | None = "${experiment}"  # runs of one experiment share a W&B group
    tags: list[str] = field(default_factory=list)


@dataclass
class PlaneConfig:
    """The loss over the plane through three models (glmc.eval.plane): `models=aligned` A, B and each
    method's aligned B, `endpoints` the pair's A and B and the next endpoint; a grid x grid lattice spanning
    the triangle's bounding box widened by `margin` of its size on each side."""

    enabled: bool = False
    grid: int = setting(11, "count")
    margin: float = setting(0.2, "nonnegative")
    models: str = setting("aligned", choices=("aligned", "endpoints"))


@dataclass
class EvalConfig:
    """How every path is evaluated (glmc.eval.evaluator): on the trainer's accelerator, batched; and the
    landscape around it: layer-wise barriers (glmc.eval.layerwise) and the plane through three models."""

    num_lambdas: int = 11
    split: EvalSplit = EvalSplit.test
    precision: EvalPrecision = EvalPrecision.full  # autocast for the path's forward passes
    cache_batches_mb: int = 2048  # batches kept on the device across lambdas while they fit in this
    # per block (and embedding, head): the barrier with only that part interpolated, the rest at A and at B;
    # `cumulative`: parts 0..l interpolated together as well
    layerwise: str = setting("none", choices=("none", "single", "cumulative"))
    plane: PlaneConfig = field(default_factory=PlaneConfig)
    # lm-evaluation-harness tasks scored at both ends and every point of each path (glmc.eval.tasks): names
    # lm-eval knows, glmc's own (pydoc_next_chars, pydoc_topic_choice) or task YAML files
    tasks: list[str] = field(default_factory=list)
    task_limit: int | None = None  # at most this many examples per task (a quick look)
    task_batch_size: int = setting(32, "count")


@dataclass
class CurveConfig:
    """A curve between A and each method's aligned B (glmc.curves; Garipov et al. 2018): `bezier`
    (a Bezier curve; bends=1: quadratic) or `chain` (a polygonal chain through `bends` points), the bends
    trained on the training split with the endpoints fixed, by the loss at a uniform t per step."""

    name: str = setting("none", choices=("none", "bezier", "chain"))
    bends: int = setting(1, "count")  # inner points: a chain's vertices, a Bezier curve's control points
    methods: list[str] = field(default_factory=lambda: ["vanilla", "weight", "learned"])  # those the run has
    max_steps: int = setting(300, "count")
    lr: float = setting(0.01, "lr")
    batches_per_eval: int = setting(0, "count0")  # 0: the curve's barrier on the whole eval split


@dataclass
class MergeConfig:
    """Merges beyond the straight line, evaluated beside each method's plain average (paper 002's
    fusion baselines): `merge=all` (fisher and regmean), `merge=fisher`, `merge=regmean`, `merge=none`."""

    name: str = "none"
    kinds: list[MergeKind] = field(default_factory=list)
    batches: int = setting(16, "count")  # training batches for the Fisher diagonals and RegMean's Gram matrices
    regmean_alpha: float = setting(0.9, "share")  # RegMean: off-diagonal Gram entries scaled by alpha
    export: bool = False  # write each pair's midpoint model as a Hugging Face folder where it has HF shape
    # an exported folder's weight files hold at most this much each (save_pretrained's max_shard_size: past
    # it, several files and the index file that names them)
    export_max_shard: str = "2GB"


@dataclass
class MultiConfig(UniverseTraining):
    """Multi-model runs (`pairing=universe`, paper 001 §4.3): universe matching, the loss over the simplex
    (Eq. 2) and the pairwise barriers; the learned refinement's settings are UniverseTraining's."""

    # multi-model methods of glmc.settings.methods.MULTI_METHODS, in plot order
    methods: list[str] = field(default_factory=lambda: list(MULTI_METHODS))
    pairwise: str = "weight"  # the registry method universe matching aligns each model with
    max_rounds: int = setting(10, "count")
    tol: float = setting(1e-4, "positive")  # stop when the anchor's relative change falls below this
    step: float = setting(0.1, "grid_step")  # barycentric grid step for three models (0.1: 66 points)
    # N > 3: Dirichlet samples besides vertices, edge midpoints and the centroid
    samples: int = setting(32, "count0")


@dataclass
class EndpointsConfig:
    """Where the endpoints come from (`endpoints=trained`, the default, or `endpoints=pretrained`).

    trained: one endpoint per seed of `seeds`, trained here or read from the endpoint cache.
    pretrained: one endpoint per folder of `paths`, each a Hugging Face model saved with save_pretrained
    (config.json and safetensors weights), its family read from config.json's model_type; `seeds`,
    `model`, `train` and the cache are not read, and text is encoded with the folders' tokenizer
    (data.tokenizer_path, else the first folder's). Pairs are formed over the folders in order, as over
    seeds (glmc.pipeline.hf_folders).
    finetuned: children fine-tuned from one parent (`pretrain`), one per seed of `seeds` on each task of
    `tasks` (each a set of overrides of `data`); pairs within and across tasks (glmc.pipeline.children).
    spawn: a parent trained from `seed_fixed`, and at each optimizer step of `steps` one child per seed of
    `seeds` continued from its state to the parent's budget (glmc.pipeline.children)."""

    source: EndpointSource = EndpointSource.trained
    paths: list[Any] = field(default_factory=list)  # folders; a series: one list of checkpoint folders each
    tasks: list[Any] = field(default_factory=list)  # finetuned: one override of `data` per task
    steps: list[int] = setting([0], "steps")  # spawn: the parent's optimizer steps the children start from


@dataclass
class Config:
    experiment: str = "demo"
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    # what an endpoint's seed draws (both: initialisation, data order and dropout); the rest from seed_fixed
    seed_vary: SeedVary = SeedVary.both
    seed_fixed: int = setting(0, "seed")
    endpoints: EndpointsConfig = field(default_factory=EndpointsConfig)
    pairing: Pairing = Pairing.disjoint  # disjoint: (s0,s1),(s2,s3),...; all: every pair
    cache_dir: str = "outputs/endpoints"
    overwrite: bool = False  # replace results.json of a different config in a reused run folder
    # torch's intra-op threads: auto chooses them per stage from the cores other processes leave free
    # (glmc.threads), N fixes them (parallel grid jobs set 1), null leaves torch's default
    threads: Any = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    symmetry: SymmetryConfig = field(default_factory=SymmetryConfig)
    matcher: MatcherConfig = field(default_factory=MatcherConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)
    curve: CurveConfig = field(default_factory=CurveConfig)
    multi: MultiConfig = field(default_factory=MultiConfig)
    # per-seed overrides of `model` ({} keeps it): endpoints of other widths, the narrower embedded (pairing=first)
    endpoint_models: list[Any] = field(default_factory=list)
    # how the narrower model's stream is sized when embedded (glmc.symmetry.embed_width.match_widths)
    embed_stream: EmbedStream = EmbedStream.keep


def register_configs() -> None:
    """Register the schema `config_schema` and the resolver `${glmc.each_method:}` (every registered method as a
    job of its own, [vanilla],[canonical],..., so conf/sweep/matchers.yaml follows the registry)."""
    OmegaConf.register_new_resolver("glmc.each_method", lambda: ",".join(f"[{m}]" for m in METHODS), replace=True)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
