"""End to end: presets/quickstart_offpolicy.yaml, one training slot and one rollout slot, one step apart.

Three launches on a local Ray cluster (about 2.5 min on 2 cores):
- the whole run (40 steps, a checkpoint at step 20): it learns by the quickstart's criterion, and every
  step's batch came from the weights the step before it started from;
- the same run in a second directory with the rollout worker killed in step 22: the launch fails naming it;
- a relaunch there resumes from step 20 (whose checkpoint holds step 21's batch, generated, never trained)
  and finishes with the metrics of the whole run at every step: no group lost, none trained twice.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from launching import PRESETS, assert_learns, read_metrics

PRESET = "quickstart_offpolicy.yaml"
OVERRIDES = ["trainer.save_freq=20"]
UNTIMED = ("timing/", "perf/tokens_per_second", "memory/")


def _launch(run_dir: Path) -> tuple[int, str]:
    from engine.launch import run_launch
    from rlconf.compile import compile_plan

    result = compile_plan(PRESETS / PRESET, OVERRIDES)
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    output = io.StringIO()
    with contextlib.redirect_stderr(output):
        code = run_launch(result.resolved, run_dir=run_dir)
    return code, output.getvalue()


@contextlib.contextmanager
def _kill_the_rollout_worker_in_step(step: int):
    """At the start of `step`, the rollout worker's process is killed (as by the OOM killer) while it generates."""
    import ray

    from engine.trainer import Trainer

    original = Trainer.step

    def step_with_kill(self, current: int):
        if current == step:
            ray.kill(self.rollout_pool.group.workers[0], no_restart=True)
        return original(self, current)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "step", step_with_kill)
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCONF_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        whole, eventful = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("eventful")
        result = {"whole_dir": whole, "eventful_dir": eventful, "whole": _launch(whole)}
        with _kill_the_rollout_worker_in_step(22):
            result["killed"] = _launch(eventful)
        result["resumed"] = _launch(eventful)
    return result


def _metrics(run_dir: Path) -> dict[int, dict]:
    lines = read_metrics(run_dir)
    steps = [m["step"] for m in lines]
    assert len(steps) == len(set(steps)), f"metrics.jsonl repeats steps: {steps}"
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(UNTIMED)} for m in lines}


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
    whole, resumed = _metrics(runs["whole_dir"]), _metrics(runs["eventful_dir"])
    # Step 21 trains the batch the checkpoint carried, step 22 the first one generated after the resume: both,
    # and every later step, as in the run that was never stopped (rewards, losses, versions, gradients).
    assert resumed[21] == whole[21] and resumed[22] == whole[22]
    assert resumed == whole
