"""The FSDP knobs where they can pay: the actor update on several GPUs of one host, each knob off and on.

    python bench/fsdp_ranks.py [--world 2] [--shape 0.5b|1.5b] [--steps 5] [--variants a,b,...]
    python bench/fsdp_ranks.py --device cpu --shape tiny --sequences 8 --response-max 64 --steps 1   # smoke test

On one GPU each FSDP all-gather is a local copy (bench/train_knobs.py measures that); here `--world`
ranks (one process and one GPU each, NCCL; gloo on CPU) shard the model and all-gather its layers
from each other, so `fsdp_config.forward_prefetch` has transfers to overlap,
`wrap_policy.min_num_params` changes their size, and `fsdp_size` (hybrid sharding) trades the
all-gathers for whole replicas. The workload is bench/train_knobs.py's on every rank (its
`--sequences` rows of spread lengths per GPU, one optimizer step over all ranks' rows: weak scaling),
the model built and the update run by the same functions (`engine_worker` ->
`ActorRolloutRefWorker.build_trained_actor`, `update_actor`), the plan compiled for `--world` GPUs.

Per variant: seconds per update (the slowest rank), tokens/s over all ranks, MFU per GPU
(6 × params × tokens/s ÷ world ÷ 989e12), the largest rank's peak memory next to rlconf's training
estimate. All variants run in one process group, one after the other; the table is printed last and
written as JSON to $OUT/fsdp_ranks.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import train_knobs  # noqa: E402  (bench/ is not a package)

PACKED_DYNAMIC = train_knobs.VARIANTS["packed+dynamic"]
FAST = train_knobs.VARIANTS["packed+dynamic+triton_head+compile_layers+no_checkpointing+no_reshard+no_sync"]
FSDP = "actor_rollout_ref.actor.fsdp_config."
VARIANTS: dict[str, list[str]] = {
    "packed+dynamic": PACKED_DYNAMIC,
    "packed+dynamic+forward_prefetch": [*PACKED_DYNAMIC, FSDP + "forward_prefetch=true"],
    "packed+dynamic+wrap_min_params_1M": [*PACKED_DYNAMIC, FSDP + "wrap_policy.min_num_params=1000000"],
    # fsdp_size 1: every rank a whole replica (no all-gathers; gradients all-reduced instead of reduce-scattered).
    "packed+dynamic+fsdp_size_1": [*PACKED_DYNAMIC, FSDP + "fsdp_size=1"],
    # The fastest one-GPU configuration (docs/benchmarks.md): weights kept gathered through the micro
    # batches and gradients reduced once, so prefetch has only the first micro batch's gathers to hide.
    "fast": FAST,
    "fast+forward_prefetch": [*FAST, FSDP + "forward_prefetch=true"],
}


def rank_main(rank: int, args: argparse.Namespace, port: int, rows_path: str) -> None:
    import torch
    import torch.distributed as dist
    import transformers

    from engine.batch import split_even
    from engine.workers.cluster.device import join_process_group, set_rendezvous_env

    world = args.world
    if args.device == "cuda":
        # One GPU per rank, as Ray gives each worker its own; before this process first touches CUDA.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
        device = torch.device("cuda", 0)
        torch.cuda.set_device(0)
    else:
        device = torch.device("cpu")
    set_rendezvous_env(rank, world, "127.0.0.1", port, "127.0.0.1")
    join_process_group(device, rank, world)
    # The same seed on every rank: identical weights and rows (FSDP2 does not broadcast them).
    config, state, params = train_knobs.random_model(args.shape)
    everything = train_knobs.make_batch(argparse.Namespace(**{**vars(args), "sequences": args.sequences * world}),
                                        config.vocab_size)
    batch = split_even(everything, world)[rank]
    tokens = int(everything["attention_mask"].sum())
    train_knobs.apply_kernel_arguments(args)
    reference: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for name in [v for v in args.variants.split(",") if v]:
        row: dict[str, Any] = {"variant": name}
        if rank == 0:
            print(f"-- {name}", flush=True)
        try:
            row.update(train_knobs.run_engine_variant(name, args, VARIANTS[name], config, state, batch, device,
                                                      params, tokens, reference, rank, world))
            row["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
        except Exception as exc:  # keep the other variants; the peers fail in the same collective or not at all
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
        # Every rank's result, so the row reports the slowest rank and the largest peak.
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, row)
        rows.append(combine(gathered, tokens, params, world))
        if rank == 0:
            print(json.dumps(rows[-1]), flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 0:
        Path(rows_path).write_text(json.dumps({
            "rows": rows, "params": params, "real_tokens": tokens, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "backend": dist.get_backend()}))
    dist.destroy_process_group()


def combine(ranks: list[dict[str, Any]], tokens: int, params: int, world: int) -> dict[str, Any]:
    """One row from every rank's: the slowest rank's seconds, the largest peak, tokens/s over all ranks."""
    errors = [r["error"] for r in ranks if "error" in r]
    row = dict(ranks[0])
    if errors:
        return {"variant": row["variant"], "error": errors[0]}
    row["seconds_per_update"] = max(r["seconds_per_update"] for r in ranks)
    row["max_memory_gib"] = max(r["max_memory_gib"] for r in ranks)
    row["tokens_per_s"] = tokens / row["seconds_per_update"]
    row["mfu_per_gpu"] = 6 * params * row["tokens_per_s"] / world / train_knobs.PEAK_FLOPS
    return row


def print_table(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nactor update, {args.shape}, {args.world} ranks x {args.sequences} seqs, {result['real_tokens']} real "
          f"tokens in all, {result['device']}, {result['backend']}, torch {result['torch']}")
    print(f"{'variant':34s} {'s/update':>9s} {'tokens/s':>10s} {'MFU/GPU':>8s} {'peak GiB':>9s} {'est GiB':>8s} "
          f"{'est/peak':>8s}")
    for row in result["rows"]:
        if "error" in row:
            print(f"{row['variant']:34s} {row['error']}")
            continue
        peak = row["max_memory_gib"] or float("nan")
        print(f"{row['variant']:34s} {row['seconds_per_update']:9.3f} {row['tokens_per_s']:10.0f} "
              f"{row['mfu_per_gpu']:8.1%} {peak:9.2f} {row['estimate_gib']:8.2f} {row['estimate_gib'] / peak:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train_knobs.add_workload_arguments(parser)
    parser.add_argument("--world", type=int, default=2, help="ranks (GPUs) on this host")
    parser.add_argument("--steps", type=int, default=5, help="timed updates per variant (after one warm-up)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    args = parser.parse_args()
    unknown = [v for v in args.variants.split(",") if v and v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")

    import tempfile

    import torch.multiprocessing as mp

    from engine.workers.cluster.failure import free_port

    rows_path = str(Path(tempfile.mkdtemp(prefix="fsdp-ranks-")) / "rows.json")
    mp.spawn(rank_main, args=(args, free_port(), rows_path), nprocs=args.world, join=True)
    result = json.loads(Path(rows_path).read_text())
    result["args"] = vars(args)
    print_table(result, args)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "fsdp_ranks.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
