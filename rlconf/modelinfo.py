"""What the compiler can learn about a model without importing transformers.

A local `config.json` (HF format) gives exact shapes; otherwise a size in the name
("Qwen2.5-7B-Instruct" -> 7e9 parameters) is enough for a memory estimate.
"""

from __future__ import annotations

import re
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
    source: str  # "config.json", "name" or "estimate.num_params_b"
    num_params: float | None = None
    model_type: str | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    max_position_embeddings: int | None = None
    intermediate_size: int | None = None

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


def tiny_arch(name: str) -> tuple[str, bool]:
    """`qwen2` -> ("qwen2", False); `qwen2-untied` -> ("qwen2", True): its LM head is a weight of its own."""
    return (name[:-len(UNTIED_SUFFIX)], True) if name.endswith(UNTIED_SUFFIX) else (name, False)


TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 512, "tie_word_embeddings": True}


# `random://<name>`: a random-weight model of a real model's shape (its config.json numbers, vocabulary
# included) and the offline tokenizer, so GPU benchmarks and dry runs need no download; engine/models
# builds it from this table. Only shapes are real: the weights are noise, and token ids the small
# tokenizer lacks decode to nothing.
RANDOM_PREFIX = "random://"
RANDOM_SHAPES: dict[str, dict] = {
    "Qwen2.5-0.5B": {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True, "rope_theta": 1000000.0},
    "Qwen2.5-1.5B": {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True, "rope_theta": 1000000.0},
    "Qwen2.5-3B": {"model_type": "qwen2", "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                   "num_key_value_heads": 2, "intermediate_size": 11008, "vocab_size": 151936,
                   "max_position_embeddings": 32768, "tie_word_embeddings": True, "rope_theta": 1000000.0},
    "Qwen2.5-7B": {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
                   "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 1000000.0},
    "Llama-3.2-1B": {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "tie_word_embeddings": True, "rope_theta": 500000.0},
}


def random_shape(path: str) -> dict | None:
    """The config numbers of a `random://NAME` path (None: not such a path, or NAME is not in the table)."""
    if not path.startswith(RANDOM_PREFIX):
        return None
    return RANDOM_SHAPES.get(path[len(RANDOM_PREFIX):])


def _info_from_config(source: str, cfg: dict, num_params_b: float | None = None) -> ModelInfo:
    params = num_params_b * 1e9 if num_params_b else _params_from_config(cfg)
    return ModelInfo(source, params, cfg.get("model_type"), cfg.get("hidden_size"), cfg.get("num_hidden_layers"),
                     cfg.get("vocab_size"), cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"),
                     cfg.get("max_position_embeddings"), cfg.get("intermediate_size"))


def model_info(path: str, num_params_b: float | None = None) -> ModelInfo | None:
    shape = random_shape(path)
    if shape is not None:
        return _info_from_config("random", shape, num_params_b)
    if path.startswith(TINY_PREFIX):
        arch, untied = tiny_arch(path[len(TINY_PREFIX):])
        cfg = dict(TINY_SHAPE, model_type=arch, tie_word_embeddings=not untied)
        return ModelInfo("tiny", _params_from_config(cfg), arch, cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"],
                         cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["max_position_embeddings"],
                         cfg["intermediate_size"])
    local = expand(path) / "config.json"
    cfg: dict = {}
    try:  # an OSError (name too long, no permission, ...) means no local config; RL009 says why
        if local.is_file():
            import json  # only for a local model: a cold `rlconf validate` of a hub name skips it

            cfg = json.loads(local.read_text())
    except (OSError, ValueError):
        cfg = {}
    if not isinstance(cfg, dict):
        cfg = {}
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg = {**cfg, **cfg["text_config"]}
    if cfg:
        return _info_from_config("config.json", cfg, num_params_b)
    name = Path(path).name
    family = next((f for f in PACKING_FAMILIES if f in name.lower()), None)
    if num_params_b:
        return ModelInfo("estimate.num_params_b", num_params_b * 1e9, family)
    match = _SIZE_IN_NAME.search(name)
    if match:
        scale = 1e9 if match.group(2) in "bB" else 1e6
        return ModelInfo("name", float(match.group(1)) * scale, family)
    return ModelInfo("name", None, family) if family else None
