"""Model shapes for hub names: a local config.json, then the HF cache, then rlconf's table
(rlconf/model_shapes.py), so the memory estimate counts activations for the models plans name."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlconf.compile import compile_plan
from rlconf.model_shapes import MODEL_SHAPES, config_url, known_shape
from rlconf.modelinfo import RANDOM_PREFIX, RANDOM_TWINS, cached_config, hf_hub_cache, model_info, random_shape

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "presets").glob("*.yaml"))
NO_CACHE = {"HF_HUB_CACHE": "/nonexistent/hf-hub-cache"}


@pytest.fixture(autouse=True)
def empty_hf_cache(monkeypatch):
    """No test here sees the HF cache of the machine it runs on."""
    monkeypatch.setenv("HF_HUB_CACHE", NO_CACHE["HF_HUB_CACHE"])


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_bundled_preset_estimates_every_memory_term(preset: Path):
    result = compile_plan(preset)
    assert result.resolved is not None, [d.message for d in result.errors]
    unestimated = [(m.phase, t.what) for m in result.resolved.memory for t in m.terms if "not estimated" in t.formula]
    assert result.resolved.memory and not unestimated, unestimated
    assert "RL610" not in [d.code for d in result.diagnostics]


# The shapes the random:// models had when the GPU measurements in docs/benchmarks.md were taken;
# the table must keep giving these numbers.
FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "rope_theta")
MEASURED_RANDOM_SHAPES = {
    "Qwen2.5-0.5B": ("qwen2", 896, 24, 14, 2, 4864, 151936, 32768, True, 1000000.0),
    "Qwen2.5-1.5B": ("qwen2", 1536, 28, 12, 2, 8960, 151936, 32768, True, 1000000.0),
    "Qwen2.5-3B": ("qwen2", 2048, 36, 16, 2, 11008, 151936, 32768, True, 1000000.0),
    "Qwen2.5-7B": ("qwen2", 3584, 28, 28, 4, 18944, 152064, 32768, False, 1000000.0),
    "Llama-3.2-1B": ("llama", 2048, 16, 32, 8, 8192, 128256, 131072, True, 500000.0),
}


def test_random_models_keep_the_shapes_they_were_measured_with():
    assert list(RANDOM_TWINS) == list(MEASURED_RANDOM_SHAPES)
    for name, numbers in MEASURED_RANDOM_SHAPES.items():
        shape = dict(zip(FIELDS, numbers))
        assert random_shape(RANDOM_PREFIX + name) == shape, name
        assert MODEL_SHAPES[RANDOM_TWINS[name]] == shape, name


def test_a_hub_name_gets_the_same_estimate_as_its_random_twin():
    preset = REPO / "presets" / "grpo_7b_8gpu.yaml"
    hub = compile_plan(preset, ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct"])
    twin = compile_plan(preset, [f"actor_rollout_ref.model.path={RANDOM_PREFIX}Qwen2.5-7B"])
    assert hub.resolved is not None and twin.resolved is not None
    assert hub.resolved.memory == twin.resolved.memory
    assert hub.resolved.model.num_params == twin.resolved.model.num_params
    assert (hub.resolved.model.info_source, twin.resolved.model.info_source) == ("table", "random")


# Parameter counts the Hub publishes for these repos (https://huggingface.co/api/models/<repo>,
# field safetensors.total). Qwen3-0.6B is left out: its checkpoint stores the tied LM head a second time.
HUB_PARAMETER_COUNTS = {
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304,
    "Qwen/Qwen2.5-3B-Instruct": 3_085_938_688,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen2.5-14B-Instruct": 14_770_033_664,
    "Qwen/Qwen2.5-32B-Instruct": 32_763_876_352,
    "Qwen/Qwen2.5-72B-Instruct": 72_706_203_648,
    "Qwen/Qwen3-1.7B": 1_720_574_976,
    "Qwen/Qwen3-4B": 4_022_468_096,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "Qwen/Qwen3-14B": 14_768_307_200,
    "Qwen/Qwen3-32B": 32_762_123_264,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "meta-llama/Llama-3.1-70B-Instruct": 70_553_706_496,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1_777_088_000,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": 32_763_876_352,
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": 8_030_261_248,
    "google/gemma-2-2b": 2_614_341_888,
    "google/gemma-2-9b": 9_241_705_984,
    "google/gemma-2-27b": 27_227_128_320,
    "google/gemma-3-1b-it": 999_885_952,
}


def exact_parameters(cfg: dict) -> int:
    """Every weight of a decoder of this shape, as its transformers class builds it: Qwen2's q, k, v
    biases, Qwen3's and Gemma 3's per-head q/k norms, Gemma's four norms per layer."""
    h, heads, family = cfg["hidden_size"], cfg["num_attention_heads"], cfg["model_type"]
    kv, head_dim = cfg["num_key_value_heads"], cfg.get("head_dim") or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    attention += {"qwen2": heads * head_dim + 2 * kv * head_dim, "qwen3": 2 * head_dim, "gemma3_text": 2 * head_dim}.get(family, 0)
    norms = (4 if family.startswith("gemma") else 2) * h
    layer = attention + 3 * h * cfg["intermediate_size"] + norms
    embeddings = cfg["vocab_size"] * h * (1 if cfg["tie_word_embeddings"] else 2)
    return cfg["num_hidden_layers"] * layer + embeddings + h  # + the final norm


@pytest.mark.parametrize("repo", sorted(HUB_PARAMETER_COUNTS))
def test_table_shapes_give_the_parameter_counts_the_hub_publishes(repo: str):
    assert exact_parameters(MODEL_SHAPES[repo]) == HUB_PARAMETER_COUNTS[repo]


def test_every_table_entry_has_what_the_estimate_and_the_rules_read():
    needed = {"model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings"}
    for repo, cfg in MODEL_SHAPES.items():
        assert needed <= set(cfg), (repo, needed - set(cfg))
        assert config_url(repo) == f"https://huggingface.co/{repo}/blob/main/config.json"


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B-Instruct", "qwen/qwen2.5-7b-instruct",
                                  "~/models/Qwen2.5-7B-Instruct/", " Qwen/Qwen2.5-7B-Instruct "])
def test_table_finds_a_model_with_or_without_its_org_in_any_case(name: str):
    assert known_shape(name) == ("Qwen/Qwen2.5-7B-Instruct", MODEL_SHAPES["Qwen/Qwen2.5-7B-Instruct"])


def test_base_and_instruct_models_keep_their_own_context():
    assert known_shape("Qwen/Qwen2.5-7B")[1]["max_position_embeddings"] == 131072
    assert known_shape("Qwen/Qwen2.5-7B-Instruct")[1]["max_position_embeddings"] == 32768
    assert known_shape("Qwen/Qwen3-8B-Base")[1]["max_position_embeddings"] == 32768
    assert known_shape("Qwen/Qwen2.5-7B-Instruct-AWQ") is None
    assert known_shape("org/model-7B") is None


def write_snapshot(cache: Path, repo: str, commit: str, hidden_size: int) -> Path:
    config = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({**MODEL_SHAPES["Qwen/Qwen2.5-7B-Instruct"], "hidden_size": hidden_size}))
    return config


def test_hf_cache_is_found_where_huggingface_hub_puts_it(tmp_path: Path):
    assert hf_hub_cache({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hf_hub_cache({"HUGGINGFACE_HUB_CACHE": "/c", "HF_HOME": "/b"}) == Path("/c")
    assert hf_hub_cache({"HF_HOME": "/b", "XDG_CACHE_HOME": "/x"}) == Path("/b/hub")
    assert hf_hub_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert hf_hub_cache({}) == Path(os.path.expanduser("~/.cache/huggingface/hub"))


def test_hf_cache_prefers_the_snapshot_refs_main_names(tmp_path: Path):
    repo = "Qwen/Qwen2.5-7B-Instruct"
    older = write_snapshot(tmp_path, repo, "aaa", 1000)
    newer = write_snapshot(tmp_path, repo, "bbb", 2000)
    os.utime(older, (1, 1))
    assert cached_config(repo, tmp_path) == newer  # no refs/main: the newest snapshot
    (tmp_path / "models--Qwen--Qwen2.5-7B-Instruct" / "refs").mkdir()
    (tmp_path / "models--Qwen--Qwen2.5-7B-Instruct" / "refs" / "main").write_text("aaa")
    assert cached_config(repo, tmp_path) == older
    assert cached_config("Qwen/Qwen3-8B", tmp_path) is None
    assert cached_config("/abs/path", tmp_path) is None and cached_config("~/model", tmp_path) is None


def test_hub_name_shape_comes_from_the_hf_cache_before_the_table(tmp_path: Path, monkeypatch):
    config = write_snapshot(tmp_path / "hub", "Qwen/Qwen2.5-7B-Instruct", "abc", 1234)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    info = model_info("Qwen/Qwen2.5-7B-Instruct")
    assert (info.source, info.hidden_size, info.shape_of) == ("hf-cache", 1234, str(config))
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub is the same cache
    assert model_info("Qwen/Qwen2.5-7B-Instruct").source == "hf-cache"


def test_local_config_comes_before_the_hf_cache_and_the_table(tmp_path: Path, monkeypatch):
    repo = "Qwen/Qwen2.5-7B-Instruct"
    write_snapshot(tmp_path / "hub", repo, "abc", 1234)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    local = tmp_path / "work" / repo / "config.json"
    local.parent.mkdir(parents=True)
    local.write_text(json.dumps({**MODEL_SHAPES[repo], "hidden_size": 4321}))
    monkeypatch.chdir(tmp_path / "work")  # the same string now names a local directory too
    assert (model_info(repo).source, model_info(repo).hidden_size) == ("config.json", 4321)
    monkeypatch.chdir(tmp_path)
    assert (model_info(repo).source, model_info(repo).hidden_size) == ("hf-cache", 1234)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert (model_info(repo).source, model_info(repo).hidden_size) == ("table", 3584)
    assert model_info(repo).shape_of == repo


def test_explain_says_where_the_shape_came_from(tmp_path: Path):
    table = compile_plan(REPO / "presets" / "grpo_7b_8gpu.yaml")
    assert table.resolved.model.info_text == "shape from rlconf's table for Qwen/Qwen2.5-7B-Instruct"
    local = tmp_path / "my-model"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(MODEL_SHAPES["Qwen/Qwen2.5-7B-Instruct"]))
    result = compile_plan(REPO / "presets" / "grpo_7b_8gpu.yaml", [f"actor_rollout_ref.model.path={local}"])
    assert result.resolved.model.info_text == f"shape from the local config ({local / 'config.json'})"


def test_an_unknown_model_keeps_the_not_estimated_row_and_warns(tmp_path: Path):
    result = compile_plan(REPO / "presets" / "grpo_7b_8gpu.yaml", ["actor_rollout_ref.model.path=org/model-7B"])
    rows = [t.formula for m in result.resolved.memory for t in m.terms if t.what == "actor activations + logits"]
    assert rows and rows[0].startswith("not estimated")
    warned = [d for d in result.diagnostics if d.code == "RL610"]
    assert len(warned) == 1 and warned[0].key == "actor_rollout_ref.model.path"
    assert "hf download org/model-7B config.json" in warned[0].help
    assert result.resolved.model.info_text == "size from the name; shapes unknown"
    local = compile_plan(REPO / "presets" / "grpo_7b_8gpu.yaml", ["actor_rollout_ref.model.path=~/ckpt/sft-7B"])
    help_text = next(d.help for d in local.diagnostics if d.code == "RL610")
    assert "hf download" not in help_text and "local model directory" in help_text  # a path, not a hub id


def test_a_table_shape_checks_the_plan_against_the_models_context():
    preset = REPO / "presets" / "long_context_ulysses.yaml"
    too_long = ["data.max_response_length=32768"]  # + 1024 prompt tokens > the instruct model's 32768 positions
    instruct = compile_plan(preset, too_long)
    assert [d.key for d in instruct.errors if d.code == "RL510"] == ["data.max_response_length"]
    base = compile_plan(preset, [*too_long, "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B"])  # 131072 positions
    assert not [d for d in base.errors if d.code == "RL510"]


def test_a_table_shape_checks_heads_against_tensor_parallel():
    result = compile_plan(REPO / "presets" / "grpo_7b_8gpu.yaml", ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
                                                                  "actor_rollout_ref.rollout.tensor_model_parallel_size=4"])
    assert [d.code for d in result.errors] == ["RL305"]  # 14 attention heads
