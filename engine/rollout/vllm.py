"""vLLM in the actor worker's own process, next to its FSDP2 shard (verl's hybrid engine).

Every rank of the actor's process group builds one `vllm.LLM` with the `external_launcher`
executor: vLLM joins the torch.distributed group the worker already has and cuts it into
tensor-parallel groups of consecutive ranks (ranks r // tp form one replica); the ranks of a
replica get the same prompts and the same seed, so they sample the same tokens, while replicas
sample independently. The engine core runs in this process (no engine subprocess), so new
weights go straight into vLLM's model with `load_weights`, full tensors as the gather yields them.

Memory: with rollout.free_cache_engine the engine sleeps at level 2 after each rollout (KV cache
and weights both released: the actor pushes fresh weights before the next rollout anyway), and
wakes in two steps, weights first (to receive the push), then the KV cache (to generate).

With `rollout.engine_kwargs.vllm.distributed_executor_backend: mp` (tensor parallel size 1) the worker keeps only
vLLM's front end: the engine core and the model runner run in processes of their own on the same GPU (verl's
layout), the weights cross by CUDA IPC (engine.rollout.vllm_processes), and sleep, wake and the memory account go
over vLLM's RPC.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import os
import time
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from engine import triton_cache
from engine.rollout.base import Sampling, assemble_rows, prompt_token_lists
from engine.batch import TensorBatch
from engine.rank_timeline import TIMELINE, step_time_summary

GIB = 1024**3
IN_PROCESS = "external_launcher"
OWN_PROCESSES = "mp"


class RolloutSetupError(RuntimeError):
    """The plan's rollout cannot start on this worker (vLLM missing, too little free memory, ...)."""


ROLLOUT_KEY = "actor_rollout_ref.rollout"
ROLLOUT_MEMORY_HELP = ("free memory for it (fsdp_config.param_offload / optimizer_offload, a smaller model, or more "
                       "GPUs to shard over)")


def import_vllm(key: str = ROLLOUT_KEY, instead: str = "use actor_rollout_ref.rollout.name=hf") -> Any:
    """vLLM, or a RolloutSetupError saying how to get it (`key`: the plan's section that asked for it)."""
    # Before any engine starts: vLLM moves Triton's cache to a folder per vLLM configuration, so each new one
    # would compile vLLM's kernels again (13-23 s on an H100); engine/triton_cache.py keeps one cache.
    triton_cache.install()
    try:
        import vllm
    except ImportError as exc:
        raise RolloutSetupError(
            f"{key}.name=vllm, but vLLM cannot be imported in the worker's Python "
            f"({type(exc).__name__}: {exc}); install it with `pip install 'rlconf[vllm]'` (a vLLM build that "
            f"matches your torch), or {instead}") from exc
    return vllm


def check_free_memory(utilization: float, free: int, total: int, key: str = ROLLOUT_KEY,
                      residents: str = "the actor (and what else shares the GPU) has loaded",
                      help: str = ROLLOUT_MEMORY_HELP) -> None:
    """vLLM takes gpu_memory_utilization × the GPU's total memory; fail before loading if it is not free."""
    wanted = utilization * total
    if free >= wanted:
        return
    fits = max(0.0, free / total - 0.02)
    raise RolloutSetupError(
        f"{key}.gpu_memory_utilization={utilization} asks vLLM for {wanted / GIB:.1f} GiB of this "
        f"GPU's {total / GIB:.1f} GiB, but only {free / GIB:.1f} GiB are free once {residents}; set "
        f"gpu_memory_utilization to at most {fits:.2f}, or {help}")


WAKE_OOM_HELP = ("vLLM could not map its {tag} ({pool:.1f} GiB, gpu_memory_utilization × the GPU) beside what the "
                 "actor keeps on this GPU between updates; lower actor_rollout_ref.rollout.gpu_memory_utilization, or "
                 "move the actor's states off the GPU between updates (fsdp_config.param_offload / optimizer_offload)")

OOM_HELP = ("vLLM ran out of GPU memory while generating; lower actor_rollout_ref.rollout.max_num_seqs or "
            "max_num_batched_tokens (fewer sequences and tokens in flight), or lower gpu_memory_utilization if the "
            "actor's training states share this GPU (with free_cache_engine off the KV cache stays during training)")


class VLLMRollout:
    name = "vllm"
    in_process = True  # vLLM's engine core and model in this process (`external_launcher`); False: `mp`

    def __init__(self, model_path: str, rollout: Any, max_model_len: int, tensor_parallel_size: int, seed: int,
                 eos_token_id: int, pad_token_id: int, trust_remote_code: bool = False) -> None:
        """`rollout`: the plan's actor_rollout_ref.rollout section. Call after the process group exists."""
        vllm = import_vllm()
        free, total = torch.cuda.mem_get_info()
        check_free_memory(rollout.gpu_memory_utilization, free, total)
        engine_kwargs = rollout.engine_kwargs.vllm
        self.executor = engine_kwargs.get("distributed_executor_backend") or IN_PROCESS
        if (self.executor not in (IN_PROCESS, OWN_PROCESSES)
                or self.executor == OWN_PROCESSES and (tensor_parallel_size > 1 or "worker_extension_cls" in engine_kwargs)):
            raise RolloutSetupError(  # the compiler refuses these first (RL372); a plan built around it gets here
                f"{ROLLOUT_KEY}.engine_kwargs.vllm.distributed_executor_backend={self.executor!r} with tensor parallel "
                f"size {tensor_parallel_size}: rlconf runs vLLM as `{IN_PROCESS}` (in this process) or `{OWN_PROCESSES}` "
                "(processes of its own, tensor parallel size 1, rlconf's own worker_extension_cls)")
        self.in_process = self.executor == IN_PROCESS
        # In process: the engine core runs here, weights are pushed into its model object, and the external
        # launcher needs the deterministic single-process scheduler. `mp`: the engine core in a process of its own
        # (vLLM's default), beside the model runner's.
        # vLLM caches its environment once an engine core starts (envs.enable_envs_cache): an engine started earlier
        # in this process (a test session) would leave the old value in force.
        import vllm.envs as vllm_envs

        if hasattr(vllm_envs, "disable_envs_cache"):
            vllm_envs.disable_envs_cache()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.sleeps = rollout.free_cache_engine
        kwargs: dict[str, Any] = dict(
            model=str(model_path),
            # Prompts arrive as token ids and responses leave as token ids: the controller decodes.
            skip_tokenizer_init=True,
            dtype=rollout.dtype,
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend=self.executor,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            max_num_seqs=rollout.max_num_seqs,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=rollout.enable_chunked_prefill,
            enforce_eager=rollout.enforce_eager,
            disable_log_stats=rollout.disable_log_stats,
            load_format=rollout.load_format,
            seed=seed,
            enable_sleep_mode=self.sleeps,
            trust_remote_code=trust_remote_code,
            # Log-probs of the distribution actually sampled from (after temperature), the one the
            # actor's recomputed old log-probs describe.
            logprobs_mode="processed_logprobs",
        )
        if tensor_parallel_size > 1:
            # Ray gives each worker one GPU (CUDA_VISIBLE_DEVICES), while vLLM's custom all-reduce and
            # its symmetric-memory one look peers up by rank among the visible GPUs (an IndexError
            # here): its tensor-parallel all-reduces go over NCCL instead.
            kwargs["disable_custom_all_reduce"] = True
            os.environ.setdefault("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
        kwargs.update(rollout.engine_kwargs.vllm)
        if not self.in_process:
            from engine.rollout.vllm_processes import EXTENSION, WeightBuffer

            kwargs["worker_extension_cls"] = EXTENSION
            self._weight_buffer = WeightBuffer(rollout.checkpoint_engine.update_weights_bucket_megabytes * 2**20)
        started = time.perf_counter()
        self.llm = vllm.LLM(**kwargs)
        self.start_seconds = time.perf_counter() - started
        client = type(self.llm.llm_engine.engine_core).__name__
        if (client == "InprocClient") != self.in_process:
            raise RolloutSetupError(f"vLLM started its engine core as {client}, not the `{self.executor}` layout the "
                                    "plan asks for (VLLM_ENABLE_V1_MULTIPROCESSING was read before it was set)")
        if not self.in_process:  # its engine core and model runner end with this process, however it ends
            atexit.register(self.shutdown)
        self._sampling_params_cls = vllm.SamplingParams
        self._tokens_prompt_cls = vllm.inputs.TokensPrompt
        self._asleep: set[str] = set()
        # Bytes of vLLM's pool that torch's allocator still counts as allocated while it sleeps
        # (unmapped, so not really held): subtracted from the training phase's measured peak.
        self.counted_while_asleep = 0
        # load_format=dummy (or dummy_*) starts from random weights: nothing may be sampled before the first push.
        self.has_weights = "dummy" not in rollout.load_format
        self._seconds: dict[str, float] = {}

    # --- memory -------------------------------------------------------------------------------

    def _wake(self, tag: str) -> None:
        if tag in self._asleep:
            started = time.perf_counter()
            # The update's activations are free but still cached by torch's allocator; vLLM maps its
            # pool from the driver, so the cache must go back first (measured: a 1.5B update left
            # enough cached to fail the KV cache's wake-up on an 80 GiB H100).
            with TIMELINE.span(f"wake_{tag}/empty_cache"):
                torch.cuda.empty_cache()
            try:
                with TIMELINE.span(f"wake_{tag}/wake_up"):
                    self.llm.wake_up(tags=[tag])
            except Exception as exc:  # `mp`: the model runner's error arrives as a plain Exception with its text
                if not out_of_memory(exc):
                    raise
                raise RuntimeError(WAKE_OOM_HELP.format(tag=tag.replace("_", " "), pool=self.pool_bytes() / GIB)
                                   + f" ({exc})") from exc
            self._asleep.discard(tag)
            self._add_seconds(f"wake_{tag}", time.perf_counter() - started)

    def release(self) -> None:
        """Level 2 sleep: KV cache and weights both go (the next rollout gets freshly pushed weights)."""
        if not self.sleeps or self._asleep:
            return
        started = time.perf_counter()
        counted_awake = torch.cuda.memory_allocated()
        with TIMELINE.span("sleep"):
            self.llm.sleep(level=2)
        dropped_from_count = counted_awake - torch.cuda.memory_allocated()
        # In process, torch's allocator here still counts part of the unmapped pool; `mp`: the pool is the model
        # runner's, never counted here.
        self.counted_while_asleep = max(0, self.pool_bytes() - dropped_from_count) if self.in_process else 0
        self._asleep = {"weights", "kv_cache"}
        self.has_weights = False
        self._add_seconds("sleep", time.perf_counter() - started)

    def shutdown(self) -> None:
        """`mp`: stop vLLM's engine core and model runner processes (in process: nothing of its own to stop)."""
        if not self.in_process and getattr(self, "llm", None) is not None and not getattr(self, "_shut_down", False):
            self._shut_down = True  # once: the worker's shutdown, then the exit hook
            self.llm.llm_engine.engine_core.shutdown()

    def pool_bytes(self) -> int:
        """Bytes in vLLM's sleep-mode memory pool (weights and KV cache), mapped or not."""
        if not self.in_process:
            return int(self.llm.collective_rpc("rlconf_pool_bytes")[0])
        from vllm.device_allocator.cumem import CuMemAllocator

        return CuMemAllocator.get_instance().get_current_usage()

    def memory_beside(self, reset_peak: bool = False) -> dict[str, int]:
        """What vLLM's model runner holds in a process of its own (`mp`): its torch allocator's peak since the last
        reset and its bytes now (the sleep-mode pool included); in process, nothing beside this process's count."""
        if self.in_process:
            return {"peak_allocated": 0, "allocated": 0, "pool": 0}
        return self.llm.collective_rpc("rlconf_memory", args=(reset_peak,))[0]

    def num_params(self) -> int:
        if not self.in_process:
            return int(self.llm.collective_rpc("rlconf_parameter_count")[0])
        return sum(p.numel() for p in self.model().parameters())

    # --- weights ------------------------------------------------------------------------------

    def model(self) -> torch.nn.Module:
        """vLLM's model object in this process (the in-process engine core's only worker)."""
        if not self.in_process:
            raise RuntimeError("vLLM's model runs in a process of its own (distributed_executor_backend mp)")
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._wake("weights")
        started = time.perf_counter()
        # vLLM's loader maps HF names onto its fused layers (qkv, gate_up) and keeps this rank's
        # tensor-parallel slice of each full tensor.
        if self.in_process:
            self.model().load_weights(weights=named_tensors)
        else:
            self._weight_buffer.push(
                named_tensors,
                load=lambda handle, generation, entries: self.llm.collective_rpc(
                    "rlconf_load_bucket", args=(handle, generation, entries)),
                drop=lambda: self.llm.collective_rpc("rlconf_drop_buffer"))
        self.has_weights = True
        self._add_seconds("load_weights", time.perf_counter() - started)

    # --- sampling -----------------------------------------------------------------------------

    def sampling_params(self, sampling: Sampling) -> Any:
        return self._sampling_params_cls(
            n=1,  # the trainer already repeated each prompt rollout.n times
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            top_k=max(sampling.top_k, 0) if not sampling.greedy else 0,
            max_tokens=sampling.max_new_tokens,
            ignore_eos=sampling.ignore_eos,
            stop_token_ids=None if sampling.ignore_eos else [self.eos_token_id],
            logprobs=0 if sampling.log_probs else None,  # the sampled token's log-prob only, or none
            flat_logprobs=True,
            detokenize=False,
        )

    def _ready_to_generate(self) -> None:
        """Weights loaded and awake, KV cache awake, no prefix cached from older weights."""
        if not self.has_weights:
            raise RuntimeError("vLLM rollout asked to generate before the actor's weights were loaded into it")
        self._wake("weights")
        self._wake("kv_cache")
        # Blocks cached for an earlier step hold keys and values of older weights (or nothing, after
        # a sleep): no prompt may hit them.
        with TIMELINE.span("reset_prefix_cache"):
            self.llm.reset_prefix_cache()

    @torch.no_grad()
    def generate(self, prompts: TensorBatch, sampling: Sampling, stop: Callable[[], bool] | None = None,
                 row_limits: torch.Tensor | None = None) -> TensorBatch:
        """`stop` (partial rollouts): checked before every engine step; once true, the requests still running are
        aborted with what they sampled so far, and the rows say how many tokens each has (`generated_tokens`).
        `row_limits` ([b], each at most sampling.max_new_tokens): each row's own token limit (a resumed row has
        fewer to go, and its longer prompt must stay within max_model_len)."""
        self._ready_to_generate()
        token_lists = prompt_token_lists(prompts)
        requests = [self._tokens_prompt_cls(prompt_token_ids=ids) for ids in token_lists]
        started = time.perf_counter()
        interrupt = None if stop is None else EngineInterrupt(self.llm.llm_engine, stop)
        try:
            with TIMELINE.span("engine") as record:
                with EngineStepClock(self.llm.llm_engine) as clock, interrupt or contextlib.nullcontext():
                    outputs = self.llm.generate(requests, self._params(sampling, row_limits), use_tqdm=False)
                record.update(clock.summary())
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            raise RuntimeError(f"{OOM_HELP} ({exc})") from exc
        self._add_seconds("generate_in_worker", time.perf_counter() - started)
        for key, value in clock.metrics().items():  # summed over the step's generate calls; the median: the last one's
            if key == "engine_step_median":
                self._seconds[key] = value
            else:
                self._add_seconds(key, value)
        free, total = torch.cuda.mem_get_info()
        self._seconds["device_used_gb"] = (total - free) / GIB  # what nvidia-smi shows, caching allocator reserve included
        if self.sleeps:
            self._seconds["pool_gb"] = self.pool_bytes() / GIB
        with TIMELINE.span("postprocess"):
            sampled = {}
            for output in outputs:
                sample = output.outputs[0]
                sampled[output.request_id] = (list(sample.token_ids),
                                              picked_log_probs(sample.logprobs, len(sample.token_ids)))
            if interrupt is not None:
                sampled.update(interrupt.partial)
            if len(sampled) != len(requests):
                raise RuntimeError(f"vLLM answered {len(sampled)} of {len(requests)} requests")
            # Request ids count up in the order the prompts were given (vLLM's LLM numbers them).
            order = sorted(sampled, key=int)
            ended = None if stop is None else [request_id not in interrupt.partial for request_id in order]
            return self._rows(prompts, [sampled[request_id] for request_id in order], sampling, ended)

    def _rows(self, prompts: TensorBatch, sampled: list[tuple[list[int], list[float]]], sampling: Sampling,
              ended: list[bool] | None) -> TensorBatch:
        """Rows from each prompt row's sampled (token ids, log-probs); with `ended` (partial rollouts) also each row's
        token count (`generated_tokens`) and vLLM's word on whether it ended (EOS or its limit, EOS among its tokens
        or not)."""
        responses = torch.full((len(sampled), sampling.max_new_tokens), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros((len(sampled), sampling.max_new_tokens), dtype=torch.float32)
        generated = torch.zeros(len(sampled), dtype=torch.long)
        for i, (ids, picked) in enumerate(sampled):
            ids = ids[: sampling.max_new_tokens]
            responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            if sampling.log_probs:
                log_probs[i, : len(ids)] = torch.tensor(picked[: sampling.max_new_tokens], dtype=torch.float32)
            generated[i] = len(ids)
        rows = assemble_rows(prompts, responses, self.eos_token_id, sampling.ignore_eos,
                             rollout_log_probs=log_probs if sampling.log_probs else None)
        if ended is not None:
            rows["generated_tokens"] = generated
            rows["ended"] = torch.tensor(ended, dtype=torch.bool)
        return rows

    @torch.no_grad()
    def stream_groups(self, prompts: TensorBatch, sampling: Sampling, group_size: int, window: int,
                      stop: Callable[[], bool] | None = None) -> Iterator[tuple[list[int], TensorBatch]]:
        """Groups of `group_size` consecutive prompt rows through one engine, at most `window` groups in it at once:
        when a group's last request finishes, the next group's requests join the running batch (continuous
        batching: verl's rollout server keeps its concurrent requests so) and the finished group is yielded as
        (its group index, its rows). Every rank of a tensor-parallel replica adds the same requests after the same
        engine step (the requests finish alike on each), so their engines stay in step.

        `stop` (partial rollouts): checked before every engine step; once true, the running requests are aborted
        with what they sampled, and one last yield holds every group not finished ((their indices, their rows)
        with `generated_tokens` and `ended`; a group never started has no tokens). Without `stop` every yield is
        one finished group."""
        self._ready_to_generate()
        token_lists = prompt_token_lists(prompts)
        groups = len(token_lists) // group_size
        params = self.sampling_params(sampling)
        engine = self.llm.llm_engine
        row_of: dict[str, int] = {}  # external request id -> prompt row
        sampled: dict[int, tuple[list[int], list[float]]] = {}  # finished rows
        left = [group_size] * groups  # requests of each group still running
        started_groups = 0

        def start_next() -> None:
            nonlocal started_groups
            rows = range(started_groups * group_size, (started_groups + 1) * group_size)
            ids = self.llm.enqueue([self._tokens_prompt_cls(prompt_token_ids=token_lists[row]) for row in rows],
                                   params, use_tqdm=False)
            for request_id, row in zip(ids, rows):
                row_of[request_id.split("-", 1)[0]] = row  # vLLM returns its internal id: "<ours>-<random>"
            started_groups += 1

        def rows_of(picked: list[int], ended: list[bool] | None) -> TensorBatch:
            chosen = {name: value[picked] for name, value in prompts.items()}
            return self._rows(chosen, [sampled.get(row, ([], [])) for row in picked], sampling, ended)

        started = time.perf_counter()
        interrupt = None if stop is None else EngineInterrupt(engine, stop)
        try:
            with TIMELINE.span("engine") as record:
                with EngineStepClock(engine) as clock, interrupt or contextlib.nullcontext():
                    while started_groups < min(window, groups):
                        start_next()
                    while engine.has_unfinished_requests():
                        done = []
                        for output in engine.step():
                            if not output.finished:
                                continue
                            sample = output.outputs[0]
                            row = row_of[output.request_id]
                            sampled[row] = (list(sample.token_ids),
                                            picked_log_probs(sample.logprobs, len(sample.token_ids)))
                            left[row // group_size] -= 1
                            if left[row // group_size] == 0:
                                done.append(row // group_size)
                        for _ in done:  # the engine's batch refilled before the groups leave
                            if started_groups < groups and (interrupt is None or not interrupt.partial):
                                start_next()
                        for group in done:
                            picked = list(range(group * group_size, (group + 1) * group_size))
                            yield [group], rows_of(picked, None if stop is None else [True] * group_size)
                record.update(clock.summary())
            if interrupt is not None:
                for request_id, (ids, picked_lp) in interrupt.partial.items():
                    sampled[row_of[request_id]] = (ids, picked_lp)
                cut = [group for group in range(groups) if left[group] > 0]
                if cut:
                    picked = [row for group in cut for row in range(group * group_size, (group + 1) * group_size)]
                    aborted = {row_of[request_id] for request_id in interrupt.partial}
                    unstarted = {row for row in picked if row // group_size >= started_groups}
                    yield cut, rows_of(picked, [row not in aborted and row not in unstarted for row in picked])
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            raise RuntimeError(f"{OOM_HELP} ({exc})") from exc
        finally:
            self._add_seconds("generate_in_worker", time.perf_counter() - started)
            running = [request_id for request_id, row in row_of.items() if row not in sampled]
            if engine.has_unfinished_requests() and running:  # the stream closed early: nothing left in the engine
                engine.abort_request(running)
        for key, value in clock.metrics().items():
            if key == "engine_step_median":
                self._seconds[key] = value
            else:
                self._add_seconds(key, value)
        free, total = torch.cuda.mem_get_info()
        self._seconds["device_used_gb"] = (total - free) / GIB
        if self.sleeps:
            self._seconds["pool_gb"] = self.pool_bytes() / GIB

    def _params(self, sampling: Sampling, row_limits: torch.Tensor | None) -> Any:
        """One SamplingParams for every request, or one per request with its own max_tokens."""
        if row_limits is None:
            return self.sampling_params(sampling)
        by_limit = {int(n): self.sampling_params(dataclasses.replace(sampling, max_new_tokens=int(n)))
                    for n in set(row_limits.tolist())}
        return [by_limit[int(n)] for n in row_limits]

    def timings(self) -> dict[str, float]:
        out, self._seconds = self._seconds, {}
        return out

    def _add_seconds(self, key: str, seconds: float) -> None:
        self._seconds[key] = self._seconds.get(key, 0.0) + seconds


def out_of_memory(exc: BaseException) -> bool:
    """A CUDA out-of-memory, raised here or (`mp`) in vLLM's model runner and passed on as a plain Exception
    carrying its text."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def picked_log_probs(flat: Any, count: int) -> list[float]:
    """The sampled tokens' log-probs of the first `count` positions of a FlatLogprobs (logprobs=0: one entry each);
    none where the request asked for none (logprobs=None: vLLM keeps None)."""
    return [] if flat is None else [flat.logprobs[s] for s in flat.start_indices[:count]]


class EngineInterrupt:
    """Ends a vLLM LLMEngine's generate when `stop()` turns true (partial rollouts): before each engine step it is
    asked; once true, each request still running is read from the engine's output processor (the token ids and
    log-probs it has so far) and aborted, so `LLM.generate` returns with the finished requests and `partial` holds
    the rest, by request id. `LLM.generate` asks the engine for final outputs only, so a running request's tokens
    are read where the output processor keeps them (vLLM 0.25: `request_states`, each with its detokenizer's
    `output_token_ids` and its logprobs processor's FlatLogprobs)."""

    def __init__(self, engine: Any, stop: Callable[[], bool]) -> None:
        self._engine, self._stop = engine, stop
        self.partial: dict[str, tuple[list[int], list[float]]] = {}
        self._wrapped: Any = None

    def __enter__(self) -> EngineInterrupt:
        self._wrapped = vars(self._engine).get("step")  # EngineStepClock's wrapper, when it runs outside this
        inner = self._engine.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if self._stop():
                self._abort_running()
                return []
            return inner(*args, **kwargs)

        self._engine.step = step
        return self

    def _abort_running(self) -> None:
        states = list(self._engine.output_processor.request_states.values())
        for state in states:
            ids = list(state.detokenizer.output_token_ids)
            self.partial[state.external_req_id] = (ids, picked_log_probs(state.logprobs_processor.logprobs, len(ids)))
        if states:
            self._engine.abort_request([state.external_req_id for state in states])

    def __exit__(self, *exc: Any) -> None:
        if self._wrapped is not None:
            self._engine.step = self._wrapped
        else:
            del self._engine.step


class EngineStepClock:
    """Times each `step()` of a vLLM LLMEngine while the block runs (one generate's engine steps).

    One engine step is one scheduling round (a decode step of every running sequence, or a prefill):
    their count, median and stalls tell a slower step (CPU or GPU per step) from a few long waits.
    The engine's `step` is wrapped on the instance only for the block's duration.
    """

    def __init__(self, engine: Any) -> None:
        self._engine, self.seconds, self.thread_cpu = engine, [], 0.0
        self._own: Any = None  # a `step` the instance itself held before (someone else's wrapper)
        # Python's cyclic garbage collector holds the GIL while it runs: in a worker whose heap also holds the
        # actor's objects, a full collection pauses the engine loop. Timed in any thread of the process.
        self.gc_seconds, self.gc_full_collections = 0.0, 0
        self._gc_began: float | None = None

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        elif self._gc_began is not None:
            self.gc_seconds += time.perf_counter() - self._gc_began
            self.gc_full_collections += info.get("generation") == 2
            self._gc_began = None

    def __enter__(self) -> EngineStepClock:
        self._own = vars(self._engine).get("step")
        original = self._engine.step

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - started)
                self.thread_cpu += time.thread_time() - cpu

        self._engine.step = timed_step
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._on_gc)
        if self._own is not None:
            self._engine.step = self._own
        else:
            del self._engine.step  # the class's method again

    def metrics(self) -> dict[str, float]:
        """The rollout's timing keys (docs/metrics.md, timing/rollout_engine_*): the median engine step, the
        seconds of steps over twice it, the engine thread's CPU seconds and the garbage collector's pauses."""
        summary = step_time_summary(self.seconds)
        return {"engine_step_median": summary.get("median_ms", 0.0) / 1e3,
                "engine_stalls": summary.get("slow_excess_s", 0.0),
                "engine_cpu": self.thread_cpu, "engine_gc": self.gc_seconds}

    def summary(self) -> dict[str, float]:
        out = {f"engine_{key}": value for key, value in step_time_summary(self.seconds).items()}
        out["engine_thread_cpu_s"] = self.thread_cpu
        out["engine_gc_s"] = self.gc_seconds
        out["engine_gc_full"] = self.gc_full_collections
        return out
