"""The reward model served by vLLM (verl 0.9.1's reward loop, a discriminative model): one worker per replica.

verl serves the reward model on its rollout engine and asks it to `classify` each (prompt, response)
text with the activation off; the score is the last entry of the returned vector (one label: the
score head's output at the last token). Here each replica is one Ray worker holding a `vllm.LLM` of
the pooling runner in its own process (tensor parallel size 1), fed the texts the controller
renders (engine.rewards.retemplate.RewardLoopPrompts) and returning one float per text.

Where it runs (`resolved.roles.served_reward_model`):
- colocated (the actor's pool): it shares each GPU with the actor's FSDP shard and its rollout
  engine. With free_cache_engine it sleeps at level 1 (weights to CPU memory, KV cache dropped: its
  weights never change) from its start on, wakes to score after the rollout, and sleeps again
  before the forward passes and the update, as verl's colocated reward model does;
- its own pool (`reward_pool`): it stays awake (verl's standalone servers skip sleep and wake).

Colocated, it starts after the actor's rollout engine went to sleep and after the critic loaded
(engine.trainer build_trainer), so its free-memory check sees what it will really share the GPU with; on
its own pool it starts while the actor loads (nothing else is on its GPUs).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from engine.rollout.vllm import GIB, check_free_memory, import_vllm
from engine.workers.cluster.device import worker_device
from engine.workers.cluster.profiling import StepProfiler
from rlconf.resolved import ResolvedPlan

KEY = "reward_model.rollout"
FSDP_INSTEAD = ("score with the FSDP reward-model worker instead (reward_model.use_reward_loop=false, with "
                "reward_model.micro_batch_size_per_gpu or use_dynamic_bsz)")
# vLLM reallocates the weights and the KV cache when it wakes; on a shared GPU that fails when the
# actor's states are still there.
WAKE_OOM_HELP = ("the served reward model's vLLM could not map its weights and KV cache back ({pool:.1f} GiB: "
                 "reward_model.rollout.gpu_memory_utilization × the GPU) beside what the actor keeps on this GPU "
                 "between updates; lower reward_model.rollout.gpu_memory_utilization, or move the actor's states off "
                 "the GPU between updates (fsdp_config.param_offload / optimizer_offload), or give the reward model a "
                 "pool of its own (reward_model.enable_resource_pool)")
LENGTH_HELP = ("a text longer than the served engine's max_model_len ({max_model_len}) is refused by vLLM; raise "
               "reward_model.rollout.max_model_len (at most the reward model's max_position_embeddings), or "
               "shorten the prompts and responses (data.max_prompt_length, data.max_response_length)")


class ServedRewardModelWorker(StepProfiler):
    ROLE = "reward_model"  # its pool is the plan's reward_model pool (engine.workers.cluster.placement)

    def __init__(self, resolved: ResolvedPlan, model_path: str, rank: int, world_size: int,
                 num_threads: int = 1) -> None:
        served = resolved.roles.served_reward_model
        if served is None:
            raise ValueError("served reward model worker started, but the plan serves no reward model "
                             "(reward_model.rollout.name)")
        if served.tensor_parallel_size != 1:
            raise ValueError(f"reward_model.rollout.tensor_model_parallel_size={served.tensor_parallel_size}: this "
                             "engine serves the reward model with one GPU per replica; set it to 1")
        if world_size != served.replicas:
            raise ValueError(f"{world_size} served reward model workers started for {served.replicas} replica(s)")
        self.resolved, self.rank, self.world_size = resolved, rank, world_size
        torch.set_num_threads(num_threads)
        self._model_path = model_path
        # verl's colocated reward model sleeps between scorings; a standalone one never does.
        self.sleeps = served.colocated and served.free_cache_engine
        self.asleep = False
        self._seconds: dict[str, float] = {}

    def init_model(self) -> dict[str, Any]:
        """Start this replica's vLLM engine (pooling runner); asleep at once when it sleeps between scorings."""
        self.device = worker_device(self.resolved.world.device)
        plan = self.resolved.config
        rollout = plan.reward_model.rollout
        vllm = import_vllm(KEY, FSDP_INSTEAD)
        free, total = torch.cuda.mem_get_info()
        residents = ("the actor, its rollout engine (asleep with actor_rollout_ref.rollout.free_cache_engine) and the "
                     "other roles on this GPU have loaded" if self.resolved.roles.served_reward_model.colocated
                     else "what else runs on this GPU has loaded")
        check_free_memory(rollout.gpu_memory_utilization, free, total, key=KEY, residents=residents,
                          help="give it a pool of its own (reward_model.enable_resource_pool), or free memory on "
                               "the GPU it shares (the actor's fsdp_config.param_offload / optimizer_offload, a "
                               "lower actor_rollout_ref.rollout.gpu_memory_utilization with free_cache_engine)")
        # The engine core runs in this process, as the rollout's does (engine.rollout.vllm): one engine, one process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        kwargs: dict[str, Any] = dict(
            model=str(self._model_path),
            runner="pooling",
            dtype=rollout.dtype,
            tensor_parallel_size=1,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            max_num_seqs=rollout.max_num_seqs,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            seed=plan.trainer.seed,
            enable_sleep_mode=self.sleeps,
            trust_remote_code=bool(plan.reward_model.model.trust_remote_code),
        )
        # A *ForTokenClassification checkpoint (verl's reward models load as token classifiers) makes vLLM pick
        # token_classify, a score per token; the reward loop asks for one score per sequence (verl's `classify`).
        from vllm.config import PoolerConfig  # a submodule: `import vllm` alone does not bind it

        kwargs["pooler_config"] = PoolerConfig(task="classify")
        if rollout.max_model_len is not None:  # None: vLLM takes the model's max_position_embeddings, as verl's server
            kwargs["max_model_len"] = rollout.max_model_len
        started = time.perf_counter()
        self.llm = vllm.LLM(**kwargs)
        # verl's request: {"activation": False}: the score head's raw output, not a sigmoid of it.
        self._pooling_params = vllm.PoolingParams(use_activation=False)
        start_seconds = time.perf_counter() - started
        if self.sleeps:
            self._sleep()
        return {"rank": self.rank, "device": str(self.device), "backend": "vllm", "start_seconds": start_seconds,
                "sleeps": self.sleeps}

    @torch.no_grad()
    def compute_rm_score(self, texts: list[str]) -> list[float]:
        """The score of each text: `probs[-1]` of vLLM's classify output, as verl's reward loop reads it."""
        if not texts:
            return []
        self._wake()
        torch.cuda.reset_peak_memory_stats()  # the peak of this scoring: vLLM's pool (torch counts it) + activations
        started = time.perf_counter()
        try:
            outputs = self.llm.classify(list(texts), pooling_params=self._pooling_params, use_tqdm=False)
        except ValueError as exc:
            text = str(exc).lower()
            if "max_model_len" in text or "maximum model length" in text or "too long" in text:
                limit = self.resolved.config.reward_model.rollout.max_model_len or "the model's max_position_embeddings"
                raise ValueError(f"{LENGTH_HELP.format(max_model_len=limit)} ({exc})") from exc
            raise
        scores = [float(output.outputs.probs[-1]) for output in outputs]
        self._add_seconds("score_in_worker", time.perf_counter() - started)
        free, total = torch.cuda.mem_get_info()  # awake and just scored: the reward phase's footprint on this GPU
        self._seconds["device_used_gb"] = max(self._seconds.get("device_used_gb", 0.0), (total - free) / GIB)
        self._seconds["peak_gb"] = max(self._seconds.get("peak_gb", 0.0), torch.cuda.max_memory_allocated() / GIB)
        if len(scores) != len(texts):
            raise RuntimeError(f"vLLM returned {len(scores)} classifications for {len(texts)} texts")
        if self.sleeps:
            self._sleep()
        return scores

    def timings(self) -> dict[str, float]:
        """Seconds in wake-up, scoring and sleep since the last call; the device's used GiB after scoring (max)."""
        out, self._seconds = self._seconds, {}
        return out

    # --- sleep and wake (colocated with free_cache_engine) -----------------------------------------

    def _sleep(self) -> None:
        started = time.perf_counter()
        self.llm.sleep(level=1)  # weights to CPU memory (they never change), KV cache dropped
        self.asleep = True
        self._add_seconds("sleep", time.perf_counter() - started)

    def _wake(self) -> None:
        if not self.asleep:
            return
        started = time.perf_counter()
        try:
            self.llm.wake_up()
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            if "out of memory" not in str(exc).lower():
                raise
            pool = self.resolved.config.reward_model.rollout.gpu_memory_utilization * torch.cuda.mem_get_info()[1]
            raise RuntimeError(f"{WAKE_OOM_HELP.format(pool=pool / GIB)} ({exc})") from exc
        # Nothing cached before the sleep survives it (verl resets the prefix cache on wake-up too).
        self.llm.reset_prefix_cache()
        self.asleep = False
        self._add_seconds("wake", time.perf_counter() - started)

    def _add_seconds(self, key: str, seconds: float) -> None:
        self._seconds[key] = self._seconds.get(key, 0.0) + seconds

    def shutdown(self) -> None:
        self.llm = None
