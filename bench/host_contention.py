"""Do two GPU processes of one host slow each other down, without rlconf, Ray or vLLM in the way?

    python bench/host_contention.py [--gpus 0,1] [--out host_contention.json]

One process per GPU, each seeing only its own GPU (CUDA_VISIBLE_DEVICES, as Ray gives a worker),
in a gloo group for the barriers between phases and an NCCL group for the collectives. Each phase
runs on rank 0 alone, then rank 1 alone, then on both at once, and reports each rank's seconds:

- cpu: a pure-Python loop (no GPU): the CPU's speed for one busy thread (SMT siblings, frequency);
- decode: an eager stand-in for a small model's decode step at batch 64 (24 MLP blocks of
  Qwen2.5-0.5B's width, the 151,936-token head, log-softmax, argmax, the sampled ids back to the CPU
  each step): launch-bound like vLLM's sampler and input preparation (vLLM's layers run as CUDA graphs);
- alloc: 24 device tensors of 800 MiB allocated and freed and the cache emptied (cudaMalloc / cudaFree,
  what the update and `torch.cuda.empty_cache` before each wake-up do), then the same with
  expandable segments (cuMemCreate / cuMemMap / cuMemUnmap, what vLLM's sleep and wake-up do);
- nccl (both ranks): all-gather of a 256 MiB bf16 bucket (the weight sync's), all-gather of one
  decoder layer's bf16 weights and reduce-scatter of its fp32 gradient (FSDP2's per-layer traffic).

A phase that takes longer on both ranks at once than on either alone points at something the two
processes share (CPU cores, the driver, PCIe). The NCCL log's transport lines (P2P, SHM, NET) come
back too. Prints JSON; writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN, INTER, LAYERS, VOCAB, BATCH = 896, 4864, 24, 151_936, 64


def cpu_loop(iterations: int = 1_500_000) -> float:
    started = time.perf_counter()
    table: dict[int, int] = {}
    for i in range(iterations):
        table[i & 1023] = table.get(i & 1023, 0) + i
    return time.perf_counter() - started


def decode_loop(torch, steps: int) -> dict[str, float]:
    device = torch.device("cuda", 0)
    gen = torch.Generator(device=device).manual_seed(0)
    ups = [torch.randn(HIDDEN, INTER, device=device, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(LAYERS)]
    downs = [torch.randn(INTER, HIDDEN, device=device, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(LAYERS)]
    head = torch.randn(VOCAB, HIDDEN, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    embed = torch.randn(VOCAB, HIDDEN, device=device, dtype=torch.bfloat16, generator=gen)
    ids = list(range(BATCH))
    times, cpu = [], []
    for step in range(steps + 10):
        started, thread = time.perf_counter(), time.thread_time()
        token_ids = torch.tensor(ids, dtype=torch.long).pin_memory().to(device, non_blocking=True)
        h = embed[token_ids]
        for up, down in zip(ups, downs):
            h = h + torch.nn.functional.silu(h @ up) @ down
        logits = (h @ head.T).float()
        log_probs = torch.log_softmax(logits, dim=-1)
        sampled = torch.argmax(log_probs, dim=-1)
        chosen = log_probs.gather(1, sampled[:, None])
        ids = sampled.tolist()  # the sync each decode step has
        chosen.cpu()
        if step >= 10:
            times.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - thread)
    times.sort()
    return {"median_ms": times[len(times) // 2] * 1e3, "p90_ms": times[(9 * len(times)) // 10] * 1e3,
            "total_s": sum(times), "thread_cpu_s": sum(cpu)}


def alloc_churn(torch, cycles: int = 3, chunks: int = 24, chunk_mib: int = 800) -> dict[str, float]:
    malloc_s = free_s = 0.0
    for _ in range(cycles):
        torch.cuda.synchronize()
        started = time.perf_counter()
        tensors = [torch.empty(chunk_mib * 2**20, dtype=torch.uint8, device="cuda") for _ in range(chunks)]
        torch.cuda.synchronize()
        malloc_s += time.perf_counter() - started
        started = time.perf_counter()
        del tensors
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        free_s += time.perf_counter() - started
    return {"malloc_s": malloc_s / cycles, "free_s": free_s / cycles}


def nccl_bench(torch, dist, group) -> dict[str, float]:
    out: dict[str, float] = {}
    world = dist.get_world_size(group)

    def timed(name: str, fn, out_bytes: int, repeat: int = 8) -> None:
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / repeat
        out[f"{name}_ms"] = seconds * 1e3
        # NCCL's bus bandwidth for all-gather / reduce-scatter: bytes of the full tensor × (n-1)/n per second.
        out[f"{name}_busbw_gbps"] = out_bytes * (world - 1) / world / seconds / 1e9

    bucket = 128 * 2**20 // 2  # bf16 elements per rank of a 256 MiB two-rank bucket
    send = torch.ones(bucket, dtype=torch.bfloat16, device="cuda")
    recv = torch.empty(bucket * world, dtype=torch.bfloat16, device="cuda")
    timed("allgather_256MiB_bf16", lambda: dist.all_gather_into_tensor(recv, send, group=group), recv.numel() * 2)
    layer = 14_912_384  # parameters of one Qwen2.5-0.5B decoder layer
    lsend = torch.ones(layer // world, dtype=torch.bfloat16, device="cuda")
    lrecv = torch.empty(layer // world * world, dtype=torch.bfloat16, device="cuda")
    timed("allgather_layer_bf16", lambda: dist.all_gather_into_tensor(lrecv, lsend, group=group), lrecv.numel() * 2)
    grad = torch.ones(layer // world * world, dtype=torch.float32, device="cuda")
    shard = torch.empty(layer // world, dtype=torch.float32, device="cuda")
    timed("reducescatter_layer_fp32", lambda: dist.reduce_scatter_tensor(shard, grad, group=group), grad.numel() * 4)
    return out


def child(rank: int, world: int, port: int, out_path: str, decode_steps: int) -> None:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()  # without a GPU (a CPU test of this script) only the cpu phase runs
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    if cuda:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    cpu_group = dist.new_group(backend="gloo")
    results: dict[str, dict[str, float]] = {}

    def phase(name: str, fn) -> None:
        for who in [*[str(r) for r in range(world)], "both"]:
            dist.barrier(group=cpu_group)
            if who == "both" or who == str(rank):
                try:
                    value = fn()
                except Exception as exc:  # noqa: BLE001 - a phase that fails here is reported, the rest runs
                    value = {"error": f"{type(exc).__name__}: {exc}"}
                results[f"{name}/{'both' if who == 'both' else 'alone'}"] = value if isinstance(value, dict) \
                    else {"seconds": value}
        dist.barrier(group=cpu_group)

    phase("cpu", cpu_loop)
    if not cuda:
        Path(out_path).write_text(json.dumps(results))
        dist.destroy_process_group()
        return
    phase("decode", lambda: decode_loop(torch, decode_steps))
    phase("alloc", lambda: alloc_churn(torch))

    def expandable() -> dict[str, float]:
        torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        try:
            return alloc_churn(torch)
        finally:
            torch.cuda.memory._set_allocator_settings("expandable_segments:False")

    phase("alloc_expandable", expandable)
    if world > 1:
        dist.barrier(group=cpu_group)
        results["nccl"] = nccl_bench(torch, dist, dist.group.WORLD)
    props = torch.cuda.get_device_properties(0)
    results["device"] = {"name": props.name, "pci_bus_id": getattr(props, "pci_bus_id", -1),
                         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def nccl_transport_lines(log: str) -> list[str]:
    """The NCCL INFO lines that say how the ranks talk (P2P/CUMEM, P2P/IPC, SHM, NET) and its version."""
    keep = [line.strip() for line in log.splitlines()
            if "NCCL INFO" in line and (" via " in line or "NCCL version" in line or "P2P" in line
                                        or "Connected all" in line)]
    return keep[:40]


def run(gpus: list[int], decode_steps: int = 200, timeout: float = 150.0) -> dict:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        procs, logs = [], []
        for rank, gpu in enumerate(gpus):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P")
            log = open(Path(tmp) / f"log{rank}", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, __file__, "--child", str(rank), "--world", str(len(gpus)),
                                           "--port", str(port), "--out", str(Path(tmp) / f"rank{rank}.json"),
                                           "--decode-steps", str(decode_steps)], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
        started = time.perf_counter()
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - started))))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append("timeout")
        for log in logs:
            log.close()
        result: dict = {"gpus": gpus, "exit_codes": codes, "seconds": time.perf_counter() - started, "ranks": {}}
        text = ""
        for rank in range(len(gpus)):
            path = Path(tmp) / f"rank{rank}.json"
            log_text = (Path(tmp) / f"log{rank}").read_text(errors="replace")
            text += log_text
            result["ranks"][rank] = json.loads(path.read_text()) if path.is_file() else {"log_tail": log_text[-2000:]}
        result["nccl_lines"] = nccl_transport_lines(text)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="0,1")
    parser.add_argument("--out")
    parser.add_argument("--decode-steps", type=int, default=200)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.world, args.port, args.out, args.decode_steps)
        return
    result = run([int(g) for g in args.gpus.split(",")], args.decode_steps)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
