"""End to end: presets/quickstart_offpolicy.yaml, one training slot and one rollout slot, one step apart.

Three launches on the module's local Ray cluster (tests/engine/conftest.py `ray_address`; about 50 s on 2 cores):
- the whole run (40 steps, a checkpoint at step 20): it learns by the quickstart's criterion, and every
  step's batch came from the weights the step before it started from;
- the same run in a second directory with the rollout worker killed in step 22: the launch fails naming it;
- a relaunch there resumes from step 20 (whose checkpoint holds step 21's batch, generated, never trained)
  and finishes with the metrics of the whole run at every step: no group lost, none trained twice.
"""

from __future__ import annotations

import json

import pytest
from launching import assert_learns, read_metrics
from offpolicy_runs import metrics_by_step, whole_killed_resumed

PRESET = "quickstart_offpolicy.yaml"
OVERRIDES = ["trainer.save_freq=20"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> dict:
    return whole_killed_resumed(tmp_path_factory, PRESET, OVERRIDES, kill_in_step=22, address=ray_address)


@pytest.mark.slow
def test_one_step_off_policy_quickstart_learns_by_the_quickstarts_criterion(runs) -> None:
    code, output = runs["whole"]
    assert code == 0, output
    assert "trainer → rollout over gloo" in output
    assert_learns(read_metrics(runs["whole_dir"]))


@pytest.mark.slow
def test_the_batch_trained_at_step_k_was_generated_by_the_weights_step_k_minus_1_started_from(runs) -> None:
    metrics = read_metrics(runs["whole_dir"])
    # Version v: the weights after v training steps. Step k trains the weights of version k-1 on a batch the
    # rollout pool generated while step k-1 trained, with the weights step k-1 started from (k-2); step 1's
    # batch was generated first, by the initial weights.
    assert [m["offpolicy/generation_version"] for m in metrics] == [max(k - 2, 0) for k in range(1, 41)]
    assert [m["offpolicy/staleness"] for m in metrics] == [0] + [1] * 39
    # The versions are the rollout workers' own tags; the loss sees the same: in bypass mode π_old is the
    # rollout's log-probs, so step 1 (same weights on both sides) starts at a ratio of 1 and a zero KL, while
    # from step 2 on the trained policy is one update ahead of the one that sampled.
    assert abs(metrics[0]["actor/ppo_kl"]) < 1e-6
    assert all(abs(m["actor/ppo_kl"]) > 100 * abs(metrics[0]["actor/ppo_kl"]) + 1e-5 for m in metrics[1:4])


@pytest.mark.slow
def test_each_side_reports_how_long_it_waited_for_the_other(runs) -> None:
    for m in read_metrics(runs["whole_dir"]):
        assert m["timing/wait_rollout"] >= 0 and m["timing/rollout_idle"] >= 0 and m["timing/rollout_generate"] > 0
        assert m["timing/wait_rollout"] <= m["timing/step"]
        # The rollout worker's own account of the generation it sent with the batch (its backend's timings).
        assert 0 < m["timing/rollout_generate_in_worker"] <= m["timing/rollout_generate"]
    plan = json.loads((runs["whole_dir"] / "plan.resolved.json").read_text())
    assert plan["schedule"]["mode"] == "one_step_off_policy" and plan["schedule"]["weight_sync"] == "gloo"


@pytest.mark.slow
def test_the_checkpoint_holds_the_batch_in_flight_generated_and_not_trained(runs) -> None:
    import torch

    from engine.controller.offpolicy import PENDING_FILE, load_pending

    step_dir = runs["whole_dir"] / "checkpoints" / "global_step_20"
    (pending,) = load_pending(torch.load(step_dir / PENDING_FILE, weights_only=True))
    prompts = 16  # train_batch_size; group ids are step × prompts + i (engine.controller.samples)
    assert sorted(set(pending.samples.group_ids)) == list(range(21 * prompts, 22 * prompts))
    assert pending.version == 19
    assert (step_dir / "rollout" / "state_rank_0.pt").is_file()


@pytest.mark.slow
def test_a_killed_rollout_worker_fails_the_launch_naming_its_role(runs) -> None:
    code, output = runs["killed"]
    assert code == 1
    assert "rollout rank 0" in output, output


@pytest.mark.slow
def test_resume_after_the_kill_neither_loses_nor_repeats_a_group(runs) -> None:
    code, output = runs["resumed"]
    assert code == 0, output
    assert "global_step_20 after step 20" in output
    whole, resumed = metrics_by_step(runs["whole_dir"]), metrics_by_step(runs["eventful_dir"])
    # Step 21 trains the batch the checkpoint carried, step 22 the first one generated after the resume: both,
    # and every later step, as in the run that was never stopped (rewards, losses, versions, gradients).
    assert resumed[21] == whole[21] and resumed[22] == whole[22]
    assert resumed == whole
