"""Paths in the plan that cannot be looked at on this machine (RL009).

Each path is stat'ed where the engine will look for it (relative paths from the working directory,
`~` expanded). Missing paths pass: a hub id or a file on the cluster is fine here. The loader
checks `base:` the same way (rlconf.loader).
"""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error
from rlconf.paths import expand, is_dir, probe, shorten
from rlconf.rules.algorithm import RESUME_MODES
from rlconf.schema import PlanConfig

MODEL_CONFIG = "config.json"  # what rlconf.modelinfo reads from a local model directory


def plan_paths(plan: PlanConfig) -> Iterator[tuple[str, str, str]]:
    """(dotted key, path as written, what it is) for every local path the plan names."""
    arr, critic, trainer = plan.actor_rollout_ref, plan.critic, plan.trainer
    yield "actor_rollout_ref.model.path", arr.model.path, "model directory"
    yield "actor_rollout_ref.model.tokenizer_path", arr.model.tokenizer_path, "tokenizer directory"
    yield "data.tokenizer", plan.data.tokenizer, "tokenizer directory"
    yield "critic.model.path", critic.model.path, "model directory"
    yield "critic.model.tokenizer_path", critic.model.tokenizer_path, "tokenizer directory"
    yield "reward_model.model.path", plan.reward_model.model.path, "model directory"
    yield "reward_model.model.input_tokenizer", plan.reward_model.model.input_tokenizer, "tokenizer directory"
    for key in ("data.train_files", "data.val_files"):
        files = getattr(plan.data, key.partition(".")[2])
        if isinstance(files, list):
            for i, file in enumerate(files):
                yield f"{key}[{i}]", file, "data file"
        else:
            yield key, files, "data file"
    yield "custom_reward_function.path", plan.custom_reward_function.path, "reward function file"
    yield "trainer.default_local_dir", trainer.default_local_dir, "run directory"
    yield "trainer.resume_from_path", trainer.resume_from_path, "checkpoint directory"
    if trainer.resume_mode not in RESUME_MODES:
        yield "trainer.resume_mode", trainer.resume_mode, "checkpoint directory"


def check_paths(plan: PlanConfig) -> Iterator[Diagnostic]:
    for key, written, what in plan_paths(plan):
        if not isinstance(written, str) or not written or "://" in written:  # unset, or a scheme (tiny://, hdfs://)
            continue
        path = expand(written)
        problem = probe(path)
        if problem is None and what == "model directory" and is_dir(path):
            problem = probe(path / MODEL_CONFIG)  # the compiler reads its config.json for the model's shape
        if problem is not None:
            yield error("RL009", key, f"{what} `{shorten(written)}` cannot be used: {problem.reason}", help=problem.help)
