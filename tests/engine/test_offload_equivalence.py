"""Offload on or off, the workers compute the same numbers: two FSDP2 ranks on gloo, the real workers.

Each variant builds a fresh `ActorRolloutRefWorker` (with a reference policy: `use_kl_loss`) and a
fresh `CriticWorker` from the same tiny checkpoint, with its offload knobs set, and runs on the same
rows: old log-probs and entropy, reference log-probs, critic values, then an update of each model
(two optimizer steps: the second uses the moments optimizer offload moved away and back), the
weight sync's gathered tensors, and a checkpoint round trip of the actor (save, a second update,
load, the second update again).
What each variant gave is compared with the variant without the knobs. A slow test also runs three
PPO steps in process with every knob on and compares the logged numbers with the plain run's.

On the CPU the offloaded states stay where they were (the device is the CPU), but the code runs:
`ModelOffload` moves shards and moments with `.cpu()` / `.to(device)` and FSDP2 re-registers them,
offload_policy runs FSDP2's CPUOffloadPolicy path (gradients copied "to the host", the optimizer
step on the offloaded shards), activation offload copies every saved activation (weights excepted)
through its hooks.
bf16 compute with fp32 master weights, as on a GPU.

Tolerance: the same operations run in the same order on the same device, so the results are
identical: asserted with rtol = atol = 0 (bit for bit), measured so on torch 2.13 (CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PPO_PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart_ppo.yaml"
WORLD_SIZE = 2
SEQUENCES, PROMPT_LENGTH, RESPONSE_LENGTH = 16, 8, 6
ACTOR, CRITIC = "actor_rollout_ref.actor.fsdp_config", "critic.model.fsdp_config"

# name -> (overrides, the variant it must agree with). The first three run in the fast suite (the knobs
# together); the rest, one knob at a time, are marked slow.
VARIANTS: dict[str, tuple[list[str], str]] = {
    "off": ([], "off"),
    "param+optimizer+ref offload": ([f"{ACTOR}.param_offload=true", f"{ACTOR}.optimizer_offload=true",
                                     f"{CRITIC}.param_offload=true", f"{CRITIC}.optimizer_offload=true",
                                     "actor_rollout_ref.ref.fsdp_config.param_offload=true"], "off"),
    "offload_policy+activation offload": ([f"{ACTOR}.offload_policy=true", f"{CRITIC}.offload_policy=true",
                                           "actor_rollout_ref.model.enable_activation_offload=true",
                                           "critic.model.enable_activation_offload=true"], "off"),
    "param offload": ([f"{ACTOR}.param_offload=true", f"{CRITIC}.param_offload=true"], "off"),
    "optimizer offload": ([f"{ACTOR}.optimizer_offload=true", f"{CRITIC}.optimizer_offload=true"], "off"),
    "offload_policy": ([f"{ACTOR}.offload_policy=true", f"{CRITIC}.offload_policy=true"], "off"),
    "ref param offload": (["actor_rollout_ref.ref.fsdp_config.param_offload=true"], "off"),
    "activation offload": (["actor_rollout_ref.model.enable_activation_offload=true",
                            "critic.model.enable_activation_offload=true"], "off"),
    "checkpointed": (["actor_rollout_ref.model.enable_gradient_checkpointing=true",
                      "critic.model.enable_gradient_checkpointing=true"], "checkpointed"),
    "checkpointed+activation offload": (["actor_rollout_ref.model.enable_gradient_checkpointing=true",
                                         "critic.model.enable_gradient_checkpointing=true",
                                         "actor_rollout_ref.model.enable_activation_offload=true",
                                         "critic.model.enable_activation_offload=true"], "checkpointed"),
}
FAST = ["off", "param+optimizer+ref offload", "offload_policy+activation offload"]
SLOW = ["off", *[name for name in VARIANTS if name not in FAST]]


def _plan(overrides: list[str]):
    from rlconf.compile import compile_plan

    result = compile_plan(PPO_PRESET, [
        f"trainer.n_gpus_per_node={WORLD_SIZE}", f"data.train_batch_size={SEQUENCES}",
        "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
        # Two optimizer steps per update, two micro batches each (8 rows per rank).
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=8", "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.forward_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01",
        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}",
        *overrides,
    ])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    assert result.resolved.roles.actor.optimizer_steps_per_train_step == 2
    assert result.resolved.roles.critic.optimizer_steps_per_train_step == 2
    return result.resolved


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompt_lengths = torch.randint(3, PROMPT_LENGTH + 1, (SEQUENCES,), generator=g)
    response_lengths = torch.randint(1, RESPONSE_LENGTH + 1, (SEQUENCES,), generator=g)
    batch = rollout_rows(prompt_lengths, response_lengths, PROMPT_LENGTH, RESPONSE_LENGTH, g)
    mask = batch["response_mask"]
    batch.update(advantages=torch.randn(SEQUENCES, 1, generator=g).expand(-1, RESPONSE_LENGTH) * mask,
                 returns=torch.randn(SEQUENCES, RESPONSE_LENGTH, generator=g) * mask,
                 log_prob_shift=(torch.rand(SEQUENCES, RESPONSE_LENGTH, generator=g) - 0.5) * 0.2)
    return batch


def _capture_gradients(model, optimizer) -> list[dict[str, torch.Tensor]]:
    """Filled with the full gradients at each optimizer step (a collective: every rank steps)."""
    captured: list[dict[str, torch.Tensor]] = []
    optimizer.register_step_pre_hook(
        lambda *_: captured.append({n: p.grad.full_tensor() for n, p in model.named_parameters()}))
    return captured


def _numbers(metrics: dict[str, float]) -> dict[str, float]:
    """The update's metrics less the process's memory (max RSS on the CPU, which only grows)."""
    return {key: value for key, value in metrics.items() if not key.startswith("memory/")}


def _where_states_are(worker_offload, model, optimizer) -> dict[str, object]:
    """What the offload set up (on the CPU the devices cannot show it)."""
    fsdp_params = [p for state in [model._get_fsdp_state()] for group in [state._fsdp_param_group] if group
                   for p in group.fsdp_params]  # FSDP2's own record of CPUOffloadPolicy (private)
    return {"params": worker_offload.params, "optimizer_states": worker_offload.optimizer_states,
            "offload_policy": bool(fsdp_params) and all(p.offload_to_cpu for p in fsdp_params),
            "moments": sorted({str(v.device) for s in optimizer.state.values() for v in s.values() if v.dim() > 0})}


def _run_actor(plan, model_dir: str, rank: int, half: slice, batch: dict, step_dir: str) -> dict:
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.workers.fsdp.sharding import full_state_dict
    from engine.workers.fsdp.gather import full_tensors

    activation_flags: list[bool] = []
    offload_context = actor_module.activation_offload

    def recording(enabled, device):
        activation_flags.append(enabled)
        return offload_context(enabled, device)

    actor_module.activation_offload = recording
    worker = actor_module.ActorRolloutRefWorker(plan, model_dir, rank, WORLD_SIZE, total_training_steps=10,
                                                pad_token_id=0, eos_token_id=1)
    worker.init_model()
    shard = {k: v[half] for k, v in batch.items() if k not in ("log_prob_shift", "returns")}
    out = worker.compute_log_prob(shard)
    ref = worker.compute_ref_log_prob(shard)
    shard.update(old_log_probs=out["old_log_probs"] + batch["log_prob_shift"][half],
                 ref_log_probs=ref["ref_log_probs"])
    grads = _capture_gradients(worker.actor, worker.optimizer)
    metrics = _numbers(worker.update_actor(shard))
    result = {"log_probs": out["old_log_probs"], "entropy": out["entropy"], "ref_log_probs": ref["ref_log_probs"],
              "grads": list(grads), "metrics": metrics, "weights": full_state_dict(worker.actor),
              "synced": dict(full_tensors(worker.actor, torch.bfloat16)),
              "offload": _where_states_are(worker.actor_offload, worker.actor, worker.optimizer),
              "ref_offload": worker.ref_offload.params, "activation_offload": activation_flags}
    worker.save_checkpoint(step_dir)
    worker.update_actor(shard)
    after_second = full_state_dict(worker.actor)
    worker.load_checkpoint(step_dir)
    result["reloaded"] = full_state_dict(worker.actor)
    worker.update_actor(shard)
    result["second_update_again"] = (after_second, full_state_dict(worker.actor))
    # The end of a run (engine.launch): the optimizer released, then the export, which moves no moment.
    moments_moved = []
    to_device = worker.actor_offload._moments_to_device
    worker.actor_offload._moments_to_device = lambda: (moments_moved.append(True), to_device())
    final = full_state_dict(worker.actor)
    worker.release_optimizer()
    worker.export_hf("actor", f"{step_dir}-hf")
    result["end"] = {"weights": final, "optimizer_states": len(worker.optimizer.state),
                     "moments_moved": bool(moments_moved), "export_dir": f"{step_dir}-hf"}
    try:
        worker.update_actor(shard)
    except RuntimeError as exc:
        result["end"]["update_after_release"] = str(exc)
    try:
        worker.save_checkpoint(f"{step_dir}-after-release")
    except RuntimeError as exc:
        result["end"]["save_after_release"] = str(exc)
    actor_module.activation_offload = offload_context
    return result


def _run_critic(plan, model_dir: str, rank: int, half: slice, batch: dict) -> dict:
    from engine.workers.roles.critic import CriticWorker
    from engine.workers.fsdp.sharding import full_state_dict

    worker = CriticWorker(plan, model_dir, rank, WORLD_SIZE, total_training_steps=10)
    worker.init_model()  # joins the actor's process group (same ranks)
    shard = {k: v[half] for k, v in batch.items() if k not in ("log_prob_shift", "advantages")}
    values = worker.compute_values(shard)["values"]
    grads = _capture_gradients(worker.critic, worker.optimizer)
    metrics = _numbers(worker.update_critic({**shard, "values": values}))
    result = {"values": values, "grads": list(grads), "metrics": metrics, "weights": full_state_dict(worker.critic),
              "offload": _where_states_are(worker.critic_offload, worker.critic, worker.optimizer)}
    worker.release_optimizer()  # the end of a run: the critic's optimizer goes too
    result["optimizer_states_after_release"] = len(worker.optimizer.state)
    try:
        worker.update_critic({**shard, "values": values})
    except RuntimeError as exc:
        result["update_after_release"] = str(exc)
    return result


def _rank_main(rank: int, port: int, plans: dict, model_dir: str, out_dir: str) -> None:
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.workers.cluster.device import join_process_group, set_rendezvous_env

    set_rendezvous_env(rank, WORLD_SIZE, "127.0.0.1", port, "127.0.0.1")
    join_process_group(torch.device("cpu"), rank, WORLD_SIZE)
    actor_module.join_process_group = lambda *args: None  # one group serves every variant's workers
    batch = _batch()
    half = slice(rank * SEQUENCES // WORLD_SIZE, (rank + 1) * SEQUENCES // WORLD_SIZE)
    results = {}
    for index, (name, plan) in enumerate(plans.items()):
        results[name] = {"actor": _run_actor(plan, model_dir, rank, half, batch, f"{out_dir}/step-{index}"),
                         "critic": _run_critic(plan, model_dir, rank, half, batch)}
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _spawn(names: list[str], model_dir: Path, out: Path) -> dict:
    from ranks import spawn_ranks

    from engine.workers.cluster.failure import free_port

    plans = {name: _plan(VARIANTS[name][0]) for name in names}
    spawn_ranks(_rank_main, args=(free_port(), plans, str(model_dir), str(out)), nprocs=WORLD_SIZE)
    return {rank: torch.load(out / f"rank{rank}.pt") for rank in range(WORLD_SIZE)}


@pytest.fixture(scope="module")
def fast_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _spawn(FAST, tiny_model_dir, tmp_path_factory.mktemp("offload_fast"))


@pytest.fixture(scope="module")
def slow_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _spawn(SLOW, tiny_model_dir, tmp_path_factory.mktemp("offload_slow"))


def _runs(request: pytest.FixtureRequest, variant: str) -> dict:
    return request.getfixturevalue("fast_runs" if variant in FAST else "slow_runs")


def _cases(names: list[str]) -> list:
    return [pytest.param(name, id=name, marks=[] if name in FAST else [pytest.mark.slow]) for name in names]


COMPARED = _cases([name for name, (_, reference) in VARIANTS.items() if name != reference])


def assert_identical(actual, expected, what: str) -> None:
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), what
        for key in expected:
            assert_identical(actual[key], expected[key], f"{what}[{key}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), what
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_identical(a, e, f"{what}[{i}]")
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=what)
    else:
        assert actual == expected, what


@pytest.mark.parametrize("variant", COMPARED)
def test_actor_log_probs_gradients_and_updated_weights_match_the_run_without_the_knob(request, variant):
    reference = VARIANTS[variant][1]
    for rank, result in _runs(request, variant).items():
        actual, expected = result[variant]["actor"], result[reference]["actor"]
        for key in ("log_probs", "entropy", "ref_log_probs", "grads", "metrics", "weights", "synced"):
            assert_identical(actual[key], expected[key], f"rank {rank} actor {key}")


@pytest.mark.parametrize("variant", COMPARED)
def test_critic_values_gradients_and_updated_weights_match_the_run_without_the_knob(request, variant):
    reference = VARIANTS[variant][1]
    for rank, result in _runs(request, variant).items():
        actual, expected = result[variant]["critic"], result[reference]["critic"]
        for key in ("values", "grads", "metrics", "weights"):
            assert_identical(actual[key], expected[key], f"rank {rank} critic {key}")


def test_the_comparison_is_not_vacuous_the_updates_moved_the_weights_and_used_both_steps(fast_runs):
    result = fast_runs[0]["off"]["actor"]
    assert len(result["grads"]) == len(fast_runs[0]["off"]["critic"]["grads"]) == 2  # the update's two steps
    assert any(float(g.abs().max()) > 0 for g in result["grads"][0].values())
    assert result["metrics"]["actor/kl_loss"] != 0.0  # the reference log-probs count
    after_second, _ = result["second_update_again"]
    assert any(not torch.equal(after_second[k], result["weights"][k]) for k in after_second)


@pytest.mark.parametrize("variant", _cases(list(VARIANTS)))
def test_weight_sync_gathers_the_full_bf16_weights_whatever_the_shards_offload(request, variant):
    result = _runs(request, variant)[0][variant]["actor"]
    for name, tensor in result["synced"].items():
        assert tensor.dtype == torch.bfloat16 and tensor.shape == result["weights"][name].shape, name
        torch.testing.assert_close(tensor, result["weights"][name].to(torch.bfloat16), rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("variant", _cases(list(VARIANTS)))
def test_a_checkpoint_round_trip_restores_weights_and_moments_under_offload(request, variant):
    for rank, result in _runs(request, variant).items():
        actor = result[variant]["actor"]
        assert_identical(actor["reloaded"], actor["weights"], f"rank {rank} reloaded weights")
        after_second, second_again = actor["second_update_again"]
        assert_identical(second_again, after_second, f"rank {rank} the second update after the reload")


@pytest.mark.parametrize("variant", _cases(list(VARIANTS)))
def test_the_end_of_run_export_follows_the_released_optimizer_and_moves_no_moment(request, variant):
    from safetensors.torch import load_file

    for rank, result in _runs(request, variant).items():
        end = result[variant]["actor"]["end"]
        assert end["optimizer_states"] == 0 and not end["moments_moved"], f"rank {rank}"
        assert "released at the end of training" in end.get("update_after_release", ""), f"rank {rank}"
        assert "after release_optimizer" in end.get("save_after_release", ""), f"rank {rank}"
        critic = result[variant]["critic"]
        assert critic["optimizer_states_after_release"] == 0, f"rank {rank}"
        assert "released at the end of training" in critic.get("update_after_release", ""), f"rank {rank}"
    end = _runs(request, variant)[0][variant]["actor"]["end"]
    exported = load_file(Path(end["export_dir"]) / "model.safetensors")
    assert exported and set(exported) <= set(end["weights"])
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, end["weights"][name], rtol=0, atol=0, msg=name)


def _offload_of(runs: dict, name: str) -> tuple[dict, dict]:
    return runs[0][name]["actor"]["offload"], runs[0][name]["critic"]["offload"]


def test_each_fast_variant_set_up_the_offload_it_names(fast_runs):
    for side in _offload_of(fast_runs, "param+optimizer+ref offload"):
        assert side["params"] and side["optimizer_states"] and not side["offload_policy"]
    assert fast_runs[0]["param+optimizer+ref offload"]["actor"]["ref_offload"]
    for side in _offload_of(fast_runs, "offload_policy+activation offload"):
        # CPUOffloadPolicy supersedes the manual knobs; FSDP2 holds every shard "on the host".
        assert side["offload_policy"] and not side["params"] and not side["optimizer_states"]
    for side in _offload_of(fast_runs, "off"):
        assert not (side["offload_policy"] or side["params"] or side["optimizer_states"])
    assert not fast_runs[0]["off"]["actor"]["ref_offload"]
    for name in FAST:
        # Every training micro step of the actor ran inside activation offload when the plan asks for it.
        flags = fast_runs[0][name]["actor"]["activation_offload"]
        assert flags and set(flags) == {"activation offload" in name}, name
        assert all(side["moments"] == ["cpu"] for side in _offload_of(fast_runs, name)), name  # the optimizer stepped


@pytest.mark.slow
def test_each_single_knob_variant_set_up_only_the_offload_it_names(slow_runs):
    assert _offload_of(slow_runs, "param offload")[0] | {"params": None} == _offload_of(slow_runs, "off")[0] | {
        "params": None}
    for side in _offload_of(slow_runs, "param offload"):
        assert side["params"] and not side["optimizer_states"] and not side["offload_policy"]
    for side in _offload_of(slow_runs, "optimizer offload"):
        assert side["optimizer_states"] and not side["params"] and not side["offload_policy"]
    for side in _offload_of(slow_runs, "offload_policy"):
        assert side["offload_policy"] and not side["params"] and not side["optimizer_states"]
    assert slow_runs[0]["ref param offload"]["actor"]["ref_offload"]
    for name in SLOW:
        flags = slow_runs[0][name]["actor"]["activation_offload"]
        assert flags and set(flags) == {"activation offload" in name}, name


def test_the_reference_kept_in_the_compute_dtype_gives_the_actors_log_probs_before_any_update(fast_runs):
    """Same weights at the start; FSDP casts the actor's fp32 shards to bf16 for compute, the reference's
    shards are bf16 already (engine/workers/roles/actor_rollout_ref.py): the log-probs agree bit for bit."""
    for rank, result in fast_runs.items():
        for name in FAST:
            actor = result[name]["actor"]
            torch.testing.assert_close(actor["ref_log_probs"], actor["log_probs"], rtol=0, atol=0,
                                       msg=f"rank {rank} {name}")


# --- a whole run ---------------------------------------------------------------------------------

RUN = ["trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
       "actor_rollout_ref.actor.use_kl_loss=true", "trainer.total_training_steps=3", "trainer.save_freq=2"]
EVERY_KNOB = [f"{ACTOR}.param_offload=true", f"{ACTOR}.optimizer_offload=true", f"{CRITIC}.offload_policy=true",
              "actor_rollout_ref.ref.fsdp_config.param_offload=true",
              "actor_rollout_ref.model.enable_activation_offload=true", "critic.model.enable_activation_offload=true"]


def _numbers_of_run(history: list[dict]) -> list[dict]:
    """What a step computed, without how long it took or how much memory the process held."""
    return [{k: v for k, v in step.items() if not k.startswith(("timing/", "memory/", "perf/"))} for step in history]


@pytest.mark.slow
def test_a_ppo_run_with_every_offload_knob_logs_the_numbers_of_the_run_without(tmp_path, monkeypatch):
    """In process (one rank a role): rollout with weight pushes from offloaded shards, reference and critic
    passes, updates, a checkpoint at step 2; every loss, reward, KL and gradient norm the same."""
    from launching import compile_preset, train_in_process

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    plain = train_in_process(compile_preset("quickstart_ppo.yaml", RUN), tmp_path / "plain", checkpoints=True)
    offloaded = train_in_process(compile_preset("quickstart_ppo.yaml", RUN + EVERY_KNOB), tmp_path / "offloaded",
                                 checkpoints=True)
    assert len(plain.history) == 3
    assert {"actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"} <= set(
        _numbers_of_run(plain.history)[0])
    assert _numbers_of_run(offloaded.history) == _numbers_of_run(plain.history)
    assert (tmp_path / "offloaded" / "checkpoints" / "global_step_2" / "actor" / ".metadata").is_file()
