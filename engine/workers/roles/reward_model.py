"""The reward model worker: a frozen scorer (backbone + one-output head), FSDP2-sharded, one per GPU / CPU slot.

The tuning guide's fourth role, as verl's FSDP RewardModelWorker: each (prompt, response) row gets
the model's score at its last real token (engine.workers.passes.sequence_scores). A worker group
of its own, with its own torch.distributed group, like the critic: next to the actor's processes
when the plan colocates it, or on its own pool's slots. Its forward micro batches (or token
budget), packing and Ulysses come from `resolved.roles.reward_model`; it has no gradients, no
optimizer and nothing to checkpoint (its weights never change).

Without reward_model.model.input_tokenizer it reads the policy's token ids as they are, so each batch's
largest id is checked against its embedding before the forward: on a GPU an id past it is a device-side
assert deep inside the model, here a ValueError that says which sizes differ and how to re-tokenize.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from engine.batch import TensorBatch
from engine.models.loading import load_reward_model, quiet_progress_bars, torch_dtype
from engine.workers.cluster.device import join_role_group, to_device, worker_device
from engine.workers.cluster.profiling import StepProfiler
from engine.workers.fsdp.memory import release_cached_memory
from engine.workers.fsdp.offload import ModelOffload
from engine.workers.fsdp.sharding import shard_frozen
from engine.workers.passes.micro_batches import forward_by_micro_batch
from engine.workers.passes.sequence_scores import last_token_scores
from engine.workers.sequence.ulysses import prepare_attention
from rlconf.resolved import ResolvedPlan

# Dry-run models (engine.models.loading.resolve_model_path builds them): a random score head is expected.
DRY_RUN_SCHEMES = ("tiny://", "random://")


def largest_id_embedded(batch: TensorBatch, packed: bool) -> int:
    """The largest token id the forward looks up: packed rows drop their padding before it, padded rows
    send the padding through the embedding too. One max over the whole shard (-1 for an empty one)."""
    ids = batch["input_ids"]
    if packed:
        ids = ids.masked_fill(batch["attention_mask"] == 0, 0)
    return int(ids.max()) if ids.numel() else -1


class RewardModelWorker(StepProfiler):
    ROLE = "reward_model"

    def __init__(self, resolved: ResolvedPlan, model_path: str, rank: int, world_size: int,
                 plan_model_path: str = "", num_threads: int = 1) -> None:
        if resolved.roles.reward_model is None:
            raise ValueError("reward model worker started, but the plan has no reward model (reward_model.enable)")
        self.resolved, self.rank, self.world_size = resolved, rank, world_size
        torch.set_num_threads(num_threads)
        quiet_progress_bars()
        self._model_path = model_path
        self._fresh_head_ok = plan_model_path.startswith(DRY_RUN_SCHEMES)

    def init_model(self) -> dict[str, Any]:
        """Joins the reward model's process group (blocks until every rank calls it), builds the scorer."""
        self.device = worker_device(self.resolved.world.device)
        join_role_group(self.device, self.ROLE, self.rank, self.world_size)
        plan = self.resolved.config
        rm_cfg = plan.reward_model
        with torch.random.fork_rng(devices=[]):  # a dry run's random head: the same on every rank
            torch.manual_seed(plan.trainer.seed)
            model = load_reward_model(self._model_path, None, bool(rm_cfg.model.trust_remote_code),
                                      fresh_head_ok=self._fresh_head_ok)
        model.requires_grad_(False)
        params = sum(p.numel() for p in model.parameters())
        self._embedding_rows = model.get_input_embeddings().num_embeddings  # read before sharding splits the weight
        compute_dtype = torch_dtype(plan.actor_rollout_ref.model.dtype)
        fsdp = rm_cfg.model.fsdp_config
        self.model = shard_frozen(model, compute_dtype, fsdp, self.device)
        self._packed = rm_cfg.model.use_remove_padding
        prepare_attention(self.model, self.device, self._packed, self.resolved.roles.reward_model.sp_size)
        # The one-output head returns its logits as a view, which FSDP2 warns about in case the caller
        # edits them in place; last_token_scores only indexes them.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
        self.offload = ModelOffload.from_plan(fsdp, self.model, None, self.device)
        return {"rank": self.rank, "params": params, "device": str(self.device), "backend": dist.get_backend(),
                "param_dtype": str(next(self.model.parameters()).dtype), "compute_dtype": str(compute_dtype)}

    @torch.no_grad()
    def compute_rm_score(self, batch: TensorBatch) -> TensorBatch:
        """{"rm_scores": [b]}: the score of every row of this rank's shard, in the plan's forward micro batches.

        A training step's shard has the plan's sequences per GPU; validation and ReMax's greedy rows
        may have any number (the micro batches or the token budget still bound the memory).
        """
        role = self.resolved.roles.reward_model
        largest = largest_id_embedded(batch, self._packed)  # the rows arrive on the host: one max, no device sync
        if largest >= self._embedding_rows:
            raise ValueError(self._past_the_embedding(batch, largest))
        with self.offload.in_use():
            # One column per row: forward_by_micro_batch puts [b, width] outputs back in row order.
            (scores,) = forward_by_micro_batch(to_device(batch, self.device), role.micro_batch_size_per_gpu,
                                               role.tokens_per_micro_batch,
                                               lambda micro: (last_token_scores(self.model, micro, self._packed)[:, None],),
                                               packed=self._packed)
        scores = scores[:, 0].cpu()
        release_cached_memory(self.resolved.world.device)  # its activations' blocks, before the next rollout
        return {"rm_scores": scores}

    def _past_the_embedding(self, batch: TensorBatch, largest: int) -> str:
        plan = self.resolved.config
        rm, policy = plan.reward_model, plan.actor_rollout_ref.model.path
        found = (f"the reward model `{rm.model.path}` has {self._embedding_rows:,} rows in its input embedding, and "
                 f"its batch holds token id {largest:,}")
        if not self._packed and largest_id_embedded(batch, packed=True) < self._embedding_rows:
            found += " at a padding position (the padding is embedded too, unless use_remove_padding packs the rows)"
        if rm.model.input_tokenizer:
            return (f"{found}: these rows were re-tokenized with the tokenizer saved at {rm.model.path} "
                    f"(reward_model.model.input_tokenizer is set), which has ids the checkpoint beside it has no "
                    f"embedding for; save the tokenizer the reward model was trained with there, or resize its "
                    f"embeddings to the tokenizer's length")
        return (f"{found}: without reward_model.model.input_tokenizer the reward model reads the policy's "
                f"(`{policy}`) token ids as they are, and the policy's vocabulary is larger than its own; set "
                f"reward_model.model.input_tokenizer={policy} (the policy's path, verl's default for this key): each "
                f"response is then decoded with the policy's tokenizer, re-rendered in the reward model's chat "
                f"template and re-tokenized with its own tokenizer; or use a reward model built on the policy's "
                f"tokenizer (rlconf validate says so before the run, as RL534, where it can read both config.json)")

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
