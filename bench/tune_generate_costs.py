"""The generation terms of `rlconf tune`'s throughput model, measured with every engine alive at once and the
generate calls interleaved.

    python bench/tune_generate_costs.py [--config 0.5b_1gpu] [--points util_0.3,util_0.3-async,util_0.7]
                                        [--rounds 6] [--out DIR]
    python bench/tune_generate_costs.py --device cpu --rounds 2   # the pipeline, on CPU (HF rollout, tiny model)

Why: launches of the same knobs generated the same 128 × 512 tokens in 2.8 to 4.7 s on the lent hosts
(docs/benchmarks.md, "`rlconf tune` on one H100"): vLLM's engine step at this size is bound by the host's CPU, whose
speed drifts between launches, so single-launch points measured async scheduling at ×1.46 (slower) while the
hand-tuned plan, with it, generated fastest in the same call. Here each point is one engine of its own
(engine/rollout/vllm.py's VLLMRollout, built from the point's compiled plan as the actor worker builds it, in a
child process of its own: one vLLM per process), started one after another and put to sleep (an awake point's engine
stays awake); then each round runs the rollout's part of a step on every engine in turn (each round starting one
engine later) — the weights pushed (waking them), generate (waking the KV cache), sleep; for an awake engine the
push and generate alone — so a slow stretch of the host falls on every point alike. An
engine that errs, dies or does not answer within its time is ended and left out of the later rounds. Round 0 is a warm-up; a point's figure is
the median of the other rounds, and `generate_rounds` keeps each.

Points: `util_U` (gpu_memory_utilization U) and `util_U-async` (the same with vLLM's async scheduling), on the
workload of bench/tune.py's configuration (its untuned plan) with `max_num_seqs` at what a replica has in flight, as
the tuner sets it; `-awake` on either keeps that engine awake between rounds (free_cache_engine false: no sleep, no
wakes, weights pushed into a running engine), against the same point without it: the tuner's keep_awake_factor;
`-mp` runs that engine's core and model runner in processes of their own (distributed_executor_backend mp, the
weights by CUDA IPC), against the same point in process: the tuner's own_processes_factor.
Only one engine sleeps and wakes at a time, so the utilizations of the asleep ones need not add up below 1; the
awake ones hold theirs throughout.

Writes points.json (under --out, else $OUT), marked `"measured": "in_process"`, `"terms": "generation"`, rewritten
after each round: `python bench/tune_costs.py --fit TRAINING/points.json THIS/points.json --write
rlconf/tune_costs.json` takes the generation curve, async scheduling's, keeping awake's and the own processes'
factors and generate_spread from it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from out_dir import out_dir  # noqa: E402

from tune import ARR, COMMON, CONFIGS, Config, _overrides_yaml, device_name, workload_yaml  # noqa: E402

DEFAULT_POINTS = "util_0.3,util_0.3-async,util_0.7"
CPU_CONFIG = Config("tiny://qwen2", 1, 4, 2, "quickstart_preset", device="cpu")
START_TIMEOUT_S, ROUND_TIMEOUT_S = 300.0, 120.0


def parse_point(point: str) -> tuple[float, bool, bool, bool]:
    """`util_U`, optionally `-async`, and `-awake` or `-mp` -> (U, async scheduling, kept awake, vLLM in processes
    of its own). `util_U+async`, the name it had when the shipped profile was measured (its recorded command says
    so), is read alike."""
    name, *extras = point.replace("+", "-").split("-")
    kind, _, value = name.partition("_")
    if (kind != "util" or not set(extras) <= {"async", "awake", "mp"} or len(set(extras)) != len(extras)
            or {"awake", "mp"} <= set(extras)):
        raise ValueError(f"{point}: a generation point is util_U, optionally -async, and -awake or -mp")
    return float(value), "async" in extras, "awake" in extras, "mp" in extras


# What the awake engines may hold together with the largest asleep one while it wakes: each child also keeps a CUDA
# context and the HF model it pushes from on the GPU.
AWAKE_ROOM = 0.85


def check_points(points: list[str], device: str) -> None:
    """Every `-awake` or `-mp` point has its twin (the same utilization and async scheduling, asleep and in process)
    to be paired with, and, on a GPU, the awake engines' shares (held throughout) and the largest asleep one's
    (while it wakes) fit."""
    parsed = {point: parse_point(point) for point in points}
    plain = {(u, a) for u, a, awake, mp in parsed.values() if not awake and not mp}
    for point, (utilization, async_scheduling, awake, mp) in parsed.items():
        if (awake or mp) and (utilization, async_scheduling) not in plain:
            twin = f"util_{utilization:g}" + ("-async" if async_scheduling else "")
            raise SystemExit(f"{point}: its twin {twin} is not among --points, so nothing measures the factor")
    held = sum(u for u, _, awake, _ in parsed.values() if awake)
    waking = max((u for u, _, awake, _ in parsed.values() if not awake), default=0.0)
    if device == "cuda" and held + waking > AWAKE_ROOM:
        raise SystemExit(f"the awake points hold {held:g} of the GPU throughout, and the largest asleep one wakes to "
                         f"{waking:g} beside them: {held + waking:g} is over {AWAKE_ROOM} (each engine's process also "
                         "keeps a CUDA context and the model it pushes from); measure fewer or smaller points at once")


def point_overrides(point: str, in_flight: int, device: str) -> list[str]:
    from rlconf.tune import in_flight_cap
    from tune_costs import ASYNC_KEY

    if device != "cuda":
        return []
    utilization, async_scheduling, awake, mp = parse_point(point)
    # Async scheduling by name either way: left unset, vLLM 0.25 turns it on (bench/tune_costs.py's ASYNC_KEY).
    return [f"{ARR}.rollout.gpu_memory_utilization={utilization}", f"{ARR}.rollout.max_num_seqs={in_flight_cap(in_flight)}",
            f"{ASYNC_KEY}={str(async_scheduling).lower()}", *([f"{ARR}.rollout.free_cache_engine=false"] if awake else []),
            *([f"{ARR}.rollout.engine_kwargs.vllm.distributed_executor_backend=mp"] if mp else [])]


def compile_point(config: Config, point: str, folder: Path, gpu_memory: float) -> tuple[Path, list[str]]:
    """The point's plan (the workload's untuned plan with the point's knobs) and those knobs; `max_num_seqs` from
    the sequences a replica has in flight as the compiler counts them, which the tuner reads too."""
    from rlconf.compile import compile_plan

    untuned = folder / "untuned.yaml"
    if not untuned.is_file():
        untuned.write_text(workload_yaml(config, gpu_memory))
    in_flight = compile_plan(untuned, COMMON).normalized.rollout.sequences_per_replica.value
    knobs = point_overrides(point, in_flight, config.device)
    path = folder / f"{point}.yaml"
    path.write_text(f"# bench/tune_generate_costs.py's point {point}\nbase: untuned.yaml\n" + _overrides_yaml(knobs))
    result = compile_plan(path, COMMON)
    if result.resolved is None:
        raise SystemExit(f"{point}: does not compile: " + "; ".join(d.message for d in result.errors))
    return path, knobs


def prompt_rows(count: int, length: int, vocab: int) -> dict[str, Any]:
    """`count` full-length prompts of random token ids (a random model has no better ones), as the trainer hands
    them to the rollout: left-padded rows with their mask (none padded here)."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (count, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def engine_child(conn: Any, point: str, plan: str, log: str) -> None:
    """One point's rollout engine, driven by the parent: "round" runs push → generate → sleep (an awake engine's
    sleep does nothing) and answers its timings; "stop" ends. Anything raised goes back as {"error": ...}."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        conn.send(_serve(conn, Path(plan)))
    except Exception as exc:  # noqa: BLE001 - the parent reports it, with the log's path
        traceback.print_exc()
        conn.send({"error": f"{type(exc).__name__}: {exc}"})


def _serve(conn: Any, plan: Path) -> dict[str, Any]:
    import torch

    from engine.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
    from engine.rollout.base import Sampling
    from engine.workers.cluster.device import join_process_group, listen_for_rendezvous, set_rendezvous_env
    from rlconf.compile import compile_plan

    compiled = compile_plan(plan, COMMON)
    resolved = compiled.resolved
    config = resolved.config
    rollout = config.actor_rollout_ref.rollout
    cuda = config.trainer.device == "cuda"
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(0)
    # vLLM's external launcher runs over a one-rank group; each child its own port
    set_rendezvous_env(0, 1, "127.0.0.1", listen_for_rendezvous("127.0.0.1"), "127.0.0.1")
    join_process_group(device, 0, 1)
    model_dir = resolve_model_path(config.actor_rollout_ref.model.path)
    tokenizer = load_tokenizer(model_dir)
    dtype = torch.bfloat16 if rollout.dtype == "bfloat16" else torch.float32
    model = load_causal_lm(model_dir).to(device=device, dtype=dtype)
    started = time.perf_counter()
    if rollout.name == "vllm":
        from engine.rollout.vllm import VLLMRollout

        backend = VLLMRollout(str(model_dir), rollout, resolved.roles.rollout.max_model_len, 1, rollout.seed,
                              tokenizer.eos_token_id, tokenizer.pad_token_id)
        weights = list(model.named_parameters())
        backend.load_weights(weights)
        backend.release()
    else:  # CPU: the HF rollout, the pipeline's test
        from engine.rollout.hf import HFRollout

        backend, weights = HFRollout(model, device, dtype, tokenizer.pad_token_id, tokenizer.eos_token_id), None
    start_s = time.perf_counter() - started
    rows = compiled.normalized.rollout.sequences_per_replica.value  # one replica: the whole generation round
    prompts = prompt_rows(rows, config.data.max_prompt_length, model.config.vocab_size)
    sampling = Sampling.from_plan(rollout, ignore_eos=True, max_new_tokens=config.data.max_response_length,
                                  log_probs=resolved.roles.rollout.log_probs)
    conn.send({"ready": True, "start_s": round(start_s, 2), "sequences": rows,
               "sampled_tokens": rows * config.data.max_response_length})
    while conn.recv() == "round":
        began = time.perf_counter()
        if weights is not None:
            backend.load_weights(weights)
        pushed = time.perf_counter()
        out = backend.generate(prompts, sampling)
        if cuda:
            torch.cuda.synchronize()
        generated = time.perf_counter()
        if weights is not None:
            backend.release()
        ended = time.perf_counter()
        timings = backend.timings() if hasattr(backend, "timings") else {}
        conn.send({"push_s": pushed - began, "generate_s": generated - pushed, "sleep_s": ended - generated,
                   "sampled": int(out["response_mask"].sum()) if "response_mask" in out else None,
                   "engine_step_median_ms": (1000 * timings["engine_step_median"]
                                             if "engine_step_median" in timings else None)})
    return {"stopped": True}


def answer_of(conn: Any, timeout_s: float) -> dict[str, Any]:
    """The child's next answer, or an error when it said nothing within `timeout_s` or its process is gone."""
    try:
        if conn.poll(timeout_s):
            return conn.recv()
    except (EOFError, OSError):
        return {"error": "the engine's process ended without an answer"}
    return {"error": f"no answer in {timeout_s:.0f} s"}


def end(process: Any) -> None:
    process.terminate()
    process.join(timeout=30)
    if process.is_alive():
        process.kill()
        process.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    from tune_costs import _local_gpu_gib, commit, in_process_arguments, one_gpu_config, write_round

    from rlconf.modelinfo import model_info

    args = in_process_arguments(argv, __doc__.splitlines()[0], DEFAULT_POINTS, "util_0.3,util_0.7", rounds=6)
    config, points = one_gpu_config(args, CPU_CONFIG), args.points
    check_points(points, args.device)
    out = out_dir(args.out, "bench_tune_generate_costs_")
    (out / "plans").mkdir(parents=True, exist_ok=True)
    gpu_memory = args.gpu_memory or (24.0 if args.device == "cpu" else _local_gpu_gib())
    info = model_info(config.model)
    record: dict[str, Any] = {
        "command": " ".join(["bench/tune_generate_costs.py", *(argv if argv is not None else sys.argv[1:])]),
        "measured": "in_process", "terms": "generation", "device": device_name() or args.device,
        "model": config.model.split("://")[-1], "num_params_b": float(f"{info.num_params / 1e9:.4g}"),
        "date": time.strftime("%Y-%m-%d"), "commit": commit(),
        "workload": {"config": args.config or ("cpu" if args.device == "cpu" else "0.5b_1gpu"), "rounds": args.rounds,
                     "common": COMMON}, "points": []}
    context = multiprocessing.get_context("spawn")  # CUDA and vLLM: never fork
    children: dict[str, tuple[Any, Any]] = {}
    started: list[Any] = []  # every child, from its start: one interrupted while starting is ended too
    entries: dict[str, dict[str, Any]] = {}
    try:
        for point in points:  # one at a time: vLLM's memory profile at start-up must see no other engine starting
            utilization, async_scheduling, awake, mp = parse_point(point)
            plan, knobs = compile_point(config, point, out / "plans", gpu_memory)
            parent, child = context.Pipe()
            log = out / f"{point}.log"
            # An `-mp` engine starts vLLM's own processes, which a daemonic process may not have: that child is not
            # one (the finally below ends every child however the bench ends).
            process = context.Process(target=engine_child, daemon=not mp,
                                      args=(child, point, str(plan), str(log)))
            process.start()
            started.append(process)
            child.close()  # the child's end lives in the child: a child that dies then reads as closed (EOFError)
            entry = {"point": point, "utilization": utilization if args.device == "cuda" else None,
                     "async_scheduling": async_scheduling, "awake": awake, "own_processes": mp, "log": log.name,
                     "knobs": knobs,
                     "generate_rounds": [], "rollout_rounds": [], "engine_step_median_ms": []}
            entries[point] = entry
            answer = answer_of(parent, START_TIMEOUT_S)
            if "error" in answer:
                entry["error"] = answer["error"]
                print(f"--- {point}: did not start: {answer['error']} (see {log})", flush=True)
                end(process)  # its memory free before the next engine's start checks it
                continue
            entry.update(start_s=answer["start_s"], sequences=answer["sequences"])
            record["workload"].update(sequences_per_gpu=answer["sequences"], sampled_tokens=answer["sampled_tokens"])
            children[point] = (parent, process)
            print(f"--- {point}: engine started in {answer['start_s']:.1f} s", flush=True)
        for round_ in range(args.rounds + 1):
            order = list(children)
            shift = round_ % len(order) if order else 0
            for point in order[shift:] + order[:shift]:  # each engine takes each place in turn
                entry, (conn, process) = entries[point], children[point]
                try:
                    conn.send("round")
                except OSError as exc:
                    answer = {"error": f"the engine's process is gone ({exc})"}
                else:
                    answer = answer_of(conn, ROUND_TIMEOUT_S)
                if "error" in answer:  # out for good: a late answer would land in another engine's round
                    entry["error"] = answer["error"]
                    print(f"--- {point}: {answer['error']} (see {entry['log']})", flush=True)
                    end(process)
                    del children[point]
                    continue
                if round_ == 0:
                    continue  # warm-up: the sampler's first shapes, the allocator
                tokens = (answer["sampled"] or record["workload"]["sampled_tokens"]) / 1000  # ignore_eos: all of them
                entry["generate_rounds"].append(round(answer["generate_s"] / tokens, 6))
                entry["rollout_rounds"].append(round(answer["push_s"] + answer["generate_s"] + answer["sleep_s"], 4))
                if answer["engine_step_median_ms"] is not None:  # vLLM's EngineStepClock (none on the HF rollout)
                    entry["engine_step_median_ms"].append(round(answer["engine_step_median_ms"], 3))
            if round_:
                write_round(out, record, entries, round_, "generate")
    finally:
        for conn, process in children.values():
            try:
                conn.send("stop")
            except OSError:
                pass
            process.join(timeout=30)
        for process in started:  # those that did not stop, and any cut off while starting
            if process.is_alive():
                end(process)
    record["points"] = list(entries.values())
    (out / "points.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out / 'points.json'}")
    return 0 if all("error" not in e for e in entries.values()) and entries else 1


if __name__ == "__main__":
    sys.exit(main())
