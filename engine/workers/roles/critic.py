"""The critic worker: a value model (LM backbone + scalar head), FSDP2-sharded, one per GPU / CPU slot.

A worker group of its own, with its own torch.distributed group: it runs next to the actor's
processes when the plan colocates the roles, or on its own pool's slots when `placement` puts it
elsewhere. Plain Python class like ActorRolloutRefWorker: engine.workers.cluster.group wraps it as a Ray
actor, and a test can build it in-process. Every batch-size number comes from
`resolved.roles.critic` (training) and `resolved.roles.critic_values` (the value forward).
Checkpoints come from CheckpointingWorker (what: `_checkpointables`), step traces from StepProfiler.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.algos.advantages import masked_mean
from engine.algos.losses import BatchCounts, value_loss
from engine.models.compile import compile_decoder_layers
from engine.models.loading import enable_activation_checkpointing, load_value_model, quiet_progress_bars, torch_dtype
from engine.batch import TensorBatch, batch_size
from engine.workers.fsdp.checkpointing import Checkpointable, CheckpointingWorker
from engine.workers.cluster.device import join_role_group, to_device, worker_device
from engine.workers.fsdp.sharding import apply_fsdp_plan, decoder_layers
from engine.workers.passes.logprob import LogitOptions, response_logits
from engine.workers.fsdp.memory import peak_memory_gb, release_cached_memory, resident_metrics
from engine.workers.passes.micro_batches import forward_by_micro_batch
from engine.workers.fsdp.offload import ModelOffload, activation_offload
from engine.workers.fsdp.optim import build_optimizer
from engine.workers.passes.ppo_update import MicroResult, ppo_update
from engine.workers.cluster.profiling import StepProfiler
from engine.workers.sequence.ulysses import prepare_attention
from rlconf.resolved import ResolvedPlan


def response_values(model: nn.Module, batch: TensorBatch, options: LogitOptions = LogitOptions()) -> torch.Tensor:
    """[b, R] values V(s_t) of the states before each response token, 0 on padding; differentiable.

    Row layout as in engine.workers.passes.logprob: [prompt (left-padded to P) | response (R)]. The state
    before response token t is the prefix ending at column P + t - 1, the same column whose logit
    predicts token t in the actor (`response_logits` picks those positions, padded or packed).
    """
    outputs, to_rows = response_logits(model, batch, options)
    values = to_rows(outputs[..., 0].float())  # the head computes in the plan's dtype
    return values * batch["response_mask"].to(values.dtype)


class CriticWorker(StepProfiler, CheckpointingWorker):
    ROLE = "critic"

    def __init__(self, resolved: ResolvedPlan, model_path: str, rank: int, world_size: int,
                 total_training_steps: int, num_threads: int = 1) -> None:
        if resolved.roles.critic is None or resolved.roles.critic_values is None:
            raise ValueError("critic worker started, but the plan has no critic (algorithm.adv_estimator is not gae)")
        self.resolved, self.rank, self.world_size = resolved, rank, world_size
        torch.set_num_threads(num_threads)
        quiet_progress_bars()
        self._model_path, self._total_steps = model_path, total_training_steps

    def init_model(self) -> dict[str, Any]:
        """Joins the critic's process group (blocks until every rank calls it), builds the value model."""
        self.device = worker_device(self.resolved.world.device)
        join_role_group(self.device, self.ROLE, self.rank, self.world_size)
        plan = self.resolved.config
        critic_cfg = plan.critic
        # Same seed on every rank: the randomly initialized value head must be identical before sharding.
        # Forked, so an actor worker sharing this process (in-process runs) keeps its sampling stream.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(plan.trainer.seed)
            model = load_value_model(self._model_path, critic_cfg.model.override_config,
                                     critic_cfg.model.trust_remote_code)
        if critic_cfg.model.enable_gradient_checkpointing:
            enable_activation_checkpointing(model)
        self.compiled_layers = compile_decoder_layers(decoder_layers(model)) if critic_cfg.model.compile_layers else 0
        # The critic section has no dtype of its own; it computes in the model dtype of the plan.
        compute_dtype = torch_dtype(plan.actor_rollout_ref.model.dtype)
        self.critic = apply_fsdp_plan(model, compute_dtype, critic_cfg.model.fsdp_config, self.device)
        self._options = LogitOptions(packed=critic_cfg.model.use_remove_padding)
        prepare_attention(self.critic, self.device, self._options.packed, self.resolved.roles.critic.sp_size)
        # The 1-output head returns its logits as a view, which FSDP2 warns about in case the caller
        # edits them in place; response_values only slices and multiplies out of place.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
        self.optimizer, self.scheduler = build_optimizer(self.critic, critic_cfg.optim, self._total_steps)
        self.critic_offload = ModelOffload.from_plan(critic_cfg.model.fsdp_config, self.critic, self.optimizer, self.device)
        # The sp ranks of a dp group (Ulysses) hold the same rows and must reorder them alike.
        self._shuffle_generator = torch.Generator().manual_seed(
            plan.trainer.seed + self.rank // self.resolved.roles.critic.sp_size)
        return {"rank": self.rank, "params": sum(p.numel() for p in model.parameters()), "device": str(self.device),
                "backend": dist.get_backend(), "param_dtype": str(next(self.critic.parameters()).dtype),
                "compute_dtype": str(compute_dtype)}

    def _checkpointables(self) -> dict[str, Checkpointable]:
        # engine.workers.fsdp.checkpointing saves these, plus every torch.Generator attribute (the shuffle order).
        return {"critic": (self.critic, self.optimizer, self.scheduler)}

    def _on_device_for_checkpoint(self) -> AbstractContextManager:
        return self.critic_offload.everything_on_device()

    def _params_on_device_for_export(self) -> AbstractContextManager:
        return self.critic_offload.in_use()

    def _release_optimizers(self) -> None:
        self.critic_offload.release_optimizer()

    # --- forward-only pass ------------------------------------------------------------------

    @torch.no_grad()
    def compute_values(self, batch: TensorBatch) -> TensorBatch:
        """V(s_t) for every response token of this rank's shard, in forward micro batches of the plan."""
        role = self.resolved.roles.critic_values
        self._check_rows(batch, role.sequences_per_gpu, role.formulas.get("sequences_per_gpu", ""), "compute_values")
        self.critic.eval()
        with self.critic_offload.in_use():
            (values,) = forward_by_micro_batch(to_device(batch, self.device), role.micro_batch_size_per_gpu,
                                               role.tokens_per_micro_batch,
                                               lambda micro: (response_values(self.critic, micro, self._options),),
                                               packed=self._options.packed)
        return {"values": values.cpu()}

    # --- training ---------------------------------------------------------------------------

    def update_critic(self, batch: TensorBatch) -> dict[str, float]:
        """PPO epochs over mini batches; each mini batch is micro batches (fixed or token-budget), one optimizer step.

        `batch` holds the rollout rows plus `values` (predicted at rollout time, the clipping anchor)
        and `returns` (the GAE targets).
        """
        role = self.resolved.roles.critic
        critic_cfg = self.resolved.config.critic
        self._check_rows(batch, role.sequences_per_gpu, role.formulas.get("sequences_per_gpu", ""), "update_critic")
        # The schema leaves critic.loss_agg_mode null to mean "as the actor's"; the resolved plan keeps the null.
        loss_agg_mode = critic_cfg.loss_agg_mode or self.resolved.config.actor_rollout_ref.actor.loss_agg_mode
        lr = self.scheduler.get_last_lr()[0]

        def micro_step(micro: TensorBatch, counts: BatchCounts) -> MicroResult:
            mask = micro["response_mask"]
            with activation_offload(critic_cfg.model.enable_activation_offload, self.device):
                values = response_values(self.critic, micro, self._options)
            loss, clip_fraction = value_loss(values, micro["values"], micro["returns"], mask,
                                             critic_cfg.cliprange_value, loss_agg_mode, totals=counts)
            return MicroResult(loss, {"vf_loss": loss.detach()},
                               {"vf_clipfrac": clip_fraction, "vpred_mean": masked_mean(values.detach(), mask)})

        with self.critic_offload.in_use():
            metrics = ppo_update(self.critic, self.optimizer, to_device(batch, self.device), epochs=role.ppo_epochs,
                                 mini_batch_size=role.ppo_mini_batch_size_per_gpu,
                                 micro_batch_size=role.ppo_micro_batch_size_per_gpu,
                                 token_budget=role.tokens_per_micro_batch, grad_clip=critic_cfg.grad_clip,
                                 shuffle=critic_cfg.shuffle, generator=self._shuffle_generator,
                                 micro_step=micro_step, prefix="critic", packed=self._options.packed,
                                 optimizer_step=self.critic_offload.optimizer_step,
                                 keep_gathered=not critic_cfg.model.fsdp_config.reshard_after_forward,
                                 no_grad_sync=critic_cfg.model.fsdp_config.use_no_sync_for_gradient_accumulation)
        self.scheduler.step()  # once per training step, like the actor's
        metrics.update({"critic/lr": lr, "memory/critic_peak_gb": peak_memory_gb(self.resolved.world.device)})
        release_cached_memory(self.resolved.world.device)
        metrics.update(resident_metrics("critic", self.resolved.world.device))
        return metrics

    def _check_rows(self, batch: TensorBatch, expected: int, formula: str, method: str) -> None:
        rows = batch_size(batch)
        if rows != expected:
            raise ValueError(f"critic rank {self.rank} {method}: got {rows} sequences, the plan says {expected} "
                             f"per GPU ({formula})")

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
