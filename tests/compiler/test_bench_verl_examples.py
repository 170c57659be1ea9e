"""bench/verl_examples.py on a small verl-like tree (verl itself is not in CI): which scripts it takes, the
overrides bash hands over, and each outcome (accepted, refused and why, misread, unread).

The scripts below are written in the shapes verl's examples use (variables with nested defaults, `if`
branches, `| tee`, an sbatch header read under `set -u`, `srun` in front of python, a comment after a line
continuation); the bench's run on verl's own 81 is in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from verl_reference import VerlResult

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # only while it imports: bench/ holds modules named like others' (tune, scaling)
try:
    import verl_examples
finally:
    sys.path.remove(str(BENCH))

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the bench reads scripts with bash")

COMMON = """\
    data.train_batch_size=16 \\
    data.max_prompt_length=256 \\
    data.max_response_length=256 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \\
    trainer.n_gpus_per_node=4 \\
"""

SCRIPTS = {
    # Nested defaults, arithmetic and an `if` branch: bash's values, not the text's last assignment.
    "examples/grpo_trainer/run_small.sh": f"""set -x
DATA_HOME=${{DATA_HOME:-"${{HOME}}/data"}}
TP=${{1:-1}}
if [ $TP -eq 1 ]; then
    n=4
else
    n=2
fi
export LD_PRELOAD=/nonexistent/libjemalloc.so.2
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files="['$DATA_HOME/gsm8k/train.parquet', '$PWD/math.parquet']" \\
    actor_rollout_ref.rollout.n=$n \\
    actor_rollout_ref.rollout.max_num_batched_tokens=$((256 + 256)) \\
{COMMON}    trainer.nnodes=1 $@ 2>&1 | tee run.log
""",
    # A Slurm script: the node count comes from sbatch, under `set -u`, through srun.
    "examples/gspo_trainer/run_slurm.sh": f"""#!/usr/bin/env bash
#SBATCH --nodes=1
set -xeuo pipefail
ulimit -n 65535
NNODES=${{SLURM_JOB_NUM_NODES}}
srun --nodes=$NNODES python -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.rollout.n=4 \\
{COMMON}    trainer.nnodes=$NNODES
""",
    "examples/ppo_trainer/run_sglang.sh": f"""python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.rollout.name=sglang \\
{COMMON}    trainer.nnodes=1
""",
    # A comment after a line continuation ends the command: the rest never reaches python, as in bash.
    "examples/ppo_trainer/run_comment.sh": f"""python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\  # grpo or gae
{COMMON}    trainer.nnodes=1
""",
    # A variable the script never sets: an empty value.
    "examples/tuning/run_unset.sh": f"""python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.rollout.n=4 \\
    data.train_files=$data_path \\
{COMMON}    trainer.nnodes=1
""",
    # verl's own batch check: 8 x n 1 / 4 GPUs = 2 per GPU, below the micro batch of 4.
    "examples/rollout_correction/run_verl_asserts.sh": f"""python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
{COMMON}    trainer.nnodes=1
""",
    # `set -u` stops it before main_ppo.
    "examples/gspo_trainer/run_stops.sh": f"""set -u
size=$((1024 / sp_size))
python3 -m verl.trainer.main_ppo \\
{COMMON}    trainer.nnodes=1
""",
    "examples/grpo_trainer/run_megatron.sh": f"""python3 -m verl.trainer.main_ppo --config-path=config \\
    --config-name='ppo_megatron_trainer.yaml' \\
{COMMON}    trainer.nnodes=1
""",
    "examples/grpo_trainer/run_default_config_named.sh": f"""python3 -m verl.trainer.main_ppo \\
    --config-path=./config --config-name ppo_trainer \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.rollout.n=4 \\
{COMMON}    trainer.nnodes=1
""",
    "examples/generation/run_generate.sh": "python3 -m verl.trainer.main_generation trainer.nnodes=1\n",
    "examples/split/README.sh": "# see verl.trainer.main_ppo for the trainer\npython3 -m verl.trainer.main_generation\n",
}


def write_tree(root: Path) -> Path:
    for path, text in SCRIPTS.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    tree = verl_examples.VerlTree(write_tree(tmp_path_factory.mktemp("verl")), verl_examples.PINNED_COMMIT)
    outcomes, left_out = verl_examples.measure(tree, dict(verl_examples.ENVIRONMENT))
    return {o.path.removeprefix("examples/"): o for o in outcomes}, {s["path"]: s["reason"] for s in left_out}


def test_the_scripts_taken_are_main_ppo_on_the_default_config(measured):
    outcomes, left_out = measured
    assert sorted(outcomes) == ["grpo_trainer/run_default_config_named.sh", "grpo_trainer/run_small.sh",
                                "gspo_trainer/run_slurm.sh", "gspo_trainer/run_stops.sh", "ppo_trainer/run_comment.sh",
                                "ppo_trainer/run_sglang.sh", "rollout_correction/run_verl_asserts.sh", "tuning/run_unset.sh"]
    assert left_out == {"examples/grpo_trainer/run_megatron.sh": "config ppo_megatron_trainer.yaml",
                        "examples/split/README.sh": "runs verl.trainer.main_generation"}


def test_overrides_are_what_bash_hands_to_python(measured):
    small = measured[0]["grpo_trainer/run_small.sh"]
    assert "data.train_files=['~/data/gsm8k/train.parquet', '$PWD/math.parquet']" in small.overrides
    assert "actor_rollout_ref.rollout.n=4" in small.overrides  # the `if` branch bash takes
    assert "actor_rollout_ref.rollout.max_num_batched_tokens=512" in small.overrides
    assert small.other_arguments == []  # `2>&1 | tee` is bash's, not python's
    slurm = measured[0]["gspo_trainer/run_slurm.sh"]
    assert slurm.overrides[-1] == "trainer.nnodes=1"  # from `#SBATCH --nodes=1`, through srun
    assert slurm.sbatch == {"SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1"} and small.sbatch == {}
    named = measured[0]["grpo_trainer/run_default_config_named.sh"]
    assert not any(word.startswith("--config") for word in named.overrides + named.other_arguments)


def test_each_outcome_with_its_reason(measured):
    outcomes = measured[0]
    for accepted in ("grpo_trainer/run_small.sh", "gspo_trainer/run_slurm.sh", "grpo_trainer/run_default_config_named.sh"):
        assert outcomes[accepted].outcome == "accepted", outcomes[accepted].summary()
        assert outcomes[accepted].verl == "runs" and outcomes[accepted].differences == []
    assert outcomes["grpo_trainer/run_small.sh"].verl_numbers["rollout"]["replicas"] == 4

    sglang = outcomes["ppo_trainer/run_sglang.sh"]
    assert (sglang.outcome, sglang.kind, sglang.features) == ("refused", "named feature", ["SGLang rollout"])
    assert {e.code for e in sglang.errors} == {"RL108"}

    comment = outcomes["ppo_trainer/run_comment.sh"]
    assert comment.overrides == ["algorithm.adv_estimator=grpo"] and comment.other_arguments == [" "]
    assert comment.outcome == "refused" and comment.kind == "verl refuses too"
    assert comment.verl.startswith("raises ValueError") and "RL205" in comment.summary()

    unset = outcomes["tuning/run_unset.sh"]
    assert "data.train_files=" in unset.overrides
    assert (unset.outcome, unset.kind) == ("refused", "empty value")
    assert [(e.code, e.key) for e in unset.errors] == [("RL102", "data.train_files")]

    asserts = outcomes["rollout_correction/run_verl_asserts.sh"]
    assert (asserts.outcome, asserts.kind) == ("refused", "verl refuses too")
    assert asserts.verl.startswith("raises AssertionError") and "RL204" in asserts.summary()

    stops = outcomes["gspo_trainer/run_stops.sh"]
    assert stops.outcome == "unread" and "sp_size: unbound variable" in stops.verl


def test_a_number_verl_computes_otherwise_is_a_misread(measured, tmp_path, monkeypatch):
    """The check can fail: an oracle that puts one more sequence on each actor GPU turns an accepted script
    into a misread naming that number."""
    args = measured[0]["grpo_trainer/run_small.sh"].overrides
    real = verl_examples.verl_normalize

    def one_off(plan) -> VerlResult:
        result = real(plan)
        result.actor["sequences_per_gpu"] += 1
        return result

    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    monkeypatch.setattr(verl_examples, "verl_normalize", one_off)
    out = verl_examples.classify("examples/grpo_trainer/run_small.sh", args, plan)
    assert out.outcome == "misread"
    assert out.differences == ["actor.sequences_per_gpu: rlconf 16, verl 17"]  # 16 x n 4 / 4 GPUs


def test_main_reads_a_commit_of_a_git_dir_and_writes_the_json(tmp_path, capsys):
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = write_tree(tmp_path / "verl")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "scripts")
    commit = git("rev-parse", "HEAD")
    (repo / "examples" / "ppo_trainer" / "run_sglang.sh").unlink()  # not at the commit's: the commit is read

    report = verl_examples.main(["--verl-repo", str(repo), "--commit", commit, "--out", str(tmp_path / "r.json")])
    assert report["verl_commit"] == commit
    assert report["totals"] == {"scripts": 8, "accepted": 3, "refused": 4, "misread": 0, "unread": 1}
    assert json.loads((tmp_path / "r.json").read_text())["totals"] == report["totals"]
    printed = capsys.readouterr().out
    assert "refused   ppo_trainer/run_sglang.sh" in printed and "[named feature] RL108: SGLang rollout" in printed
