"""The critic worker in-process (LocalWorkerGroup, one gloo rank): values, updates, sizes from the plan.

Plan: presets/quickstart_ppo.yaml on 1 CPU slot with 16 sequences per step.
critic update: mini batch 8 per GPU, micro batch 4 -> 2 accumulation steps, 2 optimizer steps per step.
critic values: forward micro batch 8 -> 2 forward passes over the 16 sequences.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PPO_PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart_ppo.yaml"
SEQUENCES, PROMPT_LENGTH, RESPONSE_LENGTH = 16, 6, 4


def _plan(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PPO_PRESET, [
        "trainer.n_gpus_per_node=1", f"data.train_batch_size={SEQUENCES}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4", "critic.forward_micro_batch_size_per_gpu=8",
        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}", *overrides,
    ])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses of 1..4 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(2, PROMPT_LENGTH + 1, (SEQUENCES,), generator=g)
    response_lengths = torch.randint(1, RESPONSE_LENGTH + 1, (SEQUENCES,), generator=g)
    return rollout_rows(prompt_lengths, response_lengths, PROMPT_LENGTH, RESPONSE_LENGTH, g)


@pytest.fixture
def make_critic(tiny_model_dir: Path):
    """Build a one-rank critic group for a plan; its process group is torn down after the test."""
    from engine.workers.roles.critic import CriticWorker
    from engine.workers.cluster.local import LocalWorkerGroup

    groups = []

    def make(resolved, total_training_steps: int = 10):
        group = LocalWorkerGroup(CriticWorker, CriticWorker.ROLE, 1, resolved=resolved, model_path=str(tiny_model_dir),
                                 total_training_steps=total_training_steps)
        groups.append(group)
        group.call_all("init_model")
        return group

    yield make
    for group in groups:
        group.kill()


def _with_targets(group, batch: dict[str, torch.Tensor], returns: torch.Tensor) -> dict[str, torch.Tensor]:
    (values,) = group.call_sharded("compute_values", [batch])
    return {**batch, **values, "returns": returns * batch["response_mask"]}


def test_compute_values_runs_the_plans_forward_micro_batches_and_zeroes_padding(make_critic, monkeypatch) -> None:
    import engine.workers.roles.critic as critic_module

    resolved = _plan()
    group = make_critic(resolved)
    seen: list[int] = []
    original = critic_module.response_values

    def recording(model, micro, options):
        seen.append(micro["input_ids"].shape[0])
        return original(model, micro, options)

    monkeypatch.setattr(critic_module, "response_values", recording)
    batch = _batch()
    (out,) = group.call_sharded("compute_values", [batch])

    micro = resolved.roles.critic_values.micro_batch_size_per_gpu
    assert seen == [micro] * resolved.roles.critic_values.micro_batches_per_gpu == [8, 8]
    assert out["values"].shape == (SEQUENCES, RESPONSE_LENGTH)
    assert out["values"].dtype == torch.float32
    assert torch.all(out["values"][batch["response_mask"] == 0] == 0)
    assert torch.any(out["values"][batch["response_mask"] == 1] != 0)


def test_update_critic_runs_the_micro_batch_accumulation_and_optimizer_steps_of_the_plan(make_critic) -> None:
    resolved = _plan()
    group = make_critic(resolved)
    batch = _with_targets(group, _batch(), torch.ones(SEQUENCES, RESPONSE_LENGTH))
    (metrics,) = group.call_sharded("update_critic", [batch])

    critic = resolved.roles.critic
    assert (critic.ppo_micro_batch_size_per_gpu, critic.grad_accum_steps, critic.optimizer_steps_per_train_step) == (4, 2, 2)
    assert metrics["critic/micro_batch_size"] == critic.ppo_micro_batch_size_per_gpu
    assert metrics["critic/grad_accum_steps"] == critic.grad_accum_steps
    assert metrics["critic/optimizer_steps"] == critic.optimizer_steps_per_train_step
    assert metrics["critic/lr"] == resolved.config.critic.optim.lr
    assert metrics["critic/vf_loss"] > 0 and metrics["critic/grad_norm"] > 0
    assert 0 < metrics["memory/critic_peak_gb"] < 64


def test_critic_fits_fixed_returns_within_a_few_updates(make_critic) -> None:
    resolved = _plan("critic.optim.lr=0.01")
    group = make_critic(resolved, total_training_steps=30)
    batch = _batch()
    # A target that depends on the prompt's last token: the critic has to read its input, not learn a constant.
    returns = (batch["input_ids"][:, PROMPT_LENGTH - 1] % 2).float()[:, None].expand(-1, RESPONSE_LENGTH)
    losses = [group.call_sharded("update_critic", [_with_targets(group, batch, returns)])[0]["critic/vf_loss"]
              for _ in range(30)]
    assert losses[-1] < 0.2 * losses[0], losses


@pytest.mark.parametrize(("cliprange_value", "clipped"), [(0.001, True), (10.0, False)])
def test_value_clipping_stops_the_gradient_beyond_cliprange_value_of_the_old_values(
        make_critic, cliprange_value: float, clipped: bool) -> None:
    # Rollout-time values 1.0 below the current ones, returns 0.5 above: with a clip range of 0.001 the
    # clipped prediction (old + 0.001) is the worse one on every token, and it does not depend on the
    # model, so there is no gradient; with a clip range of 10 nothing is clipped and the critic learns.
    group = make_critic(_plan(f"critic.cliprange_value={cliprange_value}"))
    batch = _batch()
    mask = batch["response_mask"]
    (current,) = group.call_sharded("compute_values", [batch])
    batch.update(values=(current["values"] - 1.0) * mask, returns=(current["values"] + 0.5) * mask)
    (metrics,) = group.call_sharded("update_critic", [batch])
    if clipped:
        assert metrics["critic/vf_clipfrac"] == 1.0
        assert metrics["critic/grad_norm"] == 0.0
    else:
        # (vf_clipfrac is not 0 here: old + (v - old) rounds to v ± 1 ulp, and a tie counts as clipped.)
        assert metrics["critic/grad_norm"] > 0.0


def test_critic_lr_warms_up_on_its_own_schedule(make_critic) -> None:
    resolved = _plan("critic.optim.lr_warmup_steps=2")
    group = make_critic(resolved)
    lrs = []
    for _ in range(3):
        batch = _with_targets(group, _batch(), torch.ones(SEQUENCES, RESPONSE_LENGTH))
        lrs.append(group.call_sharded("update_critic", [batch])[0]["critic/lr"])
    peak = resolved.config.critic.optim.lr
    assert lrs == pytest.approx([peak / 2, peak, peak])


def test_a_shard_of_the_wrong_size_is_refused_naming_the_critic_and_the_plan(make_critic) -> None:
    from engine.workers.cluster.group import WorkerFailure

    group = make_critic(_plan())
    short = {name: tensor[:10] for name, tensor in _batch().items()}
    with pytest.raises(WorkerFailure, match=r"critic rank 0 compute_values: got 10 sequences, the plan says 16"):
        group.call_sharded("compute_values", [short])


def test_checkpointables_name_the_critic_model_optimizer_and_scheduler(make_critic) -> None:
    group = make_critic(_plan())
    worker = group.worker
    assert worker._checkpointables() == {"critic": (worker.critic, worker.optimizer, worker.scheduler)}


def test_a_profiled_step_writes_a_chrome_trace_named_by_step_role_and_rank(make_critic, tmp_path: Path) -> None:
    import json

    group = make_critic(_plan())
    group.call_all("start_profile")
    group.call_sharded("compute_values", [_batch()])
    (path,) = group.call_all("stop_profile", str(tmp_path / "profile"), 3)
    assert Path(path) == tmp_path / "profile" / "step3_critic_rank0.json"
    events = json.loads(Path(path).read_text())["traceEvents"]
    assert any(event.get("name", "").startswith("aten::") for event in events)


# No optimizer step ran before the scheduler's, which torch warns about; the run stops here anyway.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_a_non_finite_gradient_stops_the_update_without_touching_the_weights(make_critic) -> None:
    import math

    group = make_critic(_plan("critic.ppo_epochs=2"))
    batch = _batch()
    (before,) = group.call_sharded("compute_values", [batch])
    poisoned = {**batch, **before, "returns": torch.full((SEQUENCES, RESPONSE_LENGTH), float("nan"))}
    (metrics,) = group.call_sharded("update_critic", [poisoned])
    assert math.isnan(metrics["critic/grad_norm"])  # the controller stops the run on this
    assert metrics["critic/optimizer_steps"] == 1  # the first mini batch's norm ended both epochs
    (after,) = group.call_sharded("compute_values", [batch])
    torch.testing.assert_close(after["values"], before["values"], rtol=0, atol=0)
