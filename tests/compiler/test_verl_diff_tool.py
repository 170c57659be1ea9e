"""tools/verl_diff.py against a fake verl side (verl itself is too heavy for CI): a Python script that answers
as tools/verl_side.py does, so the tool's plumbing, key translation and verdicts are tested here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import verl_diff  # noqa: E402

from rlconf.rules.catalog import RULES  # noqa: E402
from rlconf.rules.verl_audit import AUDIT  # noqa: E402

GOOD = """\
data: {train_batch_size: 16, max_prompt_length: 64, max_response_length: 64}
actor_rollout_ref:
  model: {path: org/model-1B, dtype: bfloat16}
  actor: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 2}
  rollout: {n: 4, log_prob_micro_batch_size_per_gpu: 4}
algorithm: {adv_estimator: grpo}
trainer: {nnodes: 1, n_gpus_per_node: 4, seed: 3}
"""

# Accepts every plan with the numbers below, except one whose train_batch_size is 48: verl "refuses" it.
FAKE_VERL = """\
import json, sys
out = []
for plan in json.load(sys.stdin):
    values = plan["values"]
    seen = sorted(values)
    if values.get("data.train_batch_size") == 48:
        out.append({"name": plan["name"], "valid": False, "error": "AssertionError: fake", "numbers": {}, "note": ""})
    else:
        out.append({"name": plan["name"], "valid": True, "error": "", "note": "", "numbers": {
            "actor.ppo_mini_batch_size_per_gpu": values.get("fake.mini_per_gpu", 8),
            "actor.ppo_micro_batch_size_per_gpu": 2}})
    with open(sys.argv[0] + ".seen", "a") as f:
        f.write(json.dumps(seen) + "\\n")
json.dump(out, sys.stdout)
"""


@pytest.fixture
def fake_verl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake_verl_side.py"
    script.write_text(FAKE_VERL)
    monkeypatch.setattr(verl_diff, "REPO", REPO)
    real_run = verl_diff.subprocess.run

    def run(args, **kwargs):  # the verl Python is this one, its script the fake
        if args[1:] == [str(REPO / "tools" / "verl_side.py")]:
            args = [sys.executable, str(script)]
        return real_run(args, **kwargs)

    monkeypatch.setattr(verl_diff.subprocess, "run", run)
    return script


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "plans" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_plans_both_sides_accept_with_the_same_numbers_agree(fake_verl: Path, tmp_path: Path, capsys):
    write(tmp_path, "good.yaml", GOOD)
    assert verl_diff.main([str(tmp_path / "plans"), "--verl-python", sys.executable]) == 0
    assert "1 plans: 1 agree, 0 explained, 0 disagree, 0 not compared" in capsys.readouterr().out
    # verl gets verl 0.9.1's key names, without rlconf's own keys (trainer.seed) and sections
    (seen,) = [json.loads(line) for line in Path(str(fake_verl) + ".seen").read_text().splitlines()]
    assert "actor_rollout_ref.actor.fsdp_config.dtype" in seen and "actor_rollout_ref.model.dtype" not in seen
    assert "trainer.seed" not in seen and "trainer.n_gpus_per_node" in seen


def test_a_verl_refusal_rlconf_accepts_is_a_disagreement(fake_verl: Path, tmp_path: Path, capsys):
    write(tmp_path, "refused_by_verl.yaml", GOOD.replace("train_batch_size: 16", "train_batch_size: 48"))
    assert verl_diff.main([str(tmp_path / "plans"), "--verl-python", sys.executable]) == 1
    assert "disagree      " in capsys.readouterr().out


def test_different_per_gpu_numbers_are_a_disagreement(fake_verl: Path, tmp_path: Path, capsys):
    write(tmp_path, "numbers.yaml", GOOD.replace("ppo_mini_batch_size: 8,", "ppo_mini_batch_size: 4,"))
    assert verl_diff.main([str(tmp_path / "plans"), "--verl-python", sys.executable]) == 1
    assert "actor.ppo_mini_batch_size_per_gpu: rlconf 4, verl 8" in capsys.readouterr().out


def test_an_rlconf_refusal_verl_accepts_is_explained_by_the_audit(fake_verl: Path, tmp_path: Path, capsys):
    # RL509 (vLLM on CPU): verl's config checks pass, its rollout server would not start
    write(tmp_path, "vllm_on_cpu.yaml", GOOD.replace("seed: 3}", "seed: 3, device: cpu}"))
    assert verl_diff.main([str(tmp_path / "plans"), "--verl-python", sys.executable]) == 0
    out = capsys.readouterr().out
    assert "explained" in out and "RL509: verl's run fails later" in out


def test_an_unreadable_plan_is_not_compared(fake_verl: Path, tmp_path: Path, capsys):
    write(tmp_path, "broken.yaml", "data: [unclosed\n")
    assert verl_diff.main([str(tmp_path / "plans"), "--verl-python", sys.executable]) == 0
    assert "1 not compared" in capsys.readouterr().out


def test_every_error_rule_has_an_audit_entry():
    errors = {rule.code for rule in RULES if rule.severity == "error"}
    assert errors == set(AUDIT)
