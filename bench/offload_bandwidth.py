"""How fast a model's offloaded states cross between the GPU and the host, one way of holding them against another.

    python bench/offload_bandwidth.py [--shape 7b] [--rounds 3] [--ways fresh,fresh_async,kept,pinned,registered]

param_offload / optimizer_offload move a whole fp32 shard (4 B a parameter) and Adam's two moments (8 B)
to the host and back every step. On one H200 with a 7B plan the step spent 165 of its 174 s doing that
(docs/benchmarks.md). This script times the move alone, on tensors of the model's own parameter shapes, each
way of holding the host copy:

- fresh: `.to("cpu")` into a new (pageable) tensor every time, `.to(device)` back: what `nn.Module.cpu()`
  does, and what the engine did until now;
- fresh_async: the same with `non_blocking=True` (verl's optimizer offload), then one synchronize;
- kept: a pageable host tensor per parameter, allocated once and copied into every time;
- pinned: the same, page-locked by torch's pinned allocator (`pin_memory=True`, one allocation per tensor);
- registered: one pageable block of the exact total, page-locked once with cudaHostRegister, a view per tensor.

It prints GB/s each way, per round, and the host memory each way keeps (the pinned allocator rounds its blocks
up). torch alone: no Ray, no vLLM, no engine.

`--engine`: the engine's own `ModelOffload` instead, on an FSDP2 model (one rank, NCCL) of the same parameter
shapes with AdamW's moments, `host_copies` off (a fresh `.cpu()` each time, as before) and on (page-locked copies
made once): seconds to bring the shard in (`in_use`), the moments in and out (`optimizer_step`), the shard out.
Needs only torch and the repository on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch

# name -> (hidden, intermediate, layers, vocab, kv_heads, head_dim): Qwen2.5's published shapes.
SHAPES = {
    "0.5b": (896, 4864, 24, 151936, 2, 64),
    "1.5b": (1536, 8960, 28, 151936, 2, 128),
    "3b": (2048, 11008, 36, 151936, 2, 128),
    "7b": (3584, 18944, 28, 152064, 4, 128),
}
WAYS = ("fresh", "fresh_async", "kept", "pinned", "registered")


def parameter_shapes(shape: str) -> list[tuple[int, ...]]:
    """Every parameter's shape, in model order (embedding, the layers, the final norm, the output head)."""
    hidden, inter, layers, vocab, kv_heads, head_dim = SHAPES[shape]
    kv = kv_heads * head_dim
    layer = [(hidden, hidden), (hidden,), (kv, hidden), (kv,), (kv, hidden), (kv,), (hidden, hidden),
             (inter, hidden), (inter, hidden), (hidden, inter), (hidden,), (hidden,)]
    return [(vocab, hidden)] + layer * layers + [(hidden,), (vocab, hidden)]


def host_rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def synchronize() -> None:
    torch.cuda.synchronize()


class Registered:
    """One exact-size pageable block, page-locked once, cut into one view per tensor."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        total = sum(t.numel() for t in tensors)
        self.block = torch.empty(total, dtype=tensors[0].dtype)
        nbytes = self.block.numel() * self.block.element_size()
        err = torch.cuda.cudart().cudaHostRegister(self.block.data_ptr(), nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {err}")
        self.views, at = [], 0
        for t in tensors:
            self.views.append(self.block[at:at + t.numel()].view(t.shape))
            at += t.numel()

    def close(self) -> None:
        torch.cuda.cudart().cudaHostUnregister(self.block.data_ptr())


def one_round(way: str, device_tensors: list[torch.Tensor], held: dict) -> tuple[list[torch.Tensor], float, float]:
    """Move every tensor to the host and back; (the device tensors after, D2H s, H2D s)."""
    synchronize()
    start = time.perf_counter()
    if way in ("fresh", "fresh_async"):
        host = [t.to("cpu", non_blocking=way == "fresh_async") for t in device_tensors]
    else:
        if "host" not in held:
            if way == "kept":
                held["host"] = [torch.empty(t.shape, dtype=t.dtype) for t in device_tensors]
            elif way == "pinned":
                held["host"] = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in device_tensors]
            else:
                held["registered"] = Registered(device_tensors)
                held["host"] = held["registered"].views
        host = held["host"]
        for h, t in zip(host, device_tensors):
            h.copy_(t, non_blocking=way in ("pinned", "registered"))
    synchronize()
    d2h = time.perf_counter() - start
    del device_tensors[:]  # the device copies go, as an offload frees them
    start = time.perf_counter()
    back = [h.to("cuda", non_blocking=way in ("pinned", "registered", "fresh_async")) for h in host]
    synchronize()
    h2d = time.perf_counter() - start
    return back, d2h, h2d


def engine_rounds(shape: str, rounds: int, host_copies: bool) -> list[dict]:
    """Rounds of ModelOffload's moves on an FSDP2 model of `shape`'s parameters (fp32) with AdamW's moments."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from engine.workers.fsdp.offload import ModelOffload

    shapes = parameter_shapes(shape)
    per_layer = (len(shapes) - 3) // SHAPES[shape][2]
    groups = [shapes[:1]] + [shapes[1 + i:1 + i + per_layer] for i in range(0, len(shapes) - 3, per_layer)] + [shapes[-2:]]
    class Group(nn.Module):  # fully_shard wants modules with a forward; nothing here runs one
        def __init__(self, group: list[tuple[int, ...]]) -> None:
            super().__init__()
            for j, s in enumerate(group):
                self.register_parameter(f"p{j}", nn.Parameter(torch.randn(s, device="cuda") * 0.02))

        def forward(self) -> None:
            return None

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.groups = nn.ModuleList(Group(group) for group in groups)

        def forward(self) -> None:
            return None

    model = Stack()
    mesh = init_device_mesh("cuda", (1,))
    for module in model.groups:
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    offload = ModelOffload(model, optimizer, torch.device("cuda"), params=True, optimizer_states=True,
                           host_copies=host_copies)
    rows = []
    for round_ in range(rounds + 1):  # round 0 makes the moments (the first optimizer step)
        times = {}

        def mark(name: str, start: float) -> float:
            synchronize()
            now = time.perf_counter()
            times[name] = round(now - start, 3)
            return now

        start = time.perf_counter()
        use = offload.in_use()
        use.__enter__()
        start = mark("shard_in_s", start)
        for p in model.parameters():
            p.grad = torch.ones_like(p) * 1e-3
        step = offload.optimizer_step()
        step.__enter__()
        start = mark("moments_in_s", start)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        start = mark("adam_step_s", start)
        step.__exit__(None, None, None)
        start = mark("moments_out_s", start)
        use.__exit__(None, None, None)
        mark("shard_out_s", start)
        rows.append({"round": round_, **times})
        print(f"  host_copies={host_copies!s:5s} round {round_}: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()),
              flush=True)
    del offload, optimizer, model
    torch.cuda.empty_cache()
    return rows


def main_engine(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    numel = sum(torch.Size(s).numel() for s in parameter_shapes(args.shape))
    print(f"{args.shape} under FSDP2 with AdamW: shard {numel * 4 / 1e9:.1f} GB, moments {numel * 8 / 1e9:.1f} GB; "
          f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    results = {str(on): engine_rounds(args.shape, args.rounds, on) for on in (False, True)}
    dist.destroy_process_group()
    with open(os.path.join(args.out, f"offload_engine_{args.shape}.json"), "w") as f:
        json.dump({"shape": args.shape, "shard_gb": numel * 4 / 1e9, "moments_gb": numel * 8 / 1e9,
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "commit": os.environ.get("BENCH_COMMIT"), "host_copies": results}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--engine", action="store_true", help="time engine.workers.fsdp.offload.ModelOffload")
    args = parser.parse_args()
    if args.engine:
        main_engine(args)
        return
    shapes = parameter_shapes(args.shape)
    numel = sum(torch.Size(s).numel() for s in shapes)
    gb = numel * 4 / 1e9
    print(f"{args.shape}: {len(shapes)} fp32 tensors, {numel / 1e9:.2f} B parameters, {gb:.1f} GB a direction; "
          f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    results = []
    for way in args.ways.split(","):
        tensors = [torch.randn(s, device="cuda") for s in shapes]
        checksum = sum(float(t.double().sum()) for t in tensors[:3])
        held: dict = {}
        rss_before = host_rss_gib()
        rows = []
        for round_ in range(args.rounds):
            tensors, d2h, h2d = one_round(way, tensors, held)
            rows.append({"round": round_ + 1, "d2h_s": round(d2h, 3), "h2d_s": round(h2d, 3),
                         "d2h_gb_s": round(gb / d2h, 2), "h2d_gb_s": round(gb / h2d, 2)})
            print(f"  {way:12s} round {round_ + 1}: to host {d2h:6.2f} s ({gb / d2h:5.1f} GB/s), "
                  f"back {h2d:6.2f} s ({gb / h2d:5.1f} GB/s)", flush=True)
        kept_gib = host_rss_gib() - rss_before
        assert abs(sum(float(t.double().sum()) for t in tensors[:3]) - checksum) < 1e-6 * max(1.0, abs(checksum))
        if "registered" in held:
            held["registered"].close()
        results.append({"way": way, "rounds": rows, "host_rss_growth_gib": round(kept_gib, 2)})
        print(f"  {way:12s} host memory kept: {kept_gib:.1f} GiB (max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB)",
              flush=True)
        del tensors, held
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, f"offload_bandwidth_{args.shape}.json"), "w") as f:
        json.dump({"shape": args.shape, "gb_each_way": gb, "device": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
