"""Memory estimate per GPU, per pool and phase (rollout, training). An estimate, not a promise:
it counts the large terms (weights, gradients, Adam states, the vLLM reservation, logits and
checkpointed activations) and says how each was computed.

Assumptions (documented in docs/resolved-plan.md):
- FSDP keeps fp32 master parameters and gradients and two fp32 Adam moments, sharded over the
  pool (or over fsdp_size): 4 + 4 + 8 = 16 bytes per parameter ÷ shards. The actor's gradients add
  only what they exceed the activations and logits by when an optimizer step is one micro batch
  (`one_micro_batch_per_step`: nothing accumulated is live at the loss head's peak).
- fsdp_config.reshard_after_forward=false keeps the whole model's gathered weights in the compute
  dtype through a step (2 B per parameter in bf16, on every GPU); use_no_sync_for_gradient_accumulation
  accumulates a step's gradients unsharded (4 B per parameter, not ÷ shards) when it has several
  micro batches.
- The reference policy keeps its parameters in the compute dtype (bf16: 2 bytes ÷ shards).
- LoRA (model.lora_rank > 0 or a saved adapter, rlconf.lora_adapter): the frozen base is kept in the compute dtype (2 B per parameter ÷ shards
  in bf16; param_offload and offload_policy move it as they move full weights) and only the adapters
  have fp32 parameters, gradients and Adam moments (16 B per adapter parameter ÷ shards). An adapter
  on a linear layer of in × out holds rank × (in + out) parameters. The reference is the actor with
  its adapters off: no reference term.
- Offload (engine/workers/fsdp/offload.py): param_offload / optimizer_offload take the parameters / Adam
  moments off the GPU while the model is idle (the rollout phase), and the update brings them back:
  the parameters for the whole update, the moments for each optimizer step only, when the
  activations are freed. offload_policy (FSDP2's CPUOffloadPolicy) keeps parameters, gradients and
  moments on the CPU in every phase. enable_activation_offload leaves one layer's activations on
  the GPU and lowers the loss head's peak by what it saves for backward and does not read back at
  that peak (`loss_head_bytes`).
- vLLM (>= 0.7) reserves gpu_memory_utilization × total GPU memory for its weights (one
  tensor-parallel shard) + KV cache during rollout; with free_cache_engine it sleeps before
  training (weights and KV cache released), otherwise it stays. Weights larger than that share
  count whole, with no KV cache: such an engine does not start (RL611).
- Activations per training micro batch: with gradient checkpointing, one bf16 hidden state per
  layer per token plus one layer's working set; without, ~34 bytes × hidden per token per layer
  (Korthikanti et al., 2022, without attention scores). Logits: bytes per response token × vocab at
  the loss head's peak in backward, from `loss_head_bytes` (which names every tensor): the fp32 math
  of the plain path, 24 B with the entropy and 20 B without; with entropy_from_logits_with_chunking
  or entropy_checkpointing, recomputed chunk by chunk (engine/workers/passes/logprob.py), 4 B (the
  compute-dtype logits and their gradient) plus one chunk of LOGIT_CHUNK_TOKENS rows at 22 B (18 B
  without the entropy). enable_activation_offload sends what the forward saves to the CPU: 4 B less
  for the plain path with the entropy, nothing less without it, and the chunked path's 2 B of logits.
  model.use_fused_kernels: one chunk of FUSED_LOGIT_CHUNK_TOKENS rows at 12 B plus the head
  gradient's fp32 accumulator (4 B × hidden × vocab); nothing [tokens, vocab] is kept.
  The Triton head (impl_backend triton, or actor.use_torch_compile on CUDA, on by default: rlconf.loss_head):
  4 B (the bf16 logits and their gradient), chunked or not.
  The logits scale with the response tokens, not the prompt's: the output head runs on the
  response positions alone (transformers' `logits_to_keep`; with Ulysses on every position of the
  rank's slice, whose bf16 logits then count in the forward).
- Tokens per micro batch are the worst case (every row at full length, or the token budget, which a mini
  batch of fewer tokens never fills: micro_batch_tokens), so
  use_remove_padding (packing) does not lower the estimate for the padding it removes: the worst case
  has none (on CUDA it lowers it by the keys and values it keeps at their own heads: see
  activation_bytes_per_token_layer). It saves compute, and memory whenever rows are shorter than
  the maximum. Response tokens are those rows' response share: response_length ÷ (prompt_length + response_length) of
  the budget, or micro batch × response_length.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rlconf.lora_adapter import actor_lora
from rlconf.loss_head import plan_loss_head_kernels
from rlconf.modelinfo import ModelInfo
from rlconf.normalize import Normalized, TrainPass
from rlconf.schema import PlanConfig
from rlconf.schema.model import FSDPConfig

# Rows of [tokens, vocab] logits whose fp32 math runs at once when the engine chunks it
# (engine/workers/passes/logprob.py uses this number too).
LOGIT_CHUNK_TOKENS = 2048
# Rows per chunk of the fused head (model.use_fused_kernels, engine/workers/sequence/fused_head.py): one
# chunk holds ~12 B × rows × vocab; 1024 rows × 152k vocab ≈ 1.9 GB, small beside a policy's
# activations, and large enough that each chunk's [1024, hidden] × [hidden, vocab] matmul fills a GPU.
FUSED_LOGIT_CHUNK_TOKENS = 1024

GIB = 1024**3


@dataclass(frozen=True)
class Term:
    what: str
    gib: float
    formula: str


@dataclass(frozen=True)
class PhaseEstimate:
    pool: str
    phase: str  # "rollout" or "training"; "reward" for a reward model on a pool of its own
    terms: list[Term]

    @property
    def total_gib(self) -> float:
        return sum(t.gib for t in self.terms)


def _gib(x: float) -> float:
    return x / GIB


def params_text(params: float) -> str:
    """A parameter count as people write it: 7.62B, 494M, 1.3M, 85K."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if params >= scale:
            value = params / scale
            return f"{value:.3g}{suffix}"
    return f"{params:g}"


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _shards(gpus: int, fsdp_size: int) -> int:
    return gpus if fsdp_size <= 0 or fsdp_size >= gpus else fsdp_size


def _idle_states(name: str, params: float, shards: int, fsdp: FSDPConfig) -> list[Term]:
    """What a trained model keeps on the GPU while it is idle (the rollout; a colocated critic beside the actor).

    param_offload and optimizer_offload move the shard and the Adam moments to the CPU between the
    model's own phases; offload_policy keeps them there always (engine/workers/fsdp/offload.py).
    """
    p_b = params_text(params)
    param_off = fsdp.param_offload or fsdp.offload_policy
    optim_off = fsdp.optimizer_offload or fsdp.offload_policy
    return [Term(f"{name} fp32 params", 0.0 if param_off else _gib(4 * params / shards),
                 "offloaded to CPU" if param_off else f"4 B × {p_b} ÷ {shards} shards"),
            Term(f"{name} Adam moments", 0.0 if optim_off else _gib(8 * params / shards),
                 "offloaded to CPU" if optim_off else f"8 B × {p_b} ÷ {shards} shards")]


def _training_states(name: str, params: float, shards: int, fsdp: FSDPConfig, activations_gib: float,
                     one_micro_batch: bool = False, fused_adamw: bool = False, compute_bytes: int = 2) -> list[Term]:
    """A model's parameters, Adam moments and gradients during its own update.

    `one_micro_batch` (every optimizer step is a single micro batch): the gradients are set to None
    after each step (ppo_update), and FSDP2 allocates a layer's sharded gradient only when that layer's
    backward is done, after the loss head's peak and as the activations are freed; so they add to the
    peak only what they exceed the activations (and logits) by. With accumulation, the earlier micro
    batches' gradients sit beside the next one's activations.

    param_offload brings the shard back for the update, so only offload_policy (FSDP2's
    CPUOffloadPolicy: parameters, gradients and the optimizer step on the CPU) removes those terms.
    optimizer_offload brings the moments to the GPU for each optimizer step alone, when the micro
    batches' activations are freed: the step then holds the moments (8 B) and, off CUDA, AdamW's
    temporary (4 B: its foreach implementation allocates one fp32 tensor per parameter; on CUDA,
    `fused_adamw`, the engine runs the fused kernel, which allocates none: engine/workers/fsdp/optim.py),
    so only what that exceeds the activations (and logits) by adds to the phase's peak.

    reshard_after_forward=false keeps every layer's gathered weights in the compute dtype
    (`compute_bytes`) from the first forward to the optimizer step: the whole model on every rank.
    On one H100 rank the measured peak did not move with it (docs/benchmarks.md, 2026-11-26), so the
    term may overcount there; it stays, the safe side, until a run on several GPUs measures it.
    use_no_sync_for_gradient_accumulation
    accumulates the gradients unsharded, in fp32 (FSDP2's accumulator for a reduce dtype above the
    compute dtype), when a step has several micro batches: 4 B × params on every rank.
    """
    p_b = params_text(params)
    gathered = ([Term(f"{name} gathered weights kept", _gib(compute_bytes * params),
                      f"reshard_after_forward=false: {compute_bytes} B × {p_b}, the whole model through the step")]
                if not fsdp.reshard_after_forward else [])
    if fsdp.offload_policy:
        return [Term(f"{name} fp32 params", 0.0, "on the CPU (offload_policy); one layer at a time is copied over"),
                Term(f"{name} Adam moments", 0.0, "on the CPU (offload_policy: the optimizer step runs there)"),
                Term(f"{name} fp32 grads", 0.0, "on the CPU (offload_policy)"), *gathered]
    terms = [Term(f"{name} fp32 params", _gib(4 * params / shards), f"4 B × {p_b} ÷ {shards} shards")]
    if fsdp.optimizer_offload:
        step_bytes, step_text = (8, "8 B") if fused_adamw else (12, "(8 + 4) B")
        step_gib = _gib(step_bytes * params / shards)
        terms.append(Term(f"{name} Adam moments", max(0.0, step_gib - activations_gib),
                          f"on the GPU for the optimizer step only: max(0, {step_text} × {p_b} ÷ {shards} shards "
                          f"− activations and logits {activations_gib:.2f} GiB, freed by then)"))
    else:
        terms.append(Term(f"{name} Adam moments", _gib(8 * params / shards), f"8 B × {p_b} ÷ {shards} shards"))
    # With optimizer_offload the moments' term already counts on the freed activations for the step,
    # where the gradients are live too: only one of the two may.
    if fsdp.use_no_sync_for_gradient_accumulation and not one_micro_batch:
        terms.append(Term(f"{name} fp32 grads", _gib(4 * params),
                          f"accumulated unsharded (use_no_sync_for_gradient_accumulation): 4 B × {p_b}"))
    elif one_micro_batch and not fsdp.optimizer_offload:
        terms.append(Term(f"{name} fp32 grads", max(0.0, _gib(4 * params / shards) - activations_gib),
                          f"one micro batch a step, so allocated as the backward frees the activations: "
                          f"max(0, 4 B × {p_b} ÷ {shards} shards − activations and logits {activations_gib:.2f} GiB)"))
    else:
        terms.append(Term(f"{name} fp32 grads", _gib(4 * params / shards), f"4 B × {p_b} ÷ {shards} shards"))
    return terms + gathered


def micro_batch_tokens(role: TrainPass, seq_len: int) -> int:
    """Tokens of the largest micro batch of a training pass on one data-parallel rank (its sp group's, before
    Ulysses splits them), rows at full length. With dynamic batch size that is the token budget, but never more
    than the mini batch it is cut from: a budget above mini batch × sequence length is never filled."""
    if role.use_dynamic_bsz:
        return min(role.tokens_per_micro_batch.value, role.ppo_mini_batch_size_per_gpu.value * seq_len)
    if role.ppo_micro_batch_size_per_gpu:
        return (role.ppo_micro_batch_size_per_gpu.value or 1) * seq_len
    return seq_len


def one_micro_batch_per_step(role: TrainPass, seq_len: int) -> bool:
    """Whether every optimizer step of `role` is one micro batch: no gradient accumulation, or (dynamic
    batch size) a whole mini batch of full-length rows within one micro batch's token budget."""
    if role.use_dynamic_bsz:
        return role.ppo_mini_batch_size_per_gpu.value * seq_len <= role.tokens_per_micro_batch.value
    return role.grad_accum_steps is not None and role.grad_accum_steps.value == 1


def decoder_linears(model: ModelInfo) -> dict[str, tuple[int, int]] | None:
    """The linear layers of one decoder layer as (in, out) features, under llama/qwen module names
    (None: shapes unknown). Families without a gated MLP have up_proj and down_proj only."""
    h, heads, layers = model.hidden_size, model.num_attention_heads, model.num_layers
    if not (h and heads and layers):
        return None
    kv = model.num_key_value_heads or heads
    head_dim, inter = model.attention_head_dim, model.intermediate_size or 4 * h
    linears = {"self_attn.q_proj": (h, heads * head_dim), "self_attn.k_proj": (h, kv * head_dim),
               "self_attn.v_proj": (h, kv * head_dim), "self_attn.o_proj": (heads * head_dim, h)}
    if model.gated_mlp:
        linears["mlp.gate_proj"] = (h, inter)
    linears.update({"mlp.up_proj": (h, inter), "mlp.down_proj": (inter, h)})
    return linears


def _module_matches(name: str, spec: str | list[str]) -> bool:
    """peft's rule: a list names modules by their last components, a string is a regex over the whole name."""
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return any(name == key or name.endswith("." + key) for key in spec)


def lora_params(model: ModelInfo, rank: int, target_modules: str | list[str],
                exclude_modules: str | list[str] | None) -> tuple[int, str] | None:
    """Adapter parameters of the whole model, rank × (in + out) per adapted linear layer, and the formula
    (None: shapes unknown). "all-linear" takes every decoder linear (peft leaves the LM head out); the
    LM head is adapted when named."""
    linears = decoder_linears(model)
    if linears is None:
        return None
    total, kinds = 0, {}
    for layer in range(model.num_layers or 0):
        for suffix, (fan_in, fan_out) in linears.items():
            name = f"model.layers.{layer}.{suffix}"
            if target_modules != "all-linear" and not _module_matches(name, target_modules):
                continue
            if exclude_modules is not None and _module_matches(name, exclude_modules):
                continue
            total += rank * (fan_in + fan_out)
            kinds[suffix.rsplit(".", 1)[-1]] = kinds.get(suffix.rsplit(".", 1)[-1], 0) + 1
    head = "lm_head"  # named (not by all-linear): hidden -> vocab
    if (target_modules != "all-linear" and _module_matches(head, target_modules) and model.vocab_size
            and not (exclude_modules is not None and _module_matches(head, exclude_modules))):
        total += rank * (model.hidden_size + model.vocab_size)
        kinds[head] = 1
    adapted = ", ".join(f"{count} {kind}" for kind, count in kinds.items()) or "no module"
    return total, f"rank {rank} × (in + out) of each adapted linear ({adapted})"


def _lora_actor_states(plan: PlanConfig, model: ModelInfo, params: float, shards: int, phase: str,
                       activations_gib: float = 0.0) -> list[Term]:
    """A LoRA actor's states (phase "rollout": idle; "training": its update): the frozen base in the
    compute dtype, fp32 params + gradients + Adam moments of the adapters only."""
    arr = plan.actor_rollout_ref
    fsdp = arr.actor.fsdp_config
    width, short = DTYPE_BYTES[arr.model.dtype], DTYPE_SHORT[arr.model.dtype]
    away = fsdp.offload_policy or (phase == "rollout" and fsdp.param_offload)
    base = Term(f"actor frozen base {short} params", 0.0 if away else _gib(width * params / shards),
                "offloaded to CPU" if away else f"{width} B × {params_text(params)} ÷ {shards} shards")
    lora = actor_lora(arr.model)  # the saved adapter's rank and targets when it starts from one
    counted = None if lora is None else lora_params(model, lora.rank, lora.target_modules, lora.exclude_modules)
    if counted is None:
        return [base, Term("actor LoRA adapters", 0.0, "not estimated: model shapes unknown")]
    adapters, formula = counted
    states = (_idle_states("actor adapter", adapters, shards, fsdp) if phase == "rollout"
              else _training_states("actor adapter", adapters, shards, fsdp, activations_gib))
    return [base, Term("actor adapter parameters", 0.0, f"{params_text(adapters)} = {formula}"), *states]


def activation_bytes_per_token_layer(model: ModelInfo, kv_heads_kept: bool = False) -> tuple[int, str]:
    """Bytes one token keeps for the backward pass in one decoder layer (bf16), and how that was counted.

    Korthikanti et al. (2022), without attention scores (flash/sdpa attention): 34 B × hidden, of
    which 15 B × hidden is attention and the two norms' inputs and 19 B × hidden the 4×hidden GeLU
    MLP. Gated-MLP families (modelinfo.GATED_MLP_FAMILIES: llama, qwen, mistral, gemma, ...) have one
    of `intermediate_size` instead: its input (2 B × hidden) plus gate, up, activation and product
    outputs (4 × 2 B × intermediate).

    That counts keys and values at hidden width (2 + 2 B × hidden), as they are where the attention
    repeats them to the query heads (transformers' padded SDPA and eager paths). `kv_heads_kept`: the
    attention takes them at their own heads (the packed path on CUDA: the flash kernels' GQA), so
    4 B × (hidden − kv heads × head dim) less (measured on H100, Qwen2.5-1.5B shape, no
    checkpointing: the peak dropped 2.0 GiB when the engine stopped repeating them, this term says 2.2).
    """
    h = model.hidden_size or 0
    if model.gated_mlp and model.intermediate_size:
        per_layer, text = 17 * h + 8 * model.intermediate_size, f"17 × {h} + 8 × {model.intermediate_size}"
    else:
        per_layer, text = 34 * h, f"34 × {h}"
    heads = model.num_attention_heads or 0
    kv = model.num_key_value_heads or heads
    head_dim = model.attention_head_dim
    if kv_heads_kept and head_dim and kv < heads:
        fewer = 4 * max(h - kv * head_dim, 0)
        return per_layer - fewer, f"({text} − 4 × ({h} − {kv} kv heads × {head_dim})) B"
    return per_layer, f"({text}) B"


@dataclass(frozen=True)
class LossHeadBytes:
    """Bytes per response token × vocab that the loss head holds at its peak, early in its backward.

    `saved`: what the forward saves for backward, one copy of each tensor (tests/engine/
    test_loss_head_bytes.py counts it on the engine's code); on the GPU from the forward to the
    backward unless enable_activation_offload sends it to the CPU. `read_back`: the part of it that
    the backward step at the peak reads, which comes back from the CPU under offload.
    `working`: gradients and temporaries live at the peak; `chunk_working`: per row of the one
    chunk whose fp32 math is being recomputed (chunked path; bytes per chunk row × vocab).
    """

    saved: int
    read_back: int
    working: int
    chunk_working: int
    breakdown: str

    def per_token(self, offload: bool) -> int:
        return self.working + (self.read_back if offload else self.saved)


def loss_head_bytes(chunked: bool, entropy: bool, fused: bool = False, triton: bool = False,
                    logit_width: int = 2) -> LossHeadBytes:
    """The loss head's bytes per response token × vocab (engine/workers/passes/logprob.py `token_log_probs`).

    Plain path: the fp32 logits ÷ temperature z (4 B) are saved by logsumexp, by the label's gather
    and, with the entropy, by softmax(z) × z; softmax(z) (4 B) by its own backward and that product.
    Transient, never saved: the compute-dtype logits (autograd keeps only the head's input and
    weight, and the index of the response positions) and their fp32 cast. The backward's peak holds
    16 B of fp32 gradients and temporaries beside whatever is saved (H100: 24 B with the entropy,
    20 B without; bench/loss_head_memory.py), and reads one 4 B tensor of what is saved, so
    activation offload lowers the peak by the other 4 B with the entropy and by nothing without.
    Chunked (entropy_from_logits_with_chunking, entropy_checkpointing): the checkpointed chunks save
    only their compute-dtype rows (2 B, views of the logits; offloaded, they come back one chunk at a
    time); the peak holds their bf16 gradient (2 B) and one chunk's recomputed fp32 math, the plain
    path's peak less the chunk's own bf16 rows counted above (24 - 2 = 22 B per chunk row, 18 B
    without the entropy; measured: 9.5 B per token × vocab at 8192 tokens in chunks of 2048).
    Fused (model.use_fused_kernels, engine/workers/sequence/fused_head.py): nothing vocab-wide is saved (per
    token, the fp32 logsumexp and entropy: 8 B, not per vocab entry); one chunk's recompute holds at
    most three fp32 chunk-sized tensors (12 B per chunk row; the entropy is always computed). The
    fp32 accumulator of the head's gradient (4 B × hidden × vocab) is counted by the caller.
    Triton (rlconf.loss_head: impl_backend=triton, or use_torch_compile on CUDA; engine/workers/sequence/triton_head.py): the kernels
    write nothing vocab-wide but the gradient: the compute-dtype logits saved (2 B, read back under
    offload) and their gradient (2 B), chunked or not, entropy or not; in the fused head one
    chunk's logits and gradient (4 B per chunk row) instead of its three fp32 tensors. Those are bf16's
    bytes: `logit_width` is the compute dtype's (an fp32 model on CUDA: 4 + 4 B).
    """
    if triton:
        w, dtype = logit_width, {2: "bf16", 4: "fp32"}.get(logit_width, f"{logit_width}-byte")
        if fused:
            return LossHeadBytes(saved=0, read_back=0, working=0, chunk_working=2 * w,
                                 breakdown=f"fused head, Triton: one chunk's {dtype} logits and their gradient {2 * w} B")
        return LossHeadBytes(saved=w, read_back=w, working=w, chunk_working=0,
                             breakdown=f"Triton: {dtype} logits {w} B (saved) + their gradient {w} B; no fp32 "
                                       "math kept vocab-wide")
    if fused:
        return LossHeadBytes(saved=0, read_back=0, working=0, chunk_working=12,
                             breakdown="fused head: nothing vocab-wide saved; one chunk's fp32 math 12 B")
    if chunked:
        chunk = 22 if entropy else 18
        return LossHeadBytes(saved=2, read_back=0, working=2, chunk_working=chunk,
                             breakdown=f"bf16 logits 2 B (saved) + their gradient 2 B; one chunk's fp32 math {chunk} B")
    if entropy:
        return LossHeadBytes(saved=8, read_back=4, working=16, chunk_working=0,
                             breakdown="fp32 logits ÷ temperature and their softmax 4 + 4 B (saved) + 16 B of fp32 "
                                       "gradients and temporaries in backward")
    return LossHeadBytes(saved=4, read_back=4, working=16, chunk_working=0,
                         breakdown="fp32 logits ÷ temperature 4 B (saved) + 16 B of fp32 gradients and temporaries "
                                   "in backward")


def _logits(name: str, vocab: int, tokens: int, response_tokens: int, chunked: bool, entropy: bool,
            offload: bool, fused: bool = False, hidden: int = 0, all_positions: bool = False,
            triton: bool = False, logit_width: int = 2) -> Term:
    """The loss head's peak: its backward (`loss_head_bytes`), or, if larger and the head runs on
    `all_positions` (Ulysses: each rank's slice goes through the head whole), the forward's moment
    when the compute-dtype logits of all `tokens` positions exist beside their response rows (2 + 2 B).
    Otherwise the head runs on the response positions alone (transformers' `logits_to_keep`,
    engine/workers/sequence/packing.py `head_keeps_positions`), whose 2 B of logits the backward's bytes hold.
    Fused: one chunk's math plus the fp32 accumulator of the head weight's gradient, in both passes'
    worst case (the forward has no [tokens, vocab] logits)."""
    if fused:
        head = loss_head_bytes(chunked, entropy, fused=True, triton=triton, logit_width=logit_width)
        chunk = min(FUSED_LOGIT_CHUNK_TOKENS, response_tokens)
        return Term(f"{name} logits", _gib(head.chunk_working * chunk * vocab + 4 * hidden * vocab),
                    f"({head.chunk_working} B × one chunk of {chunk} response tokens + 4 B × hidden {hidden}) × "
                    f"vocab {vocab} ({head.breakdown}, and the fp32 gradient of the head weight)")
    head = loss_head_bytes(chunked, entropy, triton=triton, logit_width=logit_width)
    per_token = head.per_token(offload)
    chunked = chunked and not triton  # the Triton head does the same with or without the chunking knobs
    chunk = min(LOGIT_CHUNK_TOKENS, response_tokens) if chunked else 0
    backward = per_token * response_tokens + head.chunk_working * chunk
    forward = 2 * tokens + 2 * response_tokens if all_positions else 0
    if forward > backward:
        return Term(f"{name} logits", _gib(forward * vocab),
                    f"(2 B × {tokens} tokens + 2 B × {response_tokens} response tokens) × vocab {vocab} "
                    "(bf16 logits of every position beside their response rows, in the forward)")
    where = "; offloaded: what backward's peak does not read waits on the CPU" if offload else ""
    chunk_text = f" + {head.chunk_working} B × one chunk of {chunk}" if chunked else ""
    return Term(f"{name} logits", _gib(backward * vocab),
                f"({per_token} B × {response_tokens} response tokens{chunk_text}) × vocab {vocab} "
                f"({head.breakdown}{where})")


def attention_keeps_kv_heads(packed: bool, device: str, sp_size: int) -> bool:
    """Whether the engine's attention takes keys and values at their own heads: packed rows on CUDA
    (engine.workers.sequence.packing: the flash kernels), not split by Ulysses (which may repeat them to the
    sp size). Padded rows go through transformers' attention, which repeats them."""
    return packed and device == "cuda" and sp_size <= 1


def _activations(name: str, model: ModelInfo, tokens: int, checkpointing: bool, vocab_head: bool,
                 offload: bool = False, *, response_tokens: int = 0, chunked_logits: bool = False,
                 entropy: bool = False, fused_logits: bool = False, all_positions: bool = False,
                 triton_logits: bool = False, kv_heads_kept: bool = False, logit_width: int = 2) -> list[Term]:
    """`offload` (enable_activation_offload): what the forward saves waits on the CPU, so one layer's
    working set is left (recomputed from its offloaded input, or its saved activations brought back),
    and the loss head's peak drops by what it saves and does not read back (`loss_head_bytes`).
    `kv_heads_kept`: see activation_bytes_per_token_layer."""
    h, layers = model.hidden_size, model.num_layers
    terms = []
    if not model.has_shapes:
        return [Term(f"{name} activations + logits", 0.0, "not estimated: model shapes unknown (RL610)")]
    per_layer, per_layer_text = activation_bytes_per_token_layer(model, kv_heads_kept)
    if offload:
        kept = "checkpointed hidden states" if checkpointing else "saved activations"
        terms.append(Term(f"{name} activations", _gib(per_layer * tokens),
                          f"{tokens} tokens × one layer × {per_layer_text} ({kept} offloaded to CPU)"))
    elif checkpointing:
        # Checkpointed: one bf16 hidden state per layer, plus the layer being recomputed.
        terms.append(Term(f"{name} activations", _gib(2 * h * tokens * layers + per_layer * tokens),
                          f"{tokens} tokens × ({layers} layers × 2 B × {h} (checkpointed) + one layer × {per_layer_text})"))
    else:
        terms.append(Term(f"{name} activations", _gib(per_layer * tokens * layers),
                          f"{tokens} tokens × {layers} layers × {per_layer_text}"))
    if vocab_head:
        terms.append(_logits(name, model.vocab_size, tokens, response_tokens, chunked_logits, entropy, offload,
                             fused_logits, h, all_positions, triton_logits, logit_width))
    return terms


def _hf_kv_cache(model: ModelInfo, rows: int, seq_len: int, width: int) -> list[Term]:
    """HF generate's KV cache: each rank generates its whole shard at once, up to prompt + response tokens."""
    per_token = kv_cache_bytes_per_token(model, width)
    if per_token is None:
        return []
    kv_heads = model.num_key_value_heads or model.num_attention_heads
    return [Term("HF generate KV cache", _gib(per_token * rows * seq_len),
                 f"2 × {model.num_layers} layers × {kv_heads} kv heads × {model.attention_head_dim} × {width} B × "
                 f"{rows} rows × {seq_len} tokens")]


def vllm_weights_gib(dtype: str, params: int, tensor_parallel_size: int) -> float:
    """What one GPU of a vLLM replica holds of its weights: one tensor-parallel shard."""
    return _gib(DTYPE_BYTES[dtype] * params / tensor_parallel_size)


# vLLM's share of a GPU above this leaves too little for anything else beside it (CUDA context, NCCL, the caching
# allocator's slack): the most RL611 suggests.
VLLM_UTILIZATION_CEILING = 0.9


def vllm_least_utilization(weights_gib: float, gpu_gib: float, kv_gib: float = 0.0) -> float:
    """The smallest gpu_memory_utilization, in steps of 0.05, that holds vLLM's weights, `kv_gib` of KV cache and
    5% of the GPU more (its share must hold them all: the weights are loaded first, the rest becomes KV cache and
    vLLM's activations)."""
    return math.ceil(round(((weights_gib + kv_gib) / gpu_gib + 0.05) * 20, 6)) / 20


def kv_cache_bytes_per_token(model: ModelInfo, width: int) -> int | None:
    """Keys and values of one token over every layer (None: the shape does not say)."""
    layers, heads = model.num_layers, model.num_attention_heads
    if not (layers and heads and model.hidden_size):
        return None
    return 2 * layers * (model.num_key_value_heads or heads) * model.attention_head_dim * width


def weight_receive_buffer(params: int, width: int, bucket_megabytes: int) -> Term:
    """A rollout pool of its own receives the weights in buckets (engine.workers.cluster.weight_sync): each is a
    fresh flat tensor, which torch's caching allocator keeps once freed, beside vLLM's share of the GPU."""
    whole = width * params
    gib = _gib(min(bucket_megabytes * 2**20, whole))
    return Term("weight receive buffer", gib, f"the largest bucket: min(update_weights_bucket_megabytes "
                                              f"{bucket_megabytes} MB, {width} B × {params_text(params)})")


def estimate_memory(plan: PlanConfig, norm: Normalized, model: ModelInfo | None,
                    reward_model: ModelInfo | None = None) -> list[PhaseEstimate]:
    """Per pool and phase, what one GPU holds. `reward_model`: the reward model's shape (reward_model.enable)."""
    if model is None or not model.num_params:
        return []
    arr = plan.actor_rollout_ref
    params = model.num_params
    gpu_gib = plan.estimate.gpu_memory_gib
    seq_len = norm.rollout.prompt_length.value + norm.rollout.response_length.value
    out: list[PhaseEstimate] = []
    actor_pool = norm.placement.roles.get("actor", "global")
    a_shards = _shards(norm.actor.pool_gpus or 1, arr.actor.fsdp_config.fsdp_size)
    fsdp = arr.actor.fsdp_config
    lora = actor_lora(arr.model) is not None
    resident = (_lora_actor_states(plan, model, params, a_shards, "rollout") if lora
                else _idle_states("actor", params, a_shards, fsdp))
    ref_terms: list[Term] = []
    # With LoRA the reference is the actor with its adapters off: nothing of its own to count.
    if norm.ref is not None and norm.placement.roles.get("ref") == actor_pool and not lora:
        # The engine keeps the frozen reference in the compute dtype; param_offload leaves it on the GPU
        # only for its own log-prob pass, which is neither phase.
        r_shards = _shards(norm.ref.pool_gpus or 1, -1)
        off = arr.ref.fsdp_config.param_offload
        width = DTYPE_BYTES[arr.model.dtype]
        ref_terms.append(Term(f"ref {DTYPE_SHORT[arr.model.dtype]} params", 0.0 if off else _gib(width * params / r_shards),
                              "offloaded to CPU" if off else f"{width} B × {params_text(params)} ÷ {r_shards} shards"))
        resident += ref_terms
    vllm_gib = arr.rollout.gpu_memory_utilization * gpu_gib if arr.rollout.name == "vllm" else 0.0
    # A rollout pool of its own (one-step off-policy) holds the rollout engine alone; the trainer's pool never
    # holds it, and the two phases run at the same time on different GPUs.
    apart = norm.schedule.mode in ("one_step_off_policy", "fully_async")
    rollout_pool = norm.placement.roles.get("rollout", actor_pool) if apart else actor_pool
    rollout_terms = [] if apart else list(resident)
    if arr.rollout.name == "vllm":
        # vLLM takes gpu_memory_utilization × the GPU for itself: its weights (one tensor-parallel
        # shard of them), then whatever is left of that share becomes KV cache (and its activations).
        # Weights larger than the share are not cut to it: vLLM loads them all and then finds no room for a
        # KV cache (RL611), and the estimate says what they take.
        width, tp = DTYPE_BYTES[arr.rollout.dtype], norm.rollout.tensor_parallel_size
        weights_gib = vllm_weights_gib(arr.rollout.dtype, params, tp)
        rollout_terms.append(Term(f"vLLM {arr.rollout.dtype} weights", weights_gib,
                                  f"{width} B × {params_text(params)} ÷ tp {tp}"))
        rollout_terms.append(Term("vLLM KV cache + activations", max(0.0, vllm_gib - weights_gib),
                                  f"gpu_memory_utilization {arr.rollout.gpu_memory_utilization} × {gpu_gib:g} GiB "
                                  f"− weights {weights_gib:.2f} GiB" + (" (none left)" if weights_gib >= vllm_gib else "")))
    else:
        width = DTYPE_BYTES[arr.rollout.dtype]
        hf_copy = Term(f"HF generate {arr.rollout.dtype} weights", _gib(width * params),
                       f"{width} B × {params_text(params)} (full copy, kept between steps)")
        rollout_terms.append(hf_copy)
        rollout_terms += _hf_kv_cache(model, norm.rollout.sequences_per_replica.value, seq_len, width)
    if apart:
        rollout_terms.append(weight_receive_buffer(params, DTYPE_BYTES[arr.rollout.dtype],
                                                   norm.schedule.bucket_megabytes))
    out.append(PhaseEstimate(rollout_pool, "rollout", rollout_terms))

    tokens = micro_batch_tokens(norm.actor, seq_len) // max(norm.actor.sp_size, 1)
    # The worst case's rows are full length: their response share of the tokens reaches the loss head.
    response_tokens = tokens * norm.rollout.response_length.value // max(seq_len, 1)
    chunked = arr.actor.entropy_from_logits_with_chunking or arr.actor.entropy_checkpointing
    activations = _activations("actor", model, tokens, arr.model.enable_gradient_checkpointing, vocab_head=True,
                               offload=arr.model.enable_activation_offload, response_tokens=response_tokens,
                               chunked_logits=chunked, entropy=arr.actor.entropy_coeff > 0,
                               fused_logits=arr.model.use_fused_kernels,  # as the engine's micro step
                               all_positions=norm.actor.sp_size > 1,
                               triton_logits=plan_loss_head_kernels(plan) == "triton",
                               logit_width=DTYPE_BYTES[arr.model.dtype],  # the logits are in the compute dtype
                               kv_heads_kept=attention_keeps_kv_heads(arr.model.use_remove_padding,
                                                                      plan.trainer.device, norm.actor.sp_size))
    activations_gib = sum(t.gib for t in activations)
    train_terms = (_lora_actor_states(plan, model, params, a_shards, "training", activations_gib) if lora
                   else _training_states("actor", params, a_shards, fsdp, activations_gib,
                                         one_micro_batch_per_step(norm.actor, seq_len),
                                         fused_adamw=plan.trainer.device == "cuda",
                                         compute_bytes=DTYPE_BYTES[arr.model.dtype]))
    train_terms += ref_terms + activations
    if arr.rollout.name == "vllm" and not arr.rollout.free_cache_engine and not apart:
        train_terms.append(Term("vLLM reservation kept", vllm_gib, "free_cache_engine is off"))
    if arr.rollout.name != "vllm" and not apart:
        train_terms.append(hf_copy)  # the engine's HF rollout copy stays on the GPU while the actor trains
    out.append(PhaseEstimate(actor_pool, "training", train_terms))

    if norm.critic is not None:
        critic_pool = norm.placement.roles.get("critic", actor_pool)
        c_fsdp = plan.critic.model.fsdp_config
        c_shards = _shards(norm.critic.pool_gpus or 1, c_fsdp.fsdp_size)
        c_tokens = micro_batch_tokens(norm.critic, seq_len) // max(norm.critic.sp_size, 1)  # Ulysses splits each row
        c_activations = _activations("critic", model, c_tokens, plan.critic.model.enable_gradient_checkpointing,
                                     vocab_head=False, offload=plan.critic.model.enable_activation_offload,
                                     kv_heads_kept=attention_keeps_kv_heads(plan.critic.model.use_remove_padding,
                                                                            plan.trainer.device, norm.critic.sp_size))
        c_terms = _training_states("critic", params, c_shards, c_fsdp, sum(t.gib for t in c_activations),
                                   fused_adamw=plan.trainer.device == "cuda", compute_bytes=DTYPE_BYTES[arr.model.dtype])
        c_terms += c_activations
        if critic_pool == actor_pool:
            # Colocated: the critic's parameters and Adam moments stay beside the actor's through both
            # phases (unless offloaded); its gradients are freed when its update ends, before the actor's starts.
            resident_critic = _idle_states("critic", params, c_shards, c_fsdp)
            if not apart:
                out[0] = PhaseEstimate(actor_pool, "rollout", rollout_terms + resident_critic)
            out[-1] = PhaseEstimate(actor_pool, "training", train_terms + resident_critic)
        else:
            out.append(PhaseEstimate(critic_pool, "training", c_terms))
    if norm.reward_model is not None:
        out = _with_reward_model(out, plan, norm, reward_model, actor_pool)
    if norm.served_reward_model is not None:
        out = _with_served_reward_model(out, plan, norm, actor_pool)
    return out


def _with_served_reward_model(phases: list[PhaseEstimate], plan: PlanConfig, norm: Normalized,
                              actor_pool: str) -> list[PhaseEstimate]:
    """The reward loop's served reward model: its engine reserves gpu_memory_utilization × the GPU (weights + KV
    cache) on each GPU of its pool. On a pool of its own that is a phase of its own ("reward"). Colocated it is
    awake in a "reward" phase between rollout and training, beside what the actor's pool keeps then (the
    actor's own vLLM asleep unless its free_cache_engine is off); with its free_cache_engine off it also
    stays through rollout and training."""
    served = norm.served_reward_model
    gpu_gib = plan.estimate.gpu_memory_gib
    share = served.gpu_memory_utilization
    reservation = Term(f"served reward model ({served.backend}) weights + KV cache", share * gpu_gib,
                       f"reward_model.rollout.gpu_memory_utilization {share} × {gpu_gib:g} GiB")
    if not served.colocated:
        return [*phases, PhaseEstimate(served.pool, "reward", [reservation])]
    rollout = plan.actor_rollout_ref.rollout
    out: list[PhaseEstimate] = []
    for phase in phases:
        if phase.pool == served.pool and phase.phase == "rollout":
            actor_asleep = rollout.name == "vllm" and rollout.free_cache_engine
            kept = [t for t in phase.terms if not (actor_asleep and t.what.startswith("vLLM "))]
            if not served.free_cache_engine:
                out.append(PhaseEstimate(phase.pool, phase.phase, [*phase.terms, reservation]))
            else:
                out.append(phase)
            out.append(PhaseEstimate(phase.pool, "reward", [*kept, reservation]))
        elif phase.pool == served.pool and not served.free_cache_engine:
            out.append(PhaseEstimate(phase.pool, phase.phase, [*phase.terms, reservation]))
        else:
            out.append(phase)
    return out


def _with_reward_model(phases: list[PhaseEstimate], plan: PlanConfig, norm: Normalized,
                       reward_model: ModelInfo | None, actor_pool: str) -> list[PhaseEstimate]:
    """The frozen reward model's shards (in the compute dtype, as the engine keeps them) on its pool: beside
    the actor's states through both phases when colocated, a phase of its own on a pool of its own."""
    role, fsdp = norm.reward_model, plan.reward_model.model.fsdp_config
    dtype = plan.actor_rollout_ref.model.dtype
    params = reward_model.num_params if reward_model is not None else None
    shards = _shards(role.pool_gpus or 1, -1)
    name = f"reward model {DTYPE_SHORT[dtype]} params"
    if not params:
        term = Term(name, 0.0, "not estimated: the reward model's size is unknown (point reward_model.model.path at "
                               "a local HF directory)")
    elif fsdp.param_offload:
        term = Term(name, 0.0, "offloaded to CPU")
    else:
        width = DTYPE_BYTES[dtype]
        term = Term(name, _gib(width * params / shards), f"{width} B × {params_text(params)} ÷ {shards} shards")
    pool = norm.placement.roles.get("reward_model", actor_pool)
    if any(phase.pool == pool for phase in phases):
        return [PhaseEstimate(p.pool, p.phase, [*p.terms, term]) if p.pool == pool else p for p in phases]
    return [*phases, PhaseEstimate(pool, "reward", [term])]
