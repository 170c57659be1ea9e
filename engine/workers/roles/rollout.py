"""A rollout worker on a pool of its own (hybrid_engine false: verl's one-step off-policy layout).

It holds a rollout backend and nothing that trains: HF generate's plain copy of the model (CPU
included) or vLLM, started from the model path and kept awake between batches (nothing else uses
these GPUs, so free_cache_engine does not apply). New weights arrive from actor rank 0 over the
trainer → rollout group (engine.workers.cluster.weight_sync), tagged with the version they are:
the number of training steps behind them. Each generated batch is answered with the version that
generated it, and the worker's own clock says how long it sat idle waiting for the trainer.

Checkpoints hold this worker's random streams (sampling draws from them) and its weight version;
its weights are the actor's, pushed again after a resume.

Partial rollouts (fully async, async_training.partial_rollout): `interrupt` runs in the actor's control thread
(engine.workers.cluster.group, concurrency group "control") while a generation runs in the thread of its other
calls; the generation
then ends where it is, and so do the calls queued behind it, until the next weights arrive. Each answer then says
how many tokens each row has and which rows are unfinished; `generate` with a `prefix` finishes them
(engine.rollout.partial).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.batch import TensorBatch, select
from engine.models.loading import load_causal_lm, quiet_progress_bars, torch_dtype
from engine.rollout.base import RolloutBackend, Sampling, add_backend_timings, assemble_rows
from engine.rollout.partial import continuation_prompts, join, unfinished
from engine.workers.cluster.device import join_process_group, worker_device
from engine.workers.cluster.weight_sync import Bucket, TensorInfo, open_weight_group, plan_buckets, receive_weights
from engine.workers.fsdp.checkpointing import capture_rng_state, restore_rng_state, save_torch_file
from rlconf.resolved import ResolvedPlan

CHECKPOINT_SUBDIR = "rollout"  # <step dir>/rollout/state_rank_<r>.pt


def state_file(step_dir: str | Path, rank: int) -> Path:
    return Path(step_dir) / CHECKPOINT_SUBDIR / f"state_rank_{rank}.pt"


class RolloutWorker:
    ROLE = "rollout"

    def __init__(self, resolved: ResolvedPlan, model_path: str, rank: int, world_size: int, pad_token_id: int,
                 eos_token_id: int, num_threads: int = 1) -> None:
        self.resolved, self.rank, self.world_size = resolved, rank, world_size
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self._model_path = model_path
        torch.set_num_threads(num_threads)
        quiet_progress_bars()
        self.version = 0  # training steps behind the weights this worker samples with
        self._buckets: list[Bucket] = []
        self._weight_group: dist.ProcessGroup | None = None
        self._last_end: float | None = None  # when the last generation ended (this worker's clock)
        self._receiving = 0.0  # seconds spent taking weights since then: busy, not idle
        self._partial = resolved.schedule.partial_rollout
        self._interrupted = threading.Event()  # set by `interrupt`, cleared when the next weights arrive
        self._carried: dict[str, float] = {}  # backend seconds before a validation: the next training call's

    def init_model(self) -> dict[str, Any]:
        """Join the rollout pool's own process group (vLLM's tensor parallelism runs in it), build the backend."""
        plan = self.resolved.config
        rollout = plan.actor_rollout_ref.rollout
        self.device = worker_device(self.resolved.world.device)
        join_process_group(self.device, self.rank, self.world_size)
        dtype = torch_dtype(rollout.dtype)
        tp = self.resolved.roles.rollout.tensor_parallel_size
        # The seeds of the colocated actor rank with the same index: one rollout rank samples as rank 0 would.
        seed = rollout.seed + plan.trainer.seed * 1000 + (self.rank // tp if rollout.name == "vllm" else self.rank)
        if rollout.name == "hf":
            from engine.rollout.hf import HFRollout

            torch.manual_seed(plan.trainer.seed)  # the model's random init (tiny://, random://) matches the actor's
            model = load_causal_lm(self._model_path, plan.actor_rollout_ref.model.override_config,
                                   plan.actor_rollout_ref.model.trust_remote_code)
            self.backend: RolloutBackend = HFRollout(model, self.device, dtype, self.pad_token_id, self.eos_token_id)
            params = self.backend.num_params()
        else:
            from engine.rollout.vllm import VLLMRollout

            kept = rollout.model_copy(update={"free_cache_engine": False})  # nothing else needs these GPUs
            self.backend = VLLMRollout(self._model_path, kept, self.resolved.roles.rollout.max_model_len, tp, seed,
                                       self.eos_token_id, self.pad_token_id,
                                       plan.actor_rollout_ref.model.trust_remote_code)
            params = self.backend.num_params()
        torch.manual_seed(seed)
        return {"rank": self.rank, "params": params, "device": str(self.device), "backend": dist.get_backend(),
                "param_dtype": str(dtype), "compute_dtype": str(dtype), "rollout": rollout.name,
                "rollout_dtype": str(dtype)}

    # --- weights ------------------------------------------------------------------------------

    def join_weight_group(self, master_addr: str, master_port: int, infos: list[TensorInfo]) -> None:
        """Rank r + 1 of the trainer → rollout group; `infos`: the actor's tensors, in the order it sends them."""
        bucket_bytes = self.resolved.schedule.bucket_megabytes * 2**20
        self._buckets = plan_buckets([TensorInfo(*info) for info in infos], bucket_bytes)
        self._weight_group = open_weight_group(self.device, self.rank + 1, self.world_size + 1, master_addr,
                                               master_port)

    def receive_weights(self, version: int) -> float:
        """Take the weights actor rank 0 broadcasts (a collective with it); returns the seconds it took."""
        started = time.perf_counter()
        self._interrupted.clear()  # the calls interrupted before this push have all answered (they ran before it)
        self.backend.load_weights(receive_weights(self._weight_group, self._buckets, self.device))
        self.version = version
        seconds = time.perf_counter() - started
        self._receiving += seconds
        return seconds

    # --- generation ---------------------------------------------------------------------------

    def interrupt(self) -> bool:
        """Partial rollouts: end the generation running now, and those queued behind it, where they are (called in
        the control thread while `generate` runs; the next `receive_weights` clears it)."""
        self._interrupted.set()
        return True

    def _begin_call(self) -> tuple[float, float, Sampling]:
        """A generation call begins: its start, the seconds this worker sat idle before it (waiting for the trainer,
        weights received excluded) and the plan's sampling."""
        rollout = self.resolved.config.actor_rollout_ref.rollout
        started = time.perf_counter()
        idle = 0.0 if self._last_end is None else started - self._last_end - self._receiving
        self._receiving = 0.0
        roles = self.resolved.roles
        return started, idle, Sampling.from_plan(rollout, rollout.ignore_eos, roles.rollout.response_length,
                                                 log_probs=roles.rollout.log_probs)

    def _cut_rows(self, rows: TensorBatch) -> dict[str, Any]:
        """Partial rollouts: each row's token count and whether a push cut it off (popped from `rows`)."""
        rollout = self.resolved.config.actor_rollout_ref.rollout
        generated, ended = rows.pop("generated_tokens"), rows.pop("ended", None)
        cut = unfinished(rows["responses"], generated, self.eos_token_id, rollout.ignore_eos,
                         self.resolved.roles.rollout.response_length)
        return {"generated_tokens": generated, "unfinished": cut if ended is None else cut & ~ended}

    @torch.no_grad()
    def generate(self, prompts: TensorBatch, prefix: TensorBatch | None = None) -> dict[str, Any]:
        """Rows as the colocated actor's `generate` returns them, with the version that sampled them and the
        seconds this worker sat idle (waiting for the trainer) before they were asked for.

        With partial rollouts the answer also has each row's token count (`generated_tokens`) and whether it is
        `unfinished` (cut off by `interrupt`); `prefix` (`responses`, `rollout_log_probs`, `generated_tokens` of
        rows cut off earlier) makes this call finish those rows on the weights it holds now."""
        started, idle, sampling = self._begin_call()
        if not self._partial:
            rows = self.backend.generate(prompts, sampling)
            extra: dict[str, Any] = {}
        else:
            rows = self._generate_partial(prompts, prefix, sampling)
            extra = self._cut_rows(rows)
        self._last_end = time.perf_counter()
        self._carried, carried = {}, self._carried
        return {"rows": rows, "version": self.version, "generate_seconds": self._last_end - started,
                "idle_seconds": max(idle, 0.0), "backend": add_backend_timings(carried, self.backend.timings()),
                **extra}

    @torch.no_grad()
    def generate_streamed(self, prompts: TensorBatch, window: int) -> Iterator[dict[str, Any]]:
        """Fully async: `prompts` (whole groups of rollout.n rows, fresh) generated with at most `window` groups in
        the engine at once, each group answered as soon as it is done: {"groups": [its indices in `prompts`],
        "rows", "version", "generate_seconds" (since the previous answer), "idle_seconds" (before the call began,
        in the first answer)} (with partial rollouts also `generated_tokens` and `unfinished`; an interrupted
        call's last answer holds every group not finished). Then one answer with the backend's timings of the call:
        {"done": True, "version", "backend"}. Ray streams the answers to the controller as
        they are yielded (engine.controller.fully_async.StreamedCall)."""
        started, idle, sampling = self._begin_call()
        mark = started
        try:
            for groups, rows in self._finished_groups(prompts, sampling, window):
                extra = self._cut_rows(rows) if self._partial else {}
                now = time.perf_counter()
                # Each answer's seconds since the last: a step's groups carry the generation time they took.
                yield {"groups": groups, "rows": rows, "version": self.version, "generate_seconds": now - mark,
                       "idle_seconds": max(idle, 0.0) if mark == started else 0.0, **extra}
                mark = now
        finally:
            self._last_end = time.perf_counter()
        self._carried, carried = {}, self._carried
        # The moments after the last group (these timings' collection) are counted nowhere.
        yield {"done": True, "version": self.version, "backend": add_backend_timings(carried, self.backend.timings())}

    def _finished_groups(self, prompts: TensorBatch, sampling: Sampling,
                         window: int) -> Iterator[tuple[list[int], TensorBatch]]:
        """(group indices, their rows) as groups finish: from the backend's own continuous batching where it has it
        (vLLM), else `window` groups a batch, each batch's groups when it ends (HF generate pads a batch to its
        longest row, so its groups end together)."""
        n = self.resolved.roles.rollout.n
        stop = self._interrupted.is_set if self._partial else None
        stream = getattr(self.backend, "stream_groups", None)
        if stream is not None and not (stop is not None and stop()):
            yield from stream(prompts, sampling, n, window, stop)
            return
        groups = len(prompts["input_ids"]) // n
        for first in range(0, groups, window):
            chosen = list(range(first, min(first + window, groups)))
            part = select(prompts, slice(first * n, (chosen[-1] + 1) * n))
            yield chosen, (self.backend.generate(part, sampling) if not self._partial
                           else self._generate_partial(part, None, sampling))

    def _generate_partial(self, prompts: TensorBatch, prefix: TensorBatch | None, sampling: Sampling) -> TensorBatch:
        """Rows with `generated_tokens`, generated until done or interrupted; with `prefix`, its rows' first tokens
        followed by the rest sampled now (prompt + prefix as the prompt)."""
        length = sampling.max_new_tokens
        rows_in = len(prompts["input_ids"])
        if prefix is None:
            head = torch.zeros((rows_in, length), dtype=torch.long)
            head_lp, head_n = torch.zeros((rows_in, length)), torch.zeros(rows_in, dtype=torch.long)
            asked = prompts
        else:  # rollout_log_probs: absent where the plan's rollout returns none (sampling.log_probs)
            head, head_lp, head_n = prefix["responses"], prefix.get("rollout_log_probs"), prefix["generated_tokens"]
            asked = continuation_prompts(prompts, head, head_n, self.pad_token_id)
        room = length - int(head_n.min()) if rows_in else 0
        if self._interrupted.is_set() or room == 0 or rows_in == 0:  # interrupted before it began: nothing sampled
            rest = torch.full((rows_in, max(room, 1)), self.pad_token_id, dtype=torch.long)
            rest_lp, rest_n = torch.zeros(rest.shape), torch.zeros(rows_in, dtype=torch.long)
            ended = None
        else:
            limits = None if prefix is None else length - head_n  # a resumed row has fewer tokens to go
            out = self.backend.generate(asked, dataclasses.replace(sampling, max_new_tokens=room),
                                        stop=self._interrupted.is_set, row_limits=limits)
            rest, rest_lp, rest_n = out["responses"], out.get("rollout_log_probs"), out["generated_tokens"]
            ended = out.get("ended")  # the backend's own word on which rows ended (vLLM), EOS seen or not
        responses, generated = join(head, head_n, rest, rest_n, length, self.pad_token_id)
        log_probs = join(head_lp, head_n, rest_lp, rest_n, length, 0.0)[0] if sampling.log_probs else None
        rows = assemble_rows(prompts, responses, self.eos_token_id, sampling.ignore_eos, rollout_log_probs=log_probs)
        rows["generated_tokens"] = generated
        if ended is not None:
            rows["ended"] = ended
        return rows

    @torch.no_grad()
    def generate_for_validation(self, prompts: TensorBatch) -> TensorBatch:
        rollout = self.resolved.config.actor_rollout_ref.rollout
        # What the backend timed before (the weights just pushed) goes with the next training call; the
        # validation's own seconds go with none (a step's engine figures are its own batch's).
        self._carried = add_backend_timings(self._carried, self.backend.timings())
        rows = self.backend.generate(prompts, Sampling.from_plan(rollout.val_kwargs, rollout.ignore_eos,
                                                                 self.resolved.roles.rollout.response_length,
                                                                 log_probs=False))
        self.backend.timings()
        self._last_end = time.perf_counter()  # validating is work, not the idle time the next batch reports
        return rows

    # --- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self, step_dir: str) -> dict[str, Any]:
        """This rank's random streams and weight version (its weights are the actor's, in the same checkpoint)."""
        path = state_file(step_dir, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_torch_file({"rng": capture_rng_state(), "version": self.version}, path)
        return {"rank": self.rank, "seconds": {}}

    def load_checkpoint(self, step_dir: str) -> dict[str, Any]:
        path = state_file(step_dir, self.rank)
        if not path.is_file():  # written by a smaller rollout pool: this rank keeps its fresh streams
            return {"rank": self.rank, "rng_restored": False}
        state = torch.load(path, weights_only=True)
        restore_rng_state(state["rng"])
        self.version = int(state["version"])
        return {"rank": self.rank, "rng_restored": True}

    def shutdown(self) -> None:
        if hasattr(getattr(self, "backend", None), "shutdown"):  # vLLM's own processes (`mp`) end here
            self.backend.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()
