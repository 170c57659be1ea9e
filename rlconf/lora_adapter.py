"""The actor's LoRA settings as the run will have them: from lora_rank / lora_alpha / target_modules, or,
with `actor_rollout_ref.model.lora_adapter_path`, from the saved adapter's own `adapter_config.json`.

verl loads a saved adapter with peft's `PeftModel.from_pretrained`, which takes rank, alpha and target
modules from the adapter's config: the plan's lora_rank, lora_alpha and target_modules then have no
effect. verl's older FSDP workers (b178a3cd, and its example run_qwen2_5-3b_gsm8k_grpo_lora_from_adapter.sh,
which sets no lora_rank) turn LoRA on from the adapter path alone; verl 0.9.1's engine worker loads it
only when lora_rank > 0 too (and otherwise trains every weight while taking the reference from the actor).
rlconf does what the example means: an adapter path turns LoRA on, whatever lora_rank says.

The compiler reads only the small JSON file, and only when the path is a local directory; otherwise
(a hub id, a remote path) it assumes the plan's lora_rank and target modules for the memory estimate,
and `validate` says so (RL551). The engine always takes the numbers from the adapter it loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

ADAPTER_CONFIG = "adapter_config.json"


class LoraSettings(NamedTuple):
    rank: int
    alpha: float
    target_modules: str | list[str]
    exclude_modules: str | list[str] | None
    source: str  # where the numbers came from, for people: "lora_rank", the adapter's config file, or "assumed"


def actor_lora(model: Any) -> LoraSettings | None:
    """The actor's LoRA settings (`model`: actor_rollout_ref.model), None for full fine-tuning."""
    path = model.lora_adapter_path
    if path is None:
        if model.lora_rank == 0:
            return None
        return LoraSettings(model.lora_rank, model.lora_alpha, model.target_modules, model.exclude_modules, "lora_rank")
    saved = read_adapter_config(path)
    if saved is None:
        return LoraSettings(model.lora_rank, model.lora_alpha, model.target_modules, model.exclude_modules, "assumed")
    return LoraSettings(int(saved["r"]), float(saved.get("lora_alpha", 8)), saved.get("target_modules") or "all-linear",
                        saved.get("exclude_modules"), str(Path(path).expanduser() / ADAPTER_CONFIG))


def read_adapter_config(path: str) -> dict[str, Any] | None:
    """The adapter's config when `path` is a local directory holding one (None otherwise or when unreadable).

    peft writes target_modules as a list in any order (a set underneath); sorted here so plans compare equal.
    """
    import json  # here: a plan without an adapter never needs it (rlconf validate stays light)

    file = Path(path).expanduser() / ADAPTER_CONFIG
    try:
        saved = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("r"), int):
        return None
    if isinstance(saved.get("target_modules"), list):
        saved["target_modules"] = sorted(saved["target_modules"])
    return saved
