"""The single controller: one GRPO or PPO training step after another, reading top to bottom.

The controller holds the data, the rewards and the KL controller; workers hold the models. Each step:
prompts -> n samples each -> generate -> decode + reward -> old log-probs -> (ref log-probs)
-> (critic values) -> token rewards (minus β·KL if the plan puts KL in the reward) -> advantages
(group-relative, or GAE with the critic) -> (critic update) -> actor update (after the critic
warmup) -> push weights to the rollout copy -> metrics.

Each of those is a unit of engine.controller.stages; this module runs them in order (the synchronous
schedule) and owns what lasts across steps: the data order, validation, metrics, checkpoints.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.algos.kl import AdaptiveKLController, FixedKLController
from engine.batch import TensorBatch
from engine.checkpoint import (
    VAL_GENERATIONS_FILE,
    CheckpointError,
    export_hf_model,
    load_checkpoint,
    save_checkpoint,
    should_save,
)
from engine.controller.advantages import build_kl_controller
from engine.controller.dispatch import Dispatch
from engine.controller.fully_async import (GroupStream, StreamingPool, backend_per_rank, merge,
                                          staleness_metrics)
from engine.controller.offpolicy import PENDING_FILE, GenerationQueue, RolloutPool, load_pending, pending_state
from engine.controller.samples import StepInputs, decode_prompts, decode_responses, expand_samples
from engine.controller.stages import StepStages, rollout_backend_metrics
from engine.data.dataset import BatchOrder, PromptDataset, read_rows
from engine.data.sources import resolve_data_files
from engine.interrupt import stop_point
from engine.loggers import MetricSink, close_all, open_sinks
from engine.metrics import MetricsFile, StageTimer, console_line, first_non_finite
from engine.models.loading import load_tokenizer, resolve_model_path
from engine.rewards.managers import RewardManager, build_reward_manager
from engine.rewards.overlong import dapo_penalties, overlong_metrics
from engine.rewards.retemplate import ChatTemplateSwitch, RewardLoopPrompts
from engine.run_errors import NonFiniteError
from engine.startup import StartupClock, last_ranks_pieces, step_one_note
from engine.validation import (
    load_validation_dataset,
    pick_generations,
    run_validation,
    should_validate,
    validation_schedule,
)
from engine.workers.cluster.profiling import profiled_step
from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
from engine.workers.roles.critic import CriticWorker
from engine.workers.roles.reward_model import RewardModelWorker
from engine.workers.roles.rollout import RolloutWorker
from engine.workers.roles.served_reward_model import ServedRewardModelWorker
from rlconf.resolved import ResolvedPlan


@dataclass
class Trainer:
    resolved: ResolvedPlan
    group: Any  # RayWorkerGroup or LocalWorkerGroup
    tokenizer: Any
    dataset: PromptDataset
    order: BatchOrder
    total_steps: int
    reward_manager: RewardManager  # reward_model.reward_manager over the plan's scorer
    metrics_file: MetricsFile
    log: Callable[[str], None] = print
    history: list[dict[str, Any]] = field(default_factory=list)
    critic_group: Any = None  # the critic's workers (GAE plans), a group with its own process group
    rm_group: Any = None  # the reward model's workers (reward_model.enable): FSDP ranks, or served replicas
    # Rows re-rendered for the reward model: reward_model.model.input_tokenizer (FSDP), or a served reward model
    rm_inputs: ChatTemplateSwitch | RewardLoopPrompts | None = None
    kl_controller: FixedKLController | AdaptiveKLController | None = None  # β of algorithm.use_kl_in_reward
    profile_dir: Path | None = None  # where trainer.profile_steps traces go (engine.workers.cluster.profiling)
    sinks: list[MetricSink] = field(default_factory=list)  # trainer.logger's tensorboard / wandb (engine.loggers)
    val_dataset: PromptDataset | None = None  # data.val_files, when the plan validates (engine.validation)
    run_dir: Path | None = None  # checkpoints go to run_dir/checkpoints (engine.checkpoint); None: no checkpoints
    start_step: int = 0  # the last step already trained: set by load_checkpoint when a run resumes
    startup: StartupClock | None = None  # the launch's start-up phases, reported with the run's first step
    # hybrid_engine false (one-step off-policy): the rollout pool that generates ahead, and the batches in flight
    rollout_pool: RolloutPool | None = None
    queue: GenerationQueue | None = None
    stream: GroupStream | None = None  # fully async (an async_training section): the pool streams groups

    @property
    def stages(self) -> StepStages:
        """The step's stages over this trainer's worker groups, scorer and KL controller."""
        return StepStages(self.resolved, self.group, self.critic_group, self.reward_manager, self._decode,
                          self.kl_controller, self.rm_group, self.rm_inputs)

    def train(self, on_step: Callable[[int], None] = lambda step: None) -> None:
        # A resumed run already has its step-0 line, and validating again would draw sampling RNG.
        # stop_point: where a Ctrl-C stops the run (engine.interrupt), after each stage; a step stopped
        # part-way is neither published nor checkpointed, and a checkpoint in progress completes first.
        if self.val_dataset is not None and self.resolved.config.trainer.val_before_train and self.start_step == 0:
            self.publish(0, {"step": 0, **self.validate(0)})  # the initial policy, as a step-0 line
            stop_point("validation before training")
        if self.stream is None and self.queue is not None and not self.queue and self.start_step < self.total_steps:
            # The first batch of the off-policy schedule: generated by the weights training starts from.
            if self.rollout_pool.version != self.start_step:
                self.rollout_pool.push(self.group, self.start_step)
            self.queue.put(self.rollout_pool.submit(self.draw_samples(self.start_step + 1)))
        for step in range(self.start_step + 1, self.total_steps + 1):
            first = step == self.start_step + 1 and self.startup is not None
            if first:
                self.log(f"start-up: step {step} begins{step_one_note(self.resolved)}")
            with profiled_step(self._worker_groups() + ([self.rm_group] if self.rm_group is not None else []),
                               self.profile_dir, step,
                               self.resolved.config.trainer.profile_steps):
                metrics = self.step(step)
            if first:  # the command's start to this step's metrics line, phase by phase
                startup = self.startup.metrics()
                metrics.update(startup)
                self.log(self.startup.summary(startup, metrics["timing/step"]))
            if self.val_dataset is not None and should_validate(step, self.total_steps,
                                                                self.resolved.config.trainer.test_freq):
                metrics.update(self.validate(step))
                stop_point(f"validation (step {step})")
            self.history.append(metrics)
            self.publish(step, metrics)
            bad = first_non_finite(metrics, ("actor/pg_loss", "actor/loss", "actor/grad_norm", "critic/vf_loss",
                                             "critic/grad_norm"))
            if bad is not None:
                raise NonFiniteError(f"step {step}: {bad} is {metrics[bad]} (non-finite); stopping the run")
            if self.run_dir is not None and should_save(step, self.total_steps, self.resolved.config.trainer.save_freq):
                self.save_checkpoint(step)
                stop_point(f"the checkpoint of step {step}")
            on_step(step)
            stop_point(f"step {step}")

    def publish(self, step: int, metrics: dict[str, Any]) -> None:
        """metrics.jsonl and every trainer.logger sink get the step's metrics; `console` prints its line."""
        for sink in (self.metrics_file, *self.sinks):
            sink.write(step, metrics)
        if "console" in self.resolved.config.trainer.logger:
            self.log(console_line(step, self.total_steps, metrics))

    def validate(self, step: int = 0) -> dict[str, float]:
        """val/* metrics of the current policy on data.val_files (rollout.val_kwargs sampling).

        With trainer.log_val_generations N > 0, N samples go to val_generations.jsonl (one line each,
        with `step`) beside metrics.jsonl, and to the console when trainer.logger has it.
        """
        if self.val_dataset is None:
            raise RuntimeError("validate() called, but the plan has no validation set (data.val_files)")
        count = self.resolved.config.trainer.log_val_generations
        samples: list[tuple[str, str, float]] | None = [] if count > 0 else None
        stages = self.stages
        group = self.group
        if self.rollout_pool is not None:
            # The rollout pool generates: once what is in flight is done, it takes the weights just trained.
            self.queue.complete()
            if self.rollout_pool.version != step:
                (self.stream or self.rollout_pool).push(self.group, step)
            group = self.rollout_pool.group
        metrics = run_validation(group, self.val_dataset, self._decode,
                                 lambda samples, out: stages.score(samples, out)[1].tolist(), self.resolved,
                                 samples=samples, decode_prompts=self._decode_prompts)
        if samples:
            self._log_generations(step, pick_generations(samples, count))
        # prime's timeouts and errors while validating, apart from the training step's
        metrics.update({f"val/{key}": value for key, value in self.reward_counts().items()})
        return metrics

    def _log_generations(self, step: int, picked: list[tuple[str, str, float]]) -> None:
        path = self.metrics_file.path.parent / VAL_GENERATIONS_FILE
        with path.open("a", encoding="utf-8") as out:
            for prompt, response, score in picked:
                out.write(json.dumps({"step": step, "prompt": prompt, "response": response, "score": score}) + "\n")
        if "console" in self.resolved.config.trainer.logger:
            for prompt, response, score in picked:
                self.log(f"[val step {step}] score={score:g} prompt={prompt!r} response={response!r}")

    def close(self) -> None:
        """Flush and close metrics.jsonl and the logger sinks (each, even if another fails)."""
        close_all([self.metrics_file, *self.sinks])

    def step(self, step: int) -> dict[str, Any]:
        """One step: synchronous (colocated), or one-step off-policy when rollout has a pool of its own."""
        timer = StageTimer(after=lambda stage: stop_point(f"{stage} (step {step})"))
        step_start = time.perf_counter()
        if self.stream is not None:
            return self._fully_async_step(step, timer, step_start)
        if self.rollout_pool is not None:
            return self._off_policy_step(step, timer, step_start)

        with timer.stage("data"):
            samples = self.draw_samples(step)

        with timer.stage("generate"):
            batch = self.stages.generate(samples.prompts)
        return self.train_on(step, samples, batch, timer, step_start)

    def _off_policy_step(self, step: int, timer: StageTimer, step_start: float) -> dict[str, Any]:
        """verl's one-step off-policy step: take the batch the rollout pool generated (waiting for it if need be),
        give the pool the weights this step starts from, start it on the next step's prompts, and train on the
        taken batch while it generates (engine.controller.offpolicy)."""
        with timer.stage("wait_rollout"):  # the trainer's idle time: the rollout pool was slower
            generated = self.queue.take()
        if self.rollout_pool.version != step - 1:
            with timer.stage("weight_sync"):
                self.rollout_pool.push(self.group, step - 1)
        if step < self.total_steps:
            with timer.stage("data"):
                self.queue.put(self.rollout_pool.submit(self.draw_samples(step + 1)))
        metrics = self.train_on(step, generated.samples, generated.rows, timer, step_start, own_rollout=False)
        metrics.update({
            "offpolicy/generation_version": generated.version,
            "offpolicy/staleness": step - 1 - generated.version,
            "timing/rollout_idle": generated.idle_seconds,
            "timing/rollout_generate": generated.generate_seconds,
            **rollout_backend_metrics(generated.backend),
            **self.rollout_pool.timings(),
        })
        return metrics

    def _fully_async_step(self, step: int, timer: StageTimer, step_start: float) -> dict[str, Any]:
        """verl's fully async step: give the pool the weights due (every trigger_parameter_sync_step steps), keep it
        generating within the staleness bound, take groups_per_step groups (waiting if the pool is behind) and train
        on them while it goes on (engine.controller.fully_async)."""
        version = self.stream.sync_due(step)
        if version is not None:
            with timer.stage("wait_rollout"):  # the push waits for the pool's calls (cut at once: partial rollouts)
                self.stream.drain()
            with timer.stage("weight_sync"):
                self.stream.push(self.group, version)
        with timer.stage("data"):
            self.stream.refill()
        with timer.stage("wait_rollout"):  # the trainer's idle time: the pool was behind
            taken = self.stream.take(step)
        with timer.stage("data"):
            self.stream.refill()
        samples, rows = merge(taken)
        metrics = self.train_on(step, samples, rows, timer, step_start, own_rollout=False)
        metrics.update({**staleness_metrics(step, taken, self.stream), **self.rollout_pool.timings(),
                        **rollout_backend_metrics(backend_per_rank(taken))})
        return metrics

    def train_on(self, step: int, samples: StepInputs, batch: TensorBatch, timer: StageTimer, step_start: float,
                 own_rollout: bool = True) -> dict[str, Any]:
        """Everything after generation: reward, log-probs, values, advantages, updates, metrics.

        `own_rollout` False (off-policy): the rollout is another pool's, so the new weights are not pushed
        into the actor's own copy, which it does not have.
        """
        roles, config, stages = self.resolved.roles, self.resolved.config, self.stages

        with timer.stage("reward"):
            scores, scores_t = stages.score(samples, batch)

        sampling_metrics: dict[str, float] = {}
        if config.algorithm.filter_groups.enable:
            with timer.stage("filter_groups"):
                samples, batch, scores_t, sampling_metrics = stages.filter_groups(
                    (samples, batch, scores, scores_t), lambda: self.draw_samples(step),
                    first_group_id=step * config.data.train_batch_size)
        overlong = {}
        penalties = dapo_penalties(config.reward_model, batch["response_mask"].sum(-1))
        if penalties is not None and config.reward_model.reward_kwargs.overlong_buffer_cfg.log:
            overlong = overlong_metrics(penalties)

        reward_baselines = None
        if config.algorithm.adv_estimator == "remax":
            with timer.stage("gen_max"):
                reward_baselines = stages.greedy_baselines(samples)
        scorer_counts = self.reward_counts()

        rollout_metrics: dict[str, float] = {}
        entropy_metric: dict[str, float] = {}
        source = roles.rollout.old_log_probs
        if source == "rollout":  # bypass mode: π_rollout is π_old (a KL in the reward reads it too, as in verl)
            batch["old_log_probs"] = batch["rollout_log_probs"]
        elif source == "recompute":
            with timer.stage("old_log_prob"):
                fields, rollout_metrics, entropy_metric = stages.old_log_probs(batch)
                batch.update(fields)
        # "update": the actor's update measures π_old's entropy, gap and IS weights on its first pass.

        if roles.ref is not None:
            with timer.stage("ref"):
                batch.update(stages.ref_log_probs(batch))

        if self.critic_group is not None:
            with timer.stage("values"):
                batch.update(stages.values(batch))

        with timer.stage("adv"):
            fields, advantage_metrics = stages.advantages(samples, batch, scores_t, reward_baselines)
            batch.update(fields)

        critic_metrics: dict[str, float] = {}
        if self.critic_group is not None:
            with timer.stage("update_critic"):
                critic_metrics = stages.update_critic(batch)

        actor_metrics: dict[str, float] = {}
        # During the critic warmup the policy stays put, so the critic first learns the values of a fixed policy.
        if self.critic_group is None or step > config.trainer.critic_warmup:
            with timer.stage("update_actor"):
                actor_metrics = stages.update_actor(batch)

            if own_rollout:
                with timer.stage("weight_sync"):
                    actor_metrics.update(stages.sync_weights())
        if own_rollout:
            rollout_metrics.update(stages.rollout_timings())
        if roles.served_reward_model is not None:
            rollout_metrics.update(stages.served_reward_model_timings())

        step_seconds = time.perf_counter() - step_start
        # From the attention mask, as verl: rollout_rs may have taken rejected tokens out of the response mask.
        response_lengths = batch["attention_mask"][:, -batch["responses"].shape[1]:].sum(-1).float()
        tokens = int(batch["attention_mask"].sum())
        return {
            "step": step,
            "epoch": self.order.epoch,
            "reward/mean": float(scores_t.mean()),
            "reward/max": float(scores_t.max()),
            "reward/full_credit_fraction": float((scores_t >= 1.0).float().mean()),
            **overlong,
            **scorer_counts,
            **sampling_metrics,
            "response_length/mean": float(response_lengths.mean()),
            "response_length/clip_fraction": float((response_lengths >= roles.rollout.response_length).float().mean()),
            **entropy_metric,
            "perf/tokens": tokens,
            "perf/tokens_per_second": tokens / step_seconds,
            "perf/tokens_per_second_per_gpu": tokens / step_seconds / self.resolved.schedule.total_gpus,
            **rollout_metrics,
            **advantage_metrics,
            **critic_metrics,
            **actor_metrics,
            **timer.as_metrics(),
            "timing/step": step_seconds,
        }

    def reward_counts(self) -> dict[str, float]:
        """Counted since the last call: prime's scorer timeouts and errors, the reward model's rows cut at max_length."""
        counts = self.reward_manager.take_metrics()
        if isinstance(self.rm_inputs, ChatTemplateSwitch):  # a served reward model cuts nothing (vLLM refuses)
            counts.update(self.rm_inputs.take_metrics())
        return counts

    def draw_samples(self, step: int) -> StepInputs:
        """The next generation batch of prompts, n samples each (the data order advances)."""
        return expand_samples(self.dataset.collate(self.order.next_indices()), self.resolved.roles.rollout.n, step)

    def _worker_groups(self) -> list[Any]:
        """Every worker group of the run (the actor's, then the critic's): for profiles and checkpoints."""
        return [group for group in (self.group, self.critic_group) if group is not None]

    # --- checkpoints (engine.checkpoint: layout and atomic commit; workers save their own shards) ------

    def controller_state(self) -> dict[str, Any]:
        """What the controller holds that a resume needs, as JSON (its RNG streams are saved beside it)."""
        return {
            "data_order": self.order.state_dict(),
            "history_length": len(self.history),
            "kl_coef": None if self.kl_controller is None else self.kl_controller.value,
            **({} if self.stream is None else {"group_stream": self.stream.counters()}),
        }

    def load_controller_state(self, state: dict[str, Any]) -> None:
        try:
            self.order.load_state_dict(state["data_order"])
        except ValueError as exc:  # another seed, batch size or dataset: a message for people, not a traceback
            raise CheckpointError(str(exc)) from None
        if self.kl_controller is not None and state.get("kl_coef") is not None:
            self.kl_controller.value = float(state["kl_coef"])

    def save_checkpoint(self, step: int) -> Path:
        if self.run_dir is None:
            raise RuntimeError("save_checkpoint() called, but the trainer has no run directory")
        started = time.perf_counter()
        trainer_cfg = self.resolved.config.trainer
        keep = {"actor": trainer_cfg.max_actor_ckpt_to_keep, "critic": trainer_cfg.max_critic_ckpt_to_keep}
        groups, files = self._worker_groups(), {}
        if self.rollout_pool is not None:
            # What the pool is generating goes into the checkpoint, done: a resume trains it, neither lost nor redone.
            files[PENDING_FILE] = (pending_state(self.queue.complete()) if self.stream is None
                                   else self.stream.file_state())
            groups = [*groups, self.rollout_pool.group]
        path = save_checkpoint(self.run_dir, step, groups, self.controller_state(), keep, self.tokenizer,
                               controller_files=files)
        self.log(f"checkpoint: {path} ({time.perf_counter() - started:.1f}s)")
        return path

    def load_checkpoint(self, step_dir: Path) -> dict[str, Any]:
        """Continue after the checkpoint's step: workers load their shards, the controller its state.

        Returns the checkpoint's trainer_state.json.
        """
        groups = self._worker_groups() + ([self.rollout_pool.group] if self.rollout_pool is not None else [])
        state, notes = load_checkpoint(step_dir, groups, self.resolved)
        written_fully_async = "group_stream" in state["controller"]
        if written_fully_async != (self.stream is not None):
            raise CheckpointError(
                f"{step_dir} was written by a run {'with' if written_fully_async else 'without'} the fully async "
                f"schedule, and this plan runs {self.resolved.schedule.mode.replace('_', ' ')}: the batches in "
                "flight at the checkpoint are kept differently; resume with the schedule of the run that wrote it "
                "(the async_training section as it was)")
        self.load_controller_state(state["controller"])
        self.start_step = int(state["step"])
        if self.rollout_pool is not None:
            self.rollout_pool.version = None  # its weights are the model file's until the next push
            pending = step_dir / PENDING_FILE
            saved = torch.load(pending, weights_only=True) if pending.is_file() else None
            if self.stream is not None:
                self.stream.load(state["controller"]["group_stream"], saved)
                self.queue = self.stream.queue
            else:
                self.queue = GenerationQueue(self.queue.capacity)
                for generated in load_pending(saved, self.resolved.roles.rollout.log_probs) if saved is not None else []:
                    self.queue.put(generated)
        for note in notes:
            self.log(f"note: {note}")
        return state

    def export_final(self, out_dir: Path) -> Path:
        """The end of training: every trained model's optimizer states go (on the device and in their host copies;
        no step, no checkpoint may follow), then the actor is written as a HF model directory
        (`AutoModelForCausalLM.from_pretrained` loads it), its full weights gathered in the memory they held."""
        for group in self._worker_groups():
            group.call_all("release_optimizer")
        return export_hf_model(self.group, "actor", self.tokenizer, out_dir)

    def _decode_prompts(self, prompts: TensorBatch) -> list[str]:
        return decode_prompts(self.tokenizer, prompts)

    def _decode(self, batch: TensorBatch) -> list[str]:
        return decode_responses(self.tokenizer, batch)


def total_training_steps(resolved: ResolvedPlan, batches_per_epoch: int) -> int:
    trainer = resolved.config.trainer
    return trainer.total_training_steps or trainer.total_epochs * batches_per_epoch


def describe_workers(role: str, infos: list[dict[str, Any]]) -> str:
    """One launch-log line per worker group: how many ranks, where, which backend and precision."""
    first = infos[0]
    return (f"{role}: {len(infos)} worker(s) on {first['device']} ({first['backend']}), {first['params'] / 1e6:.1f}M "
            f"parameters in {first['param_dtype'].removeprefix('torch.')}, computing in "
            f"{first['compute_dtype'].removeprefix('torch.')}")


def chat_template_switch(resolved: ResolvedPlan) -> ChatTemplateSwitch | None:
    """reward_model.model.input_tokenizer: the policy's rows re-rendered in the reward model's chat template (verl's
    reward model worker), cut at reward_model.max_length (verl's default: the policy's prompt + response width)."""
    rm = resolved.config.reward_model
    if resolved.roles.reward_model is None or not rm.model.input_tokenizer:
        return None
    rollout = resolved.roles.rollout
    trust = bool(rm.model.trust_remote_code)
    return ChatTemplateSwitch(load_tokenizer(resolve_model_path(rm.model.input_tokenizer), trust_remote_code=trust),
                              load_tokenizer(resolve_model_path(rm.model.path), trust_remote_code=trust),
                              rm.max_length or rollout.prompt_length + rollout.response_length)


def reward_model_inputs(resolved: ResolvedPlan, policy_tokenizer: Any) -> ChatTemplateSwitch | RewardLoopPrompts | None:
    """How the reward model reads the policy's rows: re-rendered as texts for a served one (verl's reward loop,
    which decodes with the policy's tokenizer whatever input_tokenizer says), re-rendered and re-tokenized
    for the FSDP worker with input_tokenizer, or (None) as the policy's own token ids."""
    if resolved.roles.served_reward_model is not None:
        rm = resolved.config.reward_model
        return RewardLoopPrompts(policy_tokenizer, load_tokenizer(resolve_model_path(rm.model.path),
                                                                  trust_remote_code=bool(rm.model.trust_remote_code)))
    return chat_template_switch(resolved)


def begin(group: Any, method: str, *args: Any) -> Callable[[], list[Any]]:
    """Start `method` on every rank of `group`; the returned function waits for the results. A Ray group runs it
    meanwhile; the in-process group (LocalWorkerGroup) runs it when its results are asked for."""
    if hasattr(group, "submit_all"):
        refs = group.submit_all(method, *args)
        return lambda: group.collect(refs)
    return lambda: group.call_all(method, *args)


# Loading models at the same time is allowed while their host copies take at most this share of the memory
# available on the launch's node (every rank reads its model into host memory before sharding it onto its GPU).
HOST_LOAD_SHARE = 0.5


def host_available_bytes() -> int | None:
    """MemAvailable of this node (Linux), None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def load_together_fits(loads: list[tuple[Path, int]], available: int | None) -> bool:
    """Whether roles may load at the same time: (model directory, its ranks on one node) for each; a rank's host
    copy counted as twice its weight files (fp32 from bf16 checkpoints), summed, within HOST_LOAD_SHARE of
    `available`. Unknown memory: no."""
    if available is None:
        return False
    def weight_bytes(path: Path) -> int:
        files = [f for pattern in ("*.safetensors", "*.bin", "*.pt") for f in path.glob(pattern)] if path.is_dir() else []
        return sum(f.stat().st_size for f in files)
    return sum(2 * weight_bytes(path) * ranks for path, ranks in loads) <= HOST_LOAD_SHARE * available


def build_trainer(resolved: ResolvedPlan, run_dir: Path, group_factory: Callable[..., Any],
                  log: Callable[[str], None] = print, startup: StartupClock | None = None) -> Trainer:
    """Prepare model files, data and workers. `group_factory(worker_cls, role, world_size, **kwargs)`.

    `startup`: the launch's clock; each phase below is announced as it begins and timed.
    """
    clock = StartupClock() if startup is None else startup
    plan = resolved.config
    arr = plan.actor_rollout_ref
    with clock.phase("model_files", "preparing the model files and the tokenizer"):
        model_path = resolve_model_path(arr.model.path)
        tokenizer = load_tokenizer(resolve_model_path(arr.model.tokenizer_path or plan.data.tokenizer or arr.model.path),
                                   arr.model.custom_chat_template, arr.model.trust_remote_code)
    stop_point("preparing the model files")
    with clock.phase("data", "reading the training data"):
        files = resolve_data_files(plan.data.train_files, run_dir, "train")
        dataset = PromptDataset(read_rows(files), tokenizer, resolved.roles.rollout.prompt_length, plan.data.truncation,
                                plan.data.prompt_key, plan.data.reward_fn_key, plan.data.filter_overlong_prompts)
        # verl batches its train dataloader by the generation batch, and counts a step per batch of it.
        order = BatchOrder(len(dataset), resolved.roles.rollout.prompts_per_generation, plan.data.seed,
                           plan.data.shuffle)
        total = total_training_steps(resolved, order.batches_per_epoch)
        # Loaded before any worker is built (they are only spawned yet), so a missing or unreadable validation
        # file fails fast.
        val_dataset = load_validation_dataset(resolved, run_dir, tokenizer)
    stop_point("reading the training data")
    log(f"data: {len(dataset)} prompts from {', '.join(str(f) for f in files)}; "
        f"{order.batches_per_epoch} steps per epoch (generation batches of {order.batch_size} prompts); "
        f"training {total} steps")
    if val_dataset is not None:
        log(f"validation: {len(val_dataset)} prompts, {validation_schedule(plan.trainer, total)}")
    actor = resolved.roles.actor
    rm = resolved.roles.reward_model
    critic_path = resolve_model_path(plan.critic.model.path or arr.model.path) if resolved.roles.critic else None
    rm_path = resolve_model_path(plan.reward_model.model.path) if rm is not None else None

    def start_critic() -> tuple[Any, Callable[[], list[Any]]]:
        critic = group_factory(CriticWorker, CriticWorker.ROLE, resolved.roles.critic.world_size, resolved=resolved,
                               model_path=str(critic_path), total_training_steps=total)
        return critic, begin(critic, "init_model")

    def start_reward_model() -> tuple[Any, Callable[[], list[Any]]]:
        scorer = group_factory(RewardModelWorker, RewardModelWorker.ROLE, rm.world_size, resolved=resolved,
                               model_path=str(rm_path), plan_model_path=plan.reward_model.model.path)
        return scorer, begin(scorer, "init_model")

    def start_rollout_pool() -> tuple[Any, Callable[[], list[Any]]]:
        pool = group_factory(RolloutWorker, RolloutWorker.ROLE, resolved.schedule.rollout_gpus, resolved=resolved,
                             model_path=str(model_path), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
        return pool, begin(pool, "init_model")

    served = resolved.roles.served_reward_model

    def start_served_reward_model() -> tuple[Any, Callable[[], list[Any]]]:
        scorer = group_factory(ServedRewardModelWorker, ServedRewardModelWorker.ROLE, served.replicas,
                               resolved=resolved, model_path=str(resolve_model_path(plan.reward_model.model.path)))
        return scorer, begin(scorer, "init_model")

    # The critic and the FSDP reward model load in their own processes while the actor loads (each phase below
    # is then what was left of it), all before the rollout engine starts, so that vLLM's free-memory check and
    # profiling see every resident of its GPU. One after another where their host copies together would not fit
    # the node's memory (a 7B actor, critic and reward model on 8 ranks each hold ~670 GB at once).
    per_node = plan.trainer.n_gpus_per_node
    available = host_available_bytes()
    others = [(path, min(role.world_size, per_node)) for path, role in ((critic_path, resolved.roles.critic),
                                                                        (rm_path, rm)) if path is not None]
    together = bool(others) and load_together_fits([(model_path, min(actor.world_size, per_node)), *others],
                                                   available)
    # Engines on GPUs of their own (the off-policy rollout pool, a served reward model's own pool) share no GPU
    # with a model still to load, so their start — vLLM's is the longest part of start-up — runs while the actor
    # loads. A vLLM engine reads its weights from the files onto its GPU; HF rollout holds a host copy, counted.
    # An HF pool still loading when a critic or reward model that did not fit beside the actor loads next is
    # counted against them all.
    pool_apart = resolved.schedule.off_policy
    if pool_apart and arr.rollout.name == "hf":
        pool_per_node = resolved.placement.pools[resolved.roles.rollout.pool].gpus_per_node
        pool_apart = load_together_fits([(model_path, min(actor.world_size, per_node)), *others,
                                         (model_path, min(resolved.schedule.rollout_gpus, pool_per_node))], available)
    served_apart = served is not None and not served.colocated
    critic_group = rm_group = rollout_group = served_group = None
    beside = [name for name, path in (("the critic's", critic_path), ("the reward model's", rm_path))
              if path and together]
    pool_model = "the rollout pool's engine" if arr.rollout.name == "vllm" else "the rollout pool's model"
    beside += [pool_model] * pool_apart + ["the served reward model's engine"] * served_apart
    with clock.phase("actor_load", f"loading the actor model on {actor.world_size} worker(s) ({resolved.world.device})"
                                   + (f", {' and '.join(beside)} beside it" if beside else "")):
        # The actor's pool may be smaller than the cluster when `placement` gives the critic GPUs of its own.
        created_at = time.time()
        group = group_factory(ActorRolloutRefWorker, ActorRolloutRefWorker.ROLE, actor.world_size,
                              resolved=resolved, model_path=str(model_path), total_training_steps=total,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        actor_loaded = begin(group, "init_model", False)
        if together and critic_path is not None:
            critic_group, critic_loaded = start_critic()
        if together and rm_path is not None:
            rm_group, rm_loaded = start_reward_model()
        if pool_apart:
            rollout_group, rollout_loaded = start_rollout_pool()
        if served_apart:
            served_group, served_loaded = start_served_reward_model()
        infos = actor_loaded()
    clock.actor_pieces = last_ranks_pieces(infos, created_at)
    log(describe_workers("actor", infos))
    stop_point("loading the actor model")
    if critic_path is not None:
        with clock.phase("critic_load", f"loading the critic model on {resolved.roles.critic.world_size} worker(s)"):
            if critic_group is None:
                critic_group, critic_loaded = start_critic()
            infos = critic_loaded()
        log(describe_workers("critic", infos))
        stop_point("loading the critic model")
    if rm_path is not None:
        with clock.phase("reward_model_load", f"loading the reward model on {rm.world_size} worker(s)"):
            if rm_group is None:
                rm_group, rm_loaded = start_reward_model()
            infos = rm_loaded()
        log(describe_workers("reward model", infos))
        stop_point("loading the reward model")
    if arr.rollout.name != "hf" and not resolved.schedule.off_policy:  # HF generate: a copy init_model already took
        with clock.phase("rollout_engine", f"starting the rollout engine ({arr.rollout.name}) on "
                                           f"{actor.world_size} worker(s)"):
            group.call_all("start_rollout")
        stop_point("starting the rollout engine")
    rollout_pool = queue = None
    if resolved.schedule.off_policy:
        sched = resolved.schedule
        with clock.phase("rollout_load", f"loading the rollout model on {sched.rollout_gpus} worker(s) of pool "
                                        f"`{resolved.roles.rollout.pool}` and joining the weight group ({sched.weight_sync})"):
            if rollout_group is None:
                rollout_group, rollout_loaded = start_rollout_pool()
            infos = rollout_loaded()
            pool_class = StreamingPool if resolved.schedule.fully_async else RolloutPool
            rollout_pool = pool_class(resolved, rollout_group, Dispatch(plan.trainer.balance_batch))
            tensors = rollout_pool.connect(group)
        log(describe_workers("rollout", infos) + f"; {tensors} tensors per weight push, trainer → rollout over "
            f"{sched.weight_sync}")
        queue = GenerationQueue(sched.max_staleness)
        stop_point("loading the rollout model")
    if served is not None:
        # A colocated engine starts last of all: its free-memory check must see the actor's, its asleep rollout
        # engine's and the critic's memory, the residents it will share each GPU with.
        where = "colocated with the actor" if served.colocated else f"on its own pool `{served.pool}`"
        with clock.phase("reward_model_load", f"starting the served reward model ({served.backend}) on "
                                              f"{served.replicas} replica(s), {where}"):
            if served_group is None:
                served_group, served_loaded = start_served_reward_model()
            rm_group = served_group
            infos = served_loaded()
        log(f"reward model: served by {served.backend}, {len(infos)} replica(s) of tp {served.tensor_parallel_size} "
            f"on {infos[0]['device']} {where}, gpu_memory_utilization {served.gpu_memory_utilization}"
            f"{', asleep except while it scores' if infos[0]['sleeps'] else ''}; engine started in "
            f"{max(info['start_seconds'] for info in infos):.1f}s")
        stop_point("starting the served reward model")
    rm_inputs = reward_model_inputs(resolved, tokenizer)
    kl_controller = build_kl_controller(plan.algorithm.kl_ctrl) if plan.algorithm.use_kl_in_reward else None
    trainer = Trainer(resolved, group, tokenizer, dataset, order, total,
                   build_reward_manager(plan.reward_model, plan.custom_reward_function, log),
                   MetricsFile(run_dir / "metrics.jsonl"), log, critic_group=critic_group, kl_controller=kl_controller,
                   sinks=open_sinks(resolved, run_dir), val_dataset=val_dataset, profile_dir=run_dir / "profile",
                   startup=startup, rm_group=rm_group, rm_inputs=rm_inputs, rollout_pool=rollout_pool, queue=queue)
    if resolved.schedule.fully_async:
        trainer.stream = GroupStream(resolved, rollout_pool, trainer.draw_samples, total)
        trainer.queue = trainer.stream.queue
    return trainer
