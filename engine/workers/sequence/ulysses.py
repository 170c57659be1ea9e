"""Ulysses sequence parallelism: the packed row of a micro batch split over `sp` ranks, heads split in attention.

Semantics as verl's (`ulysses_sequence_parallel_size`):

- Ranks form a (dp, sp) grid: each group of `sp` consecutive ranks (rank = dp_index × sp + sp_index)
  holds the same rows, and the controller deals each dp group its share (`shards_for_ranks`). FSDP
  shards the parameters over every rank of the worker group (or over groups of fsdp_size ranks,
  engine.workers.fsdp.sharding.mesh_shape) regardless of this grid: either way gradients average over all ranks.
- Ulysses needs sequence packing (use_remove_padding; the compiler refuses sp > 1 without it, RL306,
  as verl does). A micro batch is packed into one row of T tokens (engine.workers.sequence.packing), padded to
  a multiple of sp, and sp rank i runs the model on tokens [i·T/sp, (i+1)·T/sp) with their own position ids.
- Everything but attention is per token. In attention an all-to-all gathers the sequence and scatters
  the heads ([1, H, T/sp, D] -> [1, H/sp, T, D]), each rank attends over the whole packed row with its
  H/sp heads (cu_seqlens keep the sequences apart), and the inverse all-to-all brings back [T/sp, H].
  Heads must divide by sp; key/value heads fewer than sp are repeated up to sp (GQA: each query head
  group then still meets its own key/value head).
- Log-probs, entropy and values are computed at this rank's positions and all-gathered over the sp
  group into the full row, so every sp rank holds the same [b, R] outputs and computes the same loss.

Gradients: every rank of an sp group holds the same loss, so the gradient arriving at the gathered
values is the same on each; the gather's backward keeps this rank's slice of it (`_GatherSequence`), and
the all-to-alls send each token's gradient back to the rank that computed it. A rank's parameter
gradient is then its slice's part of its group's gradient, and the sum over the group is the group's
gradient. FSDP averages over all dp × sp ranks, so engine.workers.passes.ppo_update scales each loss by the
world size (not dp) and counts each row once per sp group (`sequence_parallel_size`).

Attention on the gathered row: on CPU per-sequence SDPA (engine.workers.sequence.packing's `rlconf_varlen`,
tested); on CUDA torch's varlen kernel through the same function, or flash-attn's varlen kernel when
installed (not run on a GPU yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engine.workers.fsdp.sharding import decoder_layers
from engine.workers.sequence.packing import (
    VARLEN_ATTENTION,
    PackedRows,
    packed_attention_implementation,
    register_varlen_attention,
    use_packed_attention,
    varlen_attention_forward,
)

ULYSSES_ATTENTION = "rlconf_ulysses"
_ATTRIBUTE = "rlconf_sequence_parallel"  # set on the model and on each attention module


@dataclass(frozen=True, eq=False)
class SequenceParallel:
    """This rank's sp group: `size` consecutive ranks, this rank at `rank` within it; `inner`: the
    attention implementation run on the gathered sequence."""

    group: Any  # torch.distributed ProcessGroup
    size: int
    rank: int
    inner: str = VARLEN_ATTENTION

    def __deepcopy__(self, memo: dict) -> SequenceParallel:
        return self  # a process group is not copied with a model copy


def sequence_parallel_group(size: int) -> SequenceParallel:
    """This rank's group of `size` consecutive ranks (a collective: every rank creates every group)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if size < 1 or world % size:
        raise ValueError(f"ulysses_sequence_parallel_size {size} does not divide the worker group's {world} ranks")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    return SequenceParallel(mine, size, rank % size)


def sequence_parallel_of(model: nn.Module) -> SequenceParallel | None:
    """The sp group `model` runs over (None: the whole sequence on this rank)."""
    return getattr(model, _ATTRIBUTE, None)


def sequence_parallel_size(model: nn.Module) -> int:
    """How many consecutive ranks hold the same rows for `model` (1 without Ulysses)."""
    sp = sequence_parallel_of(model)
    return 1 if sp is None else sp.size


# --- switching a model over ------------------------------------------------------------------

def prepare_attention(model: nn.Module, device: torch.device, packed: bool, sp_size: int) -> str | None:
    """The attention a worker's model runs: packing's (use_remove_padding), split over sp ranks when sp_size > 1.

    Returns the implementation's name (None: the model keeps its own, padded rows). Creates the sp
    groups, so every rank of the worker group calls it, in the same order.
    """
    if sp_size > 1 and not packed:
        raise ValueError(f"ulysses_sequence_parallel_size {sp_size} needs use_remove_padding: true (rule RL306): "
                         "Ulysses splits the packed row of a micro batch")
    if not packed:
        return None
    if sp_size == 1:
        return use_packed_attention(model, device)
    return use_ulysses_attention(model, device, sequence_parallel_group(sp_size))


def use_ulysses_attention(model: nn.Module, device: torch.device, sp: SequenceParallel) -> str:
    """Switch `model` to Ulysses attention over `sp`; it then runs packed rows only (`sequence_parallel_outputs`)."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % sp.size:
        raise ValueError(f"ulysses_sequence_parallel_size {sp.size} does not divide the model's {heads} attention "
                         f"heads: each sp rank attends with heads ÷ sp of them; use a divisor of {heads}")
    if kv_heads % sp.size and sp.size % kv_heads:
        raise ValueError(f"ulysses_sequence_parallel_size {sp.size} and the model's {kv_heads} key/value heads: "
                         "neither divides the other, so the key/value heads cannot be split or repeated over the sp "
                         f"ranks; use a divisor or a multiple of {kv_heads}")
    inner = "flash_attention_2" if packed_attention_implementation(device) == "flash_attention_2" else VARLEN_ATTENTION
    sp = SequenceParallel(sp.group, sp.size, sp.rank, inner)
    register_varlen_attention()
    from transformers import AttentionInterface

    AttentionInterface.register(ULYSSES_ATTENTION, ulysses_attention_forward)
    for layer in decoder_layers(model):
        setattr(layer.self_attn, _ATTRIBUTE, sp)
    setattr(model, _ATTRIBUTE, sp)
    model.set_attn_implementation(ULYSSES_ATTENTION)
    return ULYSSES_ATTENTION


# --- the forward on this rank's slice ----------------------------------------------------------

def sequence_parallel_outputs(model: nn.Module, packed: PackedRows, sp: SequenceParallel
                              ) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The model's outputs at the prediction positions in this rank's slice of the packed row.

    Returns (outputs [n, ...], mine [N] bool: which of the N response tokens those n are, in order,
    to_rows: [n, ...] values of this rank -> [b, R, ...] values of the whole micro batch, gathered over sp).
    """
    outputs, mine, gather = sequence_parallel_at(model, packed, sp, packed.predict_index)
    return outputs, mine, lambda values: packed.unpack(gather(values))


def sequence_parallel_at(model: nn.Module, packed: PackedRows, sp: SequenceParallel, positions: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The model's outputs at `positions` [N] of the packed row that fall in this rank's slice.

    Returns (outputs [n, ...], mine [N] bool: which of the N positions those n are, gather: [n, ...]
    values of this rank -> [N, ...] values at every position, gathered over sp).
    """
    total = packed.input_ids.shape[1]
    pad = -total % sp.size
    length = (total + pad) // sp.size
    start = sp.rank * length
    device = packed.input_ids.device
    input_ids = F.pad(packed.input_ids, (0, pad))
    # The padding is a sequence of its own (positions from 0, its own cu_seqlens entry), attended by nothing real.
    position_ids = torch.cat([packed.position_ids, torch.arange(pad, device=device)[None]], dim=1)
    cu_seqlens = packed.cu_seqlens
    if pad:
        cu_seqlens = torch.cat([cu_seqlens, torch.tensor([total + pad], dtype=cu_seqlens.dtype, device=device)])
    max_length = max(packed.max_seqlen, pad)
    out = model(input_ids=input_ids[:, start:start + length], position_ids=position_ids[:, start:start + length],
                attention_mask=None, use_cache=False, cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens,
                max_length_q=max_length, max_length_k=max_length)
    local = positions - start
    mine = (local >= 0) & (local < length)
    local = local[mine]

    def gather(values: torch.Tensor) -> torch.Tensor:
        slot = values.new_zeros((length, *values.shape[1:])).index_put((local,), values)
        return gather_sequence(slot, sp)[positions]

    return out.logits.squeeze(0)[local], mine, gather  # squeeze: see packing.packed_forward


# --- attention ---------------------------------------------------------------------------------

def ulysses_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [1, Hq, T/sp, D], key/value [1, Hkv, T/sp, D] of this rank's tokens -> [1, T/sp, Hq, D].

    kwargs carry the whole packed row's cu_seqlens (sequence_parallel_outputs passes them).
    """
    sp: SequenceParallel | None = getattr(module, _ATTRIBUTE, None)
    if sp is None or kwargs.get("cu_seq_lens_q") is None or query.shape[0] != 1:
        raise ValueError("rlconf_ulysses attention runs a slice of a packed row (batch 1, cu_seq_lens_q of the whole "
                         "row) on a model prepared by use_ulysses_attention; feed it sequence_parallel_outputs")
    kv_heads = key.shape[1]
    if kv_heads < sp.size:
        # Key/value head j serves query heads [j·Hq/Hkv, (j+1)·Hq/Hkv); after repeating each sp ÷ Hkv
        # times in place, rank i's one key/value head is still the one its Hq/sp query heads use.
        key = key.repeat_interleave(sp.size // kv_heads, dim=1)
        value = value.repeat_interleave(sp.size // kv_heads, dim=1)
    query, key, value = (all_to_all(t, sp, scatter_dim=1, gather_dim=2) for t in (query, key, value))
    # The local position ids are no use on the whole row: the kernels read cu_seqlens.
    kwargs.pop("position_ids", None)
    if sp.inner == "flash_attention_2":  # not run yet: no GPU with flash-attn has run this
        from transformers.integrations.flash_attention import flash_attention_forward as inner
    else:
        inner = varlen_attention_forward
    out, _ = inner(module, query, key, value, None, **kwargs)  # [1, T, Hq/sp, D]
    return all_to_all(out, sp, scatter_dim=1, gather_dim=2), None


# --- collectives with their gradients ----------------------------------------------------------

def _all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk k of `x` along scatter_dim goes to sp rank k; what rank k sent is chunk k along gather_dim."""
    send = torch.stack(x.chunk(sp.size, dim=scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=sp.group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.sp, ctx.dims = sp, (scatter_dim, gather_dim)
        return _all_to_all(x, sp, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.sp, gather_dim, scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Split `x` along scatter_dim over the sp ranks, concatenate what they send along gather_dim (differentiable)."""
    return _AllToAll.apply(x, sp, scatter_dim, gather_dim)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        ctx.sp = sp
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # Every sp rank computes the same loss from the gathered values: this rank's slice of the
        # gradient is the whole gradient of what it computed (see the module docstring).
        return grad.chunk(ctx.sp.size)[ctx.sp.rank].contiguous(), None


def gather_sequence(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """[L, ...] of each sp rank -> [sp × L, ...] in rank order, on every rank of the group."""
    return _GatherSequence.apply(x, sp)


# --- the controller's side: which rank gets which rows -------------------------------------------

def shards_for_ranks(shards: list[Any], world_size: int) -> list[Any]:
    """One shard per dp group -> one per rank: the sp consecutive ranks of a group get the same shard."""
    if not shards or world_size % len(shards):
        raise ValueError(f"{len(shards)} data-parallel shards do not spread evenly over {world_size} ranks")
    sp = world_size // len(shards)
    return [shards[rank // sp] for rank in range(world_size)]


def one_per_group(per_rank: list[Any], parts: int) -> list[Any]:
    """The results of the first rank of each of `parts` sp groups (its group's ranks return the same)."""
    return per_rank[::len(per_rank) // parts]
