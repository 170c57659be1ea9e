"""The actor update's speed and peak memory with each training knob off and on, on one GPU.

    python bench/train_knobs.py [--shape 0.5b|1.5b] [--steps 3] [--sequences 64] [--variants a,b,...]
    python bench/train_knobs.py --shape tiny --device cpu --sequences 8 --response-max 64   # smoke test

A random-weight Qwen2 model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 / 2 heads,
intermediate 4864; `--shape 1.5b`: 1536, 28, 12 / 2, 8960), vocabulary 151936, built offline. A batch
of `--sequences` rollouts with prompts of 16-256 tokens and responses of 32-1024 (uniform), left /
right padded as the rollout writes them. Each variant times the engine's actor update
(`ActorRolloutRefWorker.update_actor` -> `ppo_update`: one optimizer step over the batch, FSDP2 on one
rank, bf16 compute with fp32 master weights, gradient checkpointing) with one knob set changed;
a plain HF training step (`model(...).loss.backward()`, bf16 autocast, fused AdamW) is the reference.
For each: real tokens/s, MFU = 6 × params × tokens/s ÷ peak (989e12: H100 bf16 dense),
torch.cuda.max_memory_allocated, and for the engine variants the largest difference of their
response logits from the padded path's on the same weights and rows (bf16: a few 1e-2 at most, next
to the logits' standard deviation; cross-sequence attention would show as a difference of its size).

The offload variants (`packed+dynamic+...offload...`) add to packed+dynamic: parameter and optimizer
offload, FSDP2's CPUOffloadPolicy, activation offload (of the checkpointed layer inputs and the
loss head's saved tensors); their cost is the transfers in tokens/s, their gain the peak and
`resident` (memory_allocated after the updates: what the rollout would sit beside), next to rlconf's
training and rollout-phase estimates.

The kernel variants (`...fused_kernels`, `...liger`, `...torch_compile`) switch on
model.use_fused_kernels, model.use_liger (CUDA and liger-kernel only: an error row elsewhere) and
actor.use_torch_compile (on by default in the plan; set false for every other variant here). On CUDA
use_torch_compile runs the loss head's math in rlconf's Triton kernels (rlconf.loss_head); before
2026-11-27 it compiled that math with torch.compile, which is what docs/benchmarks.md's older
`torch_compile` rows measured. On CPU those variants run eager.

Ulysses sequence parallelism needs several GPUs: n/a here. Each variant runs in try/except, so one
failure does not lose the others; the table is printed last, and written as JSON to $OUT/train_knobs.json
when $OUT is set. Attention used by the packed variants: what engine.workers.sequence.packing picks on this
machine (flash-attn if installed, else torch's varlen kernel, else SDPA with a block-diagonal mask).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "presets" / "quickstart.yaml"
PEAK_FLOPS = 989e12  # H100 SXM bf16 dense
SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512, tie_word_embeddings=True),
}
# name -> plan overrides on top of the common ones (micro batch 8 unless dynamic)
VARIANTS: dict[str, list[str]] = {
    "padded": [],
    "packed": ["actor_rollout_ref.model.use_remove_padding=true"],
    "padded+dynamic": ["dynamic"],
    "packed+dynamic": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true"],
    "packed+dynamic+chunked_entropy": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                       "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true"],
    "packed+dynamic+entropy_checkpointing": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                             "actor_rollout_ref.actor.entropy_checkpointing=true"],
    # Offload (engine/workers/fsdp/offload.py): memory off the GPU for transfers; `resident GiB` shows what
    # the update leaves on the GPU for the rollout, `est res` rlconf's rollout-phase estimate of it.
    "packed+dynamic+param_optimizer_offload": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                               "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                               "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"],
    "packed+dynamic+offload_policy": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                      "actor_rollout_ref.actor.fsdp_config.offload_policy=true"],
    "packed+dynamic+activation_offload": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                          "actor_rollout_ref.model.enable_activation_offload=true"],
    # FSDP knobs (engine/workers/fsdp/sharding.py): on one rank the all-gathers are local copies, so these
    # show the knobs' overhead here, not their gain over a network.
    "packed+dynamic+forward_prefetch": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                        "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true"],
    "packed+dynamic+wrap_min_params_1M": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                          "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=1000000"],
    # Kernel knobs: the fused head (engine/workers/sequence/fused_head.py: no [tokens, vocab] logits kept),
    # liger's RMSNorm / SwiGLU / RoPE (engine/models/liger.py: CUDA + liger-kernel only), and
    # use_torch_compile: the loss head's Triton kernels on CUDA (rlconf.loss_head; on CPU the variant runs eager).
    # It is on by default (verl's default): the other variants set it false, so this one alone shows its effect.
    "packed+dynamic+fused_kernels": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                     "actor_rollout_ref.model.use_fused_kernels=true"],
    "packed+dynamic+liger": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                             "actor_rollout_ref.model.use_liger=true"],
    "packed+dynamic+torch_compile": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                     "actor_rollout_ref.actor.use_torch_compile=true"],
    # All three: use_torch_compile leaves the fused head as it is (rlconf.loss_head), so the combination
    # measures liger + fused head with compile requested.
    "packed+dynamic+fused_kernels+liger+torch_compile": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.use_fused_kernels=true",
        "actor_rollout_ref.model.use_liger=true", "actor_rollout_ref.actor.use_torch_compile=true"],
    # Liger and use_torch_compile with chunked entropy: until c944803 the compiled chunked plain head; since, on
    # CUDA, the Triton head, beside which the chunking does nothing (RL529). Kept under these names for the
    # commands docs/benchmarks.md records.
    "packed+dynamic+chunked_entropy+liger+torch_compile": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true", "actor_rollout_ref.model.use_liger=true",
        "actor_rollout_ref.actor.use_torch_compile=true"],
    # The best variant above without recomputing the layers in the backward: the 6 x params x tokens
    # that MFU counts is then all the matmul work done (with checkpointing the forward runs twice).
    "packed+dynamic+chunked_entropy+liger+torch_compile+no_checkpointing": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true", "actor_rollout_ref.model.use_liger=true",
        "actor_rollout_ref.actor.use_torch_compile=true", "actor_rollout_ref.model.enable_gradient_checkpointing=false"],
    # Every decoder layer through torch.compile (model.compile_layers, engine/models/compile.py): inductor
    # fuses the norms, rotary embedding, SwiGLU and residual adds itself. Without Liger: the compiler
    # refuses the two together (RL526), and Liger's RoPE patch is process-wide (engine/models/liger.py),
    # so these rows must run before any Liger row.
    "packed+dynamic+chunked_entropy+torch_compile+compile_layers": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true", "actor_rollout_ref.actor.use_torch_compile=true",
        "actor_rollout_ref.model.compile_layers=true"],
    "packed+dynamic+chunked_entropy+torch_compile+compile_layers+no_checkpointing": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true", "actor_rollout_ref.actor.use_torch_compile=true",
        "actor_rollout_ref.model.compile_layers=true", "actor_rollout_ref.model.enable_gradient_checkpointing=false"],
    # The loss head's math in rlconf's Triton kernels (fused_kernel_options.impl_backend=triton,
    # engine/workers/sequence/triton_head.py: one pass over the logits each way, nothing fp32 vocab-wide kept),
    # the same kernels use_torch_compile now runs on CUDA; then the same without FSDP's re-gather of the weights in
    # backward (fsdp_config.reshard_after_forward=false: one rank holds the whole bf16 copy anyway).
    "packed+dynamic+triton_head": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                   "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton"],
    "packed+dynamic+fused_kernels+triton_head": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                                 "actor_rollout_ref.model.use_fused_kernels=true",
                                                 "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton"],
    "packed+dynamic+triton_head+compile_layers+no_checkpointing": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
        "actor_rollout_ref.model.compile_layers=true", "actor_rollout_ref.model.enable_gradient_checkpointing=false"],
    "packed+dynamic+triton_head+compile_layers+no_checkpointing+no_reshard": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
        "actor_rollout_ref.model.compile_layers=true", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false"],
    # FSDP2 between micro batches (engine/workers/passes/ppo_update.py::between_micro_batches): the gathered
    # weights kept through the step's micro batches, the gradients accumulated unsharded and reduced once.
    # The first pair, without compile_layers, shows what keeping the gathered weights costs in memory.
    "packed+dynamic+triton_head+no_reshard": ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                                              "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
                                              "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false"],
    "packed+dynamic+triton_head+compile_layers+no_checkpointing+no_sync": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
        "actor_rollout_ref.model.compile_layers=true", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation=true"],
    "packed+dynamic+triton_head+compile_layers+no_checkpointing+no_reshard+no_sync": [
        "dynamic", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
        "actor_rollout_ref.model.compile_layers=true", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",
        "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation=true"],
    "ulysses_sp2": ["n/a"],
    # bench/verl_offpolicy.py's knobs on rlconf's side (padded, verl's fused kernels, use_torch_compile as verl
    # defaults it; --micro 16 --entropy-coeff 0 for its micro batches and loss): there rlconf's update at 0.5B
    # took 3.77 s against verl's 3.07 s on the same batch (docs/benchmarks.md, 2026-11-27).
    "padded+fused_kernels+torch_compile": ["actor_rollout_ref.model.use_fused_kernels=true",
                                           "actor_rollout_ref.actor.use_torch_compile=true"],
    "hf_reference": ["hf"],
    "hf_reference_no_checkpointing": ["hf", "no_checkpointing"],
}


def make_batch(args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    import torch

    from engine.batch import position_ids_from_mask

    g = torch.Generator().manual_seed(0)
    n, P, R = args.sequences, args.prompt_max, args.response_max
    prompt_lengths = torch.randint(args.prompt_min, P + 1, (n,), generator=g)
    response_lengths = torch.randint(args.response_min, R + 1, (n,), generator=g)
    prompt_mask = (torch.arange(P) >= P - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(R) < response_lengths[:, None]).long()
    responses = torch.randint(0, vocab, (n, R), generator=g) * response_mask
    prompts = torch.randint(0, vocab, (n, P), generator=g) * prompt_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "responses": responses,
        "response_mask": response_mask,
        # A random model is near uniform: old log-probs near log(1/V) keep the ratios near 1.
        "old_log_probs": (-torch.log(torch.tensor(float(vocab))) + 0.1 * torch.randn(n, R, generator=g)) * response_mask,
        "advantages": torch.randn(n, 1, generator=g).expand(-1, R) * response_mask,
    }


def random_model(shape: str) -> tuple[Any, dict[str, Any], int]:
    """(config, state dict, parameter count) of a random-weight Qwen2 of `shape`, the same on every call
    (seed 0): each variant, and each rank, starts from these weights. The count leaves out a tied LM head."""
    import torch
    import transformers

    config = transformers.Qwen2Config(**SHAPES[shape], max_position_embeddings=32768)
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in transformers.AutoModelForCausalLM.from_config(config).state_dict().items()}
    params = sum(v.numel() for k, v in state.items() if k != "lm_head.weight" or not config.tie_word_embeddings)
    return config, state, params


PLAN_MODELS = {"0.5b": "random://Qwen2.5-0.5B", "1.5b": "random://Qwen2.5-1.5B"}


def compile_variant(args: argparse.Namespace, overrides: list[str], world: int = 1) -> Any:
    """The plan of one variant: --sequences rows on each of `world` GPUs, one optimizer step over them all."""
    from rlconf.compile import compile_plan

    dynamic = "dynamic" in overrides
    groups = args.sequences * world // 8
    result = compile_plan(QUICKSTART, [
        f"trainer.device={args.device}", f"trainer.n_gpus_per_node={world}",
        # The plan names the model of this shape, so the compiler checks lengths against its context.
        *([f"actor_rollout_ref.model.path={PLAN_MODELS[args.shape]}"] if args.shape in PLAN_MODELS else []),
        # GRPO groups of 8 samples; one mini batch: one optimizer step over all the sequences.
        f"data.train_batch_size={groups}", "actor_rollout_ref.rollout.n=8",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={groups}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"data.max_prompt_length={args.prompt_max}", f"data.max_response_length={args.response_max}",
        "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        f"actor_rollout_ref.actor.entropy_coeff={args.entropy_coeff}",
        # Off unless the variant sets it (later overrides win), so earlier rows stay comparable.
        "actor_rollout_ref.actor.use_torch_compile=false",
        *(["actor_rollout_ref.actor.use_dynamic_bsz=true",
           f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.token_budget}"] if dynamic else []),
        *[o for o in overrides if "=" in o],
    ])
    if result.resolved is None:
        raise ValueError("plan does not compile: " + "; ".join(d.message for d in result.diagnostics if d.severity == "error"))
    return result.resolved


def build_model(config: Any, state: dict, device: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    # A copy of the config: use_packed_attention sets the attention implementation on the model's
    # config, which must not leak into the next variant's model.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=torch.float32)
    model.load_state_dict(state)
    return model


def engine_worker(resolved: Any, model: Any, device: Any, rank: int = 0, world: int = 1) -> Any:
    """The actor worker around `model`, without init_model's rollout copy and reference model.

    The trained actor is built by the worker's own `build_trained_actor`, as init_model builds it:
    until 2026-11-26 this function repeated those steps and passed FSDP reshard_after_forward=True
    and none of forward_prefetch / wrap_policy / fsdp_size, whatever the plan said.
    """
    import torch

    from engine.models.loading import enable_activation_checkpointing
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.resolved, worker.rank, worker.world_size, worker.device = resolved, rank, world, device
    worker._total_steps = 10
    worker.rollout = None  # no rollout backend: only the update is timed
    if resolved.config.actor_rollout_ref.model.enable_gradient_checkpointing:  # as init_model does
        enable_activation_checkpointing(model)
    worker.build_trained_actor(model)
    worker.attention = worker.actor.config._attn_implementation
    worker._shuffle_generator = torch.Generator().manual_seed(0)
    return worker


def repeated_heads_varlen(q: Any, k: Any, v: Any, cu_seqlens: Any, max_seqlen: int, scaling: float | None) -> Any:
    """torch's varlen_attn, causal, with k/v repeated to q's heads where it takes no `enable_gqa`."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kwargs: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scaling, **kwargs)


def layers_as_before() -> None:
    """The decoder layers as the engine ran them before e65480b and f921209, for a before/after in one
    process: compiled with `dynamic=True` (every size symbolic, the head dim too under FSDP2) and
    torch's varlen_attn with the key/value heads repeated to the query heads."""
    import torch

    import engine.models.compile as compile_module
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.workers.sequence import packing

    def compile_decoder_layers(layers: list, backend: str = "inductor") -> int:
        for layer in layers:
            layer.forward = torch.compile(layer.forward, backend=backend, dynamic=True)
        return len(layers)

    compile_module.compile_decoder_layers = compile_decoder_layers
    actor_module.compile_decoder_layers = compile_decoder_layers  # what build_trained_actor calls
    packing.flash_varlen_call = repeated_heads_varlen
    packing.varlen_kernel = lambda: "torch_flash"  # before e65480b there was no other kernel


def apply_kernel_arguments(args: argparse.Namespace) -> None:
    """--layers-as-before and --varlen-kernel, on the engine modules of this process."""
    if args.layers_as_before:
        layers_as_before()
    if args.varlen_kernel == "torch_flash":
        from engine.workers.sequence import packing

        packing.varlen_kernel = lambda: "torch_flash"


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def run_engine_variant(name: str, args, overrides, config, state, batch, device, params, tokens, reference,
                       rank: int = 0, world: int = 1) -> dict:
    """One variant on this rank's `batch` (every rank of the process group calls it alike)."""
    import torch

    from engine.workers.cluster.device import to_device
    from engine.workers.passes.logprob import response_logits

    resolved = compile_variant(args, overrides, world)
    from engine.capabilities import triton_head_problems
    from engine.models.liger import liger_problems

    model_cfg = resolved.config.actor_rollout_ref.model
    for problem in [*liger_problems(model_cfg.use_liger, args.device),
                    *triton_head_problems(model_cfg.fused_kernel_options.impl_backend, args.device,
                                          use_torch_compile=resolved.config.actor_rollout_ref.actor.use_torch_compile,
                                          use_fused_kernels=model_cfg.use_fused_kernels)]:
        raise ValueError(problem)  # as launch would: liger and the Triton head need CUDA
    worker = engine_worker(resolved, build_model(config, state, device), device, rank, world)
    row: dict[str, Any] = {"attention": worker.attention}
    if worker.attention == "rlconf_varlen" and device.type == "cuda":
        from engine.workers.sequence import packing

        row["attention"] = f"{worker.attention}/{packing.varlen_kernel()}"
    # rlconf's training-phase estimate for this variant, less the HF rollout copy this bench does not build.
    (training,) = [phase for phase in resolved.memory if phase.phase == "training"]
    row["estimate_gib"] = sum(term.gib for term in training.terms if not term.what.startswith("HF generate"))
    (rollout,) = [phase for phase in resolved.memory if phase.phase == "rollout"]
    row["estimate_resident_gib"] = sum(term.gib for term in rollout.terms if not term.what.startswith("HF generate"))
    try:
        # The same weights and rows through this variant's forward: packing must not change the logits
        # (a random model's log-probs are all near log(1/V), so compare logits, next to their spread).
        probe = to_device({k: v[:2] for k, v in batch.items()}, device)
        with torch.no_grad(), worker.actor_offload.in_use():
            logits, _ = response_logits(worker.actor, probe, worker._logit_options)
        if not worker._logit_options.packed:
            logits = logits[probe["response_mask"].bool().reshape(-1)]
        logits = logits[:, :4096].float().cpu()
        if "padded" not in reference:
            reference["padded"] = logits
        row["max_logit_diff_vs_padded"] = float((logits - reference["padded"]).abs().max())
        row["logit_std"] = float(reference["padded"].std())
        del logits
        worker.update_actor(batch)  # warm-up (allocator, kernels)
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(args.steps):
            metrics = worker.update_actor(batch)
        sync(device)
        seconds = (time.perf_counter() - start) / args.steps
        row.update(seconds_per_update=seconds, grad_accum_steps=metrics["actor/grad_accum_steps"],
                   micro_batch_size=metrics["actor/micro_batch_size"])
        if device.type == "cuda":  # what the update leaves on the GPU: the actor's states the rollout sits beside
            row["resident_gib"] = torch.cuda.memory_allocated() / 2**30
    finally:
        del worker
    return row


def run_hf_reference(args, config, state, batch, device, checkpointing: bool = True) -> dict:
    """Plain HF: padded micro batches of --micro rows, loss on response tokens, bf16 autocast, fused AdamW,
    gradient checkpointing unless `checkpointing` is false."""
    import torch

    from engine.models.loading import enable_activation_checkpointing
    from engine.workers.passes.micro_batches import micro_batches, plan_micro_batches

    model = build_model(config, state, device)
    if checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")
    micros = [{k: v.to(device) for k, v in m.items()}
              for m in micro_batches(batch, plan_micro_batches(batch, args.micro, 0))]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for m in micros:
            labels = m["input_ids"].masked_fill(m["attention_mask"] == 0, -100)
            labels[:, : m["input_ids"].shape[1] - m["responses"].shape[1]] = -100
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(input_ids=m["input_ids"], attention_mask=m["attention_mask"],
                             position_ids=m["position_ids"], labels=labels, use_cache=False).loss
            loss.backward()
        optimizer.step()

    step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(device)
    return {"attention": model.config._attn_implementation, "seconds_per_update": (time.perf_counter() - start) / args.steps,
            "grad_accum_steps": len(micros)}


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The model shape, device and batch of the workload (shared with bench/profile_update.py)."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sequences", type=int, default=64, help="a multiple of 8 (GRPO groups of 8)")
    parser.add_argument("--prompt-min", type=int, default=16)
    parser.add_argument("--prompt-max", type=int, default=256)
    parser.add_argument("--response-min", type=int, default=32)
    parser.add_argument("--response-max", type=int, default=1024)
    parser.add_argument("--micro", type=int, default=8, help="ppo_micro_batch_size_per_gpu (without dynamic bsz)")
    parser.add_argument("--token-budget", type=int, default=16384, help="ppo_max_token_len_per_gpu (dynamic bsz)")
    parser.add_argument("--layers-as-before", action="store_true",
                        help="compile the layers and call attention as before e65480b / f921209 (see layers_as_before)")
    parser.add_argument("--varlen-kernel", choices=["auto", "torch_flash"], default="auto",
                        help="the packed attention's CUDA kernel: the engine's choice (flash-attn-4 where installed, "
                             "engine.workers.sequence.packing.varlen_kernel) or torch's flash kernel")
    parser.add_argument("--entropy-coeff", type=float, default=0.001, help="> 0 so the entropy is computed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=3, help="timed updates per variant (after one warm-up)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    args = parser.parse_args()

    import torch
    import transformers

    from engine.workers.cluster.device import join_process_group, listen_for_rendezvous, set_rendezvous_env

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    # One rank: FSDP2 still needs a process group.
    set_rendezvous_env(0, 1, "127.0.0.1", listen_for_rendezvous("127.0.0.1"), "127.0.0.1")
    join_process_group(device, 0, 1)
    config, state, params = random_model(args.shape)
    batch = make_batch(args, config.vocab_size)
    tokens = int(batch["attention_mask"].sum())
    padded_tokens = batch["attention_mask"].numel()
    print(f"shape {args.shape}: {params / 1e6:.0f}M params; {args.sequences} sequences, {tokens} real tokens "
          f"({padded_tokens} padded); device {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu'}",
          flush=True)

    apply_kernel_arguments(args)
    reference: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for name in [v for v in args.variants.split(",") if v]:
        overrides = VARIANTS[name]
        row: dict[str, Any] = {"variant": name}
        print(f"-- {name}", flush=True)
        try:
            if overrides == ["n/a"]:
                row["error"] = "n/a on 1 GPU (Ulysses needs sp_size GPUs)"
            elif overrides[:1] == ["hf"]:
                row.update(run_hf_reference(args, config, state, batch, device,
                                            checkpointing="no_checkpointing" not in overrides))
            else:
                row.update(run_engine_variant(name, args, overrides, config, state, batch, device, params, tokens,
                                              reference))
            if "seconds_per_update" in row:
                row["tokens_per_s"] = tokens / row["seconds_per_update"]
                row["mfu"] = 6 * params * row["tokens_per_s"] / PEAK_FLOPS
            if device.type == "cuda":
                row["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception as exc:  # keep the other variants
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print(f"\nactor update, {args.shape}, {args.sequences} seqs, {tokens} real tokens, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    header = f"{'variant':40s} {'attention':>26s} {'s/update':>9s} {'tokens/s':>10s} {'MFU':>6s} {'peak GiB':>9s} {'accum':>6s} {'dlogit':>8s} {'logit sd':>8s} {'est GiB':>8s} {'est/peak':>8s} {'resident':>8s} {'est res':>8s}"
    print(header)
    for row in rows:
        if "error" in row:
            print(f"{row['variant']:40s} {row['error']}")
            continue
        print(f"{row['variant']:40s} {row.get('attention', ''):>26s} {row['seconds_per_update']:9.3f} "
              f"{row['tokens_per_s']:10.0f} {row['mfu']:6.1%} {row.get('max_memory_gib', float('nan')):9.2f} "
              f"{row.get('grad_accum_steps', float('nan')):6.1f} {row.get('max_logit_diff_vs_padded', float('nan')):8.1e} "
              f"{row.get('logit_std', float('nan')):8.1e} {row.get('estimate_gib', float('nan')):8.2f} "
              f"{row.get('estimate_gib', float('nan')) / row.get('max_memory_gib', float('nan')):8.2f} "
              f"{row.get('resident_gib', float('nan')):8.2f} {row.get('estimate_resident_gib', float('nan')):8.2f}")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "train_knobs.json").write_text(json.dumps({
            "args": vars(args), "params": params, "real_tokens": tokens, "padded_tokens": padded_tokens,
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "rows": rows}, indent=1))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
