"""The colocated actor + rollout + reference worker (verl's hybrid engine), one per GPU / CPU slot.

Plain Python class: engine.workers.cluster.group wraps it as a Ray actor, and a test can build it
in-process. Every batch-size number comes from `resolved.roles.*`; nothing is re-derived here.

Rollout goes through the backend that rollout.name picks (engine.rollout: HF generate on a plain
copy, or vLLM in this process); after each update the FSDP shards are gathered bucket by
bucket (engine.workers.fsdp.gather) and pushed into it (`sync_rollout_weights`), and while the actor trains the backend releases
what memory it can.

With LoRA (model.lora_rank > 0 or lora_adapter_path, engine.models.lora) the actor trains adapters on a frozen base, the
reference is the same model with its adapters off, and the rollout receives merged weights.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from engine.algos.advantages import SUM_PI_SQUARED_ESTIMATORS
from engine.algos.kl import kl_penalty
from engine.algos.losses import BatchCounts, agg_loss
from engine.algos.policy_losses import LossSettings, compute_policy_loss
from engine.algos.rollout_correction import METRIC_PREFIX, bypass_corrections, policy_loss_inputs
from engine.models.compile import compile_decoder_layers
from engine.models.liger import apply_liger
from engine.models.loading import enable_activation_checkpointing, load_causal_lm, quiet_progress_bars, torch_dtype
from engine.models.lora import adapters_off, add_lora, merge_lora_weights, merge_scaling
from engine.batch import TensorBatch, batch_size
from engine.rank_timeline import TIMELINE
from engine.workers.fsdp.checkpointing import Checkpointable, CheckpointingWorker
from engine.workers.cluster.device import join_process_group, to_device, worker_device
from engine.workers.cluster.weight_sync import open_weight_group, plan_buckets, send_weights, tensor_infos
from engine.rollout.base import RolloutBackend, Sampling, add_backend_timings
from engine.workers.passes.first_pass import FirstPassMetrics
from engine.workers.fsdp.sharding import apply_fsdp_plan, decoder_layers, shard_frozen
from engine.workers.fsdp.gather import TimedTensors, full_tensors
from engine.workers.passes.logprob import LogitOptions, response_log_probs, response_log_probs_and_sum_pi_squared
from engine.workers.fsdp.memory import peak_memory_gb, reset_peak_memory, resident_metrics
from engine.workers.passes.micro_batches import forward_by_micro_batch
from engine.workers.fsdp.offload import ModelOffload, activation_offload
from engine.workers.fsdp.optim import build_optimizer
from engine.workers.passes.ppo_update import MicroResult, ppo_update
from engine.workers.cluster.profiling import StepProfiler
from engine.workers.sequence.ulysses import prepare_attention
from rlconf.lora_adapter import actor_lora
from rlconf.loss_head import plan_loss_head_kernels
from rlconf.resolved import ResolvedPlan


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over the actor's ranks (a collective: every rank calls it for the same micro batch)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return tensor
    reduced = tensor.detach().clone() if dist.get_backend() == "nccl" else tensor.detach().cpu()
    dist.all_reduce(reduced)
    return reduced.to(tensor.device)


# ReMax's baseline: the most likely response (verl sets do_sample False for it).
GREEDY = SimpleNamespace(do_sample=False, temperature=1.0, top_p=1.0, top_k=-1)


class ActorRolloutRefWorker(StepProfiler, CheckpointingWorker):
    ROLE = "actor_rollout_ref"

    def __init__(self, resolved: ResolvedPlan, model_path: str, rank: int, world_size: int,
                 total_training_steps: int, pad_token_id: int, eos_token_id: int, num_threads: int = 1) -> None:
        self.resolved, self.rank, self.world_size = resolved, rank, world_size
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        torch.set_num_threads(num_threads)
        quiet_progress_bars()
        self._model_path, self._total_steps = model_path, total_training_steps
        self._gather_seconds = 0.0  # gathering the shards for the rollout since the last rollout_timings()
        self._carried_timings: dict[str, float] = {}  # the backend's seconds from before a validation
        # engine.startup.ACTOR_LOAD_PIECES: this worker's own start-up account (wall clock: the driver subtracts)
        self._startup: dict[str, float] = {"constructed_at": time.time()}

    def init_model(self, start_rollout: bool = True) -> dict[str, Any]:
        """Joins the process group (blocks until every rank calls it), builds the models.

        `start_rollout` False leaves a vLLM rollout to `start_rollout()`, so the launch can announce
        and time the engine's start apart from the model's load.
        """
        began = time.perf_counter()
        self.device = worker_device(self.resolved.world.device)
        join_process_group(self.device, self.rank, self.world_size)
        loading = time.perf_counter()
        self._startup["process_group"] = loading - began
        plan = self.resolved.config
        arr = plan.actor_rollout_ref
        # Same seed on every rank: identical init of anything random; sampling gets a per-rank seed below.
        torch.manual_seed(plan.trainer.seed)
        compute_dtype = torch_dtype(arr.model.dtype)
        model = load_causal_lm(self._model_path, arr.model.override_config, arr.model.trust_remote_code)
        building = time.perf_counter()
        self._startup["model_load"] = building - loading
        if arr.model.enable_gradient_checkpointing:
            enable_activation_checkpointing(model)
        self.rollout_dtype = torch_dtype(arr.rollout.dtype)
        params = sum(p.numel() for p in model.parameters())
        # The HF copy is taken from the CPU model before sharding; vLLM starts once the actor has
        # its shards on the device, so its free-memory check sees what training left it.
        # hybrid_engine false: rollout runs in workers of its own (engine.workers.roles.rollout), fed by push_weights.
        apart = self.resolved.schedule.off_policy
        self.rollout: RolloutBackend = self._build_hf_rollout(model) if arr.rollout.name == "hf" and not apart else None
        self._weight_group = None  # actor rank 0's member of the trainer → rollout group (off-policy)
        # The HF rollout copy above was taken before: it is the plain model the merged weights fill.
        self.build_trained_actor(model)
        self.ref = None
        # With LoRA the reference is the actor with its adapters off (compute_ref_log_prob): no second model.
        if self.resolved.roles.ref is not None and self.lora is None:
            ref = load_causal_lm(self._model_path, arr.model.override_config, arr.model.trust_remote_code)
            ref.requires_grad_(False)
            if arr.model.use_liger:
                self.liger_modules += apply_liger(ref)
            if arr.model.compile_layers:
                self.compiled_layers += compile_decoder_layers(decoder_layers(ref))
            self.ref = shard_frozen(ref, compute_dtype, arr.ref.fsdp_config, self.device)
            prepare_attention(self.ref, self.device, arr.model.use_remove_padding, self.resolved.roles.ref.sp_size)
            self.ref_offload = ModelOffload.from_plan(arr.ref.fsdp_config, self.ref, None, self.device)
        # PPO epochs > 1 with actor.shuffle reorder rows from this stream (checkpointed with the worker);
        # the sp ranks of a dp group hold the same rows and must reorder them alike.
        self._shuffle_generator = torch.Generator().manual_seed(
            plan.trainer.seed + self.rank // self.resolved.roles.actor.sp_size)
        self._first_pass: FirstPassMetrics | None = None  # set by update_actor when no pass computed π_old
        self._rejection_checks = plan.algorithm.rollout_correction.rejection_checks()  # bypass mode's rollout_rs
        self.sample_generator_seed = plan.actor_rollout_ref.rollout.seed + plan.trainer.seed * 1000 + self.rank
        torch.manual_seed(self.sample_generator_seed)
        self._startup["build"] = time.perf_counter() - building  # the reference model's load included
        if start_rollout:
            self.start_rollout()
        return {"rank": self.rank, "params": params, "device": str(self.device), "startup_s": dict(self._startup),
                "backend": dist.get_backend(), "param_dtype": str(next(self.actor.parameters()).dtype),
                "compute_dtype": str(compute_dtype), "rollout": arr.rollout.name,
                "rollout_dtype": str(self.rollout_dtype)}

    def start_rollout(self) -> None:
        """Start the vLLM engine with the actor's current weights (HF generate's copy exists already)."""
        if self.rollout is None and not self.resolved.schedule.off_policy:
            self.rollout = self._build_vllm_rollout()

    def build_trained_actor(self, model: torch.nn.Module) -> None:
        """`model` (loaded, on the CPU) made the actor that trains, with every knob of the plan: Liger,
        LoRA, compiled layers, FSDP, the packed rows' attention, the optimizer and its offload.

        Also what bench/train_knobs.py times, so the bench cannot drift from the engine's setup.
        """
        arr = self.resolved.config.actor_rollout_ref
        compute_dtype = torch_dtype(arr.model.dtype)
        # Liger's kernels go into the trained model (after the rollout copy, before LoRA and FSDP).
        self.liger_modules = apply_liger(model) if arr.model.use_liger else 0
        # LoRA: adapters injected into `model` in place, the base frozen (engine.models.lora).
        self.lora = add_lora(model, arr.model, compute_dtype) if actor_lora(arr.model) is not None else None
        self.lora_scaling = merge_scaling(self.lora) if self.lora is not None else None  # the adapter's own
        # After Liger and LoRA swapped their modules in, before FSDP (engine.models.compile).
        self.compiled_layers = compile_decoder_layers(decoder_layers(model)) if arr.model.compile_layers else 0
        # fully_shard moves each layer's parameters to the device as it shards them.
        self.actor = apply_fsdp_plan(model, compute_dtype, arr.actor.fsdp_config, self.device)
        prepare_attention(self.actor, self.device, arr.model.use_remove_padding, self.resolved.roles.actor.sp_size)
        self.optimizer, self.scheduler = build_optimizer(self.actor, arr.actor.optim, self._total_steps)
        self.actor_offload = ModelOffload.from_plan(arr.actor.fsdp_config, self.actor, self.optimizer, self.device)

    def _build_hf_rollout(self, model: torch.nn.Module) -> RolloutBackend:
        from engine.rollout.hf import HFRollout

        return HFRollout(model, self.device, self.rollout_dtype, self.pad_token_id, self.eos_token_id)

    def _build_vllm_rollout(self) -> RolloutBackend:
        from engine.rollout.vllm import VLLMRollout

        plan = self.resolved.config
        role = self.resolved.roles.rollout
        tp = role.tensor_parallel_size
        # The ranks of one tensor-parallel replica must sample alike: they share a seed.
        seed = plan.actor_rollout_ref.rollout.seed + plan.trainer.seed * 1000 + self.rank // tp
        backend = VLLMRollout(self._model_path, plan.actor_rollout_ref.rollout, role.max_model_len, tp, seed,
                              self.eos_token_id, self.pad_token_id, plan.actor_rollout_ref.model.trust_remote_code)
        backend.load_weights(self._rollout_weights())
        backend.release()
        return backend

    # --- rollout ----------------------------------------------------------------------------

    @property
    def _temperature(self) -> float:
        rollout = self.resolved.config.actor_rollout_ref.rollout
        return rollout.temperature if rollout.do_sample and rollout.temperature > 0 else 1.0

    @torch.no_grad()
    def generate(self, prompts: TensorBatch) -> TensorBatch:
        """[b, P] left-padded prompts -> rows [prompt | response] with masks, responses padded to R."""
        return self._generate(prompts, self.resolved.config.actor_rollout_ref.rollout,
                              log_probs=self.resolved.roles.rollout.log_probs)

    @torch.no_grad()
    def generate_for_validation(self, prompts: TensorBatch) -> TensorBatch:
        """As `generate`, but sampling with rollout.val_kwargs (greedy unless the plan asks otherwise). Its own
        backend seconds go into no step's figures; what the backend timed before it, into the next step's."""
        if self.rollout is None:
            return self._generate(prompts, self.resolved.config.actor_rollout_ref.rollout.val_kwargs)
        self._carried_timings = add_backend_timings(self._carried_timings, self.rollout.timings())
        rows = self._generate(prompts, self.resolved.config.actor_rollout_ref.rollout.val_kwargs)
        self.rollout.timings()
        return rows

    @torch.no_grad()
    def generate_greedy(self, prompts: TensorBatch) -> TensorBatch:
        """As `generate`, but greedy whatever the plan samples with: ReMax's baseline response."""
        return self._generate(prompts, GREEDY)

    def _generate(self, prompts: TensorBatch, sampling: Any, log_probs: bool = False) -> TensorBatch:
        """`sampling`: rollout or rollout.val_kwargs (both have do_sample, temperature, top_p, top_k); `log_probs`:
        the rows carry `rollout_log_probs` (training rollouts whose log-probs something reads)."""
        rollout = self.resolved.config.actor_rollout_ref.rollout
        if not getattr(self.rollout, "has_weights", True):
            # Released at level 2 since the last push (a rollout with no update between): push again.
            # Every rank reaches this point in the same state, so the gathers line up.
            self.sync_rollout_weights()
        device = self.resolved.world.device
        with TIMELINE.span("generate"):
            reset_peak_memory(device)
            rows = self.rollout.generate(prompts, Sampling.from_plan(sampling, rollout.ignore_eos,
                                                                     self.resolved.roles.rollout.response_length,
                                                                     log_probs=log_probs))
            # The rollout phase's peak: the actor's resident states, the backend's weights, KV cache and activations
            # (vLLM's model runner in a process of its own, `mp`: its allocator's peak since the last rollout, added).
            beside = self.rollout.memory_beside(reset_peak=True) if hasattr(self.rollout, "memory_beside") else {}
            self._rollout_peak_gb = peak_memory_gb(device) + beside.get("peak_allocated", 0) / 2**30
            self.rollout.release()  # the forward passes and the update come next
            reset_peak_memory(device)  # from here on the peak is the training phase's
        return rows

    def sync_rollout_weights(self) -> float:
        """Push the updated FSDP shards into the rollout backend; returns the seconds it took."""
        if self.rollout is None:  # off-policy: the rollout pool gets them from push_weights
            return 0.0
        start = time.perf_counter()
        with TIMELINE.span("weight_sync") as record:
            tensors = TimedTensors(self._rollout_weights())
            self.rollout.load_weights(tensors)
            record["gather_s"] = tensors.seconds  # the all-gathers' CPU side; load_weights includes them
        self._gather_seconds += tensors.seconds
        return time.perf_counter() - start

    def _rollout_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's full weights for the rollout backend (HF copy or vLLM alike), yielded one at a time.

        With LoRA, the base weights and adapters are gathered as they are stored and each adapted
        weight is merged (W + alpha / r · B @ A, in fp32) before the cast to the rollout dtype, under
        the base model's names, which are the only ones the backends know.
        """
        if self.lora is None:
            return full_tensors(self.actor, self.rollout_dtype)
        return merge_lora_weights(full_tensors(self.actor), self.lora_scaling, self.rollout_dtype)

    def rank_timeline(self) -> dict[str, Any]:
        """This rank's spans since the last call (engine.rank_timeline), with where it runs."""
        return {"rank": self.rank, "spans": TIMELINE.drain()}

    def rollout_timings(self) -> dict[str, float]:
        """Seconds in the rollout backend's parts (and its memory) since the last call."""
        gather, self._gather_seconds = self._gather_seconds, 0.0
        carried, self._carried_timings = self._carried_timings, {}
        backend = add_backend_timings(carried, self.rollout.timings()) if self.rollout is not None else {}
        return {**backend, "gather_weights": gather, "peak_gb": getattr(self, "_rollout_peak_gb", 0.0)}

    # --- the rollout pool of its own (hybrid_engine false, engine.workers.cluster.weight_sync) ----------

    def rollout_weight_infos(self) -> list[tuple[str, tuple[int, ...], str]]:
        """Name, shape and dtype of each tensor push_weights sends, in order (a collective: every rank gathers)."""
        infos = tensor_infos(self._rollout_weights())
        self._push_buckets = plan_buckets(infos, self.resolved.schedule.bucket_megabytes * 2**20)
        return [tuple(info) for info in infos]

    def join_weight_group(self, master_addr: str, master_port: int, rollout_ranks: int) -> None:
        """Actor rank 0 is rank 0 of the trainer → rollout group; the other actor ranks only help gather."""
        if self.rank == 0:
            self._weight_group = open_weight_group(self.device, 0, rollout_ranks + 1, master_addr, master_port)

    def push_weights(self) -> float:
        """Gather the full weights (every actor rank) and broadcast them from rank 0 to the rollout pool, bucketed;
        returns the seconds it took. The rollout ranks call receive_weights at the same time."""
        started = time.perf_counter()
        tensors = TimedTensors(self._rollout_weights())
        if self._weight_group is None:
            for _ in tensors:  # the gather is a collective of the actor's ranks: each one takes part
                pass
        else:
            send_weights(self._weight_group, tensors, self._push_buckets, self.device)
        self._gather_seconds += tensors.seconds
        return time.perf_counter() - started

    # --- forward-only passes ----------------------------------------------------------------

    @property
    def _logit_options(self) -> LogitOptions:
        """Packing (model.use_remove_padding), the entropy memory knobs of actor and the loss head's kernels
        (rlconf.loss_head) for the passes of engine.workers.passes.logprob."""
        arr = self.resolved.config.actor_rollout_ref
        return LogitOptions(packed=arr.model.use_remove_padding,
                            entropy_chunking=arr.actor.entropy_from_logits_with_chunking,
                            entropy_checkpointing=arr.actor.entropy_checkpointing,
                            fused=arr.model.use_fused_kernels,
                            triton=plan_loss_head_kernels(self.resolved.config) == "triton")

    @torch.no_grad()
    def compute_log_prob(self, batch: TensorBatch) -> TensorBatch:
        """Log-probs of the sampled tokens under the current policy, and its entropy at each of them."""
        role = self.resolved.roles.rollout.log_prob
        if self.resolved.config.algorithm.adv_estimator in SUM_PI_SQUARED_ESTIMATORS:
            return self._log_probs_and_sum_pi_squared(batch)
        with TIMELINE.span("old_log_prob"), self.actor_offload.in_use():
            log_probs, entropy = self._forward_log_probs(self.actor, batch, role.micro_batch_size_per_gpu,
                                                         role.tokens_per_micro_batch, with_entropy=True)
        return {"old_log_probs": log_probs, "entropy": entropy}

    def _log_probs_and_sum_pi_squared(self, batch: TensorBatch) -> TensorBatch:
        """compute_log_prob plus Σπ² at every response token, from the same forward (optimal token baseline)."""
        role, options = self.resolved.roles.rollout.log_prob, self._logit_options

        def forward(micro: TensorBatch) -> tuple[torch.Tensor, ...]:
            return response_log_probs_and_sum_pi_squared(self.actor, micro, self._temperature, options)

        with self.actor_offload.in_use():
            outputs = forward_by_micro_batch(to_device(batch, self.device), role.micro_batch_size_per_gpu,
                                             role.tokens_per_micro_batch, forward, packed=options.packed)
        log_probs, entropy, sum_pi_squared = (out.cpu() for out in outputs)
        return {"old_log_probs": log_probs, "entropy": entropy, "sum_pi_squared": sum_pi_squared}

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: TensorBatch) -> TensorBatch:
        role = self.resolved.roles.ref
        if role is None or (self.ref is None and self.lora is None):
            raise RuntimeError("compute_ref_log_prob called, but the plan has no reference policy")
        if self.lora is not None:
            # The base model: the actor with every adapter switched off (peft's LoRA layers then run
            # their base layer alone), on the actor's own shards.
            with self.actor_offload.in_use(), adapters_off(self.actor):
                return {"ref_log_probs": self._forward_log_probs(self.actor, batch, role.micro_batch_size_per_gpu,
                                                                 role.tokens_per_micro_batch)[0]}
        with self.ref_offload.in_use():
            return {"ref_log_probs": self._forward_log_probs(self.ref, batch, role.micro_batch_size_per_gpu,
                                                             role.tokens_per_micro_batch)[0]}

    def _forward_log_probs(self, model: torch.nn.Module, batch: TensorBatch, micro_batch_size: int | None,
                           token_budget: int, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Micro batches of `micro_batch_size` rows, or of `token_budget` tokens when it is None (use_dynamic_bsz)."""
        options = self._logit_options

        def forward(micro: TensorBatch) -> tuple[torch.Tensor, ...]:
            log_probs, entropy = response_log_probs(model, micro, self._temperature, with_entropy, options)
            return (log_probs,) if entropy is None else (log_probs, entropy)

        outputs = forward_by_micro_batch(to_device(batch, self.device), micro_batch_size, token_budget, forward,
                                         packed=options.packed)
        return outputs[0].cpu(), (outputs[1].cpu() if with_entropy else None)

    # --- training ---------------------------------------------------------------------------

    def update_actor(self, batch: TensorBatch) -> dict[str, float]:
        """PPO epochs over mini batches; each mini batch is micro batches (fixed or token-budget), one optimizer step."""
        role = self.resolved.roles.actor
        actor_cfg = self.resolved.config.actor_rollout_ref.actor
        if batch_size(batch) != role.sequences_per_gpu:
            raise ValueError(f"rank {self.rank} got {batch_size(batch)} sequences, the plan says "
                             f"{role.sequences_per_gpu} per GPU ({role.formulas.get('sequences_per_gpu', '')})")
        lr = self.scheduler.get_last_lr()[0]
        correction = self.resolved.config.algorithm.rollout_correction
        self._first_pass = None
        if self.resolved.roles.rollout.old_log_probs != "recompute":
            self._first_pass = FirstPassMetrics(batch_size(batch), correction.rollout_is_threshold)
        with TIMELINE.span("update_actor"), self.actor_offload.in_use():
            metrics = ppo_update(self.actor, self.optimizer, to_device(batch, self.device), epochs=role.ppo_epochs,
                                 mini_batch_size=role.ppo_mini_batch_size_per_gpu,
                                 micro_batch_size=role.ppo_micro_batch_size_per_gpu,
                                 token_budget=role.tokens_per_micro_batch, grad_clip=actor_cfg.grad_clip,
                                 shuffle=actor_cfg.shuffle, generator=self._shuffle_generator,
                                 micro_step=self._micro_step, prefix="actor", packed=self._logit_options.packed,
                                 optimizer_step=self.actor_offload.optimizer_step,
                                 keep_gathered=not actor_cfg.fsdp_config.reshard_after_forward,
                                 no_grad_sync=actor_cfg.fsdp_config.use_no_sync_for_gradient_accumulation)
        self.scheduler.step()  # once per training step, like verl
        # Bypass mode's rollout_corr/* diagnostics keep verl's names, not the actor/ prefix of the update's.
        metrics = {key.removeprefix("actor/") if key.startswith(f"actor/{METRIC_PREFIX}") else key: value
                   for key, value in metrics.items()}
        if self._first_pass is not None:
            metrics.update(self._first_pass.metrics())
        # A sleeping vLLM's unmapped pool is still counted by torch's allocator: not memory the update held.
        asleep_gb = getattr(self.rollout, "counted_while_asleep", 0) / 2**30
        metrics.update({"actor/lr": lr, "memory/actor_peak_gb": peak_memory_gb(self.resolved.world.device) - asleep_gb})
        metrics.update(resident_metrics("actor", self.resolved.world.device, asleep_gb))
        return metrics

    def _micro_step(self, micro: TensorBatch, counts: BatchCounts) -> MicroResult:
        """This micro batch's share of the mini batch's loss: policy loss - entropy bonus + KL loss."""
        actor_cfg = self.resolved.config.actor_rollout_ref.actor
        low = actor_cfg.clip_ratio_low if actor_cfg.clip_ratio_low is not None else actor_cfg.clip_ratio
        high = actor_cfg.clip_ratio_high if actor_cfg.clip_ratio_high is not None else actor_cfg.clip_ratio
        mode = actor_cfg.loss_agg_mode
        mask = micro["response_mask"]
        entropy_coeff = actor_cfg.entropy_coeff
        first_pass = self._first_pass
        with activation_offload(self.resolved.config.actor_rollout_ref.model.enable_activation_offload, self.device):
            log_probs, entropy = response_log_probs(self.actor, micro, self._temperature,
                                                    with_entropy=entropy_coeff > 0, options=self._logit_options,
                                                    entropy_metric=first_pass is not None)
        pl = actor_cfg.policy_loss
        settings = LossSettings(low, high, actor_cfg.clip_ratio_c, pl.clip_cov_ratio, pl.clip_cov_lb, pl.clip_cov_ub,
                                pl.kl_cov_ratio, pl.ppo_kl_coef, actor_cfg.tau_pos, actor_cfg.tau_neg)
        loss_mode, old_log_probs, is_weights = policy_loss_inputs(
            self.resolved.roles.rollout.old_log_probs, pl.loss_mode, self.resolved.config.algorithm.rollout_correction,
            log_probs, mask, micro.get("old_log_probs"), micro.get("rollout_log_probs"),
            micro.get("rollout_is_weights"))
        if first_pass is not None:
            first_pass.add(mask, log_probs, entropy, micro.get("rollout_log_probs"), is_weights)
        policy_mask, correction_metrics = mask, {}
        if self.resolved.roles.rollout.old_log_probs == "rollout":  # bypass mode: verl corrects inside the loss
            policy_mask, is_weights, correction_metrics = bypass_corrections(
                self.resolved.config.algorithm.rollout_correction, self._rejection_checks, log_probs,
                micro["rollout_log_probs"], mask, is_weights, sum_over_ranks)
        if entropy is not None and entropy_coeff == 0:
            entropy = None  # measured for the metric only
        pg = compute_policy_loss(loss_mode, old_log_probs, log_probs, micro["advantages"], policy_mask, settings,
                                 mode, totals=counts, is_weights=is_weights)
        loss = pg.loss
        terms = {"pg_loss": pg.loss.detach()}
        if entropy is not None:
            entropy_loss = agg_loss(entropy, mask, mode, totals=counts)
            loss = loss - entropy_coeff * entropy_loss
            terms["entropy_loss"] = entropy_loss.detach()
        if actor_cfg.use_kl_loss and "ref_log_probs" in micro:
            kl = agg_loss(kl_penalty(log_probs, micro["ref_log_probs"], actor_cfg.kl_loss_type), mask, mode,
                          totals=counts)
            loss = loss + actor_cfg.kl_loss_coef * kl
            terms["kl_loss"] = kl.detach()
        terms["loss"] = loss.detach()
        # Tensors: ppo_update reads them back once per update, not once per micro batch (a sync each).
        return MicroResult(loss, terms, {"pg_clipfrac": pg.clip_fraction, "ppo_kl": pg.approx_kl, **correction_metrics})

    # --- checkpoints (engine.workers.fsdp.checkpointing): the reference model is frozen, so only the actor ---

    def _checkpointables(self) -> dict[str, Checkpointable]:
        return {"actor": (self.actor, self.optimizer, self.scheduler)}

    def _hf_export_state(self, name: str, full_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """With LoRA, the plain model's weights (adapters merged, fp32: a small update to a weight must not be
        rounded away), loadable by AutoModelForCausalLM; DCP checkpoints keep base and adapters apart."""
        if self.lora is None:
            return full_state
        return dict(merge_lora_weights(full_state.items(), self.lora_scaling,
                                       torch.float32))

    def _on_device_for_checkpoint(self) -> AbstractContextManager:
        return self.actor_offload.everything_on_device()

    def _params_on_device_for_export(self) -> AbstractContextManager:
        return self.actor_offload.in_use()

    def _release_optimizers(self) -> None:
        self.actor_offload.release_optimizer()

    def _after_checkpoint_load(self) -> None:
        self.sync_rollout_weights()  # the rollout copy samples the next step: it must hold the loaded weights

    def shutdown(self) -> None:
        if hasattr(getattr(self, "rollout", None), "shutdown"):  # vLLM's own processes (`mp`) end here
            self.rollout.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()

