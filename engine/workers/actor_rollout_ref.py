"""The colocated actor + rollout + reference worker (verl's hybrid engine), one per GPU / CPU slot.

Plain Python class: engine.workers.group wraps it as a Ray actor, and a test can build it
in-process. Every batch-size number comes from `resolved.roles.*`; nothing is re-derived here.

Rollout runs HF `generate` on a plain (unsharded) copy of the actor: after each update the FSDP
shards are all-gathered into it (`sync_rollout_weights`). Generating on the FSDP module itself
would need every rank to run the same number of decode steps (each forward is a collective),
while a local copy lets each rank stop at its own EOS, and the gather is one collective per step.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.distributed as dist

from engine.algos.kl import kl_penalty
from engine.algos.losses import BatchCounts, agg_loss, policy_loss
from engine.models.loading import load_causal_lm, quiet_progress_bars, torch_dtype
from engine.workers.batch import TensorBatch, batch_size
from engine.workers.checkpointing import Checkpointable, CheckpointingWorker
from engine.workers.device import join_process_group, to_cpu, to_device, worker_device
from engine.workers.fsdp import apply_fsdp, copy_full_weights
from engine.workers.logprob import position_ids_from_mask, response_log_probs
from engine.workers.memory import peak_memory_gb
from engine.workers.micro_batches import forward_by_micro_batch
from engine.workers.optim import build_optimizer
from engine.workers.ppo_update import MicroResult, ppo_update
from engine.workers.profiling import StepProfiler
from rlconf.resolved import ResolvedPlan


class ActorRolloutRefWorker(StepProfiler, CheckpointingWorker):
    ROLE = "actor_rollout_ref"

    def __init__(self, resolved: ResolvedPlan, model_path: str, rank: int, world_size: int,
                 total_training_steps: int, pad_token_id: int, eos_token_id: int, num_threads: int = 1) -> None:
        self.resolved, self.rank, self.world_size = resolved, rank, world_size
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        torch.set_num_threads(num_threads)
        quiet_progress_bars()
        self._model_path, self._total_steps = model_path, total_training_steps

    def init_model(self) -> dict[str, Any]:
        """Joins the process group (blocks until every rank calls it), builds the models."""
        self.device = worker_device(self.resolved.world.device)
        join_process_group(self.device, self.rank, self.world_size)
        plan = self.resolved.config
        arr = plan.actor_rollout_ref
        # Same seed on every rank: identical init of anything random; sampling gets a per-rank seed below.
        torch.manual_seed(plan.trainer.seed)
        compute_dtype = torch_dtype(arr.model.dtype)
        model = load_causal_lm(self._model_path, arr.model.override_config, arr.model.trust_remote_code)
        if arr.model.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # The rollout copy is plain and full-size: HF generate runs on it without collectives. Copied on
        # the CPU and cast on the way to the device, so the device never holds a second fp32 model.
        self.rollout_model = copy.deepcopy(model).to(self.device, torch_dtype(arr.rollout.dtype)).eval()
        # fully_shard moves each layer's parameters to the device as it shards them.
        self.actor = apply_fsdp(model, compute_dtype, arr.actor.fsdp_config.reshard_after_forward, self.device)
        self.optimizer, self.scheduler = build_optimizer(self.actor, arr.actor.optim, self._total_steps)
        self.ref = None
        if self.resolved.roles.ref is not None:
            ref = load_causal_lm(self._model_path, arr.model.override_config, arr.model.trust_remote_code)
            ref.requires_grad_(False)
            self.ref = apply_fsdp(ref, compute_dtype, arr.ref.fsdp_config.reshard_after_forward, self.device).eval()
        # PPO epochs > 1 with actor.shuffle reorder rows from this stream (checkpointed with the worker).
        self._shuffle_generator = torch.Generator().manual_seed(plan.trainer.seed + self.rank)
        self.sample_generator_seed = plan.actor_rollout_ref.rollout.seed + plan.trainer.seed * 1000 + self.rank
        torch.manual_seed(self.sample_generator_seed)
        return {"rank": self.rank, "params": sum(p.numel() for p in model.parameters()), "device": str(self.device),
                "backend": dist.get_backend(), "param_dtype": str(next(self.actor.parameters()).dtype),
                "compute_dtype": str(compute_dtype), "rollout_dtype": str(next(self.rollout_model.parameters()).dtype)}

    # --- rollout ----------------------------------------------------------------------------

    @property
    def _temperature(self) -> float:
        rollout = self.resolved.config.actor_rollout_ref.rollout
        return rollout.temperature if rollout.do_sample and rollout.temperature > 0 else 1.0

    @torch.no_grad()
    def generate(self, prompts: TensorBatch) -> TensorBatch:
        """[b, P] left-padded prompts -> rows [prompt | response] with masks, responses padded to R."""
        return self._generate(prompts, self.resolved.config.actor_rollout_ref.rollout)

    @torch.no_grad()
    def generate_for_validation(self, prompts: TensorBatch) -> TensorBatch:
        """As `generate`, but sampling with rollout.val_kwargs (greedy unless the plan asks otherwise)."""
        return self._generate(prompts, self.resolved.config.actor_rollout_ref.rollout.val_kwargs)

    def _generate(self, prompts: TensorBatch, sampling: Any) -> TensorBatch:
        """`sampling`: rollout or rollout.val_kwargs (both have do_sample, temperature, top_p, top_k)."""
        rollout = self.resolved.config.actor_rollout_ref.rollout
        response_length = self.resolved.roles.rollout.response_length
        sample = sampling.do_sample and sampling.temperature > 0
        kwargs: dict[str, Any] = dict(do_sample=sample, max_new_tokens=response_length,
                                      pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id)
        if sample:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k if sampling.top_k > 0 else 0)  # 0 disables HF's default top_k=50
        if rollout.ignore_eos:
            kwargs.update(min_new_tokens=response_length)
        prompts = to_device(prompts, self.device)
        output = self.rollout_model.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
                                             **kwargs)
        prompt_length = prompts["input_ids"].shape[1]
        responses = torch.full((output.shape[0], response_length), self.pad_token_id, dtype=torch.long,
                               device=output.device)
        generated = output[:, prompt_length:]
        responses[:, :generated.shape[1]] = generated
        response_mask = _mask_after_eos(responses, self.eos_token_id, rollout.ignore_eos)
        attention_mask = torch.cat([prompts["attention_mask"], response_mask], dim=1)
        return to_cpu({
            "input_ids": torch.cat([prompts["input_ids"], responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "responses": responses,
            "response_mask": response_mask,
        })

    def sync_rollout_weights(self) -> float:
        """Gather the updated FSDP shards into the rollout copy; returns the seconds it took."""
        start = time.perf_counter()
        copy_full_weights(self.actor, self.rollout_model)
        return time.perf_counter() - start

    # --- forward-only passes ----------------------------------------------------------------

    @torch.no_grad()
    def compute_log_prob(self, batch: TensorBatch) -> TensorBatch:
        """Log-probs of the sampled tokens under the current policy, and its entropy at each of them."""
        role = self.resolved.roles.rollout.log_prob
        log_probs, entropy = self._forward_log_probs(self.actor, batch, role.micro_batch_size_per_gpu,
                                                     role.tokens_per_micro_batch, with_entropy=True)
        return {"old_log_probs": log_probs, "entropy": entropy}

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: TensorBatch) -> TensorBatch:
        role = self.resolved.roles.ref
        if self.ref is None or role is None:
            raise RuntimeError("compute_ref_log_prob called, but the plan has no reference policy")
        return {"ref_log_probs": self._forward_log_probs(self.ref, batch, role.micro_batch_size_per_gpu,
                                                         role.tokens_per_micro_batch)[0]}

    def _forward_log_probs(self, model: torch.nn.Module, batch: TensorBatch, micro_batch_size: int | None,
                           token_budget: int, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Micro batches of `micro_batch_size` rows, or of `token_budget` tokens when it is None (use_dynamic_bsz)."""
        def forward(micro: TensorBatch) -> tuple[torch.Tensor, ...]:
            log_probs, entropy = response_log_probs(model, micro, self._temperature, with_entropy)
            return (log_probs,) if entropy is None else (log_probs, entropy)

        outputs = forward_by_micro_batch(to_device(batch, self.device), micro_batch_size, token_budget, forward)
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
        metrics = ppo_update(self.actor, self.optimizer, to_device(batch, self.device), epochs=role.ppo_epochs,
                             mini_batch_size=role.ppo_mini_batch_size_per_gpu,
                             micro_batch_size=role.ppo_micro_batch_size_per_gpu,
                             token_budget=role.tokens_per_micro_batch, grad_clip=actor_cfg.grad_clip,
                             shuffle=actor_cfg.shuffle, generator=self._shuffle_generator,
                             micro_step=self._micro_step, prefix="actor")
        self.scheduler.step()  # once per training step, like verl
        metrics.update({"actor/lr": lr, "memory/actor_peak_gb": peak_memory_gb(self.resolved.world.device)})
        return metrics

    def _micro_step(self, micro: TensorBatch, counts: BatchCounts) -> MicroResult:
        """This micro batch's share of the mini batch's loss: policy loss - entropy bonus + KL loss."""
        actor_cfg = self.resolved.config.actor_rollout_ref.actor
        low = actor_cfg.clip_ratio_low if actor_cfg.clip_ratio_low is not None else actor_cfg.clip_ratio
        high = actor_cfg.clip_ratio_high if actor_cfg.clip_ratio_high is not None else actor_cfg.clip_ratio
        mode = actor_cfg.loss_agg_mode
        mask = micro["response_mask"]
        entropy_coeff = actor_cfg.entropy_coeff
        log_probs, entropy = response_log_probs(self.actor, micro, self._temperature, with_entropy=entropy_coeff > 0)
        pg = policy_loss(micro["old_log_probs"], log_probs, micro["advantages"], mask, low, high,
                         actor_cfg.clip_ratio_c, mode, totals=counts)
        loss = pg.loss
        terms = {"pg_loss": float(pg.loss.detach())}
        if entropy is not None:
            entropy_loss = agg_loss(entropy, mask, mode, totals=counts)
            loss = loss - entropy_coeff * entropy_loss
            terms["entropy_loss"] = float(entropy_loss.detach())
        if actor_cfg.use_kl_loss and "ref_log_probs" in micro:
            kl = agg_loss(kl_penalty(log_probs, micro["ref_log_probs"], actor_cfg.kl_loss_type), mask, mode,
                          totals=counts)
            loss = loss + actor_cfg.kl_loss_coef * kl
            terms["kl_loss"] = float(kl.detach())
        terms["loss"] = float(loss.detach())
        return MicroResult(loss, terms, {"pg_clipfrac": float(pg.clip_fraction), "ppo_kl": float(pg.approx_kl)})

    # --- checkpoints (engine.workers.checkpointing): the reference model is frozen, so only the actor ---

    def _checkpointables(self) -> dict[str, Checkpointable]:
        return {"actor": (self.actor, self.optimizer, self.scheduler)}

    def _after_checkpoint_load(self) -> None:
        self.sync_rollout_weights()  # the rollout copy samples the next step: it must hold the loaded weights

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _mask_after_eos(responses: torch.Tensor, eos_token_id: int, ignore_eos: bool) -> torch.Tensor:
    """1 for response tokens up to and including the first EOS, 0 after it (padding)."""
    if ignore_eos:
        return torch.ones_like(responses)
    is_eos = (responses == eos_token_id).long()
    # Tokens strictly after the first EOS have a positive count of EOS before them.
    eos_before = is_eos.cumsum(-1) - is_eos
    return (eos_before == 0).long()
