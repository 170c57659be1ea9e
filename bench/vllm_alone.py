"""vLLM as rlconf's worker runs it, alone: where its start-up goes, and how steady its decode step is.

    python bench/vllm_alone.py [--model random://Qwen2.5-0.5B] [--repeats 8] [--modes inprocess,subprocess,ray,asyncllm]
                               [--junk-objects 2000000] [--engine-kwargs '{"async_scheduling": true}' ...]
                               [--rounds 1] [--profile MODULE.FUNCTION[@N]] [--out DIR]
    python bench/vllm_alone.py --driver        # the launch's steps before Ray, each timed (no GPU work)

Two questions the GPU runs of 2026-11-27 left (docs/benchmarks.md, "Weak scaling with the fastest knobs"):

1. vLLM's start in the worker took 40-56 s with a warm compile cache, ~20 s of it between "Graph capturing
   finished" and "Kernel JIT monitor activated". Here the engine starts with rlconf's arguments
   (engine/rollout/vllm.py: in-process engine core, `external_launcher` over a one-rank process group, dummy
   weights, sleep mode) while the worker's start-up functions are timed one by one (`init`).
2. In the engine's generate, vLLM's median engine step went from 3.1 to 6.0 ms between steps of one run, and
   between the two ranks of one step, with the thread's CPU time equal to its wall time. Here the same 64
   requests × 512 tokens are generated `--repeats` times in a row by vLLM alone, each timed by the engine's own
   EngineStepClock (median step, stalls, CPU, garbage collector), then again with `--junk-objects` long-lived
   Python objects on the heap (what an actor's process holds beside vLLM), with the collector as is and with
   them frozen (`gc.freeze()`); mode `subprocess` runs the engine core in its own process (vLLM's default);
   mode `ray` runs `inprocess` inside a Ray actor of one GPU, a process as Ray makes rlconf's workers (its
   environment, threads and CPU placement) without the actor's model beside vLLM: `inprocess` against `ray`,
   interleaved over --rounds, says whether Ray's worker process or what the worker holds slows the engine step.
3. verl's rollout generated workload 1's 64 × 512 tokens in 2.07 s on an H200 against rlconf's 2.58 s
   (2026-11-28, docs/benchmarks.md), with the same engine arguments. verl runs vLLM's `AsyncLLM`: the engine core
   in a process of its own, every request submitted at once and streamed back (`RequestOutputKind` left at
   CUMULATIVE), the outputs handled in the front-end's event loop while the core steps on. Mode `asyncllm` does
   that (without verl's HTTP server and agent loop): its rounds have wall times only (the engine steps in another
   process, out of EngineStepClock's reach). `inprocess` against `asyncllm`, interleaved over --rounds, says
   whether the engine's process layout is where the 0.5 s goes. Left to itself AsyncLLM on one GPU runs the
   model in the engine core's process ("uni"); verl 0.9.1 passes `--distributed_executor_backend mp`, the model
   runner in a third process, so scheduling, the model's inputs and the outputs each have a process (and a
   core) of their own: a set with {"distributed_executor_backend": "mp"} runs `asyncllm` so (and is not run
   `inprocess`, which is external_launcher by definition).
4. Where the in-process engine's CPU time goes: `--profile vllm.entrypoints.llm.LLM.generate@3` runs the third
   generate (the first is the warm-up) under cProfile.

Each mode runs in a fresh child process. Prints a table; writes vllm_alone.json under --out (else $OUT).

Triton's kernel cache is shared across vLLM configurations as in the worker (engine/triton_cache.py): one set
of --engine-kwargs with --rounds 2 starts the same configuration twice, and the second start's `warmup_kernels`
should find the kernels the first compiled (without the shared cache such a rerun compiled them again, 13.4 s on
2026-11-27); a set with "_env": {"RLCONF_TRITON_SHARED_CACHE": "0"} keeps vLLM's folder per configuration. A
set with "_cpus": [2] pins the engine's thread to CPU 2 (pinned against unpinned: does the engine's per-call
jitter come from the scheduler moving it? It did not, 2026-11-27: the host's CPU speed did). A set with
"_logprobs": false samples without the sampled tokens' log-probs (as rlconf does where rollout.calculate_log_probs
is false and nothing reads them; verl's default, true, asks for them: what do they cost the CPU-bound engine step?).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from grpo_vs_trl import GPU_MEMORY_UTILIZATION, PROMPTS, RESPONSE_TOKENS, SAMPLES, plan_overrides  # noqa: E402
from scaling_diagnose import cpu_probe_ms  # noqa: E402

# The worker's start-up functions timed in `init` (module, attribute path): vLLM 0.25's names; one absent in
# another version is skipped and listed.
TIMED = [
    ("vllm.v1.worker.gpu_worker", "Worker.init_device"),
    ("vllm.v1.worker.gpu_worker", "Worker.load_model"),
    ("vllm.v1.worker.gpu_worker", "Worker.determine_available_memory"),
    ("vllm.v1.worker.gpu_worker", "Worker.initialize_from_config"),
    ("vllm.v1.worker.gpu_worker", "Worker.compile_or_warm_up_model"),
    ("vllm.v1.worker.gpu_worker", "kernel_warmup"),
    ("vllm.v1.worker.gpu_worker", "warmup_kernels"),
    ("vllm.v1.worker.gpu_worker", "freeze_gc_heap"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.profile_run"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.capture_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._dummy_sampler_run"),
    ("vllm.compilation.compiler_interface", "trigger_inductor_lazy_init"),
    ("vllm.utils.jit_monitor", "activate"),
]


def resolve_owner(dotted: str) -> tuple[Any, str] | None:
    """`package.module.Class.method` or `package.module.function`: (the object holding the last name, that name),
    the module being the longest importable prefix; None where nothing resolves."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:-1]:
                owner = getattr(owner, name)
            getattr(owner, parts[-1])
        except AttributeError:
            return None
        return owner, parts[-1]
    return None


def profile_function(spec: str, into: dict[str, str]) -> bool:
    """`spec`: MODULE.FUNCTION or MODULE.CLASS.METHOD, optionally `@N` (default 1): wrap it so its N-th call runs
    under cProfile (the first generate of an engine compiles the sampler's shapes; a later one is the steady
    engine loop); its top functions (by cumulative and by own time) go to `into[name]`, with the Triton cache's
    file count before and after (compiles, or loads?)."""
    import cProfile
    import io
    import pstats

    dotted, _, nth = spec.partition("@")
    call = int(nth) if nth else 1
    found = resolve_owner(dotted)
    if found is None:
        return False
    owner, name = found
    original = getattr(owner, name)
    calls = [0]

    def triton_files() -> str:
        from engine import triton_cache

        where = (triton_cache.shared_root(os.environ) if os.environ.get("TRITON_CACHE_MANAGER") == triton_cache.MANAGER
                 else os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache"))
        count = sum(len(files) for _, _, files in os.walk(where)) if os.path.isdir(where) else 0
        return f"{count} files in {where}"

    def profiled(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] != call:
            return original(*args, **kwargs)
        before = triton_files()
        profiler = cProfile.Profile()
        began = time.perf_counter()
        try:
            return profiler.runcall(original, *args, **kwargs)
        finally:
            wall = time.perf_counter() - began
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("cumulative").print_stats(35)
            stats.sort_stats("tottime").print_stats(30)
            into[name] = (f"call {call} of {dotted}: {wall:.2f} s under cProfile\n"
                          f"Triton cache before: {before}; after: {triton_files()}\n" + text.getvalue())

    setattr(owner, name, functools.wraps(original)(profiled))
    return True


def time_functions(records: list[dict[str, Any]]) -> list[str]:
    """Wrap TIMED so each call appends {name, start, seconds}; returns the names not found."""
    import importlib

    missing = []
    for module_name, path in TIMED:
        try:
            owner: Any = importlib.import_module(module_name)
            *parents, attr = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            original = getattr(owner, attr)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{path}")
            continue

        def timed(*args: Any, _original: Any = original, _name: str = f"{module_name}.{path}", **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                records.append({"name": _name, "start": started, "seconds": time.perf_counter() - started})

        setattr(owner, attr, functools.wraps(original)(timed))
    return missing


def junk_heap(count: int) -> list[Any]:
    """`count` small long-lived objects in cycles, as a training process's heap holds them."""
    out: list[Any] = []
    for i in range(count // 2):
        node: dict[str, Any] = {"i": i}
        node["self"] = [node]
        out.append(node)
    return out


def generate_once(llm: Any, requests: list[Any], params: Any) -> dict[str, float]:
    from engine.rollout.vllm import EngineStepClock

    probe = cpu_probe_ms()
    started = time.perf_counter()
    with EngineStepClock(llm.llm_engine) as clock:
        llm.generate(requests, params, use_tqdm=False)
    summary = clock.summary()
    return {"wall_s": time.perf_counter() - started, "median_ms": summary["engine_median_ms"],
            "p90_ms": summary["engine_p90_ms"], "stall_s": summary["engine_slow_excess_s"],
            "cpu_s": summary["engine_thread_cpu_s"], "gc_s": summary["engine_gc_s"],
            "gc_full": summary["engine_gc_full"], "steps": summary["engine_steps"],
            "cpu_probe_ms": (probe + cpu_probe_ms()) / 2}


def pin_cpus(engine_kwargs: dict[str, Any]) -> list[int]:
    """Pop "_cpus" (a list of CPU ids) from `engine_kwargs` and pin this thread to them, before vLLM starts its
    engine loop here; the CPUs this thread may run on afterwards. Why: the same generate took 2.0-3.4 s from step to
    step in a launch (2026-11-27), the engine loop being CPU-bound; pinned against unpinned says whether the
    scheduler moving it between CPUs is part of that."""
    cpus = engine_kwargs.pop("_cpus", None)
    if cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in cpus})  # threads started from here on inherit it
    return sorted(os.sched_getaffinity(0))


def child(mode: str, model: str, repeats: int, junk: int, engine_kwargs: dict[str, Any],
          profile: str | None = None) -> dict[str, Any]:
    """One engine in this process; its start-up and generate rounds."""
    import torch

    out: dict[str, Any] = {"mode": mode, "engine_kwargs": engine_kwargs}
    # "_env": environment variables for vLLM, set before it is imported (VLLM_USE_V2_MODEL_RUNNER=0: V1's runner).
    engine_kwargs = dict(engine_kwargs)
    os.environ.update({key: str(value) for key, value in engine_kwargs.pop("_env", {}).items()})
    out["cpus"] = pin_cpus(engine_kwargs)
    with_log_probs = bool(engine_kwargs.pop("_logprobs", True))
    records: list[dict[str, Any]] = []
    inprocess = mode == "inprocess"
    if inprocess:
        # As engine/rollout/vllm.py: the engine core in this process, over the worker's process group.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": "29533"}.items():
            os.environ[key] = value
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
        torch.cuda.set_device(0)
    started = time.perf_counter()
    # As engine/rollout/vllm.py's import_vllm: one Triton cache for every configuration (an "_env" of
    # {"RLCONF_TRITON_SHARED_CACHE": "0"} leaves it in vLLM's folder per configuration hash). Timed with the
    # import: it imports Triton, which `import vllm` did before.
    from engine import triton_cache

    out["triton_cache"] = triton_cache.install() or triton_cache.shared_root(os.environ)
    import vllm
    from vllm.inputs import TokensPrompt

    out["import_vllm_s"] = time.perf_counter() - started
    profiles: dict[str, str] = {}
    if inprocess and profile:  # before the timers: they wrap the profiled function in turn
        out["profiled"] = profile if profile_function(profile, profiles) else f"{profile}: not found"
    out["not_timed"] = time_functions(records) if inprocess else []
    from engine.models.loading import load_tokenizer, resolve_model_path
    from grpo_vs_trl import prompt_texts

    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    requests = [TokensPrompt(prompt_token_ids=tokenizer(text)["input_ids"])
                for text in prompt_texts(tokenizer, PROMPTS) for _ in range(SAMPLES)]
    kwargs: dict[str, Any] = dict(model=str(path), skip_tokenizer_init=True, dtype="bfloat16",
                                  gpu_memory_utilization=GPU_MEMORY_UTILIZATION, max_model_len=16 + RESPONSE_TOKENS,
                                  load_format="dummy", seed=0, enable_sleep_mode=True,
                                  logprobs_mode="processed_logprobs")
    if inprocess:
        kwargs["distributed_executor_backend"] = "external_launcher"
    kwargs.update(engine_kwargs)
    params = vllm.SamplingParams(n=1, temperature=1.0, max_tokens=RESPONSE_TOKENS, ignore_eos=True, detokenize=False,
                                 logprobs=0 if with_log_probs else None, flat_logprobs=True)
    if mode == "asyncllm":
        import asyncio

        return {**out, **asyncio.run(async_llm_rounds(kwargs, requests, params, repeats)), "not_timed": [],
                "gc_threshold": gc.get_threshold(), "profiles": profiles}
    began = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    out["engine_start_s"] = time.perf_counter() - began
    out["startup"] = [{**r, "at_s": r["start"] - began} for r in records]
    for r in out["startup"]:
        del r["start"]
    llm.generate(requests, params, use_tqdm=False)  # warm-up: the sampler's first shapes
    out["rounds"] = {"alone": [generate_once(llm, requests, params) for _ in range(repeats)]}
    if junk:
        heap = junk_heap(junk)
        out["rounds"]["junk"] = [generate_once(llm, requests, params) for _ in range(repeats)]
        gc.freeze()
        out["rounds"]["junk_frozen"] = [generate_once(llm, requests, params) for _ in range(repeats)]
        gc.unfreeze()
        del heap
    out["gc_threshold"] = gc.get_threshold()
    out["profiles"] = profiles
    return out


async def async_llm_rounds(kwargs: dict[str, Any], requests: list[Any], params: Any,
                           repeats: int) -> dict[str, Any]:
    """Mode `asyncllm`: vLLM's AsyncLLM started with `kwargs` (the engine core in a process of its own), a warm-up
    round, then `repeats` rounds of every request submitted at once: {"engine_start_s", "startup", "rounds"}."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    began = time.perf_counter()
    # AsyncEngineArgs logs stats by default, vllm.LLM does not; verl's rollout config turns them off too.
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**{"disable_log_stats": True, **kwargs}))
    started_s = time.perf_counter() - began
    try:
        await async_round(engine, requests, params, "warmup")
        rounds = [await async_round(engine, requests, params, f"r{i}") for i in range(repeats)]
    finally:
        engine.shutdown()
    return {"engine_start_s": started_s, "startup": [], "rounds": {"alone": rounds}}


async def async_round(engine: Any, requests: list[Any], params: Any, tag: str) -> dict[str, Any]:
    """One round through AsyncLLM: every request submitted at once, each streamed to its final output, as verl's
    server answers its agent loops. Wall time only: the engine steps in its own process."""
    import asyncio

    async def one(index: int, request: Any) -> int:
        final = None
        async for output in engine.generate(request, params, request_id=f"{tag}-{index}"):
            final = output
        return len(final.outputs[0].token_ids)

    probe = cpu_probe_ms()
    started = time.perf_counter()
    tokens = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    wall = time.perf_counter() - started
    return {"wall_s": wall, "median_ms": None, "p90_ms": None, "stall_s": None, "cpu_s": None, "gc_s": None,
            "gc_full": None, "steps": None, "tokens": sum(tokens), "cpu_probe_ms": (probe + cpu_probe_ms()) / 2}


def in_ray_actor(function: Any, *args: Any, num_gpus: float = 1) -> Any:
    """`function(*args)` in a Ray actor of a local Ray cluster started for it (as `rlconf launch` starts one):
    a worker process as Ray makes rlconf's. The bench folder goes on the actor's path (function's imports)."""
    import ray

    bench = str(Path(__file__).resolve().parent)
    ray.init(address="local", include_dashboard=False, num_gpus=num_gpus or None, log_to_driver=True,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([bench, str(ROOT),
                                                                      os.environ.get("PYTHONPATH", "")])}})
    try:
        @ray.remote(num_gpus=num_gpus)
        class Holder:
            def run(self, fn: Any, *fn_args: Any) -> Any:
                return fn(*fn_args)

        return ray.get(Holder.remote().run.remote(function, *args))
    finally:
        ray.shutdown()


def ray_child(model: str, repeats: int, junk: int, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Mode `ray`: mode `inprocess`'s child, run in a Ray actor of one GPU."""
    out = in_ray_actor(child, "inprocess", model, repeats, junk, engine_kwargs)
    return {**out, "mode": "ray"}


def driver_steps() -> dict[str, float]:
    """The launch's work before Ray, one piece at a time, in this (fresh) process: what the `plan` phase holds."""
    seconds: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        started = time.perf_counter()
        value = fn()
        seconds[name] = time.perf_counter() - started
        return value

    timed("import rlconf.compile", lambda: __import__("rlconf.compile"))
    from rlconf.compile import compile_plan

    plan = ROOT / "presets" / "quickstart.yaml"
    timed("compile the plan", lambda: compile_plan(plan, plan_overrides("random://Qwen2.5-0.5B", 4)))
    from rlconf.device import local_gpu

    timed("local_gpu (nvidia-smi)", local_gpu)
    timed("import torch", lambda: __import__("torch"))
    timed("import engine.capabilities", lambda: __import__("engine.capabilities"))
    timed("import engine.trainer", lambda: __import__("engine.trainer"))
    timed("import ray", lambda: __import__("ray"))
    timed("import engine.workers.cluster.placement", lambda: __import__("engine.workers.cluster.placement"))
    import torch

    timed("torch.cuda.device_count", torch.cuda.device_count)
    timed("compile the plan again", lambda: compile_plan(plan, plan_overrides("random://Qwen2.5-0.5B", 4)))
    return seconds


def cpus_text(cpus: list[int] | None) -> str:
    """The engine thread's CPUs, for the table: the list when pinned to a few, the count otherwise."""
    if not cpus:
        return ""
    return f"; CPUs {','.join(map(str, cpus))}" if len(cpus) <= 4 else f"; {len(cpus)} CPUs"


def _cell(value: Any, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for result in results:
        if "skipped" in result:
            lines.append(f"{result['mode']} (engine kwargs {result['engine_kwargs']}): not run, {result['skipped']}")
            continue
        if "error" in result:
            # A start cut off by --timeout-s is not a failure of what it ran (a fresh machine's first start compiles
            # everything): say which, so a script that falls back on a failure does not fall back on a slow start.
            verdict = f"TIMED OUT after {result['timed_out_s']} s" if result.get("timed_out_s") else "FAILED"
            lines.append(f"{result['mode']}: {verdict} {result['error'][-800:]}")
            continue
        lines.append(f"## {result['mode']} (engine kwargs {result['engine_kwargs']}): import vllm "
                     f"{result['import_vllm_s']:.1f} s, "
                     f"{'AsyncLLM' if result['mode'] == 'asyncllm' else 'vllm.LLM'}(...) {result['engine_start_s']:.1f} s; "
                     "Triton cache: "
                     f"{result.get('triton_cache', '?')}" + cpus_text(result.get("cpus")))
        for record in result["startup"]:
            lines.append(f"  {record['at_s']:7.1f} s  {record['seconds']:7.2f} s  {record['name']}")
        if result["not_timed"]:
            lines.append(f"  (not found, not timed: {', '.join(result['not_timed'])})")
        lines.append(f"  {'round':12} {'wall s':>7} {'median ms':>9} {'p90 ms':>7} {'stalls s':>8} {'cpu s':>6} "
                     f"{'gc s':>6} {'full gc':>7} {'cpu probe ms':>12}")
        for name, rounds in result["rounds"].items():
            for r in rounds:  # asyncllm's rounds have wall times only: "-" for what its engine's process keeps
                lines.append(f"  {name:12} {r['wall_s']:7.3f} {_cell(r['median_ms'], 9, '.2f')} "
                             f"{_cell(r['p90_ms'], 7, '.2f')} {_cell(r['stall_s'], 8, '.3f')} {_cell(r['cpu_s'], 6, '.2f')} "
                             f"{_cell(r['gc_s'], 6, '.3f')} {_cell(r['gc_full'], 7, 'd')} {r['cpu_probe_ms']:12.1f}")
            walls = [r["wall_s"] for r in rounds]
            lines.append(f"  {name:12} median {statistics.median(walls):.3f} s, min {min(walls):.3f}, "
                         f"max {max(walls):.3f}")
    return "\n".join(lines)


def not_runnable(mode: str, engine_kwargs: dict[str, Any]) -> str | None:
    """Why `mode` cannot run with these engine kwargs, or None. `inprocess` and `ray` are rlconf's layout, the
    engine core and the model in one thread over `external_launcher`; a set naming another executor backend
    (`"distributed_executor_backend": "mp"`: verl's, the model runner in a process of its own beside the engine
    core's) is for the modes where vLLM makes its own processes."""
    backend = engine_kwargs.get("distributed_executor_backend")
    if mode in ("inprocess", "ray") and backend not in (None, "external_launcher"):
        return f"distributed_executor_backend {backend!r}: this mode is rlconf's in-process engine (external_launcher)"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random://Qwen2.5-0.5B")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--modes", default="inprocess,subprocess")
    parser.add_argument("--junk-objects", type=int, default=2_000_000)
    parser.add_argument("--engine-kwargs", action="append", default=None,
                        help="JSON, added to vllm.LLM's arguments (its \"_cpus\": CPU ids the engine's thread is pinned to; "
                             "its \"_env\": environment variables set before vLLM is "
                             "imported); repeated: each set runs in turn, in every mode, and --rounds times over, "
                             "alternating (A, B, A, B: a drift of the host shows)")
    parser.add_argument("--rounds", type=int, default=1, help="passes over the engine-kwargs sets")
    parser.add_argument("--timeout-s", type=int, default=280, help="per mode")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    parser.add_argument("--driver", action="store_true")
    parser.add_argument("--profile", default=None, metavar="MODULE.FUNCTION[@N]",
                        help="inprocess: run that function's (or MODULE.CLASS.METHOD's) N-th call, default the "
                             "first, under cProfile (e.g. vllm.v1.worker.gpu_worker.warmup_kernels, or "
                             "vllm.entrypoints.llm.LLM.generate@3: a steady generate, the first being the "
                             "warm-up); its top functions go to profile_<mode>_<name>.txt")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        for name, seconds in driver_steps().items():
            print(f"{seconds:7.2f} s  {name}")
        return
    kwargs_sets = args.engine_kwargs or ["{}"]
    if args.child == "ray":
        print("RESULT " + json.dumps(ray_child(args.model, args.repeats, args.junk_objects, json.loads(kwargs_sets[0]))))
        return
    if args.child:
        result = child(args.child, args.model, args.repeats, args.junk_objects, json.loads(kwargs_sets[0]),
                       args.profile)
        print("RESULT " + json.dumps(result))
        return
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    runs = [(mode, kwargs) for _ in range(args.rounds) for kwargs in kwargs_sets for mode in modes]
    for index, (mode, kwargs) in enumerate(runs):
        if (why := not_runnable(mode, json.loads(kwargs))) is not None:
            results.append({"mode": mode, "engine_kwargs": json.loads(kwargs), "skipped": why})
            print(table(results[-1:]), flush=True)
            continue
        command = [sys.executable, __file__, "--child", mode, "--model", args.model, "--repeats", str(args.repeats),
                   "--junk-objects", str(args.junk_objects), "--engine-kwargs", kwargs,
                   *(["--profile", args.profile] if args.profile and index == 0 else [])]
        log = out_dir / f"vllm_alone_{index}_{mode}.log"
        timed_out = None
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
            text = done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            parts = [part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                     for part in (exc.stdout, exc.stderr)]
            text = "".join(parts) + f"\ntimed out after {args.timeout_s} s"
            timed_out = args.timeout_s
        log.write_text(text)
        found = [line[len("RESULT "):] for line in text.splitlines() if line.startswith("RESULT ")]
        results.append(json.loads(found[-1]) if found else
                       {"mode": mode, "error": text, **({"timed_out_s": timed_out} if timed_out else {})})
        for function, text_out in results[-1].get("profiles", {}).items():
            (out_dir / f"profile_{mode}_{function}.txt").write_text(text_out)
        (out_dir / "vllm_alone.json").write_text(json.dumps(results, indent=1))
        print(table(results[-1:]), flush=True)


if __name__ == "__main__":
    main()
