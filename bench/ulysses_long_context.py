"""Ulysses sequence parallelism against the memory wall: one sequence length, sp 1 and sp 2, on 2 GPUs.

    python bench/ulysses_long_context.py [--model random://Llama-3.2-1B] [--seq-len auto] [--sp 1,2]
    python bench/ulysses_long_context.py --device cpu --model tiny://qwen2 --seq-len 256   # smoke test

Issue 8's demonstration: a sequence length whose actor update runs out of memory with each GPU
holding whole sequences (sp 1: 2 data-parallel ranks, one sequence each) and trains when the two
GPUs share each sequence (sp 2: 1 data-parallel group, heads and sequence split by all-to-all inside
attention). The real actor worker does the update (`ActorRolloutRefWorker.init_model` and
`update_actor`, FSDP2 over both ranks, sequence packing, gradient checkpointing, micro batches of one
sequence), on rows of `--seq-len` tokens (64 of prompt, the rest response) and random advantages.

`--seq-len auto` picks the length with rlconf's own memory estimate (`rlconf explain`'s numbers, the
GPU's size from torch): the shortest power-of-two multiple of 1,024 tokens, within the model's context,
whose sp 1 plan the estimate puts above the GPU and whose sp 2 plan it puts below 85% of it. The
measured peak of the sp 2 run then checks that estimate too.

Each sp runs in a fresh process pair with a time limit (a rank that runs out of memory leaves its
peer waiting in a collective): per rank, "ok" with seconds and torch.cuda.max_memory_allocated, or
"out of memory". Writes $OUT/ulysses_long_context.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
QUICKSTART = ROOT / "presets" / "quickstart.yaml"
WORLD = 2
PROMPT = 64
GIB = 1024**3


def plan_overrides(args: argparse.Namespace, sp: int, seq_len: int) -> list[str]:
    arr = "actor_rollout_ref"
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    return [
        f"{arr}.model.path={args.model}", f"trainer.device={args.device}", f"trainer.n_gpus_per_node={WORLD}",
        f"{arr}.model.dtype={dtype}", f"{arr}.rollout.dtype={dtype}",
        f"data.max_prompt_length={PROMPT}", f"data.max_response_length={seq_len - PROMPT}",
        # Two sequences a step, one optimizer step; micro batches of one sequence on each data-parallel group.
        "data.train_batch_size=1", f"{arr}.rollout.n={WORLD}", f"{arr}.actor.ppo_mini_batch_size=1",
        f"{arr}.actor.ppo_micro_batch_size_per_gpu=1", f"{arr}.rollout.log_prob_micro_batch_size_per_gpu=1",
        f"{arr}.model.use_remove_padding=true", f"{arr}.model.enable_gradient_checkpointing=true",
        f"{arr}.actor.ulysses_sequence_parallel_size={sp}", f"{arr}.actor.entropy_coeff={args.entropy_coeff}",
        *args.overrides,
    ]


def compile_for(args: argparse.Namespace, sp: int, seq_len: int, gpu_gib: float | None = None) -> Any:
    from rlconf.compile import compile_plan

    extra = [f"estimate.gpu_memory_gib={gpu_gib:.1f}"] if gpu_gib else []
    result = compile_plan(QUICKSTART, plan_overrides(args, sp, seq_len) + extra)
    if result.resolved is None:
        raise SystemExit(f"sp {sp}, {seq_len} tokens: the plan does not compile: "
                         + "; ".join(d.message for d in result.diagnostics if d.severity == "error"))
    return result.resolved


def training_estimate_gib(resolved: Any) -> float:
    (training,) = [phase for phase in resolved.memory if phase.phase == "training"]
    return training.total_gib


def auto_length(args: argparse.Namespace, gpu_gib: float) -> int:
    """The shortest length (1,024 × a power of two) the estimate puts above the GPU at sp 1 and below 85% at sp 2."""
    from rlconf.modelinfo import random_shape

    context = (random_shape(args.model) or {}).get("max_position_embeddings", 32768)
    seq_len = 1024
    while seq_len <= context:
        over = training_estimate_gib(compile_for(args, 1, seq_len, gpu_gib)) > gpu_gib
        under = training_estimate_gib(compile_for(args, 2, seq_len, gpu_gib)) < 0.85 * gpu_gib
        if over and under:
            return seq_len
        seq_len *= 2
    raise SystemExit(f"no length up to the context of {context} tokens has sp 1 above {gpu_gib:.0f} GiB and sp 2 "
                     "below 85% of it in rlconf's estimate; try another --model or knobs (--overrides)")


def make_batch(seq_len: int, vocab: int, sequences: int) -> dict:
    import torch

    from engine.batch import position_ids_from_mask

    g = torch.Generator().manual_seed(0)
    response = seq_len - PROMPT
    attention_mask = torch.ones(sequences, seq_len, dtype=torch.long)  # full-length rows: the worst case
    input_ids = torch.randint(0, vocab, (sequences, seq_len), generator=g)
    response_mask = torch.ones(sequences, response, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask), "responses": input_ids[:, PROMPT:].clone(),
            "response_mask": response_mask,
            "advantages": torch.randn(sequences, 1, generator=g).expand(-1, response).contiguous()}


def rank_main(rank: int, port: int, resolved: Any, model_dir: str, vocab: int, seq_len: int, out_dir: str) -> None:
    import torch

    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from engine.batch import split_even
    from engine.workers.cluster.device import set_rendezvous_env
    from engine.workers.sequence.ulysses import shards_for_ranks

    # One GPU per rank, as Ray hands each worker its own (engine.workers.cluster.device.worker_device uses
    # cuda:0); set before this process first touches CUDA.
    if resolved.config.trainer.device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    set_rendezvous_env(rank, WORLD, "127.0.0.1", port, "127.0.0.1")
    worker = ActorRolloutRefWorker(resolved, model_dir, rank, WORLD, total_training_steps=2, pad_token_id=0,
                                   eos_token_id=1)
    cuda = resolved.config.trainer.device == "cuda"
    result: dict[str, Any] = {"rank": rank}
    try:
        worker.init_model()
        sp = resolved.roles.actor.sp_size
        batch = make_batch(seq_len, vocab, WORLD)
        shard = shards_for_ranks(split_even(batch, WORLD // sp), WORLD)[rank]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        metrics = worker.update_actor(shard)
        if cuda:
            torch.cuda.synchronize()
        result.update(status="ok", seconds=time.perf_counter() - started, pg_loss=metrics.get("actor/pg_loss"),
                      peak_gib=torch.cuda.max_memory_allocated() / GIB if cuda else None,
                      tokens_per_micro_batch=seq_len // sp)  # one sequence, split over the sp ranks
    except torch.OutOfMemoryError as exc:
        result.update(status="out of memory", error=str(exc).splitlines()[0][:300],
                      peak_gib=torch.cuda.max_memory_allocated() / GIB if cuda else None)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if result["status"] != "ok":
        os._exit(0)  # the peer may wait in a collective for this rank: leave without the group's teardown
    worker.shutdown()


def run_part(args: argparse.Namespace, sp: int, seq_len: int) -> dict:
    """One sp in a fresh pair of processes, cut off after --timeout seconds."""
    out_dir = tempfile.mkdtemp(prefix=f"ulysses-sp{sp}-")
    cmd = [sys.executable, __file__, "--part", str(sp), "--seq-len", str(seq_len), "--part-dir", out_dir,
           "--model", args.model, "--device", args.device, "--entropy-coeff", str(args.entropy_coeff),
           *(["--overrides", *args.overrides] if args.overrides else [])]
    started = time.perf_counter()
    # A session of its own: on the time limit the part and the ranks it spawned go together.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
        tail, code = output[-2000:], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        tail, code = f"cut off after {args.timeout} s", None
    ranks = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank*.json"))]
    return {"sp": sp, "seq_len": seq_len, "exit": code, "wall_s": time.perf_counter() - started, "ranks": ranks,
            "log_tail": tail if code != 0 else ""}


def part_main(args: argparse.Namespace) -> None:
    import torch.multiprocessing as mp

    from engine.models.loading import resolve_model_path
    from engine.workers.cluster.failure import free_port

    sp, seq_len = int(args.part), args.seq_len
    resolved = compile_for(args, sp, seq_len)
    model_dir = str(resolve_model_path(args.model))
    vocab = json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]
    mp.spawn(rank_main, args=(free_port(), resolved, model_dir, vocab, seq_len, args.part_dir), nprocs=WORLD,
             join=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random://Llama-3.2-1B", help="a random:// shape with a long context")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seq-len", default="auto", help="tokens a sequence, or auto (see the docstring)")
    parser.add_argument("--sp", default="1,2")
    # With the entropy the plain loss head holds 24 B per token × vocab in backward: the term that
    # grows fastest with the length (chunked entropy and compile cut it; --overrides turns them on).
    parser.add_argument("--entropy-coeff", type=float, default=0.001)
    parser.add_argument("--timeout", type=int, default=420, help="seconds per sp before its processes are stopped")
    parser.add_argument("--overrides", nargs="*", default=["actor_rollout_ref.actor.use_torch_compile=false"],
                        help="extra key=value overrides of both plans")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--part-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        args.seq_len = int(args.seq_len)
        part_main(args)
        return

    import torch

    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB if args.device == "cuda" else None
    seq_len = auto_length(args, gpu_gib) if args.seq_len == "auto" else int(args.seq_len)
    results: dict[str, Any] = {"model": args.model, "device": torch.cuda.get_device_name(0) if gpu_gib else "cpu",
                               "gpu_gib": gpu_gib, "seq_len": seq_len, "date": time.strftime("%Y-%m-%d"),
                               "torch": torch.__version__, "parts": []}
    for sp in [int(s) for s in args.sp.split(",")]:
        estimate = training_estimate_gib(compile_for(args, sp, seq_len, gpu_gib))
        part = run_part(args, sp, seq_len)
        part["estimate_gib"] = estimate
        results["parts"].append(part)
        print(json.dumps(part), flush=True)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
            Path(os.environ["OUT"], "ulysses_long_context.json").write_text(json.dumps(results, indent=1))
    print(f"\n{args.model}, {seq_len} tokens a sequence, {WORLD} ranks, {results['device']}")
    print(f"{'sp':>3} {'status':>15} {'s/update':>9} {'peak GiB':>9} {'est GiB':>8}")
    for part in results["parts"]:
        statuses = sorted({r["status"] for r in part["ranks"]}) or ["no result"]
        peaks = [r["peak_gib"] for r in part["ranks"] if r.get("peak_gib") is not None]
        seconds = [r["seconds"] for r in part["ranks"] if "seconds" in r]
        print(f"{part['sp']:3d} {'/'.join(statuses):>15} {max(seconds) if seconds else float('nan'):9.2f} "
              f"{max(peaks) if peaks else float('nan'):9.2f} {part['estimate_gib']:8.2f}")


if __name__ == "__main__":
    main()
