"""verl-schema parquet prompts -> left-padded token batches, and a seeded, resumable batch order.

Rows have `prompt` (a chat message list), `data_source` and `reward_model.ground_truth`
(verl's RL parquet schema). Prompts go through the tokenizer's chat template with the generation
prompt appended, then are left-padded to `max_prompt_length` so every response starts at the
same column: generation appends on the right and log-prob slicing needs one prompt width.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Truncation = Literal["error", "left", "right", "middle"]


class PromptTooLongError(ValueError):
    """A prompt exceeds max_prompt_length and data.truncation is `error`."""


# verl's multi-modal columns (data.image_key, video_key, audio_key at their defaults; other names are
# refused by the compiler, RL108).
MULTI_MODAL_COLUMNS = ("images", "videos", "audios")


def multi_modal_problem(rows: Sequence[dict[str, Any]]) -> str | None:
    """A message when rows carry images, video or audio: text-only prompts would silently drop them."""
    for index, row in enumerate(rows):
        for column in MULTI_MODAL_COLUMNS:
            if row.get(column):
                return (f"row {index} has {column} (verl's data.{column[:-1]}_key column): rlconf does not run "
                        "multi-modal data yet (the engine trains text-only models on token ids); use a text-only "
                        "dataset and model")
    return None


@dataclass(frozen=True)
class PromptBatch:
    """One step's prompts. Tensors are [B, max_prompt_length], left-padded."""

    input_ids: Any  # torch.LongTensor
    attention_mask: Any  # torch.LongTensor
    data_sources: list[str]
    ground_truths: list[str]
    extra_infos: list[dict[str, Any]]
    indices: list[int]  # row indices in the dataset (for debugging and resume checks)
    # The chat messages of each prompt (verl's raw_prompt): a reward model with its own chat template re-renders them.
    raw_prompts: list[list[dict[str, Any]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.indices)


def read_rows(files: Sequence[Path]) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for file in files:
        rows.extend(pq.read_table(file).to_pylist())
    return rows


def truncate(ids: list[int], max_length: int, mode: Truncation, where: str) -> list[int]:
    if len(ids) <= max_length:
        return ids
    if mode == "left":  # keep the end: the generation prompt must stay
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head):]
    raise PromptTooLongError(
        f"{where}: prompt is {len(ids)} tokens after the chat template, over data.max_prompt_length {max_length}; "
        "raise max_prompt_length, set data.truncation to left/right/middle, or data.filter_overlong_prompts=true")


class PromptDataset:
    """Tokenizes lazily (per batch), so a large dataset costs nothing until its rows are drawn."""

    def __init__(self, rows: list[dict[str, Any]], tokenizer: Any, max_prompt_length: int,
                 truncation: Truncation = "error", prompt_key: str = "prompt", reward_fn_key: str = "data_source",
                 filter_overlong_prompts: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.truncation: Truncation = truncation
        self.prompt_key = prompt_key
        self.reward_fn_key = reward_fn_key
        problem = multi_modal_problem(rows)
        if problem:
            raise ValueError(problem)
        if filter_overlong_prompts:
            rows = [row for row in rows if len(self.encode_row(row)) <= max_prompt_length]
        if not rows:
            raise ValueError("the dataset has no rows (after filtering overlong prompts)")
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def encode_row(self, row: dict[str, Any]) -> list[int]:
        text = self.tokenizer.apply_chat_template(row[self.prompt_key], add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, index: int) -> list[int]:
        ids = self.encode_row(self.rows[index])
        return truncate(ids, self.max_prompt_length, self.truncation, f"row {index}")

    def collate(self, indices: Sequence[int]) -> PromptBatch:
        import torch

        width, pad = self.max_prompt_length, self.tokenizer.pad_token_id
        input_ids = torch.full((len(indices), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(indices), width), dtype=torch.long)
        for i, index in enumerate(indices):
            ids = self.encode(index)
            input_ids[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids):] = 1
        rows = [self.rows[i] for i in indices]
        return PromptBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            data_sources=[str(r[self.reward_fn_key]) for r in rows],
            ground_truths=[str((r.get("reward_model") or {}).get("ground_truth", "")) for r in rows],
            extra_infos=[dict(r.get("extra_info") or {}) for r in rows],
            indices=list(indices),
            raw_prompts=[list(r[self.prompt_key]) for r in rows],
        )


# Where a generation batch's size comes from (rlconf.normalize.generation_batch).
BATCH_KEYS = "data.gen_batch_size, or data.train_batch_size when unset"


@dataclass
class BatchOrder:
    """Which rows each generation round reads: a seeded permutation per epoch, full batches only (drop_last).

    A batch is a generation batch: data.gen_batch_size prompts (train_batch_size when unset), as
    verl batches its train dataloader, so an epoch is num_rows // batch_size batches and a DAPO
    step that generates several rounds draws several of them (crossing into the next epoch if it
    must). The permutation of epoch e depends only on (seed, e), so (epoch, position) is the whole
    state a resume needs.
    """

    num_rows: int
    batch_size: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    position: int = 0  # batches already taken in this epoch

    def __post_init__(self) -> None:
        if self.batches_per_epoch == 0:
            raise ValueError(f"the generation batch of {self.batch_size} prompts ({BATCH_KEYS}) is larger than the "
                             f"dataset ({self.num_rows} rows)")

    @property
    def batches_per_epoch(self) -> int:
        return self.num_rows // self.batch_size

    def permutation(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_indices(self) -> list[int]:
        if self.position >= self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        self.position += 1
        return self.permutation(self.epoch)[start:start + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        # The permutation's inputs are saved to be checked on load, not restored: they come from the plan and data.
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "batch_size": self.batch_size,
                "num_rows": self.num_rows}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, what in (("seed", "data.seed"), ("batch_size", f"a generation batch ({BATCH_KEYS})"),
                          ("num_rows", "the number of training prompts")):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(f"the saved data order was drawn with {what} = {state[key]}, this run has "
                                 f"{getattr(self, key)}: resuming would repeat some prompts and skip others; "
                                 "resume with the same plan and data, or start over with trainer.resume_mode=disable")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
