"""Partial rollouts (verl's async_training.partial_rollout): a response cut off by a weight push, resumed after it.

A rollout worker interrupted mid-call answers with what it sampled so far: each row's response tokens and their
log-probs, right-padded to the response length R as usual, and how many tokens each row has (`generated`). A row is
unfinished when it has fewer than R tokens and has not ended (an EOS, unless ignore_eos). After the push the
controller sends the unfinished rows back with those tokens; the worker generates the rest on the new weights with
prompt + prefix as the prompt and joins the two, so the trainer sees one response whose rollout log-probs are those
of the weights that sampled each token (the rollout correction reads them as they are).

Pure functions on CPU tensors; the worker (engine.workers.roles.rollout) and the controller
(engine.controller.fully_async) call them.
"""

from __future__ import annotations

import torch

from engine.batch import TensorBatch


def unfinished(responses: torch.Tensor, generated: torch.Tensor, eos_token_id: int, ignore_eos: bool,
               response_length: int) -> torch.Tensor:
    """[b] bool: rows cut off before their end (fewer than `response_length` tokens, no EOS among them)."""
    short = generated < response_length
    if ignore_eos:
        return short
    width = responses.shape[1]
    within = torch.arange(width)[None, :] < generated[:, None]
    ended = ((responses == eos_token_id) & within).any(dim=1)
    return short & ~ended


def continuation_prompts(prompts: TensorBatch, responses: torch.Tensor, generated: torch.Tensor,
                         pad_token_id: int) -> TensorBatch:
    """Each row's prompt followed by its first `generated[i]` response tokens, left-padded to one width: the prompts
    the rest of the responses are generated from."""
    rows = [torch.cat([ids[mask.bool()], responses[i, :int(generated[i])]])
            for i, (ids, mask) in enumerate(zip(prompts["input_ids"], prompts["attention_mask"]))]
    width = max((len(r) for r in rows), default=0)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            input_ids[i, -len(row):] = row
            attention_mask[i, -len(row):] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def join(prefix: torch.Tensor, prefix_generated: torch.Tensor, rest: torch.Tensor, rest_generated: torch.Tensor,
         response_length: int, fill: float | int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i: its first prefix_generated[i] values of `prefix`, then the first rest_generated[i] of `rest`, cut at
    `response_length` and padded with `fill`; and each row's count. Works for tokens and log-probs alike."""
    out = torch.full((prefix.shape[0], response_length), fill, dtype=prefix.dtype)
    counts = torch.zeros(prefix.shape[0], dtype=torch.long)
    for i in range(prefix.shape[0]):
        head = prefix[i, :int(prefix_generated[i])]
        tail = rest[i, :max(0, min(int(rest_generated[i]), response_length - len(head)))]
        row = torch.cat([head, tail])
        out[i, :len(row)] = row
        counts[i] = len(row)
    return out, counts
