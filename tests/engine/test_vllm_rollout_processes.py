"""On a CUDA GPU with vLLM: the rollout with vLLM in processes of its own beside the actor worker
(`rollout.engine_kwargs.vllm.distributed_executor_backend: mp`, verl's layout): the weights cross by CUDA IPC
(engine/rollout/vllm_processes.py), sleep and wake go over vLLM's RPC, and the rollout phase's memory counts the
model runner's process.

Run it in a pytest process of its own, apart from tests/engine/test_vllm_rollout.py (whose in-process engine
sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for the whole process):
`python -m pytest -q -m gpu tests/engine/test_vllm_rollout_processes.py`.
"""

from __future__ import annotations

import pytest
from launching import assert_learns, launch_preset, read_metrics
from test_vllm_rollout import ON_ONE_GPU_VLLM, _log_prob_gap, _prompts, check_pushed_weights_reach_vllm  # noqa: F401
from test_vllm_rollout import actor_worker_with_vllm, check_sleep_frees_memory, small_model_dir  # noqa: F401
from test_vllm_rollout import pytestmark as VLLM_ON_A_GPU

torch = pytest.importorskip("torch")

pytestmark = VLLM_ON_A_GPU  # needs CUDA and vLLM, as the in-process tests do

OWN_PROCESSES = ON_ONE_GPU_VLLM + ["actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=mp"]


@pytest.fixture(scope="module")
def mp_worker(small_model_dir):  # noqa: F811
    # Buckets of 1 MB: every push fills the buffer many times over, as a 7B push of 2 GB buckets does.
    group, info = actor_worker_with_vllm(small_model_dir, OWN_PROCESSES + [
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1"])
    yield group, info
    group.kill()


def test_the_weights_reach_vllms_own_process_and_its_log_probs_match_the_actor(mp_worker):
    group, info = mp_worker
    backend = group.worker.rollout
    assert info["rollout"] == "vllm" and not backend.in_process
    with pytest.raises(RuntimeError, match="process of its own"):
        backend.model()
    # vLLM pads the embedding's rows to a multiple of 64 (the tiny model's 509 ids: 512), the actor does not
    actor_params = sum(p.numel() for p in group.worker.actor.parameters())
    hidden = group.worker.actor.config.hidden_size if hasattr(group.worker.actor, "config") else 256
    assert 0 <= backend.num_params() - actor_params <= 64 * hidden * 2, (backend.num_params(), actor_params)
    assert type(backend.llm.llm_engine.engine_core).__name__ == "SyncMPClient"  # the layout asked for, not in process
    (rows,) = group.call_sharded("generate", [_prompts()])
    assert rows["responses"].shape == (16, 32)
    gap = _log_prob_gap(group, rows)
    assert gap.numel() > 0 and float(gap.mean()) < 0.05, (float(gap.mean()), float(gap.max()))
    (timings,) = group.call_all("rollout_timings")
    assert timings["generate_in_worker"] > 0 and timings["sleep"] > 0 and timings["load_weights"] > 0
    # The rollout phase's peak counts the model runner's process: the actor's resident states here and, there,
    # vLLM's pool (its weights and KV cache, all mapped while it generated; none of it counted in this process).
    pool = backend.memory_beside()["pool"]
    assert pool > 0 and timings["peak_gb"] * 2**30 >= torch.cuda.memory_allocated() + 0.9 * pool, (timings, pool)


def test_weights_pushed_after_an_update_reach_vllms_own_process(mp_worker):
    check_pushed_weights_reach_vllm(mp_worker[0])


def test_pushes_of_many_buckets_each_leave_no_memory_behind(mp_worker):
    """The buffer is shared once per allocation and freed at each push's end (a handle shared again and never
    opened would keep its block in torch's IPC limbo: a bucket lost a push)."""
    group, _ = mp_worker
    group.call_all("sync_rollout_weights")
    torch.cuda.synchronize()
    reserved, (free, total) = torch.cuda.memory_reserved(), torch.cuda.mem_get_info()
    for _ in range(5):
        group.call_all("sync_rollout_weights")
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved() <= reserved + 2**20
    assert torch.cuda.mem_get_info()[0] >= free - 2**21, (free, torch.cuda.mem_get_info()[0])
    group.worker.rollout.release()


def test_vllms_own_process_sleeps_during_training_and_frees_its_memory(mp_worker):
    check_sleep_frees_memory(mp_worker[0])
    assert mp_worker[0].worker.rollout.counted_while_asleep == 0


def test_grpo_with_vllm_in_processes_of_its_own_learns(tmp_path_factory, small_model_dir):  # noqa: F811
    _, run_dir, code = launch_preset(tmp_path_factory, "vllm_mp_grpo", "quickstart.yaml",
                                     OWN_PROCESSES + [f"actor_rollout_ref.model.path={small_model_dir}"])
    assert code == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 41))
    assert_learns(metrics)
    assert all(m["rollout/log_prob_diff_mean"] < 0.05 for m in metrics)
