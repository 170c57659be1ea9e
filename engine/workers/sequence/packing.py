"""Sequence packing (use_remove_padding): a micro batch's real tokens in one row, attention kept per sequence.

A micro batch of rows [prompt (left-padded to P) | response (right-padded to R)] becomes one row of
T = (real tokens) positions: the rows' tokens one after another, position ids restarting at 0 for
each sequence, and cu_seqlens [0, len_0, len_0 + len_1, ...]. No compute is spent on padding, and
the outputs come back in the padded [b, R] layout, so the losses do not change.

Attention must not cross from one sequence into the next. Which attention implementation does that
(chosen once per model by `use_packed_attention`, see `packed_attention_implementation`):

- `flash_attention_2` (CUDA, flash-attn 2 installed, flash-attn-4 not): transformers passes our
  cu_seqlens to `flash_attn_varlen_func`.
- `rlconf_varlen` (CUDA, torch built with flash attention): registered below; on cu_seqlens, with the
  model's fewer key/value heads as they are (GQA), flash-attn-4's kernels where installed
  (engine.workers.sequence.fa4_attention), else torch's own varlen flash kernel (the one
  `torch.nn.attention.varlen_attn` wraps). No mask is built. This is what the GPU image
  (torch 2.11, no flash-attn) runs.
- `sdpa` (everything else, the CPU of CI): transformers 5 sees position ids that restart inside a
  row with no attention mask (masking_utils.find_packed_sequence_indices) and builds a
  block-diagonal causal mask [1, 1, T, T] for SDPA. Correct everywhere; the mask costs T² bools.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from engine.batch import TensorBatch
from engine.workers.sequence.fa4_attention import fa4_available, fa4_varlen_call

VARLEN_ATTENTION = "rlconf_varlen"


@dataclass(frozen=True)
class PackedRows:
    """One micro batch packed into one row, and where its response tokens go back.

    input_ids, position_ids: [1, T]. cu_seqlens: [n + 1] int32 (n: rows with tokens). max_seqlen: the longest
    sequence, which the varlen kernels size their grids by (the compiled decoder layers take it as a dynamic int:
    engine.models.compile).
    predict_index: [N] packed position whose output belongs to each real response token (its
    logit predicts the token; its value is the state before it), N = response tokens.
    response_rows, response_cols: [N] that token's place in the padded [b, R] response layout.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    predict_index: torch.Tensor
    response_rows: torch.Tensor
    response_cols: torch.Tensor
    rows: int
    response_width: int

    def attention_kwargs(self) -> dict[str, Any]:
        """What the varlen attention kernels read (transformers' FlashAttentionKwargs names)."""
        return {"cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_seqlen, "max_length_k": self.max_seqlen}

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """[N, ...] per-response-token values -> [b, R, ...], 0 where the response is padding."""
        out = values.new_zeros((self.rows, self.response_width, *values.shape[1:]))
        return out.index_put((self.response_rows, self.response_cols), values)


# pack_rows' results by the attention mask they were computed from (weakly: an entry goes with its
# micro batch), so that packing them all before the first forward (`pack_ahead`) is not repeated.
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def pack_rows(batch: TensorBatch) -> PackedRows:
    """Pack the real tokens (attention_mask 1) of `batch`'s rows, in row order, into one row.

    Packing reads data-dependent sizes back from the device (a sync each). A batch packed before, by
    `pack_ahead` or an earlier call, is not packed again: its masks are the same tensors.
    """
    cached = _PACKED.get(batch["attention_mask"])
    if cached is not None and cached[0] is batch["response_mask"]:
        return cached[1]
    packed = _pack_rows(batch)
    _PACKED[batch["attention_mask"]] = (batch["response_mask"], packed)
    return packed


def pack_ahead(batches: list[TensorBatch]) -> None:
    """Pack every micro batch now, before the first one's forward.

    Packing waits for the GPU (its sizes are read back); done at the top of each micro batch, that
    left the GPU idle while the CPU packed and then queued the next forward. Done here, the
    micro batches' forwards and backwards are queued back to back with no read-back between them.
    """
    for batch in batches:
        pack_rows(batch)


def _pack_rows(batch: TensorBatch) -> PackedRows:
    attention_mask = batch["attention_mask"].bool()
    rows, width = attention_mask.shape
    response_width = batch["responses"].shape[1]
    prompt_width = width - response_width
    flat = attention_mask.reshape(-1).nonzero().squeeze(-1)
    tokens = flat.numel()
    # The rows' own position ids (0.. for each row's first real token): the padded forward uses the same.
    input_ids = batch["input_ids"].reshape(-1)[flat][None]
    position_ids = batch["position_ids"].reshape(-1)[flat][None]
    lengths = attention_mask.sum(-1)
    lengths = lengths[lengths > 0]
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    packed_of = torch.full((rows * width,), -1, dtype=torch.long, device=flat.device)
    packed_of[flat] = torch.arange(tokens, device=flat.device)
    response_rows, response_cols = batch["response_mask"].bool().nonzero(as_tuple=True)
    token_index = packed_of[response_rows * width + prompt_width + response_cols]
    # The token before a response token is in the same sequence: every row has at least one prompt token.
    return PackedRows(input_ids, position_ids, cu_seqlens, int(lengths.max()) if lengths.numel() else 0,
                      token_index - 1, response_rows, response_cols, rows, response_width)


def packed_forward(model: nn.Module, packed: PackedRows, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The model's output logits on the packed row (no attention mask: see the module doc): [T, ...],
    or [len(positions), ...] at `positions` of the row only.

    With `positions`, the output head runs on those positions alone where the model takes a tensor
    `logits_to_keep` (`head_keeps_positions`): for the response tokens that is the prompts' share of
    the head's matmul and of its [T, vocab] logits not computed, in forward and backward.
    """
    keep = positions is not None and head_keeps_positions(model)
    extra = {"logits_to_keep": positions} if keep else {}
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                use_cache=False, **packed.attention_kwargs(), **extra)
    # squeeze, not [0]: a select's backward writes the gradient into a zero-filled copy of the whole
    # [1, T, vocab] logits (measured: 10.7 ms of fill and copy per 1.5B update on H100, and that
    # buffer beside the logits' gradient at the loss head's peak); a squeeze's is a view.
    logits = out.logits.squeeze(0)
    return logits if positions is None or keep else logits[positions]


def head_keeps_positions(model: nn.Module) -> bool:
    """Whether `model(...)` takes `logits_to_keep` as a tensor of positions (transformers' causal LMs
    since 4.50; older ones take only an int, or nothing)."""
    return _head_keeps_positions(type(model))


@cache
def _head_keeps_positions(model_type: type) -> bool:
    parameter = inspect.signature(model_type.forward).parameters.get("logits_to_keep")
    return parameter is not None and "Tensor" in str(parameter.annotation)


# --- choosing and registering the attention implementation ------------------------------------

def _torch_flash_available() -> bool:
    return torch.backends.cuda.is_flash_attention_available()


def _has_flash_attn() -> bool:
    """Whether flash-attn 2 (what transformers' `flash_attention_2` calls) is installed.

    Not just `import flash_attn`: flash-attn-4 installs the same top-level package with only its
    `flash_attn.cute` kernels in it, and transformers then refuses `flash_attention_2`.
    """
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except ImportError:
        return False
    return True


def packed_attention_implementation(device: torch.device) -> str:
    """The attention implementation a packed model runs on `device` (see the module docstring)."""
    if device.type == "cuda" and fa4_available():
        return VARLEN_ATTENTION  # with flash-attn-4's kernels (varlen_kernel): faster than flash-attn 2's
    if device.type == "cuda" and _has_flash_attn():
        return "flash_attention_2"
    if device.type == "cuda" and _torch_flash_available():
        return VARLEN_ATTENTION
    return "sdpa"


def use_packed_attention(model: nn.Module, device: torch.device, implementation: str | None = None) -> str:
    """Switch `model` to the attention that keeps packed sequences apart; returns its name.

    Only for a model that runs packed rows from now on: `rlconf_varlen` builds no mask, so it refuses
    a padded batch. Call it on the training/log-prob model, not on a copy that generates.
    """
    name = implementation or packed_attention_implementation(device)
    if name == VARLEN_ATTENTION:
        register_varlen_attention()
    model.set_attn_implementation(name)
    return name


def register_varlen_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)


def varlen_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None,
                             dropout: float = 0.0, sliding_window: int | None = None, **kwargs: Any
                             ) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed sequence. query [1, Hq, T, D], key/value [1, Hkv, T, D] -> [1, T, Hq, D].

    torch's varlen flash kernel on CUDA (flash_varlen_call); elsewhere (tests on CPU) SDPA one
    sequence at a time, which is the same math without the kernel.
    """
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None or query.shape[0] != 1:
        raise ValueError("rlconf_varlen attention runs packed rows only (batch 1 with cu_seq_lens_q); this model "
                         "was switched to it by use_packed_attention, so feed it engine.workers.sequence.packing.pack_rows")
    if dropout:
        raise ValueError("rlconf_varlen attention has no dropout")
    if sliding_window is not None:
        raise ValueError("rlconf_varlen attention has no sliding window; use_remove_padding needs full attention here")
    q, k, v = (t.squeeze(0).transpose(0, 1) for t in (query, key, value))  # [T, H, D]; squeeze: see packed_forward
    if q.is_cuda:
        call = fa4_varlen_call if varlen_kernel() == "flash_attn_4" else flash_varlen_call
        # max_length_q stays as given: under torch.compile a Python int() of it would pin the graph to one length.
        out = call(q, k, v, cu_seqlens.to(q.device, torch.int32), kwargs["max_length_q"], scaling)
    else:
        out = _sdpa_per_sequence(q, k, v, cu_seqlens.tolist(), scaling)
    return out[None], None


@torch.compiler.assume_constant_result
def varlen_kernel() -> str:
    """The kernel `rlconf_varlen` runs on CUDA: flash-attn-4's where it is installed and runs here
    (engine.workers.sequence.fa4_attention: faster on H100), else torch's built-in flash kernel.

    A constant to torch.compile (model.compile_layers traces the attention): the graph holds the
    chosen kernel's call, not the import probing that chose it.
    """
    return "flash_attn_4" if fa4_available() else "torch_flash"


def flash_varlen_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                      max_seqlen: int, scaling: float | None) -> torch.Tensor:
    """Causal attention within each sequence by the flash kernel torch's varlen_attn wraps, called as the
    aten operator. q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D].

    Why not varlen_attn itself: torch 2.11's has no `enable_gqa`, so the key/value heads had to be
    repeated to the query heads first; the operator takes them as they are (measured on H100 at the
    1.5B shape: the update's peak 2 GiB lower, a layer's time unchanged within noise).
    Differentiable (autograd's formula is `_flash_attention_backward`) and traced by torch.compile.
    """
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                   0.0, True, False, scale=scaling)[0]


def _sdpa_per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int],
                       scaling: float | None) -> torch.Tensor:
    parts = []
    gqa = q.shape[1] != k.shape[1]
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (t[start:stop].transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling,
                                                    enable_gqa=gqa).transpose(0, 1))
    return torch.cat(parts)
