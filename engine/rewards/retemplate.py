"""A reward model reads each row re-rendered in its own chat template: the one place that renders them.

`render_chats` is the rendering both of verl's reward-model paths share; each path then does its own:

- the FSDP reward model with a tokenizer of its own (reward_model.model.input_tokenizer): `ChatTemplateSwitch`;
- the reward model served by vLLM (verl 0.9.1's reward loop, reward_model.rollout.name): `RewardLoopPrompts`,
  which always re-renders (the served engine takes text) and drops a leading BOS text, as verl's
  RewardLoopWorker._preprocess_reward_inputs does before its `classify` request.

verl's FSDP reward model worker (`_switch_chat_template`, verl 0.8/0.9 fsdp_workers.py) does, per row:
decode the response's valid ids with input_tokenizer (the policy's; special tokens kept), drop its
EOS text, append it to the prompt's chat messages as the assistant turn, render the whole chat with
the reward model's own template (no generation prompt), tokenize that text (no added special tokens),
and cut or right-pad it to reward_model.max_length (default: the policy's prompt + response width),
the tail cut off. The reward model scores that row at its last real token.

`verl_rows` is that procedure; `worker_rows` lays its rows out as the engine's workers read every
row (prompt left-padded | response), the whole re-rendered sequence as the prompt and an empty
response, which gives the same scores (the mask and position ids leave padding out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.batch import TensorBatch, position_ids_from_mask


def render_chats(input_tokenizer: Any, reward_tokenizer: Any, raw_prompts: Sequence[Sequence[dict[str, Any]]],
                 responses: torch.Tensor, attention_mask: torch.Tensor) -> list[str]:
    """Each row's chat (prompt messages + the decoded response) in the reward model's template, as verl renders it:
    the response's valid ids (the response part of the attention mask) decoded with the policy's tokenizer,
    special tokens kept, its EOS text removed, appended as the assistant turn, rendered without a generation prompt."""
    if len(raw_prompts) != responses.shape[0]:
        raise ValueError(f"{len(raw_prompts)} chat prompts for {responses.shape[0]} responses: the re-rendering "
                         "needs each row's chat messages (StepInputs.raw_prompts)")
    width = responses.shape[1]
    eos = input_tokenizer.eos_token
    out = []
    for chat, ids, mask in zip(raw_prompts, responses, attention_mask, strict=True):
        valid = int(mask[-width:].sum()) if width else 0
        response = input_tokenizer.decode(ids[:valid].tolist())
        if eos:
            response = response.replace(eos, "")
        messages = [*chat, {"role": "assistant", "content": response}]
        out.append(reward_tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False))
    return out


def require_chat_template(reward_tokenizer: Any, why: str, instead: str) -> None:
    if not getattr(reward_tokenizer, "chat_template", None):
        raise ValueError(f"{why}, so responses are re-rendered with the reward model's chat template, and the reward "
                         f"model's tokenizer has none; use a reward model whose tokenizer has a chat template, or "
                         f"{instead}")


@dataclass
class RewardLoopPrompts:
    """The policy's rows -> the texts a served reward model scores (verl 0.9.1's reward loop)."""

    input_tokenizer: Any  # the policy's: decodes the response ids (verl: actor_rollout_ref.model.path's tokenizer)
    reward_tokenizer: Any  # the reward model's own tokenizer and chat template (reward_model.model.path)

    def __post_init__(self) -> None:
        require_chat_template(self.reward_tokenizer, "the reward model is served (reward_model.rollout.name), which "
                              "scores text", "score with the FSDP reward-model worker (reward_model.use_reward_loop="
                              "false), which reads the policy's token ids")

    def texts(self, raw_prompts: Sequence[Sequence[dict[str, Any]]], responses: torch.Tensor,
              attention_mask: torch.Tensor) -> list[str]:
        """`render_chats`, less a leading BOS text: the served engine tokenizes the text itself and adds its
        special tokens (verl strips the template's BOS so that a Llama-style tokenizer does not get two)."""
        bos = self.reward_tokenizer.bos_token
        texts = render_chats(self.input_tokenizer, self.reward_tokenizer, raw_prompts, responses, attention_mask)
        return [text[len(bos):] if bos is not None and text.startswith(bos) else text for text in texts]


@dataclass
class ChatTemplateSwitch:
    """The policy's rows -> the reward model's, as verl's reward model worker re-renders them."""

    input_tokenizer: Any  # decodes the policy's response ids (reward_model.model.input_tokenizer)
    reward_tokenizer: Any  # the reward model's own tokenizer and chat template (reward_model.model.path)
    max_length: int  # reward_model.max_length, or the policy's prompt + response width
    counts: dict[str, float] = field(default_factory=dict)  # truncated rows since take_metrics

    def __post_init__(self) -> None:
        require_chat_template(self.reward_tokenizer, "reward_model.model.input_tokenizer is set", "leave "
                              "input_tokenizer unset (the reward model then reads the policy's token ids)")
        if self.reward_tokenizer.pad_token_id is None:
            raise ValueError("the reward model's tokenizer has no pad token (nor an EOS to pad with)")

    def texts(self, raw_prompts: Sequence[Sequence[dict[str, Any]]], responses: torch.Tensor,
              attention_mask: torch.Tensor) -> list[str]:
        """Each row's chat (prompt messages + the decoded response) in the reward model's template."""
        return render_chats(self.input_tokenizer, self.reward_tokenizer, raw_prompts, responses, attention_mask)

    def verl_rows(self, raw_prompts: Sequence[Sequence[dict[str, Any]]], responses: torch.Tensor,
                  attention_mask: torch.Tensor) -> TensorBatch:
        """{input_ids, attention_mask, position_ids}: [B, max_length], right-padded, cut at max_length (verl's rows)."""
        texts = self.texts(raw_prompts, responses, attention_mask)
        rows = len(texts)
        input_ids = torch.full((rows, self.max_length), self.reward_tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((rows, self.max_length), dtype=torch.long)
        truncated = 0
        for i, text in enumerate(texts):
            ids = list(self.reward_tokenizer(text, add_special_tokens=False)["input_ids"])
            truncated += len(ids) > self.max_length
            ids = ids[:self.max_length]
            input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[i, :len(ids)] = 1
        self.counts["reward/rm_inputs_truncated"] = self.counts.get("reward/rm_inputs_truncated", 0) + truncated
        return {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)}

    def take_metrics(self) -> dict[str, float]:
        """How many rows were cut at max_length since the last call."""
        counts, self.counts = self.counts, {}
        return counts


def worker_rows(rows: TensorBatch) -> TensorBatch:
    """Right-padded [B, L] rows -> the workers' layout: the sequence left-padded as a prompt of width L, and an
    empty response of width 1 (the reward model scores the last real token, the sequence's own last)."""
    mask = rows["attention_mask"]
    lengths = mask.sum(-1)
    width = mask.shape[1]
    # Row i's tokens move right by the padding it has, so they end at column L - 1.
    columns = (torch.arange(width)[None, :] - (width - lengths)[:, None]) % width
    input_ids = torch.gather(rows["input_ids"], 1, columns)
    left_mask = torch.gather(mask, 1, columns)
    empty = torch.zeros((mask.shape[0], 1), dtype=torch.long)
    return {"input_ids": torch.cat([input_ids * left_mask, empty], 1), "attention_mask": torch.cat([left_mask, empty], 1),
            "position_ids": torch.cat([position_ids_from_mask(left_mask), empty], 1), "responses": empty,
            "response_mask": empty}
