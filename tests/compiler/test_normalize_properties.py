"""Property tests for rlconf's normalization: generated plans, compiled end to end.

For every generated plan that compiles without errors, the per-GPU numbers must multiply back to
the global ones (the arithmetic of verl/workers/fsdp_workers.py L240-262 and L1231-1252, run in
reverse). Any plan at all, nonsense numbers included, must compile to diagnostics, never raise.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from unittest import mock
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st

from rlconf.compile import CompileResult, compile_plan
from rlconf.loader import RawPlan
from rlconf.sources import SourceMap
from rlconf.resolved import ResolvedPlan

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
_WORKDIR = tempfile.TemporaryDirectory(prefix="rlconf-props-")


def compile_dict(plan: dict[str, Any], via_yaml: bool = False) -> CompileResult:
    """Compile `plan` with rlconf.compile.compile_plan. YAML parsing (ruamel, pure Python) is most of
    a compile's time and is not what these properties test, so by default the loader is handed the
    dict directly (a copy, as load_plan would build a fresh one); `via_yaml` goes through a file."""
    path = Path(_WORKDIR.name) / "plan.yaml"
    if via_yaml:
        path.write_text(json.dumps(plan))  # JSON is YAML
        return compile_plan(path)
    raw = RawPlan(copy.deepcopy(plan), SourceMap(), [str(path)])
    with mock.patch("rlconf.compile.load_plan", lambda _path, _overrides: raw):
        return compile_plan(path)


# A model rlconf knows no shape of: the properties are about batch arithmetic, and a known shape would
# add head and position checks (RL305, RL510) that reject many of the drawn sp and tp sizes.
MODEL = "org/model-0.5B"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def plans(draw) -> dict[str, Any]:
    """Plans that are often valid: sizes are mostly drawn to divide evenly, sometimes not."""
    nnodes = draw(st.integers(1, 4))
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    world = nnodes * per_node
    n = draw(st.integers(1, 16))
    adv = draw(st.sampled_from(["grpo", "rloo", "gae", "reinforce_plus_plus"]))
    use_critic = adv == "gae"
    use_kl_loss = draw(st.booleans())

    # placement: sometimes a policy pool and (for gae) a value pool
    split = draw(st.booleans()) and world >= 2
    policy_gpus, value_gpus, placement = world, world, None
    if split:
        if nnodes >= 2:
            a = draw(st.integers(1, nnodes - 1))
            pools = {"policy": {"nnodes": a, "n_gpus_per_node": per_node},
                     "value": {"nnodes": nnodes - a, "n_gpus_per_node": per_node}}
            policy_gpus, value_gpus = a * per_node, (nnodes - a) * per_node
        else:
            half = per_node // 2
            pools = {"policy": {"nnodes": 1, "n_gpus_per_node": half}, "value": {"nnodes": 1, "n_gpus_per_node": half}}
            policy_gpus = value_gpus = half
        roles = {"actor": "policy", "rollout": "policy"}
        if use_kl_loss:
            roles["ref"] = "policy"
        if use_critic:
            roles["critic"] = "value"
        else:
            del pools["value"]
        placement = {"pools": pools, "roles": roles}

    def mostly(valid: st.SearchStrategy, wild: st.SearchStrategy):
        """The valid choice 9 times in 10, so that most plans compile and the invariants get checked."""
        return draw(wild if draw(st.integers(0, 9)) == 0 else valid)

    pool_per_node = per_node if not split or nnodes >= 2 else per_node // 2
    sp = mostly(st.sampled_from(divisors(policy_gpus)), st.integers(1, 8))
    tp = mostly(st.sampled_from(divisors(pool_per_node)), st.integers(1, 8))
    dp = max(policy_gpus // sp, 1)

    # smallest train_batch_size step with train × n divisible by every pool (verl's chunking)
    gpus = math.lcm(world, policy_gpus, value_gpus)
    step = gpus // math.gcd(gpus, n)
    train = mostly(st.builds(lambda k, m: step * k * m, st.integers(1, 8), st.sampled_from([1, 2, 4])), st.integers(1, 512))
    # mini × n must split over dp: mini a multiple of dp / gcd(dp, n), dividing train when possible
    mini_step = dp // math.gcd(dp, n)
    good_minis = [d for d in divisors(train) if d % mini_step == 0] or [mini_step]
    mini = mostly(st.sampled_from(good_minis), st.integers(1, 2 * train))
    mini_gpu = mini * n // dp if (mini * n) % dp == 0 else 0
    micro = draw(st.sampled_from(divisors(mini_gpu)) if mini_gpu else st.integers(1, 16))
    dynamic = draw(st.booleans())

    actor: dict[str, Any] = {"ppo_mini_batch_size": mini, "ulysses_sequence_parallel_size": sp,
                             "ppo_epochs": draw(st.integers(1, 3)), "use_kl_loss": use_kl_loss}
    rollout: dict[str, Any] = {"n": n, "tensor_model_parallel_size": tp}
    ref: dict[str, Any] = {}
    deprecated = draw(st.booleans())
    if dynamic:
        actor["use_dynamic_bsz"] = True
        actor["ppo_max_token_len_per_gpu"] = draw(st.sampled_from([256, 1024, 2048, 8192]))
    elif deprecated:
        actor["ppo_micro_batch_size"] = micro * dp if draw(st.booleans()) else draw(st.integers(1, 64))
        rollout["log_prob_micro_batch_size"] = 2 * micro * dp
        ref["log_prob_micro_batch_size"] = 2 * micro * dp
    else:
        actor["ppo_micro_batch_size_per_gpu"] = micro
        rollout["log_prob_micro_batch_size_per_gpu"] = draw(st.integers(1, 32))
        ref["log_prob_micro_batch_size_per_gpu"] = draw(st.integers(1, 32))

    plan: dict[str, Any] = {
        "data": {"train_batch_size": train, "max_prompt_length": 256, "max_response_length": 768},
        "actor_rollout_ref": {"model": {"path": MODEL, "use_remove_padding": draw(st.booleans()) or sp > 1},
                              "actor": actor, "rollout": rollout, "ref": ref},
        "algorithm": {"adv_estimator": adv},
        "trainer": {"nnodes": nnodes, "n_gpus_per_node": per_node},
    }
    if use_critic:
        c_sp = draw(st.sampled_from(divisors(value_gpus)))
        c_dp = value_gpus // c_sp
        critic: dict[str, Any] = {"ulysses_sequence_parallel_size": c_sp, "model": {"use_remove_padding": True}}
        c_mini = mini
        if draw(st.booleans()):
            c_step = c_dp // math.gcd(c_dp, n)
            c_mini = critic["ppo_mini_batch_size"] = draw(st.sampled_from(
                [d for d in divisors(train) if d % c_step == 0] or [c_step]))
        if draw(st.booleans()):
            critic["ppo_epochs"] = draw(st.integers(1, 3))
        c_mini_gpu = c_mini * n // c_dp if (c_mini * n) % c_dp == 0 else 0
        c_micro = draw(st.sampled_from(divisors(c_mini_gpu)) if c_mini_gpu else st.integers(1, 16))
        if dynamic:
            critic["ppo_max_token_len_per_gpu"] = draw(st.sampled_from([1024, 4096, 32768]))
        elif deprecated:
            critic["ppo_micro_batch_size"] = c_micro * c_dp
        else:
            critic["ppo_micro_batch_size_per_gpu"] = c_micro
            if draw(st.booleans()):
                critic["forward_micro_batch_size_per_gpu"] = draw(st.integers(1, 64))
        plan["critic"] = critic
    if placement is not None:
        plan["placement"] = placement
    return plan


def _pool_gpus(r: ResolvedPlan, role: str) -> int:
    return r.placement.pools[r.placement.roles[role]].gpus


def _check_train_role(role, train: int, n: int, pool_gpus: int) -> None:
    assert role.world_size == pool_gpus
    assert role.dp_size * role.sp_size == role.world_size
    assert role.ppo_mini_batch_size_per_gpu * role.dp_size == role.ppo_mini_batch_size * n
    assert role.sequences_per_gpu * role.dp_size == train * n
    assert role.ppo_mini_batch_size_per_gpu > 0
    if role.use_dynamic_bsz:
        assert role.ppo_micro_batch_size_per_gpu is None and role.grad_accum_steps is None
    else:
        assert role.ppo_micro_batch_size_per_gpu * role.grad_accum_steps == role.ppo_mini_batch_size_per_gpu
    assert role.tokens_per_micro_batch == role.max_token_len_per_gpu * role.sp_size
    if train % role.ppo_mini_batch_size == 0:
        assert role.optimizer_steps_per_train_step == role.ppo_epochs * (train // role.ppo_mini_batch_size)


def _check_forward_role(role, sequences: int, pool_gpus: int, seq_len: int) -> None:
    assert role.world_size == pool_gpus
    assert role.dp_size * role.sp_size == role.world_size
    assert role.sequences_per_gpu * role.dp_size == sequences
    if role.use_dynamic_bsz:
        assert role.micro_batch_size_per_gpu is None
        assert role.max_token_len_per_gpu * role.sp_size >= seq_len  # seqlen_balancing.py L382-384
    else:
        micro, count = role.micro_batch_size_per_gpu, role.micro_batches_per_gpu
        assert micro > 0
        assert count * micro >= role.sequences_per_gpu
        assert (count - 1) * micro < role.sequences_per_gpu or role.sequences_per_gpu == 0


@SETTINGS
@given(plans())
def test_valid_plans_multiply_back_to_global_sizes(plan: dict[str, Any]):
    result = compile_dict(plan)
    assume(not result.errors)
    r = result.resolved
    assert r is not None
    train = plan["data"]["train_batch_size"]
    n = plan["actor_rollout_ref"]["rollout"]["n"]
    sequences = train * n
    seq_len = r.roles.rollout.prompt_length + r.roles.rollout.response_length

    _check_train_role(r.roles.actor, train, n, _pool_gpus(r, "actor"))

    rollout = r.roles.rollout
    assert rollout.replicas * rollout.tensor_parallel_size == _pool_gpus(r, "rollout")
    assert rollout.sequences_per_replica * rollout.replicas == sequences
    assert rollout.sequences_per_step == sequences
    _check_forward_role(rollout.log_prob, sequences, _pool_gpus(r, "actor"), seq_len)
    if r.roles.ref is not None:
        _check_forward_role(r.roles.ref, sequences, _pool_gpus(r, "ref"), seq_len)

    if plan["algorithm"]["adv_estimator"] == "gae":
        assert r.roles.critic is not None and r.roles.critic_values is not None
        _check_train_role(r.roles.critic, train, n, _pool_gpus(r, "critic"))
        _check_forward_role(r.roles.critic_values, sequences, _pool_gpus(r, "critic"), seq_len)
    else:
        assert r.roles.critic is None and r.roles.critic_values is None

    # The resolved plan is the compiler/engine contract: it must survive JSON unchanged.
    assert ResolvedPlan.model_validate_json(r.model_dump_json()) == r


SHORT_LAST_MINI_BATCH = {  # 96 prompts in mini batches of 64: verl does 2 optimizer steps (64 + 32)
    "data": {"train_batch_size": 96},
    "actor_rollout_ref": {"model": {"path": MODEL, "use_remove_padding": True},
                          "actor": {"ppo_mini_batch_size": 64, "ppo_micro_batch_size_per_gpu": 4},
                          "rollout": {"n": 1, "log_prob_micro_batch_size_per_gpu": 8}},
    "algorithm": {"adv_estimator": "reinforce_plus_plus"},
    "trainer": {"nnodes": 1, "n_gpus_per_node": 8},
}


# No shrinking: the explicit example already is minimal, and shrinking through assume() is slow.
@settings(SETTINGS, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(plans())
@example(SHORT_LAST_MINI_BATCH)
def test_optimizer_steps_count_the_short_last_mini_batch(plan: dict[str, Any]):
    """verl dp_actor.py L541-560: `data.split(ppo_mini_batch_size)` keeps a short last mini batch, so a
    step makes ppo_epochs × ⌈train_batch_size ÷ ppo_mini_batch_size⌉ optimizer steps (rlconf RL207 warns
    about the short batch; the count must still include it)."""
    result = compile_dict(plan)
    assume(not result.errors)
    train = plan["data"]["train_batch_size"]
    roles = [result.resolved.roles.actor] + ([result.resolved.roles.critic] if result.resolved.roles.critic else [])
    for role in roles:
        assert role.optimizer_steps_per_train_step == role.ppo_epochs * math.ceil(train / role.ppo_mini_batch_size)


# --- anything at all: diagnostics, never an exception -------------------------------------------

SIZE = st.none() | st.integers(-4, 64) | st.sampled_from([2**31 - 1, 2**31, 10**12])
MAYBE_BOOL = st.none() | st.booleans()


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (_drop_none(v) if isinstance(v, dict) else v) for k, v in d.items() if v is not None}


@st.composite
def wild_plans(draw) -> dict[str, Any]:
    plan = {
        "data": {"train_batch_size": draw(SIZE), "max_prompt_length": draw(SIZE), "max_response_length": draw(SIZE)},
        "actor_rollout_ref": {
            "model": {"use_remove_padding": draw(MAYBE_BOOL)},
            "actor": {"ppo_mini_batch_size": draw(SIZE), "ppo_micro_batch_size": draw(SIZE),
                      "ppo_micro_batch_size_per_gpu": draw(SIZE), "use_dynamic_bsz": draw(MAYBE_BOOL),
                      "ppo_max_token_len_per_gpu": draw(SIZE), "ulysses_sequence_parallel_size": draw(SIZE),
                      "ppo_epochs": draw(SIZE), "use_kl_loss": draw(MAYBE_BOOL)},
            "rollout": {"n": draw(SIZE), "tensor_model_parallel_size": draw(SIZE),
                        "log_prob_micro_batch_size": draw(SIZE), "log_prob_micro_batch_size_per_gpu": draw(SIZE),
                        "log_prob_max_token_len_per_gpu": draw(SIZE), "prompt_length": draw(SIZE),
                        "response_length": draw(SIZE), "max_model_len": draw(SIZE),
                        "max_num_batched_tokens": draw(SIZE), "log_prob_use_dynamic_bsz": draw(MAYBE_BOOL)},
            "ref": {"log_prob_micro_batch_size": draw(SIZE), "log_prob_micro_batch_size_per_gpu": draw(SIZE),
                    "ulysses_sequence_parallel_size": draw(SIZE), "log_prob_max_token_len_per_gpu": draw(SIZE)},
        },
        "critic": {"ppo_mini_batch_size": draw(SIZE), "ppo_micro_batch_size": draw(SIZE),
                   "ppo_micro_batch_size_per_gpu": draw(SIZE), "forward_micro_batch_size": draw(SIZE),
                   "forward_micro_batch_size_per_gpu": draw(SIZE), "ulysses_sequence_parallel_size": draw(SIZE),
                   "ppo_epochs": draw(SIZE), "use_dynamic_bsz": draw(MAYBE_BOOL),
                   "ppo_max_token_len_per_gpu": draw(SIZE), "forward_max_token_len_per_gpu": draw(SIZE)},
        "reward_model": {"enable": draw(MAYBE_BOOL), "micro_batch_size": draw(SIZE),
                         "micro_batch_size_per_gpu": draw(SIZE), "ulysses_sequence_parallel_size": draw(SIZE)},
        "algorithm": {"adv_estimator": draw(st.none() | st.sampled_from(["gae", "grpo", "rloo", "reinforce_plus_plus"])),
                      "use_kl_in_reward": draw(MAYBE_BOOL)},
        "trainer": {"nnodes": draw(SIZE), "n_gpus_per_node": draw(SIZE)},
    }
    if draw(st.booleans()):
        plan["placement"] = {
            "pools": {"a": {"nnodes": draw(SIZE), "n_gpus_per_node": draw(SIZE)},
                      "b": {"nnodes": draw(SIZE), "n_gpus_per_node": draw(SIZE)}},
            "roles": draw(st.dictionaries(st.sampled_from(["actor", "rollout", "ref", "critic", "reward_model"]),
                                          st.sampled_from(["a", "b", "missing"]))),
        }
    return _drop_none(plan)


@SETTINGS
@given(wild_plans(), st.integers(0, 4))
def test_compile_never_raises(plan: dict[str, Any], through_file: int):
    result = compile_dict(plan, via_yaml=through_file == 0)  # any exception fails the test
    codes = [d.code for d in result.diagnostics]
    assert all(code.startswith("RL") for code in codes)
    if result.errors:
        assert result.resolved is None and result.exit_code() == 1
    else:
        assert result.resolved is not None and result.exit_code() == 0
        assert ResolvedPlan.model_validate_json(result.resolved.model_dump_json()) == result.resolved


def test_generated_plans_are_often_valid():
    """Guard against a generator that only makes invalid plans (the invariants would then be vacuous)."""
    valid = 0
    examples: list[dict[str, Any]] = []

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(plans())
    def collect(plan):
        examples.append(plan)

    collect()
    for plan in examples:
        valid += not compile_dict(plan).errors
    assert valid >= len(examples) // 5, f"only {valid} of {len(examples)} generated plans were valid"
