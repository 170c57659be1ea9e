"""Micro batches: a fixed number of rows each, or as many rows as a token budget holds (use_dynamic_bsz).

Rows are [prompt (left-padded to P) | response (right-padded to R)]. Padded (the default), a micro
batch costs rows × its *padded* width; each micro batch is trimmed to the widest prompt and
response it holds (`trim`), and a token budget counts that padded area: rows × (longest prompt +
longest response) ≤ budget. Rows of similar length are grouped together so little padding is left.

Packed (use_remove_padding, engine.workers.sequence.packing), a micro batch costs its real tokens, so a token
budget counts those: sum of (prompt + response) ≤ budget, and the rows are spread so the micro
batches hold similar token counts (`balance_by_budget`).

Every rank of a group must run the same number of micro batches, because each forward and
backward of an FSDP module is a collective; `plan_micro_batches` takes the agreed count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from engine.batch import TensorBatch, batch_size, select
from engine.workers.sequence.packing import pack_ahead


def row_extents(batch: TensorBatch) -> tuple[list[int], list[int]]:
    """(prompt tokens, response tokens) of each row, from the masks (both paddings excluded)."""
    response_length = batch["responses"].shape[1]
    prompt_mask = batch["attention_mask"][:, :-response_length] if response_length else batch["attention_mask"]
    prompts = prompt_mask.sum(-1).tolist()
    # Responses are right-padded: the extent is one past the last valid token.
    response_mask = batch["response_mask"]
    positions = torch.arange(1, response_length + 1, device=response_mask.device)
    responses = (response_mask.to(torch.long) * positions).amax(-1).tolist() if response_length else [0] * len(prompts)
    return [int(p) for p in prompts], [int(r) for r in responses]


def padded_cost(rows: Sequence[int], prompts: Sequence[int], responses: Sequence[int]) -> int:
    """Tokens a micro batch of these rows computes once trimmed: rows × (longest prompt + longest response)."""
    if not rows:
        return 0
    return len(rows) * (max(prompts[i] for i in rows) + max(responses[i] for i in rows))


def pack_by_budget(prompts: Sequence[int], responses: Sequence[int], budget: int) -> list[list[int]]:
    """Fewest groups of similar-length rows whose padded cost fits `budget`; a longer row stands alone.

    Rows are taken longest first, so each group's widest row comes first and the rest pad little.
    """
    order = sorted(range(len(prompts)), key=lambda i: (prompts[i] + responses[i], i), reverse=True)
    groups: list[list[int]] = []
    for i in order:
        if groups and padded_cost(groups[-1] + [i], prompts, responses) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [sorted(group) for group in groups]


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """`count` groups: halve the group with the most rows until there are enough (halves cost less)."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda k: len(groups[k]))
        if len(groups[largest]) < 2:
            raise ValueError(f"cannot make {count} micro batches out of {sum(map(len, groups))} rows")
        group = groups.pop(largest)
        groups[largest:largest] = [group[:len(group) // 2], group[len(group) // 2:]]
    return groups


def agreed_count(local: int) -> int:
    """The largest micro batch count of any rank of this process's group (a collective)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return local
    count = torch.tensor([local], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        count = count.cuda()
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def balance_by_budget(lengths: Sequence[int], budget: int, count: int) -> list[list[int]] | None:
    """`count` groups of rows with similar token sums, each within `budget` (None when this greedy fails).

    Longest row first, each into the group holding the fewest tokens so far (LPT scheduling).
    """
    if count > len(lengths):
        return None
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = min(range(count), key=lambda k: (loads[k], k))
        groups[k].append(i)
        loads[k] += lengths[i]
    if any(loads[k] > budget and len(groups[k]) > 1 for k in range(count)):
        return None  # (a row longer than the budget may stand alone, as in pack_by_budget)
    return [sorted(group) for group in groups]


def plan_micro_batches(batch: TensorBatch, micro_batch_size: int | None, token_budget: int,
                       packed: bool = False) -> list[list[int]]:
    """Row indices of each micro batch: fixed-size slices, or token-budget groups agreed over the ranks.

    Token budgets count the padded area of the trimmed rows, or the real tokens when `packed`.
    """
    rows = batch_size(batch)
    if micro_batch_size is not None:
        return [list(range(start, min(start + micro_batch_size, rows))) for start in range(0, rows, micro_batch_size)]
    prompts, responses = row_extents(batch)
    if not packed:
        groups = pack_by_budget(prompts, responses, token_budget)
        return split_to(groups, agreed_count(len(groups)))
    lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
    # Fewest groups that fit: first fit over rows longest first. Any count from there up is possible
    # (split_to halves groups), so the ranks take the largest count any of them needs.
    groups: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(rows), key=lambda i: (-lengths[i], i)):
        fit = next((k for k, load in enumerate(loads) if load + lengths[i] <= token_budget), None)
        if fit is None:
            groups.append([i])
            loads.append(lengths[i])
        else:
            groups[fit].append(i)
            loads[fit] += lengths[i]
    count = agreed_count(len(groups))
    balanced = balance_by_budget(lengths, token_budget, count)
    return balanced if balanced is not None else split_to([sorted(g) for g in groups], count)


def trim(micro: TensorBatch) -> tuple[TensorBatch, int]:
    """`micro` without the columns that are padding in every row; returns it and its response width.

    Fields are [b, P + R] (ids, masks, positions: trimmed on both sides) or [b, R] (response-aligned:
    trimmed on the right). Position ids are taken from the untrimmed rows, so they do not change.
    """
    width, response_width = micro["input_ids"].shape[1], micro["responses"].shape[1]
    prompt_width = width - response_width
    prompts, responses = row_extents(micro)
    keep_prompt, keep_response = max(max(prompts), 1), max(max(responses), 1)
    start, stop = prompt_width - keep_prompt, prompt_width + keep_response
    out = {}
    for name, tensor in micro.items():
        if tensor.dim() >= 2 and tensor.shape[1] == width:
            out[name] = tensor[:, start:stop]
        elif tensor.dim() >= 2 and tensor.shape[1] == response_width:
            out[name] = tensor[:, :keep_response]
        else:
            out[name] = tensor
    return out, keep_response


def micro_batches(batch: TensorBatch, plan: list[list[int]]) -> list[TensorBatch]:
    """The micro batches of `plan`, each trimmed of shared padding."""
    return [trim(select(batch, torch.tensor(rows, dtype=torch.long, device=batch["input_ids"].device)))[0]
            for rows in plan]


def scatter_rows(parts: list[torch.Tensor], plan: list[list[int]], rows: int, width: int) -> torch.Tensor:
    """Put per-micro-batch [b_k, w_k] response outputs back into [rows, width] in the batch's row order (0-padded)."""
    out = parts[0].new_zeros((rows, width))
    for part, indices in zip(parts, plan):
        out[torch.tensor(indices, dtype=torch.long, device=out.device), :part.shape[1]] = part
    return out


def forward_by_micro_batch(batch: TensorBatch, micro_batch_size: int | None, token_budget: int,
                           forward: Callable[[TensorBatch], tuple[torch.Tensor, ...]],
                           packed: bool = False) -> list[torch.Tensor]:
    """Run `forward` (no grad) on each micro batch; its [b, R_k] outputs come back as [rows, R] in row order."""
    plan = plan_micro_batches(batch, micro_batch_size, token_budget, packed)
    micros = micro_batches(batch, plan)
    if packed:
        pack_ahead(micros)  # the packing's read-backs before the first forward, none between them
    outputs = [forward(micro) for micro in micros]
    rows, width = batch_size(batch), batch["responses"].shape[1]
    return [scatter_rows([out[k] for out in outputs], plan, rows, width) for k in range(len(outputs[0]))]
