"""A step's prompts expanded to n samples each, and the decoding the reward and the logs read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.batch import TensorBatch, masked_rows
from engine.data.dataset import PromptBatch


@dataclass
class StepInputs:
    """One step's prompts expanded to n samples each, with what the reward needs per sample."""

    prompts: TensorBatch
    group_ids: list[int]  # samples of the same prompt share an id (the GRPO group)
    data_sources: list[str]
    ground_truths: list[str]
    extra_infos: list[dict[str, Any]]
    # The chat messages of each sample's prompt (verl's raw_prompt; empty: not carried), for a reward model
    # that re-renders them with its own chat template (reward_model.model.input_tokenizer).
    raw_prompts: list[list[dict[str, Any]]] = field(default_factory=list)


def expand_samples(batch: PromptBatch, n: int, step: int) -> StepInputs:
    def repeat(values: list[Any]) -> list[Any]:
        return [v for v in values for _ in range(n)]

    return StepInputs(
        prompts={"input_ids": batch.input_ids.repeat_interleave(n, dim=0),
                 "attention_mask": batch.attention_mask.repeat_interleave(n, dim=0)},
        group_ids=repeat([step * len(batch) + i for i in range(len(batch))]),
        data_sources=repeat(batch.data_sources),
        ground_truths=repeat(batch.ground_truths),
        extra_infos=repeat(batch.extra_infos),
        raw_prompts=repeat(batch.raw_prompts),
    )


def decode_responses(tokenizer: Any, batch: TensorBatch) -> list[str]:
    return tokenizer.batch_decode(masked_rows(batch["responses"], batch["response_mask"]), skip_special_tokens=True)


def decode_prompts(tokenizer: Any, prompts: TensorBatch) -> list[str]:
    return tokenizer.batch_decode(masked_rows(prompts["input_ids"], prompts["attention_mask"]), skip_special_tokens=True)
