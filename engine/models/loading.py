"""Resolve a plan's model path to a local HF directory, and load models and tokenizers from it.

`tiny://qwen2` / `tiny://llama` (and `tiny://qwen2-untied`, an LM head apart from the embeddings) are
built offline (engine.models.tiny) into a cache directory,
so the quickstart and the tests never download anything. Any other path is used as given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

TINY_SCHEME = "tiny://"
RANDOM_SCHEME = "random://"


def cache_root() -> Path:
    """Where built artifacts live: $RLCONF_CACHE_DIR, else ~/.cache/rlconf."""
    return Path(os.environ.get("RLCONF_CACHE_DIR") or Path.home() / ".cache" / "rlconf").expanduser()


def resolve_model_path(path: str) -> Path:
    """A local model directory for `path`, building tiny models on first use (idempotent)."""
    if path.startswith(TINY_SCHEME):
        from engine.models.tiny import build_tiny_model
        from rlconf.modelinfo import REWARD_SUFFIX, tiny_arch

        name = path[len(TINY_SCHEME):]
        arch, untied = tiny_arch(name)
        if name.endswith(REWARD_SUFFIX):
            from engine.models.tiny import build_tiny_reward_model

            return build_tiny_reward_model(cache_root() / f"tiny-{name}", arch=arch)
        return build_tiny_model(cache_root() / f"tiny-{name}", arch=arch, tie_word_embeddings=not untied)
    if path.startswith(RANDOM_SCHEME):
        from engine.models.tiny import build_random_model

        name = path[len(RANDOM_SCHEME):]
        return build_random_model(name, cache_root() / f"random-{name}")
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


def quiet_progress_bars() -> None:
    """No transformers progress bars in worker processes: Ray forwards them to the launch's console,
    where they would interleave with its own progress bar and step lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


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


def load_value_model(path: str | Path, override_config: dict[str, Any] | None = None,
                     trust_remote_code: bool = False) -> Any:
    """The critic: the causal LM's backbone with a 1-output linear head on every position.

    `AutoModelForTokenClassification` with one label is exactly that (backbone + `score` Linear),
    and it loads the backbone from a causal LM checkpoint; the head starts random (HF init, small
    weights, so values start near 0). Dropout before the head is turned off: the value loss clips
    against the values computed at rollout time, and dropout noise would make those disagree with
    the training forward even before any update.
    """
    model, _head_loaded = _load_scalar_head_model("critic", path, override_config, trust_remote_code)
    return model


def load_reward_model(path: str | Path, override_config: dict[str, Any] | None = None,
                      trust_remote_code: bool = False, fresh_head_ok: bool = False) -> Any:
    """The reward model: a backbone with a trained 1-output head (`score`), as verl loads it
    (AutoModelForTokenClassification, one label; a sequence-classification checkpoint has the same
    `score` weights). A checkpoint without them is a causal LM, not a reward model: refused, unless
    `fresh_head_ok` (tiny:// and random:// dry runs, whose weights are noise anyway).
    """
    model, head_loaded = _load_scalar_head_model("reward_model", path, override_config, trust_remote_code)
    if not head_loaded and not fresh_head_ok:
        raise ValueError(f"reward_model: {path} has no trained score head (no `score.*` weights): it looks like a "
                         "causal LM; point reward_model.model.path at a reward model (a sequence- or "
                         "token-classification checkpoint with one label)")
    return model


def _load_scalar_head_model(role: str, path: str | Path, override_config: dict[str, Any] | None,
                            trust_remote_code: bool) -> tuple[Any, bool]:
    """(the model with a one-output head on every position, fp32; whether the head came from the checkpoint)."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    # A fresh head is checked below; transformers' load report would only repeat it.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=torch.float32, trust_remote_code=trust_remote_code, output_loading_info=True)
    except ValueError as exc:  # transformers raises ValueError for an architecture without the head class
        raise ValueError(f"{role}: cannot build a model with a score head from {path} (model_type "
                         f"{config.model_type}): {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    missing_backbone = sorted(key for key in info["missing_keys"] if not key.startswith("score."))
    if missing_backbone:
        raise ValueError(f"{role}: {path} lacks {len(missing_backbone)} backbone weights (e.g. "
                         f"{', '.join(missing_backbone[:3])}); is {role}.model.path a model of the same family?")
    return model, not any(key.startswith("score.") for key in info["missing_keys"])


def enable_activation_checkpointing(model: Any) -> None:
    """enable_gradient_checkpointing: each decoder layer's activations recomputed in the backward.

    transformers 5.2x renamed the switch (`activation_checkpointing_enable`) and warns on the old
    name at every call; older releases (the GPU image's 5.17 among them) have only the old one.
    """
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable()
    else:
        model.gradient_checkpointing_enable()
