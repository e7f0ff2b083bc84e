"""Users' own Hugging Face folders whose config.json does not fit their weights or each other: refused by
key, value and folder before any weight is loaded (routing to more experts than there are, mixtures of
different expert counts, heads normed over different head_dim, sizes or layer counts the safetensors headers
contradict, soft caps of 0); mixtures of different widths embed exactly."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from test_pretrained_endpoints import SEQ_LEN, pretrained

import glmc
from glmc.models import to_canonical
from glmc.pipeline import hf_folders
from glmc.pipeline.folder_fit import check_pairs
from glmc.pipeline.hf_folders import FolderError, read_folder
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.symmetry.embed_width import match_widths

from conftest import compose_config
from numeric import FORWARD, assert_close_rel
from tiny_hf import (
    inputs_for,
    tiny_gemma2,
    tiny_gemma3,
    tiny_mixtral,
    tiny_olmo2,
    tiny_qwen2_moe,
    tiny_qwen3,
    tiny_qwen3_moe,
)

TEXT = ("data=pydoc", f"data.seq_len={SEQ_LEN}")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`saved(name, build, **changes)` -> a folder holding build()'s model saved with save_pretrained, its
    config.json then given `changes`; written once per module and name."""
    root, written = tmp_path_factory.mktemp("folders"), {}

    def write(name, build, **changes):
        if name not in written:
            folder = root / name
            build().save_pretrained(folder)
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, **changes}))
            written[name] = folder
        return written[name]

    return write


@pytest.fixture
def no_loading(monkeypatch):
    """Fails the test where a folder's weights are loaded: every refusal here comes before."""

    def refuse(f):
        raise AssertionError(f"{f.key}: loaded")

    monkeypatch.setattr(hf_folders, "load_model", refuse)


def _refusal(paths, *overrides) -> str:
    with pytest.raises(ConfigError) as refused:
        validate_config(pretrained(paths, *TEXT, *overrides))
    return str(refused.value)


# ---- item 9: num_experts_per_tok above the experts there are ----

MOE = {"mixtral": (tiny_mixtral, "num_local_experts"), "qwen3_moe": (tiny_qwen3_moe, "num_experts")}


@pytest.mark.parametrize("family", list(MOE))
def test_routing_to_more_experts_than_there_are_is_refused_by_key_before_loading(family, saved, no_loading):
    build, count = MOE[family]
    normal = saved(f"{family}_a", lambda: build(seed=0))
    over = [saved(f"{family}_k8_{i}", lambda i=i: build(seed=i), num_experts_per_tok=8) for i in (1, 2)]
    for paths in ([over[0], over[1]], [normal, over[1]]):
        message = _refusal(paths)
        for i, path in enumerate(paths):
            said = f"endpoints.paths[{i}]={path}: its config.json routes each token to num_experts_per_tok=8 experts"
            assert (said in message) == (path in over)
        assert f"of {count}=4" in message and "num_experts_per_tok between 1 and 4" in message
        assert "out of range" not in message


# ---- item 10: mixtures of different expert counts; mixtures of different widths ----


@pytest.mark.parametrize("methods", ["[weight]", "[vanilla,weight]"])
def test_mixtures_of_different_expert_counts_are_refused_by_name_before_loading(methods, saved, no_loading):
    four = saved("mixtral_a", lambda: tiny_mixtral(seed=0))
    two = saved("mixtral_2experts", lambda: tiny_mixtral(seed=3, experts=2))
    message = _refusal([four, two], f"matcher.methods={methods}")
    assert f"endpoints.paths[1]={two} has 2 experts per layer (num_local_experts), endpoints.paths[0]={four} has 4" in (
        message
    )
    assert "give folders with as many experts" in message
    assert "drop vanilla" not in message  # the advice would lead to the same refusal


def test_mixtures_routing_to_other_numbers_of_experts_are_refused_by_name_before_loading(saved, no_loading):
    two = saved("mixtral_a", lambda: tiny_mixtral(seed=0))
    one = saved("mixtral_top1", lambda: tiny_mixtral(seed=3, top_k=1))
    message = _refusal([two, one], "matcher.methods=[weight]")
    assert f"endpoints.paths[1]={one} routes each token to 1 experts (num_experts_per_tok), " in message
    assert f"endpoints.paths[0]={two} to 2" in message


def test_trained_mixtures_of_different_expert_counts_are_refused_before_training():
    cfg = compose_config("model=mixtral_text", *TEXT, "seeds=[0,1]", "endpoint_models=[{},{num_experts:2}]")
    with pytest.raises(ConfigError, match=r"endpoint_models\[1\] \(seed 1\): model.num_experts=2 differs from"):
        validate_config(cfg)


@pytest.mark.parametrize("methods", ["[weight]", "[vanilla,weight]"])
def test_widths_no_symmetry_embeds_are_refused_before_loading_not_sent_to_drop_vanilla(methods, saved, no_loading):
    # Gemma 2's sandwich norms keep the stream's size; OLMo-2 normalises all heads' queries together
    gemma = saved("gemma2_w16", lambda: tiny_gemma2(seed=0)), saved("gemma2_w32", lambda: tiny_gemma2(1, hidden=32))
    message = _refusal([gemma[1], gemma[0]], f"matcher.methods={methods}")
    assert f"endpoints.paths[1]={gemma[0]} has width 16 (hidden_size), endpoints.paths[0]={gemma[1]} has 32" in message
    assert "residual stream admits permutations only" in message and "give folders of one hidden_size" in message
    narrow_olmo = lambda: tiny_olmo2(1, hidden=16, heads=2, kv_heads=1)  # noqa: E731
    olmo = saved("olmo2_h4", lambda: tiny_olmo2(seed=0)), saved("olmo2_h2", narrow_olmo)
    message = _refusal(list(olmo), f"matcher.methods={methods}")
    assert f"endpoints.paths[1]={olmo[1]} has 2 heads (num_attention_heads), endpoints.paths[0]={olmo[0]} has 4" in (
        message
    )
    assert "give folders of as many heads" in message and "give folders of one hidden_size" in message
    assert "drop vanilla" not in message


@pytest.mark.parametrize("build", [tiny_mixtral, tiny_qwen2_moe, tiny_qwen3_moe], ids=lambda b: b.__name__)
def test_a_narrower_mixture_embeds_exactly_into_a_wider_one(build):
    narrow_hf = build(seed=1, hidden=16, heads=2, kv_heads=1, mlp=8)
    narrow, wide = to_canonical(narrow_hf), to_canonical(build(seed=2, hidden=32, heads=4, kv_heads=2, mlp=16))
    embedded = match_widths(wide, narrow, torch.Generator().manual_seed(0))
    x = inputs_for(narrow_hf)
    with torch.no_grad():
        assert_close_rel(embedded(x), narrow(x), FORWARD, "embedded mixture: logits")


def test_embedding_a_mixture_of_other_expert_count_is_refused_naming_the_experts():
    wide, narrow = to_canonical(tiny_mixtral(seed=0)), to_canonical(tiny_mixtral(seed=1, experts=2))
    with pytest.raises(ValueError, match=r"experts: narrow has \[2, 2\] per layer, wide \[4, 4\]"):
        match_widths(wide, narrow)


# ---- item 11: heads normed over different head_dim ----


@pytest.fixture(scope="module")
def head_dims(saved):
    """Two Qwen3 folders of width 32 and 4 heads, of head_dim 16 and 8."""

    def build(seed, head_dim):
        from transformers import Qwen3ForCausalLM

        config = tiny_qwen3(seed=seed).config
        config.head_dim = head_dim
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config).eval()

    return saved("qwen3_hd16", lambda: build(0, 16)), saved("qwen3_hd8", lambda: build(1, 8))


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_heads_normed_over_other_head_dims_are_refused_by_name_before_loading(order, head_dims, no_loading):
    paths = [head_dims[i] for i in order]
    message = _refusal(paths, "matcher.methods=[weight]")
    dims = [16, 8] if order == (0, 1) else [8, 16]
    assert (
        f"endpoints.paths[1]={paths[1]} has head_dim {dims[1]}, endpoints.paths[0]={paths[0]} has head_dim {dims[0]}"
    ) in message
    assert "give folders of one head_dim" in message
    assert "vocabulary" not in message and "widest folder first" not in message


def test_the_api_refuses_heads_of_other_head_dims_naming_head_dim(head_dims):
    from transformers import Qwen3ForCausalLM

    a, b = (glmc.to_canonical(Qwen3ForCausalLM.from_pretrained(p)) for p in head_dims)
    with pytest.raises(ValueError) as refused:
        glmc.align(a, b, "weight")
    message = str(refused.value)
    assert "model_b has query/key head dim 8 in layer 0 (head_dim), model_a has query/key head dim 16" in message


def test_a_pair_that_embeds_in_no_order_is_not_told_to_put_the_widest_first():
    # OLMo-2's stream admits permutations only: a narrower model embeds into no wider one, in either order
    wide = to_canonical(tiny_olmo2(seed=0, hidden=32, heads=4))
    narrow = to_canonical(tiny_olmo2(seed=1, hidden=16, heads=2, kv_heads=1))
    endpoints = [SimpleNamespace(canonical=m, path=f"/x/{n}") for m, n in ((wide, "wide"), (narrow, "narrow"))]
    cfg = pretrained(["/x/wide", "/x/narrow"], *TEXT, "matcher.methods=[weight]")
    with pytest.raises(FolderError) as refused:
        check_pairs(cfg, endpoints)
    message = str(refused.value)
    assert "endpoints.paths[1]=/x/narrow does not embed into endpoints.paths[0]=/x/wide" in message
    assert "stream admits permutations only" in message
    assert "endpoints.paths[0] is already the wider, so reordering the folders does not help" in message
    assert "widest folder first" not in message


# ---- item 12: config.json against the safetensors headers ----


@pytest.fixture
def built_on_meta_only(monkeypatch):
    """Records the default device of every Hugging Face model built, and fails any weights load."""
    from transformers import PreTrainedModel

    devices, init = [], PreTrainedModel.__init__

    def record(self, *args, **kwargs):
        devices.append(torch.get_default_device().type)
        init(self, *args, **kwargs)

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(PreTrainedModel, "__init__", record)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(no_load))
    return devices


@pytest.mark.parametrize(
    ("name", "build", "expected"),
    [
        ("qwen3", lambda: tiny_qwen3(seed=0), "model.layers.0.mlp.down_proj.weight of shape [32, 10000000], but "),
        ("mixtral", lambda: tiny_mixtral(seed=0), "model.layers.0.mlp.experts.down_proj of shape [4, 32, 10000000]"),
    ],
)
def test_a_size_the_weights_contradict_is_refused_from_the_headers(name, build, expected, saved, built_on_meta_only):
    folder = saved(f"{name}_huge_mlp", build, intermediate_size=10_000_000)
    built_on_meta_only.clear()  # the folder's own model, written above
    with pytest.raises(FolderError) as refused:
        read_folder(str(folder), 0, "causal_lm")
    message = str(refused.value)
    assert message.startswith(f"endpoints.paths[0]={folder}: its config.json's intermediate_size=10000000 makes ")
    assert expected in message and "save_pretrained" in message
    assert set(built_on_meta_only) <= {"meta"}  # the model the config describes is never allocated


@pytest.mark.parametrize("layers", [10_000, 1])
def test_a_layer_count_the_weights_contradict_is_refused_before_any_model_is_built(layers, saved, built_on_meta_only):
    folder = saved(f"mixtral_{layers}_layers", lambda: tiny_mixtral(seed=0), num_hidden_layers=layers)
    built_on_meta_only.clear()
    with pytest.raises(FolderError) as refused:
        read_folder(str(folder), 0, "causal_lm")
    message = str(refused.value)
    assert f"its config.json's num_hidden_layers={layers}, but its weights hold 2 layers" in message
    assert "model.layers.1." in message and "in model.safetensors" in message and "set num_hidden_layers=2" in message
    assert built_on_meta_only == []  # not even on the meta device


def test_a_folder_whose_config_fits_its_weights_reads(saved):
    folder = saved("mixtral_a", lambda: tiny_mixtral(seed=0))
    assert read_folder(str(folder), 0, "causal_lm").hf_class == "MixtralForCausalLM"


# ---- item 16: soft caps of 0 ----


def test_transformers_applies_a_soft_cap_of_0_rather_than_switching_it_off():
    model = tiny_gemma2(seed=0)
    model.config.final_logit_softcapping = 0.0
    with torch.no_grad():
        assert not model(inputs_for(model)).logits.any()  # every logit 0 * tanh(x / 0): no model left


@pytest.mark.parametrize("cap", [0, 0.0])  # an int 0 fails transformers' own validation, naming no fix
@pytest.mark.parametrize("key", ["final_logit_softcapping", "attn_logit_softcapping"])
@pytest.mark.parametrize("build", [tiny_gemma2, tiny_gemma3], ids=["gemma2", "gemma3"])
def test_a_soft_cap_of_0_is_refused_by_key_saying_null_switches_it_off(cap, key, build, saved, no_loading):
    folder = saved(f"{build.__name__}_{key}_{cap!r}", lambda: build(seed=0), **{key: cap})
    with pytest.raises(FolderError) as refused:
        read_folder(str(folder), 0, "causal_lm")
    message = str(refused.value)
    assert message.startswith(f"endpoints.paths[0]={folder}: its config.json's {key}={cap!r}: ")
    assert f"set {key} to null to switch it off" in message


def test_a_soft_cap_of_null_is_off_and_reads(saved):
    folder = saved("gemma2_no_caps", lambda: tiny_gemma2(seed=0), final_logit_softcapping=None)
    assert read_folder(str(folder), 0, "causal_lm").hf_config.final_logit_softcapping is None
