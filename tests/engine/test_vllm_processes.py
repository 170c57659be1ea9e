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


def _push(pusher, weights):
    calls, got, drops = [], {}, []

    def load(handle, generation, entries):
        calls.append((handle["numel"], generation, [(entry[0], entry[3]) for entry in entries]))
        got.update({name: view.clone() for name, view in vp.views(pusher.buffer, [vp.Entry(*e) for e in entries])})

    pushed = pusher.push(weights, load, drop=lambda: drops.append(pusher.generation))
    return pushed, calls, got, drops


def test_a_push_fills_the_buffer_in_order_and_a_larger_tensor_gets_a_buffer_of_its_own():
    weights = dict(_weights())
    pusher = vp.WeightBuffer(bucket_bytes=512, device="cpu")
    pushed, calls, got, drops = _push(pusher, weights.items())
    assert pushed == sum(t.numel() * t.element_size() for t in weights.values()) == 1536
    # embed 120 B at 0, norm at 256 (aligned); proj would end past 512: the buffer goes to the model runner first.
    # big (1280 B) is larger than the buffer: the model runner lets go of it, and a buffer of big's size follows.
    assert calls == [(512, 1, [("embed", 0), ("norm", 256)]), (512, 1, [("proj", 0)]),
                     (1280, 2, [("big", 0)]), (1280, 2, [("bias", 0)])]
    assert drops == [1, 2] and pusher.buffer is None  # at the growth, and at the end: none held between pushes
    for name, tensor in weights.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_a_later_push_needs_no_larger_buffer_than_the_model():
    small = [("a", torch.ones(10)), ("b", torch.ones(20))]  # 120 B in all, far below the bucket
    pusher = vp.WeightBuffer(bucket_bytes=1 << 20, device="cpu")
    _, first, _, _ = _push(pusher, small)
    _, second, _, _ = _push(pusher, small)
    assert first[0][0] == 1 << 20 and second[0][0] == 120  # the first push cannot know the model's size


def test_a_failed_load_still_lets_go_of_the_buffer():
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


def test_the_model_runner_opens_each_buffer_once_and_loads_the_views_in_place(monkeypatch):
    """RolloutWorkerExtension's side on the CPU: the handle rebuilds the buffer once per generation (the producer
    shares it once), every bucket's entries load as views into it, and a drop lets go of it."""
    opened = []
    weights = dict(_weights())
    pusher = vp.WeightBuffer(bucket_bytes=512, device="cpu")
    monkeypatch.setattr(vp, "buffer_from_handle", lambda handle: opened.append(handle["numel"]) or pusher.buffer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    class Model:
        loaded: dict = {}

        def load_weights(self, weights):
            for name, view in weights:
                assert not torch.is_grad_enabled()
                self.loaded[name] = view.clone()

    runner = vp.RolloutWorkerExtension()
    runner.model_runner = type("Runner", (), {"model": Model()})()
    pusher.push(weights.items(), lambda handle, generation, entries: runner.rlconf_load_bucket(
        handle, generation, entries), drop=runner.rlconf_drop_buffer)
    assert opened == [512, 1280]  # two buffers (the second for the larger tensor), each opened once
    assert runner._rlconf_buffer is None and runner._rlconf_generation == -1
    assert all(torch.equal(Model.loaded[name], tensor) for name, tensor in weights.items())
