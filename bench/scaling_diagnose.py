"""Where the second GPU goes: bench/scaling.py's workload on 1 GPU and on 2 (two vLLM replicas), each
rank's own account of every stage, variants switched step by step, and a profile of one step.

    python bench/scaling_diagnose.py [--configs 2gpu_tp1,1gpu] [--model random://Qwen2.5-0.5B]
                                     [--schedule-1gpu ...] [--schedule-2gpu ...] [--budget-s 520] [overrides...]

Each configuration runs in a fresh child process that builds the trainer as `rlconf launch` does
(Ray placement groups, FSDP over NCCL, vLLM in the workers) and drives its steps itself, so that
between two steps it can switch a variant and drain every rank's spans (engine.rank_timeline).
The schedule names each step's variant (step 1 is the warm-up; comma-separated, one per step):

- base: as launched;
- profile: base, under torch.profiler on every rank; a text summary per rank (top kernels by device
  time, top CPU ops by CPU time) instead of a trace;
- serial_gen: the driver sends generate to one replica, waits, then the next (2 GPUs, TP 1): each
  replica generating alone on the same two-GPU run;
- pin: each rank's threads pinned to CPU cores of its own, on its GPU's NUMA node when the machine
  says which (restored after the step);
- gc_freeze: the rollout's generate runs with the heap that exists before it frozen (gc.freeze): Python's
  collector, which holds the GIL, then walks only what generating creates (the engine's
  timing/rollout_engine_gc says how long it ran in the other steps);
- no_sleep: vLLM is not put to sleep after generating (its KV cache and weights stay mapped through
  the update, as free_cache_engine=false keeps them): the first such step still wakes, the second
  neither wakes nor sleeps.

Before the configurations, bench/host_contention.py measures the host without the engine.
Writes under --out (else $OUT): diagnose.json (everything), diagnose.txt (the tables), profile_<config>.txt,
log_<config>.txt. The default overrides are the issue's fastest knobs (chunked entropy dropped: moot beside the Triton head).
"""

from __future__ import annotations

import argparse
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

from grpo_vs_trl import PROMPTS, RESPONSE_TOKENS, SAMPLES, plan_overrides  # noqa: E402
from scaling import CONFIGS, config_overrides  # noqa: E402

ARR = "actor_rollout_ref"
KNOBS = [f"{ARR}.rollout.engine_kwargs.vllm.async_scheduling=true", f"{ARR}.model.use_remove_padding=true",
         f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu=34816"]
# The loss head: use_torch_compile's Triton kernels (its default; no compile, nothing to chunk).
SCHEDULES = {"1gpu": "base,base,base,profile,pin,pin,no_sleep,no_sleep,gc_freeze,gc_freeze",
             "2gpu_tp1": "base,base,base,profile,serial_gen,pin,pin,no_sleep,no_sleep,gc_freeze,gc_freeze",
             "2gpu_tp2": "base,base,base,profile,pin,pin,no_sleep,no_sleep,gc_freeze,gc_freeze"}
VARIANTS = ("base", "profile", "serial_gen", "pin", "no_sleep", "gc_freeze")


def parse_schedule(text: str, gpus: int, tp: int) -> list[str]:
    steps = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(steps) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown} in the schedule {text!r}; known: {', '.join(VARIANTS)}")
    if "serial_gen" in steps and (gpus == 1 or tp != 1):
        raise SystemExit("serial_gen needs several replicas of tensor_model_parallel_size 1 (2gpu_tp1)")
    if len(steps) < 2:
        raise SystemExit(f"the schedule {text!r} has {len(steps)} step(s): step 1 is the warm-up, give at least 2")
    return steps


# --- pinning: which CPUs each rank gets ------------------------------------------------------------------

def cpu_sets(ranks: list[dict[str, Any]], cores_per_rank: int = 4) -> list[list[int]]:
    """Disjoint CPU sets, one per rank: `cores_per_rank` physical cores (with their SMT siblings) of the
    rank's NUMA node when it is known (else of every CPU the process may use), in order of rank.

    `ranks[r]`: {"allowed": [cpu ids], "numa_cpus": [cpu ids of its GPU's node] or [], "siblings": {cpu: first
    sibling}}. Falls back to an equal split of what is left when a node has too few cores.
    """
    taken: set[int] = set()
    out: list[list[int]] = []
    every_core = {rank.get("siblings", {}).get(c, rank.get("siblings", {}).get(str(c), c))
                  for rank in ranks for c in rank["allowed"]}
    cores_per_rank = max(1, min(cores_per_rank, len(every_core) // max(1, len(ranks))))
    for rank in ranks:
        allowed = set(rank["allowed"])
        pool = [c for c in (rank["numa_cpus"] or rank["allowed"]) if c in allowed and c not in taken]
        siblings = {int(k): v for k, v in rank.get("siblings", {}).items()}
        cores: dict[int, list[int]] = {}
        for cpu in pool:
            cores.setdefault(siblings.get(cpu, cpu), []).append(cpu)
        chosen = [cpu for core in list(cores)[:cores_per_rank] for cpu in cores[core]]
        if not chosen:  # nothing left on the node: any free allowed CPU
            chosen = [c for c in sorted(allowed) if c not in taken][:cores_per_rank]
        out.append(sorted(chosen))
        taken.update(chosen)
    return out


def where_cpus(worker: Any) -> dict[str, Any]:
    """In a worker: the CPUs it may use, its GPU's NUMA node and that node's CPUs, SMT siblings."""
    import subprocess as sp

    allowed = sorted(os.sched_getaffinity(0))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    numa, numa_cpus, bus = -1, [], ""
    try:
        bus = sp.run(["nvidia-smi", "-i", visible, "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                     capture_output=True, text=True, timeout=20).stdout.strip()
        domain, rest = bus.split(":", 1)
        node_file = Path(f"/sys/bus/pci/devices/{domain[-4:].lower()}:{rest.lower()}/numa_node")
        numa = int(node_file.read_text()) if node_file.is_file() else -1
        if numa >= 0:
            numa_cpus = parse_cpu_list(Path(f"/sys/devices/system/node/node{numa}/cpulist").read_text())
    except Exception:  # noqa: BLE001 - a VM that hides its topology: pin without NUMA
        pass
    siblings = {}
    for cpu in allowed:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings[cpu] = parse_cpu_list(path.read_text())[0] if path.is_file() else cpu
    return {"rank": worker.rank, "allowed": allowed, "numa": numa, "numa_cpus": numa_cpus, "gpu_bus": bus,
            "siblings": siblings, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "threads": len(os.listdir("/proc/self/task")), "torch_threads": __import__("torch").get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            low, high = part.split("-")
            cpus.extend(range(int(low), int(high) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def set_thread_affinity(worker: Any, cpus: list[int] | None) -> dict[str, Any]:
    """In a worker: pin every thread of the process to `cpus` (None: back to what each had before)."""
    saved = getattr(worker, "_diag_affinity", None)
    done = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            if cpus is None:
                if saved and int(tid) in saved:
                    os.sched_setaffinity(int(tid), saved[int(tid)])
                    done += 1
            else:
                if saved is None:
                    worker._diag_affinity = saved = {}
                saved.setdefault(int(tid), os.sched_getaffinity(int(tid)))
                os.sched_setaffinity(int(tid), cpus)
                done += 1
        except OSError:  # a thread that ended meanwhile
            continue
    if cpus is None:
        worker._diag_affinity = None
    return {"rank": worker.rank, "threads_set": done}


def set_sleeps(worker: Any, sleeps: bool) -> bool:
    backend = worker.rollout
    if not hasattr(backend, "sleeps"):
        return False
    backend.sleeps = sleeps and worker.resolved.config.actor_rollout_ref.rollout.free_cache_engine
    return backend.sleeps


def cpu_probe_ms(worker: Any = None) -> float:
    """A fixed pure-Python workload's milliseconds (~20 ms on a 4 GHz core), run in a worker (`worker` given, as
    on_workers calls it) or here: if it slows down with the engine step, the CPU itself was slower (the guest's
    vCPU, its frequency), not the engine's work. Self-contained: it travels to the workers by value."""
    started = time.perf_counter()
    total = 0
    for i in range(400_000):
        total += i * i % 7
    return (time.perf_counter() - started) * 1e3


def set_gc_freeze(worker: Any, on: bool) -> bool:
    """In a worker: while `on`, the rollout's generate runs with every object that exists before it frozen out of
    Python's collector (gc.freeze, gc.unfreeze after): a collection then walks only what generating creates."""
    import gc

    backend = worker.rollout
    if not on:
        vars(backend).pop("generate", None)  # the class's method again
        return False
    original = type(backend).generate

    def frozen(*args: Any, **kwargs: Any) -> Any:
        gc.freeze()
        try:
            return original(backend, *args, **kwargs)
        finally:
            gc.unfreeze()

    backend.generate = frozen
    return True


def start_profile(worker: Any) -> None:
    worker.start_profile()


def stop_profile_summary(worker: Any) -> str:
    return worker.stop_profile_summary(row_limit=30)


# --- the driver's side: each call's seconds, and generate one replica at a time -------------------------

class TimedGroup:
    """A worker group that records each call's method and seconds (the driver's view, Ray included), and
    can send `generate` to one rank at a time (`serial_generate`)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls, self.serial_generate = inner, [], False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def call_all(self, method: str, *args: Any) -> list[Any]:
        started = time.time()
        out = self.inner.call_all(method, *args)
        self.calls.append({"method": method, "start": started, "seconds": time.time() - started})
        return out

    def call_sharded(self, method: str, shards: Any) -> list[Any]:
        started = time.time()
        if self.serial_generate and method == "generate":
            out = []
            for rank, shard in enumerate(shards):
                out += self.inner.collect(self.inner.submit_to(rank, method, shard))
        else:
            out = self.inner.call_sharded(method, shards)
        self.calls.append({"method": method, "start": started, "seconds": time.time() - started,
                           "serial": self.serial_generate and method == "generate"})
        return out


def on_workers(group: Any, fn: Any, *per_rank_args: Any) -> list[Any]:
    """Run `fn(worker, *args)` in every rank's process (`per_rank_args[i][r]` is rank r's i-th argument)."""
    import ray

    refs = [w.__ray_call__.remote(fn, *(args[rank] for args in per_rank_args))
            for rank, w in enumerate(group.workers)]
    return ray.get(refs)


# --- one configuration, in its own process -----------------------------------------------------------------

def run_child(name: str, model: str, schedule: list[str], extra: list[str], out_dir: Path) -> dict[str, Any]:
    import tempfile

    from engine.launch import device_memory_override, start_ray
    from engine.trainer import build_trainer
    from engine.workers.cluster.placement import worker_group_factory
    from rlconf.compile import compile_plan
    from rlconf.device import local_gpu

    gpus, tp = CONFIGS[name]
    prompts = PROMPTS * gpus
    overrides = plan_overrides(model, len(schedule)) + config_overrides(name, gpus, tp, prompts) + extra
    plan = ROOT / "presets" / "quickstart.yaml"
    result = compile_plan(plan, overrides)
    if result.resolved is None:
        raise SystemExit("\n".join(d.message for d in result.diagnostics))
    memory, _ = device_memory_override(result.resolved, local_gpu())
    if memory is not None:
        result = compile_plan(plan, [*overrides, memory])
    resolved = result.resolved
    out: dict[str, Any] = {"config": name, "gpus": gpus, "tp": tp, "prompts": prompts, "schedule": schedule,
                           "overrides": overrides, "steps": []}
    started = time.perf_counter()
    start_ray(None, False, num_cpus=None, num_gpus=None)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        trainer = build_trainer(resolved, run_dir, worker_group_factory(resolved, run_dir), log=print)
        out["startup_s"] = time.perf_counter() - started
        group = TimedGroup(trainer.group)
        trainer.group = group
        out["workers"] = on_workers(group, where_cpus)
        pins = cpu_sets(out["workers"])
        on_workers(group, lambda w: w.rank_timeline())  # start-up's spans: not a step's
        profile_text, sleeping = "", True
        partial = out_dir / f".child_{name}.json"
        for step, variant in enumerate(schedule, start=1):
            group.serial_generate = variant == "serial_gen"
            if variant == "pin":
                on_workers(group, set_thread_affinity, pins)
            if sleeping != (variant != "no_sleep"):
                sleeping = variant != "no_sleep"
                on_workers(group, set_sleeps, [sleeping] * gpus)
            if variant == "gc_freeze":
                on_workers(group, set_gc_freeze, [True] * gpus)
            if variant == "profile":
                on_workers(group, start_profile)
            probes = on_workers(group, cpu_probe_ms)
            group.calls.clear()
            step_start = time.time()
            metrics = trainer.step(step)
            record = {"step": step, "variant": variant, "start": step_start, "metrics": metrics,
                      "driver_calls": list(group.calls), "cpu_probe_ms": probes + on_workers(group, cpu_probe_ms)}
            if variant == "profile":
                profile_text += "".join(on_workers(group, stop_profile_summary))
            record["ranks"] = on_workers(group, lambda w: w.rank_timeline())
            out["steps"].append(record)
            if variant == "pin":
                on_workers(group, set_thread_affinity, [None] * gpus)
            if variant == "gc_freeze":
                on_workers(group, set_gc_freeze, [False] * gpus)
            engine = " ".join(f"{key.split('/')[-1]} {metrics[key]:.4g}" for key in (
                "timing/rollout_engine_step_median", "timing/rollout_engine_gc") if key in metrics)
            print(f"{name} step {step} ({variant}): {metrics['timing/step']:.2f} s; {engine}; CPU probe ms before/after "
                  f"(by rank) {[round(ms, 1) for ms in record['cpu_probe_ms']]}", flush=True)
            out["pins"], out["wall_s"] = pins, time.perf_counter() - started
            partial.write_text(json.dumps(out, default=str))  # what a timeout leaves is still read
        out["pins"] = pins
        out["wall_s"] = time.perf_counter() - started
        if profile_text:
            (out_dir / f"profile_{name}.txt").write_text(profile_text)
        trainer.close()
    return out


# --- reading the results -------------------------------------------------------------------------------------

STAGE_SPANS = ["generate", "generate/wake_kv_cache/empty_cache", "generate/wake_kv_cache/wake_up",
               "generate/reset_prefix_cache", "generate/engine", "generate/postprocess", "generate/sleep",
               "update_actor", "update_actor/counts", "update_actor/micro_batches", "update_actor/clip_grad_norm",
               "update_actor/optimizer_step", "update_actor/read_back", "weight_sync",
               "weight_sync/wake_weights/empty_cache", "weight_sync/wake_weights/wake_up"]


def rank_stage_seconds(step: dict[str, Any]) -> dict[int, dict[str, dict[str, float]]]:
    """{rank: {span: {seconds, thread_cpu_s, involuntary_switches, ...}}} of one step (spans summed by name)."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for rank_info in step["ranks"]:
        spans: dict[str, dict[str, float]] = {}
        for span in rank_info["spans"]:
            into = spans.setdefault(span["span"], {})
            for key, value in span.items():
                if isinstance(value, (int, float)) and key != "start":
                    into[key] = into.get(key, 0) + value
            into.setdefault("first_start", span.get("start", 0.0))
        out[rank_info["rank"]] = spans
    return out


def steady(result: dict[str, Any], variant: str) -> list[dict[str, Any]]:
    """The steps of `variant` after the warm-up (no_sleep: its second and later steps only)."""
    steps = [s for s in result["steps"][1:] if s["variant"] == variant]
    return steps[1:] if variant == "no_sleep" else steps


def median_table(result: dict[str, Any], variant: str) -> dict[str, Any]:
    steps = steady(result, variant)
    if not steps:
        return {}
    table: dict[str, Any] = {"steps": [s["step"] for s in steps]}
    for key in ("timing/step", "timing/generate", "timing/update_actor", "timing/weight_sync"):
        values = [s["metrics"][key] for s in steps if key in s["metrics"]]
        if values:
            table[key] = statistics.median(values)
    per_rank = [rank_stage_seconds(s) for s in steps]
    for rank in sorted(per_rank[0]):
        for span in STAGE_SPANS:
            for field in ("seconds", "thread_cpu_s", "involuntary_switches", "engine_steps", "engine_median_ms",
                          "engine_p90_ms", "engine_slow_steps", "engine_slow_excess_s", "engine_thread_cpu_s",
                          "gather_s"):
                values = [p[rank][span][field] for p in per_rank if span in p.get(rank, {}) and field in p[rank][span]]
                if values:
                    table[f"rank{rank}/{span}/{field}"] = statistics.median(values)
    # When each rank began generating, after the first one: the driver's dispatch skew.
    skews = []
    for p in per_rank:
        starts = [p[r]["generate"]["first_start"] for r in p if "generate" in p[r]]
        if len(starts) > 1:
            skews.append(max(starts) - min(starts))
    if skews:
        table["generate_start_skew_s"] = statistics.median(skews)
    return table


KEY_FIGURES = [("step s", "timing/step"), ("generate s (driver)", "timing/generate"),
               ("update s (driver)", "timing/update_actor"), ("sync s (driver)", "timing/weight_sync"),
               ("gen start skew s", "generate_start_skew_s")]
RANK_FIGURES = [("generate", "generate/seconds"), ("  wake kv", "generate/wake_kv_cache/wake_up/seconds"),
                ("  empty_cache", "generate/wake_kv_cache/empty_cache/seconds"),
                ("  engine", "generate/engine/seconds"), ("  engine steps", "generate/engine/engine_steps"),
                ("  step median ms", "generate/engine/engine_median_ms"),
                ("  step p90 ms", "generate/engine/engine_p90_ms"),
                ("  slow steps", "generate/engine/engine_slow_steps"),
                ("  slow excess s", "generate/engine/engine_slow_excess_s"),
                ("  engine thread cpu s", "generate/engine/engine_thread_cpu_s"),
                ("  involuntary sw", "generate/involuntary_switches"),
                ("  postprocess", "generate/postprocess/seconds"), ("  sleep", "generate/sleep/seconds"),
                ("update", "update_actor/seconds"), ("  counts (waits peer)", "update_actor/counts/seconds"),
                ("  micro batches", "update_actor/micro_batches/seconds"),
                ("  clip (waits GPU)", "update_actor/clip_grad_norm/seconds"),
                ("  optimizer step", "update_actor/optimizer_step/seconds"),
                ("  read back", "update_actor/read_back/seconds"),
                ("weight sync", "weight_sync/seconds"), ("  wake weights", "weight_sync/wake_weights/wake_up/seconds"),
                ("  gather (CPU side)", "weight_sync/gather_s")]


def key_figures(results: dict[str, Any]) -> list[str]:
    """One column per (configuration, variant): the driver's stage seconds and each rank's own."""
    columns = []
    for name, result in results.get("configs", {}).items():
        if "error" in result:
            continue
        for variant in VARIANTS:
            table = median_table(result, variant)
            if table:
                columns.append((f"{name}:{variant}", table, result["gpus"]))
    if not columns:
        return []
    width = max(12, *(len(c[0]) for c in columns))
    lines = ["## key figures (medians of the steady steps of each variant; rankN: that rank's own seconds)",
             f"{'':<28}" + "".join(f"{c[0]:>{width + 1}}" for c in columns)]

    def cell(table: dict[str, Any], key: str) -> str:
        value = table.get(key)
        return f"{value:>{width + 1}.4g}" if isinstance(value, (int, float)) else f"{'-':>{width + 1}}"

    for label, key in KEY_FIGURES:
        lines.append(f"{label:<28}" + "".join(cell(c[1], key) for c in columns))
    for rank in range(max(c[2] for c in columns)):
        for label, key in RANK_FIGURES:
            lines.append(f"{f'rank{rank} {label}':<28}" + "".join(cell(c[1], f"rank{rank}/{key}") for c in columns))
    return lines


def report(results: dict[str, Any]) -> str:
    lines = key_figures(results)
    host = results.get("host_contention", {})
    if host.get("ranks"):
        lines.append("## host contention (bench/host_contention.py): rank: alone -> both at once")
        for rank, phases in host["ranks"].items():
            for phase in ("cpu", "decode", "alloc", "alloc_expandable"):
                alone, both = phases.get(f"{phase}/alone", {}), phases.get(f"{phase}/both", {})
                for field in sorted(set(alone) & set(both)):
                    if isinstance(alone[field], (int, float)):
                        lines.append(f"rank {rank} {phase} {field}: {alone[field]:.4g} -> {both[field]:.4g} "
                                     f"({both[field] / alone[field]:.2f}x)" if alone[field] else "")
            if "nccl" in phases:
                lines.append(f"rank {rank} nccl: " + ", ".join(f"{k}={v:.3g}" for k, v in phases["nccl"].items()))
        lines += host.get("nccl_lines", [])[:12]
    for name, result in results.get("configs", {}).items():
        if "error" in result:
            lines.append(f"## {name}: failed: {result['error']}")
            continue
        lines.append(f"## {name} (startup {result.get('startup_s', 0):.0f} s, wall {result.get('wall_s', 0):.0f} s)")
        for variant in VARIANTS:
            table = median_table(result, variant)
            if not table:
                continue
            lines.append(f"### {variant} (steps {table.pop('steps')}), medians")
            lines += [f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}"
                      for key, value in table.items()]
    return "\n".join(line for line in lines if line) + "\n"


def host_info() -> dict[str, str]:
    commands = {"nvidia_smi": ["nvidia-smi", "--query-gpu=index,name,pci.bus_id,clocks.sm,clocks.max.sm,power.draw,"
                               "power.limit,temperature.gpu,pstate", "--format=csv"],
                "topo": ["nvidia-smi", "topo", "-m"], "lscpu": ["lscpu"], "nproc": ["nproc"],
                "numa": ["sh", "-c", "cat /sys/devices/system/node/node*/cpulist 2>/dev/null"],
                "cgroup_cpu": ["sh", "-c", "cat /sys/fs/cgroup/cpu.max 2>/dev/null; cat /proc/loadavg"]}
    out = {}
    for key, command in commands.items():
        try:
            out[key] = subprocess.run(command, capture_output=True, text=True, timeout=20).stdout[-3000:]
        except Exception as exc:  # noqa: BLE001
            out[key] = f"{type(exc).__name__}: {exc}"
    return out


def wait_for_free_gpus(max_used_mib: int = 2048, timeout: float = 30.0) -> None:
    """Until every GPU has at most `max_used_mib` in use (the last configuration's processes gone), or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=10).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            return  # no nvidia-smi: a CPU run
        if not used or all(int(mib) <= max_used_mib for mib in used):
            return
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="2gpu_tp1,1gpu")
    parser.add_argument("--model", default="random://Qwen2.5-0.5B")
    parser.add_argument("--schedule-1gpu", default=SCHEDULES["1gpu"])
    parser.add_argument("--schedule-2gpu", default=SCHEDULES["2gpu_tp1"])
    parser.add_argument("--no-knobs", action="store_true", help="leave out the default knobs (KNOBS)")
    parser.add_argument("--skip-host", action="store_true", help="leave out bench/host_contention.py")
    parser.add_argument("--budget-s", type=float, default=520.0, help="start no configuration after this")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of every configuration's plan")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = ([] if args.no_knobs else KNOBS) + args.overrides
    if args.child:
        gpus, tp = CONFIGS[args.child]
        schedule = parse_schedule(args.schedule_1gpu if gpus == 1 else args.schedule_2gpu, gpus, tp)
        result = run_child(args.child, args.model, schedule, extra, out_dir)
        (out_dir / f".child_{args.child}.json").write_text(json.dumps(result, default=str))
        import ray

        ray.shutdown()  # the workers go, and their GPU memory with them, before the next configuration starts
        os._exit(0)  # vLLM's and torch's exit handlers can take tens of seconds; the results are written
    started = time.perf_counter()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "overrides": extra,
                               "host": host_info(), "configs": {}}

    def save() -> None:
        (out_dir / "diagnose.json").write_text(json.dumps(results, indent=1, default=str))
        (out_dir / "diagnose.txt").write_text(report(results))

    for name in args.configs.split(","):  # every mistake in the arguments before anything starts
        if name not in SCHEDULES:  # 2gpu_offpolicy steps through another loop (a rollout pool of its own)
            raise SystemExit(f"--configs: {name!r} is not diagnosed here; choose from {', '.join(SCHEDULES)}")
        gpus, tp = CONFIGS[name]
        parse_schedule(args.schedule_1gpu if gpus == 1 else args.schedule_2gpu, gpus, tp)
    if not args.skip_host:
        import host_contention

        results["host_contention"] = host_contention.run([0, 1])
        save()
    for name in args.configs.split(","):
        gpus, tp = CONFIGS[name]
        left = args.budget_s - (time.perf_counter() - started)
        if left < 120:
            results["configs"][name] = {"error": f"not started: {left:.0f} s of the budget left"}
            continue
        wait_for_free_gpus()
        child = out_dir / f".child_{name}.json"
        command = [sys.executable, __file__, "--child", name, "--model", args.model, "--out", str(out_dir),
                   "--schedule-1gpu", args.schedule_1gpu, "--schedule-2gpu", args.schedule_2gpu,
                   *(["--no-knobs"] if args.no_knobs else []), *args.overrides]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=left, cwd=ROOT,
                                  env=dict(os.environ, PYTHONUNBUFFERED="1"))
            log, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            log = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
            code = "timeout"
        (out_dir / f"log_{name}.txt").write_text(log[-4_000_000:])
        if child.is_file():
            results["configs"][name] = json.loads(child.read_text())
            child.unlink()
        else:
            results["configs"][name] = {"error": f"exit {code}", "log_tail": log[-3000:]}
        save()
    save()
    print(report(results))


if __name__ == "__main__":
    main()
