"""Whether an endpoints=pretrained run's model folders fit the data and each other: before any data is loaded
(`folder_problems`), once the tokenizer is (`check_tokenizer`) and once the weights are (`check_pairs`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmc.config import Config
from glmc.datasets import IMAGES, TEXT, DatasetInfo, dataset, datasets_for, example_option
from glmc.pipeline.hf_folders import (
    TOKEN_ROLES,
    Folder,
    FolderError,
    evaluation_config,
    folder_names,
    read_folder,
    saved_vocabulary,
    tokenizer_asks_for_code,
)
from glmc.pipeline.pairing import folder_count_problems, seed_pairs

if TYPE_CHECKING:
    from glmc.pipeline.endpoint_record import Endpoint

log = logging.getLogger(__name__)

# what the families' input limits count (Family.hf_input_limits), as a message says it
LIMITS = {"vocab": "a vocabulary of {} tokens", "positions": "{} positions", "classes": "{} classes"}


def width_alignment_problem(cfg: Config) -> str | None:
    """Why this run cannot embed the narrower model of a pair into the wider, or None."""
    if cfg.pairing == "universe":
        return "pairing=universe aligns models of one shape only"
    if "vanilla" in cfg.matcher.methods:
        return (
            f"vanilla interpolates the original models, which differ in shape: drop vanilla from matcher.methods "
            f"(now {list(cfg.matcher.methods)}) to embed the narrower model into the wider one first"
        )
    if cfg.merge.kinds:
        return (
            f"merge.kinds=[{','.join(map(str, cfg.merge.kinds))}]: Fisher and RegMean merge models of one norm, and "
            "an embedded narrower model keeps its own norm epsilon; use merge=none"
        )
    return None


def folder_problems(cfg: Config) -> tuple[list[Folder], list[str]]:
    """(the folders read, what cannot work), before any data or weights are loaded."""
    paths = [str(p) for p in cfg.endpoints.paths]
    if len(paths) < 2:
        return [], [
            f"endpoints.paths={paths}: endpoints=pretrained aligns two or more Hugging Face model folders; give "
            "them as endpoints.paths=[path/to/a,path/to/b]"
        ]
    problems = []
    seen: dict[Path, int] = {}
    for i, path in enumerate(paths):
        resolved = Path(path).expanduser().resolve()
        if resolved in seen:
            problems.append(
                f"endpoints.paths[{i}]={path} is endpoints.paths[{seen[resolved]}] again: a pair of one model is one "
                "model twice; give every endpoint its own folder"
            )
        seen.setdefault(resolved, i)
    info = dataset(cfg.data.name)  # the data's entry, read once for every folder
    problems += folder_count_problems(len(paths), str(cfg.pairing)) + _tokenizer_kind_problems(cfg, info)
    folders = []
    names = folder_names(paths)
    for i, path in enumerate(paths):
        try:
            folders.append(read_folder(path, i, str(cfg.data.task), names[i]))
        except FolderError as err:
            problems.append(str(err))
    if len(folders) < len(paths):
        return folders, problems
    problems += [p for f in folders for p in _data_problems(cfg, info, f)]
    problems += _shared_problems(cfg, folders)
    if not cfg.data.tokenizer_path and info.is_text:  # named on purpose: checked when loaded
        problems += _folder_tokenizer_problems(cfg, folders)
    return folders, problems


def command_line_value(key: str) -> Any:
    """The value the command line gave `key`, or None (none given, or no command line)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if not HydraConfig.initialized():
        return None
    try:
        overrides = OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task))
    except OverrideParseException:
        return None
    given = [o.value() for o in overrides if o.key_or_group == key and not o.is_delete()]
    return given[-1] if given else None


def _tokenizer_kind_problems(cfg: Config, info: DatasetInfo) -> list[str]:
    """A tokenizer built from the corpus, asked for on the command line: not the folders' ids."""
    kind = str(cfg.data.tokenizer)
    if not info.is_text or command_line_value("data.tokenizer") != kind:
        return []  # a dataset's own default is replaced by the folders' tokenizer (evaluation_config)
    if kind == "char" or (kind == "wordpiece" and not cfg.data.tokenizer_path):
        return [
            f"data.tokenizer={kind}: builds its ids from the corpus, and a pretrained model's embedding table "
            "reads the ids of the tokenizer it was trained with; leave data.tokenizer unset (the text is encoded "
            "with the first folder's tokenizer) or set data.tokenizer_path=<folder> to encode it with the "
            "tokenizer saved there"
        ]
    return []


def _folder_tokenizer_problems(cfg: Config, folders: list[Folder]) -> list[str]:
    """Without data.tokenizer_path: no folder's tokenizer may ask for its own code, and all must agree."""
    problems = [
        f"{f.key}: its tokenizer_config.json asks for the folder's own code (auto_map), and glmc never runs code "
        "from a model folder; save a tokenizer of the transformers library there, or set data.tokenizer_path="
        "<folder> to encode the text for every model with the tokenizer saved there"
        for f in folders
        if tokenizer_asks_for_code(f.path, f.key)
    ]
    if problems:
        return problems
    return [
        f"{line}: every folder's model would read the text as the ids of one tokenizer, which this one was "
        "not trained with; give folders that share a tokenizer, or set data.tokenizer_path=<folder> to encode "
        "the text for every model with that folder's tokenizer on purpose"
        for line in tokenizer_differences(cfg, folders)
    ]


def _data_problems(cfg: Config, info: DatasetInfo, f: Folder) -> list[str]:
    """The folder's model against the data's registry entry."""
    data, kind = cfg.data, info.modality
    is_a, own = f"{f.key} is a {f.family.name} model ({f.hf_class})", f.family.data_kind
    if own != kind:
        return [f"{is_a} for {own}, data={data.name} is {kind}: choose a dataset of {own}"]
    if f.task != data.task:
        example = example_option(str(f.task), TEXT) if kind == TEXT else None
        return [
            f"{is_a}, which is trained on {f.task}; data.task={data.task}: evaluate it on data of its task"
            + (f" (e.g. data={example})" if example else "")
        ]
    limits = f.limits()
    problems = []
    positions = limits.get("positions")
    if kind == TEXT and positions is not None and data.seq_len > positions:
        problems.append(
            f"{f.key} has {positions} positions, fewer than the data.seq_len={data.seq_len} tokens of a window: "
            f"set data.seq_len={positions} (or less)"
        )
    if kind == IMAGES:
        problems += _image_problems(data, info, f)
    classes, expected = limits.get("classes"), info.num_classes()
    if expected is not None and classes is not None and classes != expected:
        problems.append(
            f"{f.key} has {classes} classes, data={data.name} has {expected}: use a checkpoint with "
            f"num_labels={expected}"
        )
    return problems


def _image_problems(data: Any, info: Any, f: Folder) -> list[str]:
    """The folder's image size and channels against the dataset's."""
    size = data.image_size if info.resizable and data.image_size is not None else info.image_size
    channels, image, own_channels = info.channels, f.size("image_size"), f.size("num_channels")
    problems = []
    if size is not None and image is not None and image != size:
        fix = f"set data.image_size={image}" if info.resizable else "use a checkpoint for that size"
        resizable = " and ".join(d.name for d in datasets_for() if d.resizable)
        problems.append(
            f"{f.key} reads {image}x{image} images, data={data.name} loads {size}x{size}: {fix} (data.image_size "
            f"resizes {resizable} only)"
        )
    if channels is not None and own_channels is not None and own_channels != channels:
        problems.append(
            f"{f.key} reads images of {own_channels} channels, data={data.name}'s have {channels}: use a "
            f"checkpoint with num_channels={channels}"
        )
    return problems


def _shared_problems(cfg: Config, folders: list[Folder]) -> list[str]:
    """What every folder must share with the first, and the widths of each pair."""
    first = folders[0]
    problems = []
    for f in folders[1:]:
        if f.family is not first.family:
            problems.append(
                f"{f.key} is a {f.family.name} model, endpoints.paths[0] a {first.family.name} model: the endpoints of "
                "a run are of one family"
            )
            continue
        layers = (f.size("num_hidden_layers"), first.size("num_hidden_layers"))
        if layers[0] != layers[1]:
            problems.append(
                f"{f.key} has {layers[0]} layers, {first.key} has {layers[1]}: models to align need as many"
            )
        problems += _expert_count_problems(f, first) + _head_dim_problems(f, first)
        mine, theirs = f.limits(), first.limits()
        for what, named in LIMITS.items():
            if mine.get(what) != theirs.get(what):
                problems.append(
                    f"{f.key} has {named.format(mine.get(what))}, {first.key} has {named.format(theirs.get(what))}: "
                    "models to align need the same"
                )
    if problems:
        return problems
    widths = [(f.size("hidden_size"), f.size("num_attention_heads")) for f in folders]
    if len(set(widths)) == 1:
        return []
    problems = [p for f, w in zip(folders, widths) for p in _fixed_width_problems(f, first, w, widths[0])]
    if problems:  # no matcher embeds these, with vanilla or without
        return problems
    reason = width_alignment_problem(cfg)
    if reason:
        differ = next(f for f, w in zip(folders, widths) if w != widths[0])
        return [
            f"{differ.key} has width {widths[differ.index][0]} and {widths[differ.index][1]} heads, "
            f"{first.key} width {widths[0][0]} and {widths[0][1]} heads: {reason}"
        ]
    try:
        pairs = seed_pairs(list(range(len(folders))), str(cfg.pairing))
    except ValueError:  # folder_count_problems names it
        return []
    for a, b in pairs:
        (wa, ha), (wb, hb) = widths[a], widths[b]
        if wb > wa or hb > ha:
            problems.append(
                f"{folders[b].key} (width {wb}, {hb} heads) is wider than {folders[a].key} (width {wa}, {ha} heads), "
                f"which pairing={cfg.pairing} embeds it into: put the widest folder first (pairing=first aligns "
                "every folder to the first)"
            )
    return problems


def _fixed_width_problems(f: Folder, first: Folder, width: tuple, first_width: tuple) -> list[str]:
    """Widths the family's symmetries cannot embed: a stream admitting permutations only keeps its size, and
    heads normed all together keep their count (glmc.symmetry.embed_width)."""
    family, kind = first.family, first.family.attention_block()
    problems = []
    if width[0] != first_width[0] and "orthogonal" not in family.residual_classes:
        problems.append(
            f"{f.key} has width {width[0]} (hidden_size), {first.key} has {first_width[0]}: the {family.name} "
            f"family's residual stream admits permutations only ({family.residual_note}), so a narrower model "
            "embeds into no wider one; give folders of one hidden_size"
        )
    if width[1] != first_width[1] and "semi_permutation" not in kind.head_classes:
        problems.append(
            f"{f.key} has {width[1]} heads (num_attention_heads), {first.key} has {first_width[1]}: {family.name}'s "
            f"{kind.name} attention normalises all heads' queries together, so added heads would change every "
            "head's queries; give folders of as many heads"
        )
    return problems


def _head_dim(f: Folder) -> int | None:
    """The size of each attention head of the folder's model: config.json's head_dim, or width / heads."""
    width, heads = f.size("hidden_size"), f.size("num_attention_heads")
    return f.size("head_dim") or (width // heads if isinstance(width, int) and isinstance(heads, int) else None)


def _head_dim_problems(f: Folder, first: Folder) -> list[str]:
    """Heads whose queries and keys are normed over their dims (no qk space) embed only into heads as large."""
    kind = first.family.attention_block()
    dims = _head_dim(f), _head_dim(first)
    if "qk" in kind.head_spaces or dims[0] == dims[1]:
        return []
    return [
        f"{f.key} has head_dim {dims[0]}, {first.key} has head_dim {dims[1]}: {first.family.name} normalises each "
        f"head's queries and keys over their head_dim ({kind.name} attention), so zero dims added to a head would "
        "change its norm and no matcher can embed one into the other; give folders of one head_dim"
    ]


def _expert_count_problems(f: Folder, first: Folder) -> list[str]:
    """Mixtures of experts align with as many experts per layer: an expert added to embed a smaller mixture
    would take a share of the router's softmax, so no embedding computes the same function."""
    key = first.family.experts_key
    counts = (f.size(key), first.size(key)) if key else (None, None)
    top_k = (f.size("num_experts_per_tok"), first.size("num_experts_per_tok")) if key else (None, None)
    problems = []
    if counts[0] != counts[1]:
        problems.append(
            f"{f.key} has {counts[0]} experts per layer ({key}), {first.key} has {counts[1]}: mixtures of experts "
            "align with as many experts only (an added expert would take a share of the routing, so no matcher can "
            "embed the smaller mixture); give folders with as many experts"
        )
    if top_k[0] != top_k[1]:  # a path point would route each token to a number of experts neither model uses
        problems.append(
            f"{f.key} routes each token to {top_k[0]} experts (num_experts_per_tok), {first.key} to {top_k[1]}: "
            "give folders that route to as many experts"
        )
    return problems


def read_folders(cfg: Config) -> list[Folder]:
    """The folders; FolderError with every problem folder_problems finds."""
    folders, problems = folder_problems(cfg)
    if problems:
        raise FolderError("endpoints=pretrained:\n  " + "\n  ".join(problems))
    return folders


def check_tokenizer(cfg: Config, vocab_size: int | None) -> None:
    """The loaded tokenizer's ids must fit every model's embedding; a folder's own other tokenizer is logged."""
    if vocab_size is None:
        return
    source = evaluation_config(cfg).data.tokenizer_path
    folders = read_folders(cfg)
    if cfg.data.tokenizer_path:
        for line in tokenizer_differences(cfg, folders):
            log.warning("%s; it is not used: data.tokenizer_path=%s encodes the text for every folder", line, source)
    for f in folders:
        vocab = f.limits().get("vocab")
        if vocab is not None and vocab < vocab_size:
            raise FolderError(
                f"{f.key} has a vocabulary of {vocab} tokens, fewer than the {vocab_size} ids of the tokenizer in "
                f"{source}: use the tokenizer the models were trained with (data.tokenizer_path=<its folder>)"
            )


def _vocabulary_difference(mine, theirs, me: str, them: str) -> str | None:
    """One example of how two tokenizers' (vocabulary, special tokens) differ, or None."""
    (vocab, special), (other_vocab, other_special) = mine, theirs
    order = lambda ids: lambda token: (ids[token] if isinstance(ids[token], int) else -1, token)  # by id
    for token in sorted(other_vocab, key=order(other_vocab)):
        i = other_vocab[token]
        if vocab.get(token) != i:
            own = f"id {vocab[token]}" if token in vocab else "no id"
            return f"token {token!r} has {own} in {me} and id {i} in {them}"
    extra = sorted(set(vocab) - set(other_vocab), key=order(vocab))
    if extra:
        return f"token {extra[0]!r} has id {vocab[extra[0]]} in {me} and no id in {them}"
    for role in TOKEN_ROLES:
        if special.get(role) != other_special.get(role):
            return f"its {role} is {special.get(role)!r} in {me} and {other_special.get(role)!r} in {them}"
    return None


def tokenizer_differences(cfg: Config, folders: list[Folder]) -> list[str]:
    """One line per folder whose saved tokenizer maps text to other ids than the run's (text data only)."""
    if not dataset(cfg.data.name).is_text:
        return []
    source = Path(str(evaluation_config(cfg).data.tokenizer_path)).expanduser()
    ref = next((f.key for f in folders if f.path.resolve() == source.resolve()), f"data.tokenizer_path={source}")
    try:
        reference = saved_vocabulary(source, ref) if source.is_dir() else None
    except FolderError:  # the data module names a damaged tokenizer when it loads it
        return []
    if reference is None:
        return []
    out = []
    for f in folders:
        if f.path.resolve() == source.resolve():
            continue
        try:
            own = saved_vocabulary(f.path, f.key)
        except FolderError as err:
            out.append(f"{err} (its tokenizer cannot be compared with that of {ref})")
            continue
        difference = None if own is None else _vocabulary_difference(own, reference, f.key, ref)
        if difference is not None:
            out.append(f"{f.key} holds a tokenizer other than that of {ref}: {difference}")
    return out


def check_pairs(cfg: Config, endpoints: list[Endpoint]) -> None:
    """Every pair's canonical models fit together, or the narrower embeds exactly into the wider."""
    import torch

    from glmc.models.compatibility import check_compatible
    from glmc.symmetry.embed_width import match_widths, same_shapes

    prefix = "model_a and model_b do not fit together: "
    # pairing=universe forms no pairs: every model is checked against the first
    pairs = seed_pairs(list(range(len(endpoints))), str(cfg.pairing)) or [(0, j) for j in range(1, len(endpoints))]
    for ia, ib in pairs:
        a, b = endpoints[ia].canonical, endpoints[ib].canonical  # read once: a large folder's is built on use
        where = f"endpoints.paths[{ib}]={endpoints[ib].path} and endpoints.paths[{ia}]={endpoints[ia].path}"
        if same_shapes(a, b):
            try:
                check_compatible(a, b)
            except ValueError as err:
                raise FolderError(f"{where} do not fit together: {str(err).removeprefix(prefix)}") from None
            continue
        reason = width_alignment_problem(cfg)
        if reason:
            raise FolderError(f"{where} differ in shape (widths, heads or MLP units): {reason}")
        if a.config.norm_eps != b.config.norm_eps:
            raise FolderError(
                f"{where} differ in norm epsilon ({b.config.norm_eps} and {a.config.norm_eps}): "
                "models of different widths are embedded with the first one's"
            )
        try:
            match_widths(a, b, torch.Generator().manual_seed(ib), str(cfg.embed_stream))
        except ValueError as err:
            # the other order helps only where the embedded model is the larger somewhere
            fix = (
                "put the widest folder first"
                if _larger_somewhere(b, a)
                else f"endpoints.paths[{ia}] is already the wider, so reordering the folders does not help; give "
                "folders whose models differ in no more than the reason allows"
            )
            raise FolderError(
                f"endpoints.paths[{ib}]={endpoints[ib].path} does not embed into endpoints.paths[{ia}]="
                f"{endpoints[ia].path} ({err}): {fix}"
            ) from None
        del a, b  # a large pair's forms freed before the next pair's are built


def _larger_somewhere(b, a) -> bool:
    """Whether canonical model `b` is wider than `a` in its stream or in some layer's heads or units."""
    from glmc.symmetry.embed_width import layer_sizes

    sa, sb = layer_sizes(a), layer_sizes(b)
    return b.width > a.width or any(y > x for k in sb if k in sa for x, y in zip(sa[k], sb[k]))
