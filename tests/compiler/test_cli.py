"""Behaviour of the `rlconf` command line: validate, explain, presets, overrides, base inheritance
and how diagnostics are rendered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from rlconf.cli import app

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "presets").glob("*.yaml"))

# A small valid GRPO plan on 4 GPUs: mini batch per GPU = 8 × n 2 ÷ 4 = 4, micro 2 -> 2 accum steps.
VALID = """\
data:
  train_batch_size: 16
  max_prompt_length: 64
  max_response_length: 64
actor_rollout_ref:
  model:
    path: org/model-1B
  actor:
    ppo_mini_batch_size: 8
    ppo_micro_batch_size_per_gpu: 2
  rollout:
    n: 2
    log_prob_micro_batch_size_per_gpu: 4
algorithm:
  adv_estimator: grpo
trainer:
  nnodes: 1
  n_gpus_per_node: 4
"""

runner = CliRunner()


def run(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"exception escaped: {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output, result.output
    return result


def run_json(*args: str) -> tuple[int, dict]:
    result = run(*args, "--format", "json")
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def plan(tmp_path: Path):
    """Write a plan file (default: the valid plan) and return its path."""

    def write(text: str = VALID, name: str = "plan.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def codes(payload: dict) -> list[str]:
    return [d["code"] for d in payload["diagnostics"]]


# --- validate ------------------------------------------------------------------------------


def test_the_small_valid_plan_validates_clean(plan) -> None:
    code, payload = run_json("validate", plan())
    assert code == 0
    assert payload["valid"] is True and payload["exit_code"] == 0
    assert payload["diagnostics"] == []


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_bundled_preset_validates_without_errors(preset: Path) -> None:
    code, payload = run_json("validate", preset)
    errors = [d for d in payload["diagnostics"] if d["severity"] == "error"]
    assert code == 0, errors
    assert errors == []
    assert payload["valid"] is True


def test_presets_folder_is_not_empty() -> None:
    assert len(PRESETS) >= 1
    assert (REPO / "presets" / "quickstart.yaml") in PRESETS


DEPRECATED = VALID.replace("    log_prob_micro_batch_size_per_gpu: 4", "    log_prob_micro_batch_size: 8")


def test_deprecated_key_is_only_a_warning_without_strict(plan) -> None:
    path = plan(DEPRECATED)
    result = run("validate", path)
    assert result.exit_code == 0, result.output
    assert "warning[RL106]" in result.output
    assert "error[" not in result.output
    code, payload = run_json("validate", path)
    assert code == 0 and payload["valid"] is True
    assert codes(payload) == ["RL106"]
    assert payload["diagnostics"][0]["severity"] == "warning"


def test_strict_turns_a_warning_into_exit_1(plan) -> None:
    path = plan(DEPRECATED)
    result = run("validate", path, "--strict")
    assert result.exit_code == 1, result.output
    assert "warning[RL106]" in result.output
    code, payload = run_json("validate", path, "--strict")
    assert code == 1
    assert payload["valid"] is False and payload["exit_code"] == 1


def test_strict_keeps_a_clean_plan_at_exit_0(plan) -> None:
    assert run("validate", plan(), "--strict").exit_code == 0


# --- overrides -----------------------------------------------------------------------------


def test_override_is_parsed_to_the_schema_type(plan) -> None:
    code, resolved = run_json("explain", plan(), "actor_rollout_ref.rollout.n=8")
    assert code == 0
    n = resolved["roles"]["rollout"]["n"]
    assert n == 8 and isinstance(n, int) and not isinstance(n, bool)
    assert resolved["config"]["actor_rollout_ref"]["rollout"]["n"] == 8
    # 16 prompts × 8 samples, and the source records the override.
    assert resolved["roles"]["rollout"]["sequences_per_step"] == 128
    assert "actor_rollout_ref.rollout.n=8" in resolved["source"]["overrides"]


def test_overrides_parse_floats_and_lists(plan) -> None:
    code, resolved = run_json("explain", plan(), "actor_rollout_ref.actor.optim.lr=3e-6",
                              "trainer.logger=[console,tensorboard]")
    assert code == 0
    assert resolved["config"]["actor_rollout_ref"]["actor"]["optim"]["lr"] == pytest.approx(3e-6)
    assert resolved["config"]["trainer"]["logger"] == ["console", "tensorboard"]


def test_override_diagnostic_is_located_at_the_override_text(plan) -> None:
    override = "data.train_batch_size=15"
    result = run("validate", plan(), override)
    assert result.exit_code == 1
    assert "error[RL201]" in result.output
    assert f"override `{override}`" in result.output
    code, payload = run_json("validate", plan(), override)
    rl201 = [d for d in payload["diagnostics"] if d["code"] == "RL201"]
    assert rl201 and rl201[0]["location"] == f"override `{override}`"
    assert rl201[0]["key"] == "data.train_batch_size"


def test_later_override_wins_over_earlier_one(plan) -> None:
    code, resolved = run_json("explain", plan(), "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.n=8")
    assert code == 0
    assert resolved["roles"]["rollout"]["n"] == 8


# --- explain ---------------------------------------------------------------------------------


def test_explain_json_has_the_resolved_contract(plan) -> None:
    code, resolved = run_json("explain", plan())
    assert code == 0
    assert isinstance(resolved["schema_version"], int)
    assert resolved["world"] == {"nnodes": 1, "gpus_per_node": 4, "world_size": 4, "device": "cuda"}
    assert "global" in resolved["placement"]["pools"]
    assert resolved["placement"]["roles"]["actor"] == "global"
    actor = resolved["roles"]["actor"]
    # mini per GPU = 8 × 2 ÷ 4 = 4; micro 2 -> 2 accumulation steps.
    assert actor["ppo_mini_batch_size_per_gpu"] == 4
    assert actor["grad_accum_steps"] == 2
    assert "grad_accum_steps" in actor["formulas"]


def test_explain_text_shows_formulas(plan) -> None:
    result = run("explain", plan())
    assert result.exit_code == 0, result.output
    out = result.output
    assert "× n" in out
    assert "8 × n 2 ÷ (4 GPUs ÷ sp 1) = 4" in out
    assert "gradient accumulation steps" in out


def test_explain_says_what_offloaded_states_hold_of_the_host_and_nothing_without_offload() -> None:
    """rlconf.host_memory: 2 B a parameter for the 7B preset's offloaded bf16 reference; 12 B with the actor's
    parameters and moments offloaded; no line without offload."""
    out = " ".join(run("explain", REPO / "presets" / "grpo_7b_8gpu.yaml").output.split())
    assert "host memory the offloaded states hold 14.2 GiB of the machine while training" in out
    assert "reference parameters (param_offload) 14.2" in out and "full fp32 weights (28.4 GiB)" in out
    both = " ".join(run("explain", REPO / "presets" / "grpo_7b_8gpu.yaml",
                        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true").output.split())
    assert "hold 99.3 GiB of the machine" in both and "actor Adam moments (optimizer_offload) 56.7" in both
    assert "host memory" not in run("explain", REPO / "presets" / "quickstart.yaml").output


def test_explain_of_an_invalid_plan_reports_diagnostics_as_json(plan) -> None:
    path = plan(VALID.replace("ppo_micro_batch_size_per_gpu: 2", "ppo_micro_batch_size_per_gpu: 3"))
    code, payload = run_json("explain", path)
    assert code == 1
    assert payload["valid"] is False
    assert "RL204" in codes(payload)


# --- presets ---------------------------------------------------------------------------------


def test_presets_lists_every_preset_name() -> None:
    result = run("presets")
    assert result.exit_code == 0, result.output
    for preset in PRESETS:
        assert preset.stem in result.output


def test_presets_show_prints_the_preset_yaml() -> None:
    result = run("presets", "show", "quickstart")
    assert result.exit_code == 0, result.output
    shown = YAML(typ="safe").load(result.stdout)
    expected = YAML(typ="safe").load((REPO / "presets" / "quickstart.yaml").read_text())
    assert shown == expected
    assert shown["trainer"]["device"] == "cpu"


def test_presets_show_unknown_name_exits_2() -> None:
    result = run("presets", "show", "no_such_preset")
    assert result.exit_code == 2
    assert "quickstart" in result.output  # names the bundled presets


# --- rendering ---------------------------------------------------------------------------------


def test_caret_points_at_the_offending_value(plan) -> None:
    path = plan(VALID.replace("    ppo_micro_batch_size_per_gpu: 2", "    ppo_micro_batch_size_per_gpu: 0"))
    result = run("validate", path)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert any(line.startswith("error[RL103]") for line in lines), result.output
    assert f"{path.name}:10:35" in result.output  # line 10, the value's column
    source = next(i for i, line in enumerate(lines) if line.startswith("10 | "))
    assert lines[source] == "10 |     ppo_micro_batch_size_per_gpu: 0"
    caret = lines[source + 1]
    assert re.fullmatch(r" +\| +\^", caret), caret
    # The gutters have the same width, so the caret sits right under the `0`.
    assert caret.index("^") == lines[source].index(": 0") + 2
    assert caret.count("^") == 1


def test_caret_underlines_the_whole_unknown_key(plan) -> None:
    path = plan(VALID.replace("  max_prompt_length: 64", "  max_prompt_lenght: 64"))
    lines = run("validate", path).output.splitlines()
    source = next(i for i, line in enumerate(lines) if line.startswith("3 | "))
    caret = lines[source + 1]
    start = lines[source].index("max_prompt_lenght")
    assert caret.index("^") == start
    assert caret.count("^") == len("max_prompt_lenght")


def _plans_to_render() -> list[tuple[Path, list[str]]]:
    """Every preset and every malformed plan of the corpus, with the corpus' overrides."""
    from test_bad_plans import CASES, parse_header

    return [(p, []) for p in PRESETS] + [(p, parse_header(p).overrides) for p in CASES]


RENDER_CASES = _plans_to_render()


@pytest.mark.parametrize("path, overrides", RENDER_CASES, ids=[p.stem for p, _ in RENDER_CASES])
def test_plain_report_is_what_rich_prints_to_a_pipe(path: Path, overrides: list[str]) -> None:
    """`validate` into a pipe writes plain text without importing rich: it must be the text rich prints."""
    import io

    from rich.console import Console

    from rlconf.compile import compile_plan
    from rlconf.render import plain_report, print_diagnostics, summary_text

    result = compile_plan(path, overrides, resolve=False)
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, highlight=False, soft_wrap=True)
    print_diagnostics(console, result.diagnostics, result.sources)
    console.print(summary_text(str(path), result.diagnostics))
    report = plain_report(str(path), result.diagnostics, result.sources)
    assert report is None or report == buffer.getvalue()


def test_plain_report_leaves_tabs_and_trailing_whitespace_to_rich(plan) -> None:
    from rlconf.compile import compile_plan
    from rlconf.render import plain_report

    # A tab inside a quoted value: rich expands it in the source line it shows.
    path = plan(VALID.replace("  max_prompt_length: 64", '  max_prompt_length: "6\t4"'))
    result = compile_plan(path, resolve=False)
    assert result.errors and plain_report(str(path), result.diagnostics, result.sources) is None
    # Control characters rich drops are dropped from the plain text too.
    path = plan(VALID.replace("  max_prompt_length: 64", '  max_prompt_length: "6\\r4"'))
    result = compile_plan(path, resolve=False)
    report = plain_report(str(path), result.diagnostics, result.sources)
    assert report is not None and "\r" not in report


def test_validate_into_a_pipe_imports_no_rich_and_a_terminal_still_gets_colour(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    probe = "import sys, runpy; sys.argv = ['rlconf'] + sys.argv[1:]\n" \
            "try:\n    runpy.run_module('rlconf', run_name='__main__')\n" \
            "finally:\n    print('RICH' if 'rich' in sys.modules else 'NO-RICH', file=sys.stderr)\n"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR")}
    for args in (["presets/quickstart.yaml"], ["presets/quickstart.yaml", "actor_rollout_ref.rollout.tensor_model_parallel_size=3"]):
        proc = subprocess.run([sys.executable, "-c", probe, "validate", *args], capture_output=True, text=True,
                              cwd=REPO, env=env, timeout=60)
        assert proc.stderr.strip().endswith("NO-RICH"), proc.stderr
        assert "\x1b[" not in proc.stdout
    # FORCE_COLOR asks rich for escape codes even into a pipe, as before.
    proc = subprocess.run([sys.executable, "-m", "rlconf", "validate", "presets/quickstart.yaml",
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
                          capture_output=True, text=True, cwd=REPO, env={**env, "FORCE_COLOR": "1"}, timeout=60)
    assert proc.returncode == 1 and "\x1b[" in proc.stdout, proc.stdout


# --- base inheritance -----------------------------------------------------------------------


def test_base_plan_is_inherited_and_child_values_win(plan) -> None:
    plan(VALID, name="common.yaml")
    child = plan("base: common.yaml\ndata:\n  train_batch_size: 32\nactor_rollout_ref:\n  rollout:\n    n: 4\n", name="child.yaml")
    code, resolved = run_json("explain", child)
    assert code == 0, resolved
    config = resolved["config"]
    assert config["data"]["train_batch_size"] == 32  # the child's
    assert config["actor_rollout_ref"]["rollout"]["n"] == 4  # the child's
    assert config["data"]["max_prompt_length"] == 64  # the base's
    assert config["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] == 2  # the base's, merged key by key
    assert config["trainer"]["n_gpus_per_node"] == 4
    files = resolved["source"]["files"]
    assert len(files) == 2 and files[0].endswith("child.yaml") and files[1].endswith("common.yaml")


def test_base_can_name_a_bundled_preset(plan) -> None:
    child = plan("base: quickstart\ntrainer:\n  total_training_steps: 3\n")
    code, resolved = run_json("explain", child)
    assert code == 0, resolved
    assert resolved["config"]["trainer"]["total_training_steps"] == 3
    assert resolved["config"]["actor_rollout_ref"]["rollout"]["name"] == "hf"  # from the preset
    assert resolved["world"]["device"] == "cpu"


def test_diagnostic_for_an_inherited_value_points_into_the_base_file(plan) -> None:
    plan(VALID.replace("  train_batch_size: 16", "  train_batch_size: 15"), name="common.yaml")
    child = plan("base: common.yaml\ntrainer:\n  total_epochs: 2\n", name="child.yaml")
    code, payload = run_json("validate", child)
    assert code == 1
    rl201 = next(d for d in payload["diagnostics"] if d["code"] == "RL201")
    assert "common.yaml:2:" in rl201["location"]


# --- unknown keys ---------------------------------------------------------------------------


def test_misspelled_key_suggests_the_right_one(plan) -> None:
    path = plan(VALID.replace("  max_prompt_length: 64", "  max_prompt_lenght: 64"))
    result = run("validate", path)
    assert result.exit_code == 1
    assert "error[RL101]" in result.output
    assert "did you mean `data.max_prompt_length`?" in result.output
    _, payload = run_json("validate", path)
    (diag,) = payload["diagnostics"]
    assert diag["key"] == "data.max_prompt_lenght"
    assert diag["help"] == "did you mean `data.max_prompt_length`?"


def test_misplaced_key_is_unknown_and_points_to_its_real_section(plan) -> None:
    path = plan(VALID.replace("    ppo_micro_batch_size_per_gpu: 2\n", "").replace(
        "    log_prob_micro_batch_size_per_gpu: 4", "    log_prob_micro_batch_size_per_gpu: 4\n    ppo_micro_batch_size_per_gpu: 2"))
    code, payload = run_json("validate", path)
    assert code == 1
    (diag,) = [d for d in payload["diagnostics"] if d["code"] == "RL101"]
    assert diag["key"] == "actor_rollout_ref.rollout.ppo_micro_batch_size_per_gpu"
    suggested = re.fullmatch(r"did you mean `([\w.]+)`\?", diag["help"]).group(1)
    assert suggested == "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    # The suggestion is a real key: moving the line there makes the plan valid.
    fixed = plan(VALID, name="fixed.yaml")
    assert run("validate", fixed).exit_code == 0


# --- DAPO dynamic sampling (algorithm.filter_groups) -------------------------------------------


@pytest.mark.parametrize(("overrides", "expected"), [
    # A group baseline with a metric the engine computes: nothing to say.
    (("algorithm.filter_groups.metric=score",), []),
    # seq_final_reward would include the in-reward KL, which is only known after filtering here.
    (("algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true"), ["RL522"]),
    # GAE does not compare a prompt's responses: a uniform group still carries signal.
    (("algorithm.filter_groups.metric=score", "algorithm.adv_estimator=gae"), ["RL523"]),
    # The default metric `reward` is verl 0.9.1's canonical pre-KL reward, which the engine computes.
    ((), []),
    # `acc` comes from verl's reward extra info, which the engine does not keep.
    (("algorithm.filter_groups.metric=acc",), ["RL522"]),
    # One response per prompt: verl keeps groups of one, so the filter does nothing (a warning).
    (("algorithm.filter_groups.metric=score", "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus"),
     ["RL523"]),
])
def test_filter_groups_checks_metric_and_estimator(plan, overrides, expected) -> None:
    _, payload = run_json("validate", plan(), "algorithm.filter_groups.enable=true", *overrides)
    assert [code for code in codes(payload) if code in ("RL522", "RL523")] == expected


# --- data.gen_batch_size: the generation round of DAPO dynamic sampling ---------------------------
# VALID: train_batch_size 16, n 2, 4 GPUs at the default rollout tp 2 -> 2 replicas.

FILTER = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score")


def only(payload: dict, code: str) -> list[dict]:
    return [d for d in payload["diagnostics"] if d["code"] == code]


def test_gen_batch_size_without_filter_groups_is_refused_with_the_size_verl_would_train(plan) -> None:
    # verl trains on the whole generation batch when nothing filters it: 48 prompts, not 16.
    code, payload = run_json("validate", plan(), "data.gen_batch_size=48")
    assert code == 1
    (diag,) = only(payload, "RL524")
    assert diag["severity"] == "error" and diag["key"] == "data.gen_batch_size"
    assert "train on all 48 generated prompts a step, not on 16" in diag["message"]
    assert "data.train_batch_size: 48" in diag["help"]


def test_gen_batch_size_equal_to_train_batch_size_is_accepted_without_filter_groups(plan) -> None:
    # verl scripts write gen_batch_size = train_batch_size (examples/gspo_trainer): the same run as unset.
    code, payload = run_json("validate", plan(), "data.gen_batch_size=16")
    assert code == 0 and not only(payload, "RL524")


def test_gen_batch_size_with_filter_groups_is_the_generation_round_explain_shows(plan) -> None:
    code, resolved = run_json("explain", plan(), "data.gen_batch_size=48", *FILTER)
    assert code == 0
    rollout = resolved["roles"]["rollout"]
    # 48 prompts × n 2 = 96 sequences a round, ÷ 2 replicas = 48 each; the step still trains 16 × 2 = 32.
    assert (rollout["prompts_per_generation"], rollout["sequences_per_generation"], rollout["sequences_per_replica"],
            rollout["sequences_per_step"]) == (48, 96, 48, 32)
    assert rollout["formulas"]["prompts_per_generation"] == "data.gen_batch_size = 48"
    assert rollout["formulas"]["sequences_per_replica"] == "96 sequences ÷ 2 replicas = 48"
    text = run("explain", plan(), "data.gen_batch_size=48", *FILTER).stdout
    assert re.search(r"prompts per generation round\s+│\s+48 │ data\.gen_batch_size = 48", text), text


def test_unset_gen_batch_size_is_train_batch_size_and_says_so(plan) -> None:
    _, resolved = run_json("explain", plan(), *FILTER)
    rollout = resolved["roles"]["rollout"]
    assert rollout["prompts_per_generation"] == 16
    assert rollout["formulas"]["prompts_per_generation"] == "train_batch_size = 16 (gen_batch_size unset)"


def test_gen_batch_size_below_train_batch_size_warns_of_the_extra_rounds(plan) -> None:
    code, payload = run_json("validate", plan(), "data.gen_batch_size=8", *FILTER)
    assert code == 0
    (diag,) = only(payload, "RL524")
    assert diag["severity"] == "warning"
    assert diag["note"] == "⌈16 ÷ 8⌉ = 2 rounds a step; steps per epoch = prompts ÷ 8"
    assert "3 × train_batch_size = 48" in diag["help"]


def test_gen_batch_size_that_max_num_gen_batches_can_never_fill_is_an_error(plan) -> None:
    # 3 rounds × 4 prompts = 12 groups at most < 16: every step would fail, even if every group is kept.
    code, payload = run_json("validate", plan(), "data.gen_batch_size=4", *FILTER,
                             "algorithm.filter_groups.max_num_gen_batches=3")
    assert code == 1
    (diag,) = only(payload, "RL524")
    assert "hold at most 12 groups" in diag["message"]
    # ⌈16 ÷ 3⌉ = 6 prompts a round fill 16 in 3 rounds; ⌈16 ÷ 4⌉ = 4 rounds fill it with 4 prompts each.
    assert diag["help"] == "raise gen_batch_size to at least 6, or max_num_gen_batches to at least 4"
    # With no limit (0) the same size only warns.
    _, payload = run_json("validate", plan(), "data.gen_batch_size=4", *FILTER)
    assert [d["severity"] for d in only(payload, "RL524")] == ["warning"]


@pytest.mark.parametrize(("gen_batch_size", "expected"), [(17, ["RL208"]), (18, [])])
def test_generation_round_must_split_over_the_rollout_replicas(plan, gen_batch_size, expected) -> None:
    # tp 1 on 4 GPUs: 4 replicas. 17 × 2 = 34 sequences leave 2 over; 18 × 2 = 36 is 9 each.
    _, payload = run_json("validate", plan(), f"data.gen_batch_size={gen_batch_size}", *FILTER,
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    assert [d["code"] for d in payload["diagnostics"] if d["code"] == "RL208"] == expected
    if expected:
        (diag,) = only(payload, "RL208")
        assert diag["note"] == "34 sequences ÷ 4 replicas = 8.5 (not a whole number)"
        assert diag["help"] == "make gen_batch_size a multiple of 2 (e.g. 16 or 18)"
