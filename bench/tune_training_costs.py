"""The training terms of `rlconf tune`'s throughput model, measured inside one process with the points interleaved.

    python bench/tune_training_costs.py [--config 0.5b_1gpu] [--points budget_2,budget_8,budget_32,nockpt_8,compile_8]
                                        [--rounds 4] [--out DIR]
    python bench/tune_training_costs.py --config 1.5b_1gpu --park [--points ...]   # points that cannot share the GPU
    python bench/tune_training_costs.py --device cpu --points budget_2,budget_8 --rounds 2   # the pipeline, on CPU

Why not launches: on the lent hosts, launches with the same training knobs landed 30% apart (docs/benchmarks.md,
"`rlconf tune` on one H100"), while the steps of one launch agree to a few percent, so bench/tune_costs.py's
single-launch points could not tell compiled layers' ×0.89 from their own scatter. Here every point is one
engine actor worker (the engine's own: `ActorRolloutRefWorker.build_trained_actor`, FSDP2 on one rank, as
bench/train_knobs.py builds it) over the same weights and rows, all alive at once; each round times the
training passes of a step (π_old's log-prob pass, `compute_log_prob`, then the update, `update_actor`) of every
point in turn, so a slow stretch of the host falls on all of them. Round 0 is a warm-up (the compiled layers'
first shapes); the point's figure is the median of the other rounds, and `training_rounds` keeps each.

--park: each point's parameters and Adam moments wait in host memory while the other points run, and come to the
GPU before its own passes (engine.workers.fsdp.offload.ModelOffload, the moves outside the timed region; an
offload_K point is not parked, its worker moves its own states inside its passes): the way to measure a size
whose points' states do not fit the GPU together. ModelOffload empties the allocator's cache as a point leaves,
so a parked point's passes pay their allocations again each round: its times compare with the call's other
points, not with an unparked call's (bench/tune_costs.py refuses to fit the two together) (1.5B: 25 GB a point on the GPU; parked,
18.5 GB of host memory a point; 3B: 37 GB a point in host memory, so no more than three fit a 128 GiB host).

Workload: bench/tune.py's configuration (default 0.5b_1gpu: 128 rows of 16 + 512 tokens, full length, two
mini batches), with bench/tune_costs.py's knobs for each point (packing, dynamic batch size at K sequences,
checkpointing on; nockpt_K, compile_K, chunk_K, offload_K change one). Points of generation (util_U, async_K)
need vLLM: bench/tune_costs.py's launches measure those.

Writes points.json in bench/tune_costs.py's format, marked `"measured": "in_process"` (under --out, else $OUT),
rewritten after each round: `python bench/tune_costs.py --fit THIS/points.json LAUNCHES/points.json` then takes
the training terms and their spread from this file and the generation terms from the launches'.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from out_dir import out_dir  # noqa: E402

from train_knobs import engine_worker, make_batch, sync  # noqa: E402
from tune import COMMON, CONFIGS, SAMPLES, Config, device_name, workload_yaml  # noqa: E402
from tune_costs import (_local_gpu_gib, commit, in_process_arguments, one_gpu_config, point_overrides,  # noqa: E402
                        write_round)

TRAINING_POINTS = ("budget", "nockpt", "compile", "chunk", "offload")
DEFAULT_POINTS = "budget_2,budget_8,budget_32,nockpt_8,compile_8"
CPU_CONFIG = Config("tiny://qwen2", 1, 16, 8, "quickstart_preset", device="cpu")


def compile_point(config: Config, point: str, folder: Path, gpu_memory: float):
    from rlconf.compile import compile_plan
    from tune import _overrides_yaml

    kind = point.partition("_")[0]
    if kind not in TRAINING_POINTS:
        raise SystemExit(f"{point}: not a training point ({', '.join(k + '_K' for k in TRAINING_POINTS)}); "
                         "generation points need vLLM: bench/tune_costs.py")
    untuned = folder / "untuned.yaml"
    if not untuned.is_file():
        untuned.write_text(workload_yaml(config, gpu_memory))
    lengths = compile_plan(untuned, COMMON).normalized.rollout  # the workload's own, as bench/tune_costs.py reads them
    prompt, response = lengths.prompt_length.value, lengths.response_length.value
    path = folder / f"{point}.yaml"
    path.write_text(f"# bench/tune_training_costs.py's point {point}\nbase: untuned.yaml\n"
                    + _overrides_yaml(point_overrides(point, prompt + response, config.device)))
    result = compile_plan(path, COMMON)
    if result.resolved is None:
        raise SystemExit(f"{point}: does not compile: " + "; ".join(d.message for d in result.errors))
    return result.resolved, prompt, response


def rows(config: Config, seq_prompt: int, seq_response: int, vocab: int):
    """Full-length rows, as the estimate's worst case and bench/tune.py's `ignore_eos` launches have them."""
    shape = argparse.Namespace(sequences=config.prompts * SAMPLES // config.gpus, prompt_min=seq_prompt,
                               prompt_max=seq_prompt, response_min=seq_response, response_max=seq_response)
    return make_batch(shape, vocab)


def main(argv: list[str] | None = None) -> int:
    def park_option(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--park", action="store_true", help="keep each idle point's parameters and optimizer "
                            "states in host memory (points whose states do not fit the GPU together)")

    args = in_process_arguments(argv, __doc__.splitlines()[0], DEFAULT_POINTS, "budget_2,budget_8", rounds=4,
                                extra=park_option)
    import torch

    from engine.models.loading import load_causal_lm, resolve_model_path

    config = one_gpu_config(args, CPU_CONFIG)
    out = out_dir(args.out, "bench_tune_training_costs_")
    (out / "plans").mkdir(parents=True, exist_ok=True)
    points = args.points
    gpu_memory = args.gpu_memory or (24.0 if args.device == "cpu" else _local_gpu_gib())
    from engine.workers.cluster.device import join_process_group, listen_for_rendezvous, set_rendezvous_env

    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    # One rank: FSDP2 still needs a process group (as bench/train_knobs.py).
    set_rendezvous_env(0, 1, "127.0.0.1", listen_for_rendezvous("127.0.0.1"), "127.0.0.1")
    join_process_group(device, 0, 1)
    model_dir = resolve_model_path(config.model)
    record = {"command": " ".join(["bench/tune_training_costs.py", *(argv if argv is not None else sys.argv[1:])]),
              "measured": "in_process", "device": device_name() or args.device,
              "model": config.model.split("://")[-1], "date": time.strftime("%Y-%m-%d"), "commit": commit(),
              "workload": {"config": args.config or ("cpu" if args.device == "cpu" else "0.5b_1gpu"),
                           "rounds": args.rounds, "common": COMMON, "parked": args.park}, "points": []}
    workers, entries, parked = {}, {}, {}
    for point in points:
        resolved, prompt, response = compile_point(config, point, out / "plans", gpu_memory)
        seq = prompt + response
        model = load_causal_lm(model_dir).to(device)
        if not record.get("num_params_b"):
            record["num_params_b"] = float(f"{sum(p.numel() for p in model.parameters()) / 1e9:.4g}")
            batch = {k: v.to(device) for k, v in rows(config, prompt, response, model.config.vocab_size).items()}
            tokens = int(batch["attention_mask"].sum())
            record["workload"].update(sequence_tokens=seq, sequences_per_gpu=batch["input_ids"].shape[0], tokens=tokens)
        workers[point] = engine_worker(resolved, model, device)
        # To host memory now: the next point's model loads onto the GPU beside only the running one. Not an offload
        # point: its worker moves its own states around its passes, which a parking context around them would
        # take out of the timing (the uploads it measures would already have happened).
        if args.park and not point.startswith("offload_"):
            parked[point] = park(workers[point], device)
        entries[point] = {"point": point, "knobs": point_overrides(point, seq, config.device), "utilization": None,
                          "training_rounds": [], "update_rounds": [], "old_log_prob_rounds": []}
        print(f"--- {point}: worker built", flush=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # the workers' building is not a point's peak
    for round_ in range(args.rounds + 1):
        for point, worker in workers.items():
            entry = entries[point]
            if "error" in entry:  # out for good: its later rounds would pair with the others' wrong rounds
                continue
            try:
                with parked[point].everything_on_device() if point in parked else contextlib.nullcontext():
                    sync(device)
                    began = time.perf_counter()
                    worker.compute_log_prob(batch)
                    sync(device)
                    middle = time.perf_counter()
                    worker.update_actor(batch)  # the rows' own old log-probs: a random model's ratios stay near 1
                    sync(device)
                    ended = time.perf_counter()
                if device.type == "cuda":  # the GPU's peak during the point's passes: its states and activations,
                    # and, unparked, every other point's states beside them
                    entry["peak_gib"] = round(max(entry.get("peak_gib", 0.0),
                                                  torch.cuda.max_memory_allocated(device) / 2**30), 2)
            except Exception as exc:  # one point's failure (out of memory, a kernel) keeps the others
                entry["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
                continue
            finally:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)  # a failed point's peak is not the next one's
            if round_ == 0:
                continue  # warm-up: allocator, kernels, the compiled layers' first shapes
            entry["old_log_prob_rounds"].append(round(middle - began, 4))
            entry["update_rounds"].append(round(ended - middle, 4))
            entry["training_rounds"].append(round((ended - began) / (tokens / 1000), 6))
        if round_:
            write_round(out, record, entries, round_, "training")
    print(f"wrote {out / 'points.json'}")
    torch.distributed.destroy_process_group()
    return 0 if all("error" not in e for e in entries.values()) else 1


def park(worker: Any, device: Any) -> Any:
    """A ModelOffload of the worker's actor and optimizer with both offloads on: the shard and Adam's moments in
    host memory, on the device only inside `everything_on_device()`. Built here, it moves the shard at once."""
    from engine.workers.fsdp.offload import ModelOffload

    return ModelOffload(worker.actor, worker.optimizer, device, params=True, optimizer_states=True)


if __name__ == "__main__":
    sys.exit(main())
