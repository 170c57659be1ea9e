"""engine/rollout/vllm_processes.py on the CPU: how the actor's weights are packed into the shared byte buffer, read
back as views by the model runner's side, and how the buffer's CUDA IPC handle travels in plain types. The CUDA
IPC itself and vLLM's `mp` engine need a GPU: tests/engine/test_vllm_rollout_processes.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.rollout import vllm_processes as vp  # noqa: E402


def _weights() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [("embed", torch.randn(10, 6, dtype=torch.bfloat16)), ("norm", torch.randn(6)),
            ("proj", torch.randn(6, 6, dtype=torch.bfloat16)), ("big", torch.randn(40, 8)),
            ("bias", torch.arange(5, dtype=torch.int64))]


def test_runs_fit_the_buffer_in_order_and_a_larger_tensor_goes_alone():
    runs = []
    largest = vp.pack(_weights(), 512, lambda run: runs.append([(e.name, e.offset) for e, _ in run]))
    # embed 120 B at 0, norm 24 B at 256 (aligned), proj 72 B would end past 512: a new run; big 1280 B alone
    assert runs == [[("embed", 0), ("norm", 256)], [("proj", 0)], [("big", 0)], [("bias", 0)]]
    assert largest == vp.aligned(40 * 8 * 4)


def test_every_tensor_comes_back_whole_through_the_buffer():
    weights = dict(_weights())
    buffer = torch.zeros(4096, dtype=torch.uint8)
    seen = {}

    def flush(run):
        vp.copy_into(buffer, run)
        entries = [vp.Entry(*list(entry)) for entry, _ in run]  # as they travel: plain lists
        seen.update({name: view.clone() for name, view in vp.views(buffer, entries)})

    vp.pack(weights.items(), 1024, flush)
    assert seen.keys() == weights.keys()
    for name, tensor in weights.items():
        assert seen[name].dtype == tensor.dtype and torch.equal(seen[name], tensor), name


def test_a_push_shares_a_buffer_that_grows_for_a_larger_run_and_is_dropped_at_the_end(monkeypatch):
    monkeypatch.setattr(vp, "share", lambda buffer: {"numel": buffer.numel()})
    weights = dict(_weights())
    pusher = vp.WeightBuffer(bucket_bytes=512, device="cpu")
    calls, got, drops = [], {}, []

    def load(handle, generation, entries):
        calls.append((handle["numel"], generation, [entry[0] for entry in entries]))
        got.update({name: view.clone() for name, view in vp.views(pusher.buffer, [vp.Entry(*e) for e in entries])})

    pushed = pusher.push(weights.items(), load, drop=lambda: drops.append(pusher.buffer is not None))
    assert pushed == sum(t.numel() * t.element_size() for t in weights.values())
    # one buffer per size needed: the first run's, then the larger tensor's (a new generation), reused after it
    assert [(n, g) for n, g, _ in calls] == [(280, 1), (280, 1), (1280, 2), (1280, 2)]
    assert all(torch.equal(got[name], tensor) for name, tensor in weights.items())
    assert drops == [True] and pusher.buffer is None  # neither side holds it between pushes


def test_a_failed_load_still_lets_go_of_the_buffer(monkeypatch):
    monkeypatch.setattr(vp, "share", lambda buffer: {})
    pusher = vp.WeightBuffer(bucket_bytes=512, device="cpu")
    drops = []

    def load(handle, generation, entries):
        raise RuntimeError("the model runner refused")

    with pytest.raises(RuntimeError, match="refused"):
        pusher.push(_weights(), load, drop=lambda: drops.append(1))
    assert drops == [1] and pusher.buffer is None


def test_the_ipc_handle_travels_as_plain_values_and_rebuilds_the_same_arguments():
    args = (torch.Tensor, torch.Size([4096]), (1,), 0, torch.storage.TypedStorage, torch.uint8, 0, b"\x01handle",
            8192, 512, False, b"/torch_ref", 3, b"\x02event", True)
    handle = vp.ipc_handle(args)
    assert all(isinstance(v, (bytes, int, bool, type(None))) for v in handle.values())
    assert vp.reduction_args(handle) == args
    with pytest.raises(ValueError, match="flat uint8"):
        vp.ipc_handle((torch.Tensor, torch.Size([8, 8]), (8, 1), 0, torch.storage.TypedStorage, torch.uint8, 0,
                       b"h", 64, 0, False, b"r", 0, None, False))


def test_dtype_names_round_trip_and_a_stranger_is_refused():
    for dtype in (torch.bfloat16, torch.float32, torch.float16, torch.int64, torch.uint8):
        assert vp.dtype_of(vp.dtype_name(dtype)) is dtype
    with pytest.raises(ValueError):
        vp.dtype_of("Tensor")
