"""engine/workers/fsdp/host_copies.py: offloaded shards and moments wait in host copies made once.

One FSDP2 rank (gloo on the CPU, NCCL on a GPU) trains a tiny model for three steps with param_offload and
optimizer_offload through `ModelOffload`, and once without: the numbers agree bit for bit, every offloaded
shard and moment is a view of its copies' block after each step, and the copies are the same ones from the
first step to the last. Three gloo ranks do the same with shards FSDP2 pads (64 rows over 3), which keep the
`.cpu()` path. On the CPU the copies are turned on by hand (the device is the host there, and the
engine leaves them off); on a GPU they are the default and page-locked.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
dist = pytest.importorskip("torch.distributed")

from engine.workers.fsdp.host_copies import evenly_sharded  # noqa: E402  (after the skips: it imports torch)


def test_copies_are_kept_while_the_layout_stays_and_made_again_when_it_changes():
    from engine.workers.fsdp.host_copies import Mirror

    mirror = Mirror(page_lock=False)
    a, b = torch.randn(3, 4), torch.randn(5, dtype=torch.bfloat16)
    views = mirror.views_for([a, b])
    first = mirror.copies
    assert [tuple(v.shape) for v in views] == [(3, 4), (5,)] and [v.dtype for v in views] == [a.dtype, b.dtype]
    assert first.nbytes == 12 * 4 + 5 * 2  # exact: one block per dtype, no rounding
    assert mirror.views_for([torch.zeros(3, 4), torch.zeros(5, dtype=torch.bfloat16)]) is views
    assert mirror.copies is first
    mirror.views_for([torch.zeros(4, 3), b])  # same sizes, another shape: new copies
    assert mirror.copies is not first


@pytest.mark.parametrize("nbytes", [1, 4096, 4097, 3 * 1024 * 1024 + 5])
def test_each_block_spans_whole_pages_of_its_own(nbytes):
    """cudaHostRegister locks whole pages: a block that shared one with another allocation (a second dtype's
    small block on the heap) would fail to register."""
    import mmap

    from engine.workers.fsdp.host_copies import _page_region

    region = _page_region(nbytes)
    assert region.data_ptr() % mmap.PAGESIZE == 0 and region.numel() % mmap.PAGESIZE == 0
    assert nbytes <= region.numel() < nbytes + mmap.PAGESIZE


def _storage(tensor):
    from engine.workers.fsdp.host_copies import local_tensor

    return local_tensor(tensor.detach()).untyped_storage().data_ptr()


def _train(model_dir, device, offload: bool, host_copies: bool | None):
    """Three steps of a tiny LM under FSDP2 (parameters left unsharded after each forward, so the offload
    must reshard them first); per step, whether every shard and moment sat in the same host copies."""
    from engine.models.loading import load_causal_lm
    from engine.workers.fsdp.offload import ModelOffload
    from engine.workers.fsdp.sharding import apply_fsdp

    torch.manual_seed(0)
    model = apply_fsdp(load_causal_lm(model_dir).train(), torch.float32, False, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    offloaded = ModelOffload(model, optimizer, device, params=offload, optimizer_states=offload,
                             host_copies=host_copies)
    ids = torch.randint(10, 250, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    copies, in_copies = [], []
    for _ in range(3):
        with offloaded.in_use():
            model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1).mean().backward()
            with offloaded.optimizer_step():
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():  # leaves the root's parameters unsharded (reshard_after_forward=False)
                model(input_ids=ids, use_cache=False)
        if offload and offloaded.host_copies:
            params, moments = offloaded._param_copies.copies, offloaded._moment_copies.copies
            copies.append((params, moments))
            blocks = {b.untyped_storage().data_ptr() for c in (params, moments) for b in c.blocks.values()}
            states = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
            even = [p for p in model.parameters() if evenly_sharded(p)]
            uneven = [p for p in model.parameters() if not evenly_sharded(p)]
            in_copies.append(all(_storage(t) in blocks for t in [*even, *states])
                             and not any(_storage(t) in blocks for t in uneven)
                             and all(p.to_local().device.type == "cpu" for p in uneven))
    with offloaded.everything_on_device():
        for module in model.modules():  # the plain run's root is still unsharded after its last forward
            if hasattr(module, "reshard"):
                module.reshard()
        result = {name: p.full_tensor().detach().clone().cpu() for name, p in model.named_parameters()}
    return result, offloaded, copies, in_copies


def _compare(model_dir, device, host_copies):
    plain, _, _, _ = _train(model_dir, device, offload=False, host_copies=host_copies)
    kept, offloaded, copies, in_copies = _train(model_dir, device, offload=True, host_copies=host_copies)
    for name in plain:
        torch.testing.assert_close(kept[name], plain[name], rtol=0, atol=0, msg=name)
    assert in_copies == [True, True, True]
    assert all(c[0] is copies[0][0] and c[1] is copies[0][1] for c in copies)  # made once, at the first step
    even = [p for p in offloaded.model.parameters() if evenly_sharded(p)]
    assert copies[0][0].nbytes == sum(p.to_local().numel() * p.element_size() for p in even)
    return copies[0]


def test_offloaded_states_wait_in_the_same_host_copies_and_train_as_without_offload(tiny_model_dir):
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        params, moments = _compare(tiny_model_dir, torch.device("cpu"), host_copies=True)
    finally:
        dist.destroy_process_group()
    assert not params.page_locked and not moments.page_locked  # nothing to page-lock for on a CPU


def _three_ranks(rank: int, port: int, model_dir: str) -> None:
    from engine.workers.cluster.device import join_process_group, set_rendezvous_env

    set_rendezvous_env(rank, 3, "127.0.0.1", port, "127.0.0.1")
    join_process_group(torch.device("cpu"), rank, 3)
    try:
        _, offloaded, _, _ = _train(model_dir, torch.device("cpu"), offload=True, host_copies=True)
        uneven = [p for p in offloaded.model.parameters() if not evenly_sharded(p)]
        # 64 rows over 3 ranks: 22, 22, 20: the last rank's shards of such tensors are padded by FSDP2
        assert bool(uneven) == (rank == 2), (rank, [tuple(p.to_local().shape) for p in uneven])
        _compare(model_dir, torch.device("cpu"), host_copies=True)
    finally:
        dist.destroy_process_group()


def test_on_three_ranks_uneven_shards_move_as_before_and_the_rest_wait_in_the_copies(tiny_model_dir):
    """FSDP2 pads a shard shorter than the others in a fresh tensor whenever it moves: such shards keep the old
    path (a `.cpu()` copy), the others their host copies; the numbers agree with the plain run on every rank."""
    from ranks import spawn_ranks

    from engine.workers.cluster.failure import free_port

    spawn_ranks(_three_ranks, args=(free_port(), str(tiny_model_dir)), nprocs=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)")
def test_on_a_gpu_the_host_copies_are_page_locked_by_default(tiny_model_dir):
    assert not dist.is_initialized()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        params, moments = _compare(tiny_model_dir, torch.device("cuda", 0), host_copies=None)
    finally:
        dist.destroy_process_group()
    assert params.page_locked and moments.page_locked
    assert all(block.is_pinned() for c in (params, moments) for block in c.blocks.values())
