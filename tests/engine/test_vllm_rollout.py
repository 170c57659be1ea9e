"""On a CUDA GPU with vLLM: the vLLM rollout backend inside the actor worker (the hybrid engine).

vLLM runs in the worker's process next to its FSDP2 shard, receives the actor's weights after each
update, sleeps during training, and returns the sampling log-probs. Skipped without a CUDA device
or without vLLM (CI has neither). Run on the GPU machine with
`python -m pytest -q -m gpu tests/engine/test_vllm_rollout.py`; docs/benchmarks.md records the runs.

vLLM's sleep-mode allocator serves one engine per process, so the in-process tests share one
worker (module fixture) and the end-to-end run goes through `run_launch` (Ray worker processes).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
from launching import assert_learns, compile_preset, launch_preset, read_metrics

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install 'rlconf[vllm]')"),
]

# A head size vLLM's attention kernels take (64); the CPU tiny model's 16 is below what they support.
SMALL_SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512,
                   max_position_embeddings=1024)
ON_ONE_GPU_VLLM = ["trainer.device=cuda", "trainer.n_gpus_per_node=1", "actor_rollout_ref.model.dtype=bfloat16",
                   "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.name=vllm",
                   "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("small_qwen2"), arch="qwen2", **SMALL_SHAPE)


def actor_worker_with_vllm(model_dir, overrides: list[str]):
    """One actor worker in this process, its vLLM rollout started: (group, init_model's answer)."""
    from engine.workers.cluster.local import LocalWorkerGroup
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker

    resolved = compile_preset("quickstart.yaml", overrides + [f"actor_rollout_ref.model.path={model_dir}",
                                                              "data.max_response_length=32"])
    group = LocalWorkerGroup(ActorRolloutRefWorker, "actor_rollout_ref", 1, resolved=resolved,
                             model_path=str(model_dir), total_training_steps=4, pad_token_id=0, eos_token_id=3)
    (info,) = group.call_all("init_model")
    return group, info


@pytest.fixture(scope="module")
def vllm_worker(small_model_dir):
    group, info = actor_worker_with_vllm(small_model_dir, ON_ONE_GPU_VLLM)
    yield group, info
    group.kill()


def _prompts(rows: int = 16, length: int = 12) -> dict:
    ids = torch.randint(10, 400, (rows, length))
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[::2, :4] = 0  # left padding on every other row
    return {"input_ids": ids * mask, "attention_mask": mask}


def _log_prob_gap(group, rows) -> torch.Tensor:
    (recomputed,) = group.call_sharded("compute_log_prob", [rows])
    mask = rows["response_mask"].bool()
    return (rows["rollout_log_probs"] - recomputed["old_log_probs"]).abs()[mask]


def test_vllm_worker_samples_with_log_probs_that_match_the_actor(vllm_worker):
    group, info = vllm_worker
    assert info["rollout"] == "vllm"
    (rows,) = group.call_sharded("generate", [_prompts()])
    assert rows["responses"].shape == (16, 32)
    assert set(rows) >= {"input_ids", "attention_mask", "position_ids", "responses", "response_mask", "rollout_log_probs"}
    gap = _log_prob_gap(group, rows)
    # bf16 sampler vs bf16-compute actor over fp32 master weights: close, never equal.
    assert gap.numel() > 0 and float(gap.mean()) < 0.05, (float(gap.mean()), float(gap.max()))
    (timings,) = group.call_all("rollout_timings")
    assert timings["generate_in_worker"] > 0 and timings["sleep"] > 0


def check_pushed_weights_reach_vllm(group) -> None:
    """After an optimizer step with a large learning rate the old weights would give far-off log-probs;
    the pushed weights make vLLM's log-probs agree with the updated actor again."""
    with torch.no_grad():
        for p in group.worker.actor.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # a visible change to every weight, as an update would make
    # vLLM dropped its weights in its level-2 sleep, so the worker pushes the current ones before sampling.
    (rows_first,) = group.call_sharded("generate", [_prompts()])
    assert float(_log_prob_gap(group, rows_first).mean()) < 0.05
    (seconds,) = group.call_all("sync_rollout_weights")
    assert seconds > 0
    (rows,) = group.call_sharded("generate", [_prompts()])
    assert float(_log_prob_gap(group, rows).mean()) < 0.05


def check_sleep_frees_memory(group) -> None:
    free_before, total = torch.cuda.mem_get_info()  # the whole GPU: every process's memory
    group.call_sharded("generate", [_prompts()])  # wakes, generates, sleeps again
    free_after, _ = torch.cuda.mem_get_info()
    # The KV cache (most of gpu_memory_utilization 0.3) is given back after the rollout.
    assert free_after >= free_before - 0.02 * total, (free_before / 2**30, free_after / 2**30)


def test_weights_pushed_after_an_update_reach_vllm(vllm_worker):
    check_pushed_weights_reach_vllm(vllm_worker[0])


def test_vllm_sleeps_during_training_and_frees_its_memory(vllm_worker):
    check_sleep_frees_memory(vllm_worker[0])


def test_a_generation_cut_off_between_engine_steps_finishes_from_its_prefix(vllm_worker):
    """Partial rollouts on vLLM (engine.rollout.vllm.EngineInterrupt): a generate stopped after a few engine steps
    returns each row's tokens so far; finished from prompt + those tokens with each row's own limit, every row
    reaches the full length, and the actor's log-probs of the joined responses agree with vLLM's: the tokens
    after the cut were sampled in the context of the tokens before it."""
    from engine.rollout.base import Sampling, assemble_rows
    from engine.rollout.partial import continuation_prompts, join

    group, _ = vllm_worker
    backend, length = group.worker.rollout, 32
    group.call_all("sync_rollout_weights")  # the backend holds weights (it dropped them in its last sleep)
    sampling = Sampling(greedy=False, temperature=1.0, top_p=1.0, top_k=0, ignore_eos=True, max_new_tokens=length)
    prompts = _prompts()
    steps = iter(range(10**6))
    cut = backend.generate(prompts, sampling, stop=lambda: next(steps) >= 8)
    done_before = cut["generated_tokens"]
    assert 0 < int(done_before.min()) and int(done_before.max()) < length, done_before
    rest = backend.generate(continuation_prompts(prompts, cut["responses"], done_before, pad_token_id=0),
                            Sampling(False, 1.0, 1.0, 0, True, length - int(done_before.min())),
                            stop=lambda: False, row_limits=length - done_before)
    responses, counts = join(cut["responses"], done_before, rest["responses"], rest["generated_tokens"], length, 0)
    log_probs, _ = join(cut["rollout_log_probs"], done_before, rest["rollout_log_probs"], rest["generated_tokens"],
                        length, 0.0)
    backend.release()
    assert counts.tolist() == [length] * len(counts)
    assert torch.equal(responses[:, :int(done_before.min())], cut["responses"][:, :int(done_before.min())])
    rows = assemble_rows(prompts, responses, 3, True, rollout_log_probs=log_probs)
    gap = _log_prob_gap(group, rows)
    assert float(gap.mean()) < 0.05, (float(gap.mean()), float(gap.max()))


def test_sampled_without_log_probs_the_rows_have_none_and_a_cut_keeps_its_tokens(vllm_worker):
    """Sampling.log_probs false (rollout.calculate_log_probs false): vLLM is asked for none (logprobs=None), a plain
    and a cut generate answer rows without `rollout_log_probs`, the cut one with its tokens so far."""
    from engine.rollout.base import Sampling

    group, _ = vllm_worker
    backend = group.worker.rollout
    group.call_all("sync_rollout_weights")
    sampling = Sampling(greedy=False, temperature=1.0, top_p=1.0, top_k=0, ignore_eos=True, max_new_tokens=16,
                        log_probs=False)
    assert backend.sampling_params(sampling).logprobs is None
    whole = backend.generate(_prompts(), sampling)
    steps = iter(range(10**6))
    cut = backend.generate(_prompts(), sampling, stop=lambda: next(steps) >= 4)
    backend.release()
    assert "rollout_log_probs" not in whole and "rollout_log_probs" not in cut
    assert whole["response_mask"].sum(-1).tolist() == [16] * len(whole["responses"])
    assert 0 < int(cut["generated_tokens"].min()) and int(cut["generated_tokens"].max()) < 16


def test_streamed_groups_leave_as_they_finish_with_the_window_refilled(vllm_worker):
    """The fully async schedule's streamed calls (VLLMRollout.stream_groups): 8 groups of 2 rows, at most 3 in the
    engine at once (the random model rarely samples its EOS, so groups end three at a time and the next three join
    the batch then): every group comes out once, whole, with its own prompts and log-probs that agree with the
    actor's; and a stream stopped after a few engine steps ends with one answer of every group not finished, rows
    cut where they were, only the window's groups started."""
    from engine.rollout.base import Sampling

    group, _ = vllm_worker
    backend = group.worker.rollout
    group.call_all("sync_rollout_weights")
    sampling = Sampling(greedy=False, temperature=1.0, top_p=1.0, top_k=0, ignore_eos=False, max_new_tokens=32)
    prompts = _prompts()
    answers = list(backend.stream_groups(prompts, sampling, group_size=2, window=3))
    order = [g for groups, _ in answers for g in groups]
    assert sorted(order) == list(range(8)) and all(len(groups) == 1 for groups, _ in answers)
    for groups, rows in answers:
        (g,) = groups
        assert torch.equal(rows["input_ids"][:, :12], prompts["input_ids"][2 * g:2 * g + 2])
        assert rows["responses"].shape == (2, 32) and "generated_tokens" not in rows
        gap = _log_prob_gap(group, rows)
        assert float(gap.mean()) < 0.05, (g, float(gap.mean()))
    steps = iter(range(10**6))
    cut_answers = list(backend.stream_groups(prompts, dataclasses.replace(sampling, ignore_eos=True), 2, 3,
                                             stop=lambda: next(steps) >= 6))
    backend.release()
    *finished, (cut_groups, cut_rows) = cut_answers
    assert not finished and sorted(cut_groups) == list(range(8))  # 6 steps: no 32-token group could end
    started = cut_rows["generated_tokens"] > 0
    assert int(started.sum()) == 6 and not bool(cut_rows["ended"].any())  # the window's 3 groups, 2 rows each


def test_grpo_with_vllm_rollout_and_truncated_is_on_one_gpu_learns(tmp_path_factory, small_model_dir):
    _, run_dir, code = launch_preset(tmp_path_factory, "vllm_grpo", "quickstart.yaml",
                                     ON_ONE_GPU_VLLM + [f"actor_rollout_ref.model.path={small_model_dir}",
                                                        "algorithm.rollout_correction.rollout_is=token"])
    assert code == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 41))
    assert_learns(metrics)
    assert all("rollout/log_prob_diff_mean" in m and "timing/rollout_load_weights" in m for m in metrics)
    # The IS weights were applied and are close to 1: vLLM and the actor describe nearly the same policy.
    assert all(0.9 < m["rollout/is_weight_mean"] < 1.1 for m in metrics)


@pytest.mark.parametrize("loss_type, rollout_is", [("ppo_clip", "null"), ("reinforce", "token")])
def test_bypass_mode_trains_on_vllms_log_probs_without_an_old_log_prob_pass(tmp_path_factory, small_model_dir,
                                                                            loss_type, rollout_is):
    """verl's bypass mode: π_old is vLLM's sampling log-probs; no forward pass before the update."""
    _, run_dir, code = launch_preset(tmp_path_factory, f"vllm_bypass_{loss_type}", "quickstart.yaml",
                                     ON_ONE_GPU_VLLM + [f"actor_rollout_ref.model.path={small_model_dir}",
                                                        "algorithm.rollout_correction.bypass_mode=true",
                                                        f"algorithm.rollout_correction.loss_type={loss_type}",
                                                        f"algorithm.rollout_correction.rollout_is={rollout_is}"])
    assert code == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 41))
    assert_learns(metrics)
    assert not any("timing/old_log_prob" in m for m in metrics)
    # the update measured the gap to vLLM's log-probs (and, with reinforce, the IS weights it applied)
    assert all(m["rollout/log_prob_diff_mean"] < 0.05 for m in metrics)
    if rollout_is != "null":
        assert all(0.9 < m["rollout/is_weight_mean"] < 1.1 for m in metrics)
