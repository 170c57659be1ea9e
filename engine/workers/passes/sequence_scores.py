"""One score per sequence: a token-classification model's output at each row's last real token.

What a reward model (verl's RewardModelWorker) reads: the model scores every position, and the
score of a whole (prompt, response) is the one at its last token — the response's end (its EOS,
where it has one), or the prompt's last token for an empty response. Rows are [prompt (left-padded
to P) | response (right-padded to R)], as everywhere in the engine; packed rows (use_remove_padding)
and Ulysses shards of them give the same scores as the padded forward.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.batch import TensorBatch
from engine.workers.sequence.packing import pack_rows, packed_forward
from engine.workers.sequence.ulysses import sequence_parallel_at, sequence_parallel_of


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[b] column of each row's last real token (the mask is 1 on real tokens, left- and right-padded)."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (columns * attention_mask.to(columns.dtype)).argmax(-1)


def last_token_scores(model: nn.Module, batch: TensorBatch, packed: bool = False) -> torch.Tensor:
    """[b] fp32 scores: the model's first output at each row's last real token."""
    if packed:
        rows = pack_rows(batch)
        last = (rows.cu_seqlens[1:] - 1).long()  # every row has prompt tokens, so one sequence per row
        sp = sequence_parallel_of(model)
        if sp is not None:
            outputs, _mine, gather = sequence_parallel_at(model, rows, sp, last)
            return gather(outputs[..., 0].float())
        return packed_forward(model, rows, last)[..., 0].float()
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False)
    rows = torch.arange(out.logits.shape[0], device=out.logits.device)
    return out.logits[rows, last_token_index(batch["attention_mask"]), 0].float()
