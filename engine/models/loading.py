"""Resolve a plan's model path to a local HF directory, and load models and tokenizers from it.

`tiny://qwen2` / `tiny://llama` are built offline (engine.models.tiny) into a cache directory,
so the quickstart and the tests never download anything. Any other path is used as given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

TINY_SCHEME = "tiny://"


def cache_root() -> Path:
    """Where built artifacts live: $RLCONF_CACHE_DIR, else ~/.cache/rlconf."""
    return Path(os.environ.get("RLCONF_CACHE_DIR") or Path.home() / ".cache" / "rlconf").expanduser()


def resolve_model_path(path: str) -> Path:
    """A local model directory for `path`, building tiny models on first use (idempotent)."""
    if path.startswith(TINY_SCHEME):
        from engine.models.tiny import build_tiny_model

        arch = path[len(TINY_SCHEME):]
        return build_tiny_model(cache_root() / f"tiny-{arch}", arch=arch)
    return Path(path).expanduser()


def load_tokenizer(path: str | Path, chat_template: str | None = None, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if tokenizer.pad_token_id is None:
        # Left padding needs a pad id; any id works because padded positions are masked out.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_causal_lm(path: str | Path, override_config: dict[str, Any] | None = None,
                   trust_remote_code: bool = False) -> Any:
    """Weights are loaded in fp32: FSDP keeps fp32 master weights and casts for compute."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    return AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32,
                                                trust_remote_code=trust_remote_code)
