"""Checkpoints and resume end to end: `run_launch` on a local Ray cluster, 2 FSDP2 actor ranks on gloo.

GRPO: one short quickstart variant (4 steps, a checkpoint every 2) runs twice, once per module:

- uninterrupted: 4 steps in one launch.
- eventful: launch 1 crashes while the step-4 checkpoint is being written (after the shards, before
  the rename); launch 2 resumes (resume_mode auto) from step 2, and a worker is killed in its step 3;
  launch 3 resumes from step 2 again and finishes.

PPO: a short quickstart_ppo variant with a critic and an adaptive KL coefficient in the reward runs
4 steps; a second launch in a new run directory resumes from its step-2 checkpoint (resume_mode
resume_path) and runs steps 3 and 4 again.

Tolerance: none. On CPU with fixed seeds every random stream is restored (per-rank sampling RNG,
the critic's shuffle generator, controller RNG, data order, optimizers, LR schedulers, the KL
coefficient), so the resumed runs' metrics and final weights are compared with `==` against the
uninterrupted runs'. About a minute on 2 cores: six launches, each joining the module's Ray cluster
(tests/engine/conftest.py `ray_address`); most of it is worker start-up.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

import pytest

PRESETS = Path(__file__).resolve().parents[2] / "presets"
SHORT_RUN = [
    "data.train_files=synthetic://echo?size=64&seed=0",
    "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "trainer.total_training_steps=4", "trainer.save_freq=2",
    # An entropy bonus gives every step a gradient, even one whose 16 samples all score 0 (then GRPO's
    # advantages are 0): the policy keeps moving after the checkpoint, so equal metrics mean something.
    "actor_rollout_ref.actor.entropy_coeff=0.01",
]
PPO_SHORT_RUN = [
    "data.train_files=synthetic://echo?size=64&seed=0",
    "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    # Two critic epochs with shuffling: the critic's own shuffle generator must be continued too.
    "critic.ppo_micro_batch_size_per_gpu=4", "critic.forward_micro_batch_size_per_gpu=8",
    "critic.ppo_epochs=2", "critic.shuffle=true",
    "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=100",
    "trainer.total_training_steps=4", "trainer.save_freq=2",
    # Every actor checkpoint also carries a HF export.
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
]
# Metrics that measure wall time or memory differ between any two runs; everything else must not.
UNTIMED = ("timing/", "perf/tokens_per_second", "memory/")


def _compile(preset: str, overrides: list[str]):
    from rlconf.compile import compile_plan

    result = compile_plan(PRESETS / preset, overrides)
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def _launch(run_dir: Path, overrides: list[str] = (), preset: str = "quickstart.yaml", address: str | None = None
            ) -> tuple[int, str, float]:
    """(exit code, what launch printed, seconds) of one `run_launch` of the preset's short run plus `overrides`."""
    from engine.launch import run_launch

    base = SHORT_RUN if preset == "quickstart.yaml" else PPO_SHORT_RUN
    output = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stderr(output):  # launch prints through a rich console on stderr
        code = run_launch(_compile(preset, [*base, *overrides]), run_dir=run_dir, address=address)
    return code, output.getvalue(), time.perf_counter() - started


def _metrics(run_dir: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in lines]
    assert len(steps) == len(set(steps)), f"metrics.jsonl repeats steps: {steps}"
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(UNTIMED)} for m in lines}


@contextlib.contextmanager
def _crash_while_writing_checkpoint(step: int):
    """The controller dies after every shard of `step` is written, before the rename publishes them."""
    import engine.checkpoint

    def commit(root: Path, tmp: Path, committed_step: int) -> Path:
        if committed_step == step:
            raise OSError(f"injected crash while committing {tmp.name}")
        return original(root, tmp, committed_step)

    original = engine.checkpoint.commit_checkpoint
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine.checkpoint, "commit_checkpoint", commit)
        yield


@contextlib.contextmanager
def _kill_actor_rank_1_during_step(step: int, killed_at: list[float]):
    """In `step`, after generation and log-probs, actor rank 1's process is killed (as by the OOM killer)
    just before the update, so rank 0 enters FSDP collectives that can never finish."""
    import ray

    from engine.trainer import Trainer

    original_step = Trainer.step

    def step_with_kill(self, current: int):
        if current == step:
            group, dispatch = self.group, self.group.call_sharded

            def call_sharded(method, shards):
                if method == "update_actor":
                    killed_at.append(time.perf_counter())
                    ray.kill(group.workers[1], no_restart=True)
                return dispatch(method, shards)

            group.call_sharded = call_sharded
        return original_step(self, current)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "step", step_with_kill)
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCONF_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        uninterrupted = tmp_path_factory.mktemp("uninterrupted")
        eventful = tmp_path_factory.mktemp("eventful")
        result = {"uninterrupted_dir": uninterrupted, "eventful_dir": eventful}
        result["uninterrupted"] = _launch(uninterrupted, address=ray_address)

        with _crash_while_writing_checkpoint(step=4):
            result["crashed"] = _launch(eventful, address=ray_address)
        root = eventful / "checkpoints"
        result["after_crash"] = {"latest": (root / "latest_checkpointed_iteration.txt").read_text().strip(),
                                 "entries": sorted(p.name for p in root.iterdir())}

        killed_at: list[float] = []
        with _kill_actor_rank_1_during_step(3, killed_at):
            result["killed"] = _launch(eventful, address=ray_address)
        result["kill_to_exit_seconds"] = time.perf_counter() - killed_at[0] if killed_at else None

        result["resumed"] = _launch(eventful, address=ray_address)
    return result


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCONF_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        uninterrupted = tmp_path_factory.mktemp("ppo_uninterrupted")
        resumed = tmp_path_factory.mktemp("ppo_resumed")
        result = {"uninterrupted_dir": uninterrupted, "resumed_dir": resumed}
        result["uninterrupted"] = _launch(uninterrupted, preset="quickstart_ppo.yaml", address=ray_address)
        step_2 = uninterrupted / "checkpoints" / "global_step_2"
        result["resumed"] = _launch(resumed, ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={step_2}"],
                                    preset="quickstart_ppo.yaml", address=ray_address)
    return result


@pytest.mark.slow
def test_uninterrupted_run_checkpoints_every_2_steps_and_exports_the_actor(runs) -> None:
    code, output, _ = runs["uninterrupted"]
    assert code == 0, output
    run_dir = runs["uninterrupted_dir"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "global_step_2", "global_step_4", "latest_checkpointed_iteration.txt"]
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "4\n"
    state = json.loads((run_dir / "checkpoints" / "global_step_4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["controller"]["history_length"] == 4
    assert state["controller"]["data_order"] == {"epoch": 0, "position": 4, "seed": 0, "batch_size": 4, "num_rows": 64}
    assert sorted(p.name for p in (run_dir / "checkpoints" / "global_step_4" / "actor").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "extra_state_rank_0.pt", "extra_state_rank_1.pt"]


@pytest.mark.slow
def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one_latest(runs) -> None:
    code, output, _ = runs["crashed"]
    assert code == 1 and "injected crash while committing .tmp-step_4" in output, output
    # Every shard of step 4 was written, but never renamed: the pointer still names step 2.
    assert runs["after_crash"] == {"latest": "2", "entries": [
        ".tmp-step_4", "global_step_2", "latest_checkpointed_iteration.txt"]}


@pytest.mark.slow
def test_a_killed_worker_fails_the_launch_within_60_s_naming_its_role(runs) -> None:
    code, output, _ = runs["killed"]
    assert code == 1, output
    assert "resumed from" in output and "global_step_2 after step 2" in output  # it picked the step-2 checkpoint
    assert "worker actor_rollout_ref rank 1 on node " in output and " failed: " in output, output
    assert "the worker's traceback in " in output, output
    assert runs["kill_to_exit_seconds"] < 60


@pytest.mark.slow
def test_a_relaunch_after_the_failures_resumes_from_step_2_and_finishes(runs) -> None:
    code, output, _ = runs["resumed"]
    assert code == 0, output
    assert "global_step_2 after step 2" in output and "2 steps to go" in output, output
    run_dir = runs["eventful_dir"]
    assert list(_metrics(run_dir)) == [1, 2, 3, 4]  # the crashed launch's lines 3 and 4 were set aside
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "4\n"
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))


@pytest.mark.slow
def test_resumed_run_has_the_metrics_of_the_uninterrupted_run_at_every_step(runs) -> None:
    assert runs["uninterrupted"][0] == 0 and runs["resumed"][0] == 0
    uninterrupted, resumed = _metrics(runs["uninterrupted_dir"]), _metrics(runs["eventful_dir"])
    # Step 3 is the first step after the checkpoint: sampling, rewards, losses and gradients all match.
    assert resumed[3] == uninterrupted[3]
    assert resumed == uninterrupted
    # The comparison is only worth something if the policy actually moved after the checkpoint.
    assert any(uninterrupted[step]["actor/grad_norm"] > 0 for step in (3, 4)), uninterrupted


@pytest.mark.slow
def test_resumed_run_ends_with_the_same_weights_as_the_uninterrupted_run(runs) -> None:
    from safetensors.torch import load_file

    uninterrupted = load_file(runs["uninterrupted_dir"] / "hf_actor" / "model.safetensors")
    resumed = load_file(runs["eventful_dir"] / "hf_actor" / "model.safetensors")
    assert uninterrupted.keys() == resumed.keys()
    assert all((uninterrupted[name] == resumed[name]).all() for name in uninterrupted)


@pytest.mark.slow
def test_hf_export_loads_with_transformers_and_gives_the_logits_of_the_checkpointed_actor(runs, tmp_path) -> None:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = runs["uninterrupted_dir"]
    exported = AutoModelForCausalLM.from_pretrained(run_dir / "hf_actor")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf_actor")
    assert exported.config.architectures == ["Qwen2ForCausalLM"]

    # The final DCP checkpoint, consolidated without any process group, loaded into the same architecture.
    dcp_to_torch_save(run_dir / "checkpoints" / "global_step_4" / "actor", tmp_path / "actor.pt")
    actor_weights = torch.load(tmp_path / "actor.pt", weights_only=True)["model"]
    checkpointed = AutoModelForCausalLM.from_config(exported.config)
    checkpointed.load_state_dict(actor_weights)

    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Repeat: apple"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        assert torch.equal(exported.eval()(ids).logits, checkpointed.eval()(ids).logits)


@pytest.mark.slow
def test_ppo_resumed_from_another_run_directory_matches_the_uninterrupted_run(ppo_runs) -> None:
    code, output, _ = ppo_runs["uninterrupted"]
    assert code == 0, output
    step_2 = ppo_runs["uninterrupted_dir"] / "checkpoints" / "global_step_2"
    assert sorted(p.name for p in step_2.iterdir()) == ["actor", "controller_rng.pt", "critic", "trainer_state.json"]
    code, output, _ = ppo_runs["resumed"]
    assert code == 0, output
    assert "after step 2" in output and "has 0 of the 2 steps before the checkpoint" in output, output
    uninterrupted, resumed = _metrics(ppo_runs["uninterrupted_dir"]), _metrics(ppo_runs["resumed_dir"])
    assert list(resumed) == [3, 4]  # the new run directory holds the steps this launch trained
    assert resumed[3] == uninterrupted[3] and resumed[4] == uninterrupted[4]
    assert uninterrupted[3]["critic/grad_norm"] > 0 and uninterrupted[3]["kl_in_reward/beta"] > 0


@pytest.mark.slow
def test_save_contents_hf_model_puts_a_loadable_hf_export_in_every_actor_checkpoint(ppo_runs) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert ppo_runs["uninterrupted"][0] == 0
    for step in (2, 4):
        export = ppo_runs["uninterrupted_dir"] / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"
        assert AutoModelForCausalLM.from_pretrained(export).config.architectures == ["Qwen2ForCausalLM"]
        assert AutoTokenizer.from_pretrained(export).chat_template
    assert not (ppo_runs["uninterrupted_dir"] / "checkpoints" / "global_step_2" / "critic" / "huggingface").exists()


def test_save_freq_minus_one_writes_no_checkpoint_says_so_and_still_exports_the_actor(tmp_path, ray_address,
                                                                                       monkeypatch) -> None:
    """verl's meaning of trainer.save_freq=-1: no checkpoint at all, not even after the last step."""
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    code, output, _ = _launch(run_dir, ["trainer.total_training_steps=2", "trainer.save_freq=-1"], address=ray_address)
    assert code == 0, output
    assert list(_metrics(run_dir)) == [1, 2]
    root = run_dir / "checkpoints"
    assert not root.exists() or list(root.iterdir()) == []
    assert "checkpoint: " not in output, output  # the line a saved checkpoint prints
    assert "metrics.jsonl, no checkpoints: trainer.save_freq=-1)" in output, output
    assert "note: no checkpoint written: trainer.save_freq=-1 never saves" in output, output
    assert output.strip().splitlines()[-1].startswith("done: 2 steps"), output
    assert (run_dir / "hf_actor" / "model.safetensors").is_file()  # the export does not need a checkpoint


def test_a_resume_path_that_does_not_exist_exits_1_with_a_message_before_ray_starts(monkeypatch, tmp_path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    from typer.testing import CliRunner

    import engine.launch
    from rlconf.cli import app

    started: list[str] = []
    monkeypatch.setattr(engine.launch, "start_ray", lambda *a, **k: started.append("ray"))
    result = CliRunner().invoke(app, ["launch", str(PRESETS / "quickstart.yaml"), "trainer.resume_mode=resume_path",
                                      f"trainer.resume_from_path={tmp_path / 'nowhere'}",
                                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "error: trainer.resume_from_path=" in result.output and "no such directory" in result.output
    assert "Traceback" not in result.output
    assert started == [] and not (tmp_path / "run").exists()
