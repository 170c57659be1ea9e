"""The pieces of the one-step off-policy schedule, without Ray: the weight buckets, the push over a real gloo
group between processes (the GPU path's code, NCCL there), and the queue between producer and consumer."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine.controller.offpolicy import Generated, GenerationQueue, load_pending, pending_state  # noqa: E402
from engine.controller.samples import StepInputs  # noqa: E402
from engine.workers.cluster.weight_sync import TensorInfo, plan_buckets  # noqa: E402


def test_buckets_keep_the_order_hold_one_dtype_each_and_stay_under_the_byte_limit() -> None:
    infos = [TensorInfo("a", (4, 4), "torch.float32"), TensorInfo("b", (8,), "torch.float32"),
             TensorInfo("c", (2,), "torch.int64"), TensorInfo("d", (100,), "torch.float32"),
             TensorInfo("e", (3,), "torch.float32")]
    buckets = plan_buckets(infos, bucket_bytes=64)  # a (64 B) fills one; b + c differ in dtype
    assert [[slot.name for slot in b.slots] for b in buckets] == [["a"], ["b"], ["c"], ["d"], ["e"]]
    buckets = plan_buckets(infos, bucket_bytes=4 * 24)  # a (16) and b (8) fit exactly; d (400 B) goes alone
    assert [[slot.name for slot in b.slots] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert [(slot.offset, slot.numel) for slot in buckets[0].slots] == [(0, 16), (16, 8)]
    assert [b.dtype for b in buckets] == ["torch.float32", "torch.int64", "torch.float32", "torch.float32"]


def _member(rank: int, world: int, port: int, infos: list, out: multiprocessing.Queue, received) -> None:
    from engine.workers.cluster.weight_sync import open_weight_group, plan_buckets, receive_weights, send_weights

    device = torch.device("cpu")
    group = open_weight_group(device, rank, world, "127.0.0.1", port)
    buckets = plan_buckets([TensorInfo(*info) for info in infos], bucket_bytes=64)
    if rank == 0:
        generator = torch.Generator().manual_seed(0)
        tensors = [(name, torch.randn(shape, generator=generator)) for name, shape, _ in infos]
        out.put((rank, send_weights(group, iter(tensors), buckets, device), {n: t for n, t in tensors}))
    else:
        out.put((rank, len(buckets), {name: tensor.clone() for name, tensor in receive_weights(group, buckets, device)}))
    # A tensor in the queue travels as a file descriptor this process hands out on request: it must live until the
    # test has taken it (exiting first made the test fail under load with FileNotFoundError in resource_sharer).
    received.wait(timeout=120)


@pytest.mark.slow  # three processes: ~15 s on 2 cores when each imports torch, ~1 s forked from tests/engine/ranks.py's
def test_a_push_over_gloo_gives_every_rollout_rank_the_senders_tensors_bit_for_bit() -> None:
    from ranks import rank_context, rank_target

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    infos = [("embed.weight", (6, 5), "torch.float32"), ("layer.bias", (5,), "torch.float32"),
             ("head.weight", (3, 7), "torch.float32")]
    context = rank_context()
    out, received = context.Queue(), context.Event()
    members = [context.Process(target=rank_target(_member), args=(rank, 3, port, infos, out, received))
               for rank in range(3)]
    for member in members:
        member.start()
    results = {rank: (count, tensors) for rank, count, tensors in (out.get(timeout=120) for _ in members)}
    received.set()
    for member in members:
        member.join(timeout=60)
    sent_bytes, sent = results[0]
    assert sent_bytes == 4 * (30 + 5 + 21)
    for rank in (1, 2):
        buckets, received = results[rank]
        assert buckets == 3  # 64-byte buckets: each tensor goes alone
        assert received.keys() == sent.keys()
        assert all(torch.equal(received[name], sent[name]) for name in sent)


def _generated(version: int) -> Generated:
    prompts = {"input_ids": torch.full((2, 3), version), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    chats = [[{"role": "user", "content": "Say a."}], [{"role": "user", "content": "Say b."}]]
    samples = StepInputs(prompts, [7, 7], ["echo", "echo"], ["a", "b"], [{"i": 0}, {"i": 1}], chats)
    return Generated(samples, {"responses": torch.full((2, 2), version)}, version, 0.5, 0.25)


def test_the_queue_hands_batches_out_oldest_first_and_refuses_more_than_its_capacity() -> None:
    queue = GenerationQueue(capacity=1)
    queue.put(_generated(3))
    with pytest.raises(RuntimeError, match="already in flight"):
        queue.put(_generated(4))
    assert queue.take().version == 3 and len(queue) == 0


def test_a_pending_batch_survives_the_checkpoint_round_trip(tmp_path) -> None:
    path = tmp_path / "pending.pt"
    torch.save(pending_state([_generated(5)]), path)
    (back,) = load_pending(torch.load(path, weights_only=True))
    original = _generated(5)
    assert back.version == 5 and back.samples.group_ids == [7, 7] and back.samples.extra_infos == [{"i": 0}, {"i": 1}]
    assert back.samples.raw_prompts == original.samples.raw_prompts  # what a reward model re-renders after a resume
    assert torch.equal(back.rows["responses"], original.rows["responses"])
    assert torch.equal(back.samples.prompts["input_ids"], original.samples.prompts["input_ids"])


def test_a_resumed_queue_follows_the_plans_rollout_log_probs(tmp_path) -> None:
    """Rows saved with log-probs lose them under a plan whose rollout returns none (a step's batches are joined key
    by key); rows saved without them are refused by a plan that reads them, with the reason."""
    from engine.checkpoint import CheckpointError

    with_them = _generated(2)
    with_them.rows["rollout_log_probs"] = torch.full((2, 2), -0.5)
    saved = pending_state([with_them, _generated(3)])
    kept = load_pending(saved, log_probs=None)
    assert "rollout_log_probs" in kept[0].rows  # None: as saved
    dropped = load_pending(saved, log_probs=False)
    assert all("rollout_log_probs" not in g.rows for g in dropped)
    assert torch.equal(dropped[0].rows["responses"], with_them.rows["responses"])
    with pytest.raises(CheckpointError, match="sampled without log-probs"):
        load_pending(saved, log_probs=True)  # the second batch has none
    assert "rollout_log_probs" in load_pending(pending_state([with_them]), log_probs=True)[0].rows


def test_launch_refuses_what_the_off_policy_modes_do_not_run_yet() -> None:
    """A saved adapter alone turns LoRA on (rlconf.lora_adapter.actor_lora), and a served reward model colocated with
    the trainer has no estimate there: both are refused at launch with the off-policy layout."""
    from engine.capabilities import off_policy_problems, served_reward_model_problems
    from rlconf.compile import compile_plan

    presets = Path(__file__).resolve().parents[2] / "presets"
    adapter = compile_plan(presets / "quickstart_offpolicy.yaml",
                           ["actor_rollout_ref.model.lora_adapter_path=/nonexistent/adapter"]).resolved
    assert adapter is not None and adapter.config.actor_rollout_ref.model.lora_rank == 0
    assert any("lora_adapter_path" in problem for problem in off_policy_problems(adapter))
    served = compile_plan(presets / "quickstart_offpolicy.yaml", [
        "reward_model.enable=true", "reward_model.model.path=tiny://qwen2-reward", "reward_model.rollout.name=vllm",
        "reward_model.rollout.tensor_model_parallel_size=1", "data.return_raw_chat=true", "trainer.device=cuda",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]).resolved
    assert served is not None and served.roles.served_reward_model.colocated
    assert any("enable_resource_pool" in problem
               for problem in served_reward_model_problems(served, vllm_found=lambda: True))


def test_the_pools_timings_come_from_answers_already_collected_not_a_call_behind_the_generation() -> None:
    """A Ray actor runs its calls in order: a call asking the rollout workers for their timings would wait behind
    the batch they are generating and stall the trainer each step. The pool reports what pushes returned."""
    from engine.controller.offpolicy import RolloutPool

    class NoCalls:
        def __getattr__(self, name: str):
            raise AssertionError(f"the rollout group's {name} was called")

    pool = RolloutPool(resolved=None, group=NoCalls(), dispatch=None)
    pool._received_seconds = 0.25  # what push() adds from the receive_weights answers it collected
    assert pool.timings() == {"timing/rollout_receive_weights": 0.25}
    assert pool.timings() == {"timing/rollout_receive_weights": 0.0}
