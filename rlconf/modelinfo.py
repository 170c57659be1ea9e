"""What the compiler can learn about a model without importing transformers or the network.

Its shape (config.json numbers) comes from, in order: a local directory's config.json, the HF
cache's copy of a hub model's config.json, or rlconf's table of well-known models
(rlconf.model_shapes). Without a shape, a size in the name ("org/model-7B" -> 7e9 parameters) is
enough for the weights and optimizer terms of the memory estimate, not for its activations.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from rlconf.paths import expand

# Families whose HF implementations accept packed (padding-free) inputs; seed: the
# performance-tuning guide lists llama, mistral, gemma1 and qwen for use_remove_padding.
PACKING_FAMILIES = ("llama", "mistral", "gemma", "qwen")
# Families whose MLP is gated (gate, up and down projections of intermediate_size: SwiGLU/GeGLU),
# by a substring of config.json's model_type; the activation estimate counts their MLP differently.
GATED_MLP_FAMILIES = ("llama", "mistral", "mixtral", "gemma", "qwen", "phi3", "deepseek", "internlm", "olmo",
                      "granite", "glm", "baichuan", "yi")

_SIZE_IN_NAME = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])")


class ModelInfo(NamedTuple):
    # Where the shape came from: "config.json" (a local directory), "hf-cache", "table"
    # (rlconf.model_shapes), "random", "tiny"; or, with no shape, where the size came from: "name",
    # "estimate.num_params_b". `source_text` says it in words.
    source: str
    num_params: float | None = None
    model_type: str | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    max_position_embeddings: int | None = None
    intermediate_size: int | None = None
    head_dim: int | None = None  # config.json's, where it sets one (Qwen3, Gemma); see attention_head_dim
    shape_of: str | None = None  # the config.json read (local, cache) or the table's repo id (table, random)

    @property
    def has_shapes(self) -> bool:
        """Enough of the shape for the activation and logit terms of the memory estimate."""
        return bool(self.hidden_size and self.num_layers and self.vocab_size)

    @property
    def attention_head_dim(self) -> int | None:
        """Width of one attention head: config.json's head_dim, else hidden_size ÷ heads (as transformers)."""
        if self.head_dim:
            return self.head_dim
        return self.hidden_size // self.num_attention_heads if self.hidden_size and self.num_attention_heads else None

    @property
    def gated_mlp(self) -> bool:
        name = (self.model_type or "").lower()
        return any(family in name for family in GATED_MLP_FAMILIES)

    @property
    def family(self) -> str | None:
        name = (self.model_type or "").lower()
        return next((f for f in PACKING_FAMILIES if f in name), None)


def _params_from_config(cfg: dict) -> float | None:
    h, layers, vocab = cfg.get("hidden_size"), cfg.get("num_hidden_layers"), cfg.get("vocab_size")
    if not (h and layers and vocab):
        return None
    inter = cfg.get("intermediate_size") or 4 * h
    heads = cfg.get("num_attention_heads") or 1
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or h // heads
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o and k, v projections
    mlp = 3 * h * inter  # gate, up, down
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(layers * (attn + mlp + 2 * h) + embeddings)


# `tiny://<arch>`: the engine builds a random-weight model of this shape (engine/models/tiny.py
# uses the same numbers) so that CPU runs and tests need no downloads.
TINY_PREFIX = "tiny://"
TINY_ARCHES = ("qwen2", "llama")
UNTIED_SUFFIX = "-untied"
# `tiny://qwen2-reward`: a reward model of the tiny shape whose score is set by hand (the fraction of
# digit tokens; engine/models/tiny.py build_tiny_reward_model), for reward-model runs without downloads.
REWARD_SUFFIX = "-reward"


def tiny_arch(name: str) -> tuple[str, bool]:
    """`qwen2` -> ("qwen2", False); `qwen2-untied` -> ("qwen2", True): its LM head is a weight of its own.
    `qwen2-reward` -> ("qwen2", False): the tiny reward model has a score head and no LM head."""
    if name.endswith(REWARD_SUFFIX):
        return name[:-len(REWARD_SUFFIX)], False
    return (name[:-len(UNTIED_SUFFIX)], True) if name.endswith(UNTIED_SUFFIX) else (name, False)


TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 512, "tie_word_embeddings": True}


# `random://<name>`: a random-weight model of a real model's shape (its config.json numbers, vocabulary
# included) and the offline tokenizer, so GPU benchmarks and dry runs need no download; engine/models
# builds it from the shape table. Only shapes are real: the weights are noise, and token ids the small
# tokenizer lacks decode to nothing.
RANDOM_PREFIX = "random://"
# name -> the repo in rlconf.model_shapes whose shape it has. The Qwen2.5 names take the instruct
# models' (32k positions): the GPU measurements in docs/benchmarks.md ran these shapes.
RANDOM_TWINS: dict[str, str] = {
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen2.5-3B": "Qwen/Qwen2.5-3B-Instruct",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct",
    "Llama-3.2-1B": "meta-llama/Llama-3.2-1B",
}


def random_shape(path: str) -> dict | None:
    """The config numbers of a `random://NAME` path (None: not such a path, or NAME is not in RANDOM_TWINS)."""
    if not path.startswith(RANDOM_PREFIX):
        return None
    twin = RANDOM_TWINS.get(path[len(RANDOM_PREFIX):])
    if twin is None:
        return None
    from rlconf.model_shapes import MODEL_SHAPES  # only for a random:// or hub path: a local model needs no table

    return MODEL_SHAPES[twin]


# A hub repo id as the HF cache names it: `org/name` or `name`, without `--` or `..` (the Hub refuses both).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def is_hub_id(name: str) -> bool:
    """Whether `name` can be a hub repo id (`Qwen/Qwen2.5-7B-Instruct`), not a path (`/data/m`, `~/m`, `./m`)."""
    return bool(_HUB_ID.fullmatch(name)) and "--" not in name and ".." not in name


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps its downloads, by its own order: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE,
    HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(os.path.expanduser(env[key]))
    if env.get("HF_HOME"):
        return Path(os.path.expanduser(env["HF_HOME"])) / "hub"
    return Path(os.path.expanduser(env.get("XDG_CACHE_HOME") or "~/.cache")) / "huggingface" / "hub"


def cached_config(repo_id: str, hub_cache: Path) -> Path | None:
    """The config.json of `repo_id` in the HF cache, without the network: the snapshot refs/main
    names, else the newest snapshot that has one; None when the cache holds none."""
    if not is_hub_id(repo_id):
        return None
    repo_dir = hub_cache / f"models--{repo_id.replace('/', '--')}"
    try:
        main = (repo_dir / "refs" / "main").read_text().strip()
    except (OSError, ValueError):
        main = ""
    try:
        if main and (repo_dir / "snapshots" / main / "config.json").is_file():
            return repo_dir / "snapshots" / main / "config.json"
        found = [(c.stat().st_mtime, c.name, c) for c in (s / "config.json" for s in (repo_dir / "snapshots").iterdir())
                 if c.is_file()]
    except OSError:  # no such repo in the cache (the usual case), or one this user cannot read
        return None
    return max(found)[2] if found else None


def _read_config(path: Path) -> dict:
    """config.json's fields ({} when it cannot be read or is no JSON object); a multimodal config's
    text_config lifted to the top, where the decoder's numbers are looked for."""
    try:  # an OSError (name too long, no permission, ...) means no config; RL009 says why for a local path
        if not path.is_file():
            return {}
        import json  # only when a config.json is there: a cold `rlconf validate` of a hub name skips it

        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    return cfg


def _info_from_config(source: str, cfg: dict, num_params_b: float | None = None, shape_of: str | None = None) -> ModelInfo:
    params = num_params_b * 1e9 if num_params_b else _params_from_config(cfg)
    return ModelInfo(source, params, cfg.get("model_type"), cfg.get("hidden_size"), cfg.get("num_hidden_layers"),
                     cfg.get("vocab_size"), cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"),
                     cfg.get("max_position_embeddings"), cfg.get("intermediate_size"), cfg.get("head_dim"), shape_of)


def model_info(path: str, num_params_b: float | None = None, env: Mapping[str, str] | None = None) -> ModelInfo | None:
    """What rlconf knows of the model at `path` (a local directory, a hub id, tiny:// or random://);
    `env` (default os.environ) locates the HF cache. None: nothing, not even a size."""
    shape = random_shape(path)
    if shape is not None:
        return _info_from_config("random", shape, num_params_b, RANDOM_TWINS[path[len(RANDOM_PREFIX):]])
    if path.startswith(TINY_PREFIX):
        arch, untied = tiny_arch(path[len(TINY_PREFIX):])
        cfg = dict(TINY_SHAPE, model_type=arch, tie_word_embeddings=not untied)
        return _info_from_config("tiny", cfg)
    local = expand(path) / "config.json"
    cfg = _read_config(local)
    if cfg:
        return _info_from_config("config.json", cfg, num_params_b, str(local))
    cached = cached_config(path.strip().rstrip("/"), hf_hub_cache(os.environ if env is None else env))
    cfg = _read_config(cached) if cached is not None else {}
    if cfg:
        return _info_from_config("hf-cache", cfg, num_params_b, str(cached))
    from rlconf.model_shapes import known_shape

    known = known_shape(path)
    if known is not None:
        return _info_from_config("table", known[1], num_params_b, known[0])
    name = Path(path).name
    family = next((f for f in PACKING_FAMILIES if f in name.lower()), None)
    if num_params_b:
        return ModelInfo("estimate.num_params_b", num_params_b * 1e9, family)
    match = _SIZE_IN_NAME.search(name)
    if match:
        scale = 1e9 if match.group(2) in "bB" else 1e6
        return ModelInfo("name", float(match.group(1)) * scale, family)
    return ModelInfo("name", None, family) if family else None


def source_text(info: ModelInfo, size_given: bool = False) -> str:
    """Where `info` came from, in words, for `rlconf explain` (`size_given`: estimate.num_params_b
    set the size beside a known shape)."""
    words = {
        "config.json": f"shape from the local config ({info.shape_of})",
        "hf-cache": f"shape from the HF cache ({info.shape_of})",
        "table": f"shape from rlconf's table for {info.shape_of}",
        "random": f"random weights in the shape of {info.shape_of} (rlconf's table)",
        "tiny": "a tiny random model",
        "name": "size from the name; shapes unknown",
        "estimate.num_params_b": "size from estimate.num_params_b; shapes unknown",
    }.get(info.source, info.source)
    if size_given and info.has_shapes:
        words += "; size from estimate.num_params_b"
    return words
