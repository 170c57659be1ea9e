"""Every key of verl 0.9.1's trainer config is known to rlconf, and every default is verl's or a
deliberate difference with its reason.

The facts (keys, resolved defaults, which key a default follows) are rlconf/schema/verl_keys.json,
written by tools/verl_keys.py from verl's package; rlconf's side is rlconf/schema/verl_compat.py.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from rlconf.compile import compile_plan
from rlconf.schema import PlanConfig
from rlconf.schema.errors import all_schema_keys
from rlconf.schema.plan import COPIED_DEFAULTS
from rlconf.schema.verl_compat import (
    ALIASES,
    DIFFERENCES,
    FOLLOWS,
    FOLLOWS_DIFFER,
    NOT_RUN_VALUES,
    RLCONF_ONLY,
    UNDECLARED,
    VERL_ONLY,
    _glob,
    verl_facts,
    verl_only,
)
from rlconf.schema.verl_only import schema_tree

REPO = Path(__file__).resolve().parents[2]
FACTS = verl_facts()
VERL = FACTS["keys"]
SCHEMA_KEYS = set(all_schema_keys())


def schema_leaves(tree: dict[str, Any] = None, prefix: str = "") -> list[str]:
    out = []
    for name, sub in (schema_tree() if tree is None else tree).items():
        path = f"{prefix}{name}"
        out += [path] if sub is None else schema_leaves(sub, path + ".")
    return out


def rlconf_default(key: str) -> Any:
    node: Any = PlanConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_the_fact_file_is_verl_0_9_1_and_whole():
    assert FACTS["verl_version"] == "0.9.1"
    assert FACTS["source"] == "verl/trainer/config/_generated_ppo_trainer.yaml"
    assert len(VERL) == 898
    assert VERL["actor_rollout_ref.rollout.tensor_model_parallel_size"] == {"default": 2}
    assert VERL["critic.ppo_mini_batch_size"] == {"default": 256, "follows": ["actor_rollout_ref.actor.ppo_mini_batch_size"]}


@pytest.mark.skipif(not os.environ.get("VERL_WHEEL"), reason="set VERL_WHEEL to verl-0.9.1-py3-none-any.whl "
                    "(and VERL_KEYS_PYTHON to a Python with omegaconf, if this one has none)")
def test_the_fact_file_regenerates_from_verls_package(tmp_path: Path):
    out = tmp_path / "verl_keys.json"
    python = os.environ.get("VERL_KEYS_PYTHON", sys.executable)
    subprocess.run([python, str(REPO / "tools" / "verl_keys.py"), os.environ["VERL_WHEEL"], "--out", str(out)], check=True)
    assert json.loads(out.read_text())["keys"] == VERL


def how_rlconf_knows(key: str) -> str | None:
    """A schema key (honoured), a verl 0.9 spelling of one, or a listed verl-only key (RL108/RL109)."""
    if key in SCHEMA_KEYS:
        return "schema"
    if key in ALIASES:
        return "alias" if ALIASES[key] in SCHEMA_KEYS else None
    return "verl-only" if verl_only(key) is not None else None


def test_every_verl_key_is_known():
    keys = [*VERL, *FACTS["removed"], *UNDECLARED]
    unknown = [key for key in keys if how_rlconf_knows(key) is None]
    assert not unknown, f"add these to VERL_ONLY (rlconf/schema/verl_compat.py) or the schema: {unknown}"


def _equal(a: Any, b: Any) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def default_problem(key: str) -> str | None:
    verl = VERL[key]
    mine = rlconf_default(key)
    if "follows" in verl and key not in FOLLOWS_DIFFER and key not in DIFFERENCES:
        # verl's `${...}`: null here, resolved to the key it follows (or copied from it, COPIED_DEFAULTS).
        if FOLLOWS.get(key) != verl["follows"][0]:
            return f"{key} follows {verl['follows']} in verl; add it to FOLLOWS or FOLLOWS_DIFFER"
        if mine is not None and key not in COPIED_DEFAULTS:
            return f"{key} must be null in the schema to follow {verl['follows'][0]}"
        return None
    if key in DIFFERENCES:
        return None if not _equal(mine, verl["default"]) or "follows" in verl else f"{key} is listed as different but is verl's"
    return None if _equal(mine, verl["default"]) else f"{key}: rlconf {mine!r}, verl {verl['default']!r}; match it or list it in DIFFERENCES"


def test_every_default_is_verls_or_a_deliberate_difference():
    checked = [k for k in schema_leaves() if k in VERL]
    assert len(checked) > 150
    problems = [p for p in map(default_problem, checked) if p]
    assert not problems, "\n".join(problems)


def test_difference_and_follow_tables_name_schema_keys_only():
    for table in (DIFFERENCES, FOLLOWS, FOLLOWS_DIFFER):
        assert set(table) <= SCHEMA_KEYS, set(table) - SCHEMA_KEYS
    for key, reason in DIFFERENCES.items():
        assert key in VERL and reason, key


def test_every_schema_key_verl_does_not_have_says_why():
    extra = [k for k in schema_leaves() if k not in VERL]
    unexplained = [k for k in extra if not any(k == p or k.startswith(p + ".") for p in RLCONF_ONLY)]
    assert not unexplained, f"schema keys verl 0.9.1 has not: add them to RLCONF_ONLY: {unexplained}"
    for prefix in RLCONF_ONLY:
        assert any(k == prefix or k.startswith(prefix + ".") for k in extra), f"RLCONF_ONLY {prefix} is stale"


def test_every_verl_only_glob_matches_a_verl_key():
    keys = [*VERL, *FACTS["removed"], *UNDECLARED]
    dead = [pattern for pattern, _, _ in VERL_ONLY if not any(_glob(pattern).match(k + ".") for k in keys)]
    assert not dead, dead


def test_not_run_values_are_values_the_schema_accepts():
    for key, values in NOT_RUN_VALUES.items():
        parent, _, leaf = key.rpartition(".")
        node: Any = PlanConfig()
        for part in parent.split("."):
            node = getattr(node, part)
        annotation = type(node).model_fields[leaf].annotation
        if key == "trainer.logger":  # a list of names
            annotation = get_args(annotation)[0]
        allowed = {True, False} if annotation is bool else set(get_args(annotation))
        assert set(values) <= allowed, (key, set(values) - allowed)
        default = rlconf_default(key)
        assert not set(default if isinstance(default, list) else [default]) & set(values)


def test_the_engine_runs_exactly_the_estimators_the_table_does_not_refuse():
    from rlconf.schema.sections import AdvEstimator

    runnable = set(get_args(AdvEstimator)) - set(NOT_RUN_VALUES["algorithm.adv_estimator"])
    capabilities = (REPO / "engine" / "capabilities.py").read_text()
    # engine/capabilities.py is read as text: the compiler's tests do not import the engine (torch).
    table = capabilities[capabilities.index("ADVANTAGE_ESTIMATORS = "):].split(" = ", 1)[1]
    engine_runs = ast.literal_eval(table[:table.index("}") + 1])
    assert runnable == engine_runs == {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                       "opo", "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized", "remax",
                                       "optimal_token_baseline", "tir_optimal_token_baseline"}


def test_verls_whole_default_config_validates_without_a_word(tmp_path: Path):
    """Every one of verl's 898 keys written at verl's default, plus the values verl makes a plan set
    (a rollout backend, micro batch sizes): rlconf accepts it silently and resolves tp 2 replicas.
    Its one word is about the memory estimate: verl's default model (~/models/deepseek-llm-7b-chat)
    is not on this machine nor in rlconf's shape table, so the estimate leaves out activations (RL610)."""
    plan: dict[str, Any] = {}
    for key, entry in VERL.items():
        *parents, leaf = key.split(".")
        node = plan
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = entry["default"]
    arr = plan["actor_rollout_ref"]
    arr["rollout"]["name"] = "vllm"
    arr["actor"]["ppo_micro_batch_size_per_gpu"] = 8
    arr["rollout"]["log_prob_micro_batch_size_per_gpu"] = 16
    plan["critic"]["ppo_micro_batch_size_per_gpu"] = 8
    path = tmp_path / "verl.yaml"
    path.write_text(json.dumps(plan))
    result = compile_plan(path)
    assert [d.code for d in result.diagnostics] == ["RL610"]
    assert result.resolved.roles.rollout.replicas == 4


def off_default(value: Any) -> Any:
    return {bool: lambda d: not d, int: lambda d: d + 1, float: lambda d: d + 0.5, str: lambda d: d + "x",
            list: lambda d: [*d, "x"], dict: lambda d: {**d, "x": 1}, type(None): lambda d: "x"}[type(value)](value)


def test_every_verl_only_key_off_its_default_is_rl108_or_rl109_naming_what_rlconf_does(tmp_path: Path):
    """All of verl's keys the schema does not hold, each set off verl's default in one plan: each gets
    exactly one diagnostic, an error (RL108) or a warning (RL109), that names the feature and why."""
    verl_only_keys = [k for k in VERL if k not in SCHEMA_KEYS and k not in ALIASES]
    plan: dict[str, Any] = {}
    for key in verl_only_keys:
        *parents, leaf = key.split(".")
        node = plan
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = off_default(VERL[key]["default"])
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps(plan))  # some keys (nsys options) are not identifiers: a file, not an override
    result = compile_plan(path, resolve=False)
    by_key = {d.key: d for d in result.diagnostics if d.code in ("RL108", "RL109")}
    assert sorted(by_key) == sorted(verl_only_keys)
    for key in verl_only_keys:
        _, not_run = verl_only(key)
        diag = by_key[key]
        assert diag.code == ("RL108" if not_run.refused else "RL109"), key
        assert "verl has this" in diag.message and not_run.feature in diag.message and not_run.why in diag.message


def test_verl_compat_doc_lists_every_verl_key():
    text = (REPO / "docs" / "verl-compat.md").read_text()
    missing = [k for k in [*VERL, *FACTS["removed"], *UNDECLARED] if f"| `{k}` |" not in text]
    assert not missing, missing[:10]


def test_verl_09_spellings_are_read_into_the_schema_keys_and_a_typo_among_them_is_unknown(tmp_path: Path):
    path = tmp_path / "plan.yaml"
    path.write_text("{}\n")
    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"]
    result = compile_plan(path, [*base, "critic.fsdp.param_offload=true", "actor_rollout_ref.actor.optim.clip_grad=0.5",
                                 "reward.custom_reward_function.path=my_reward.py"], resolve=False)
    assert result.errors == []
    assert result.config.critic.model.fsdp_config.param_offload is True
    assert result.config.actor_rollout_ref.actor.grad_clip == 0.5
    assert result.config.custom_reward_function.path == "my_reward.py"
    typo = compile_plan(path, [*base, "critic.fsdp.param_ofload=true"], resolve=False)
    assert [(d.code, d.help) for d in typo.errors] == [("RL101", "did you mean `critic.fsdp.param_offload`?")]
