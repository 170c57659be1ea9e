"""The checkpoint directory, without torch.distributed: schedule, atomic commit, latest pointer, pruning,
resume modes, and how a resumed run brings the run directory back to its checkpoint's step.

A fake checkpoint here is what engine.checkpoint writes around the workers' shards: a committed
`global_step_<k>` with `trainer_state.json` and one empty directory per model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.checkpoint import (
    LATEST_FILE,
    STATE_FILE,
    CheckpointError,
    begin_checkpoint,
    checkpoints_root,
    commit_checkpoint,
    complete_checkpoints,
    latest_checkpoint,
    no_checkpoint_note,
    prune_checkpoints,
    read_latest,
    resolve_resume,
    should_save,
    start_timeline,
    write_latest,
)


def _write_shards(tmp: Path, step: int, models: tuple[str, ...]) -> None:
    for model in models:
        (tmp / model).mkdir()
        (tmp / model / ".metadata").write_bytes(b"shards")
    (tmp / STATE_FILE).write_text(json.dumps({"step": step}))


def _checkpoint(run_dir: Path, step: int, models: tuple[str, ...] = ("actor",)) -> Path:
    root = checkpoints_root(run_dir)
    tmp = begin_checkpoint(root, step)
    _write_shards(tmp, step, models)
    return commit_checkpoint(root, tmp, step)


def _steps(run_dir: Path) -> list[int]:
    return [step for step, _ in complete_checkpoints(checkpoints_root(run_dir))]


def _write_metrics(run_dir: Path, steps: list[int]) -> None:
    lines = [json.dumps({"step": step, "reward/mean": step / 10}) for step in steps]
    (run_dir / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))


def _metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- schedule --------------------------------------------------------------------------------------

def test_a_checkpoint_is_saved_every_save_freq_steps_and_after_the_last_step() -> None:
    assert [step for step in range(1, 11) if should_save(step, total_steps=10, save_freq=4)] == [4, 8, 10]


def test_save_freq_minus_one_never_saves_as_in_verl() -> None:
    # verl 0.9.1 ray_trainer.fit: `save_freq > 0 and (is_last_step or global_steps % save_freq == 0)`
    assert [step for step in range(1, 11) if should_save(step, total_steps=10, save_freq=-1)] == []
    assert no_checkpoint_note(-1) is not None and "trainer.save_freq=-1" in no_checkpoint_note(-1)
    assert no_checkpoint_note(4) is None


def test_a_save_freq_longer_than_the_run_saves_after_the_last_step_only() -> None:
    assert [step for step in range(1, 4) if should_save(step, total_steps=3, save_freq=20)] == [3]


# --- atomic commit and the latest pointer ----------------------------------------------------------

def test_commit_renames_the_temporary_directory_and_then_points_latest_at_it(tmp_path: Path) -> None:
    root = checkpoints_root(tmp_path)
    tmp = begin_checkpoint(root, 2)
    assert tmp.name == ".tmp-step_2"
    _write_shards(tmp, 2, ("actor",))
    final = commit_checkpoint(root, tmp, 2)
    assert final == root / "global_step_2" and (final / "actor" / ".metadata").is_file()
    assert not tmp.exists()
    assert (root / LATEST_FILE).read_text() == "2\n"  # verl's file name and format
    assert latest_checkpoint(root) == final


def test_a_checkpoint_interrupted_before_its_rename_leaves_the_previous_one_latest(tmp_path: Path) -> None:
    previous = _checkpoint(tmp_path, 2)
    root = checkpoints_root(tmp_path)
    interrupted = begin_checkpoint(root, 4)
    _write_shards(interrupted, 4, ("actor",))  # every shard written, the crash comes before the rename
    assert latest_checkpoint(root) == previous
    assert read_latest(root) == 2
    # The next save starts by clearing what the crash left.
    begin_checkpoint(root, 4)
    assert not (interrupted / "actor").exists()


def test_commit_refuses_a_directory_without_its_trainer_state(tmp_path: Path) -> None:
    root = checkpoints_root(tmp_path)
    tmp = begin_checkpoint(root, 2)
    (tmp / "actor").mkdir()
    with pytest.raises(CheckpointError, match="not fully written"):
        commit_checkpoint(root, tmp, 2)
    assert latest_checkpoint(root) is None


def test_a_failed_pointer_update_keeps_the_previous_pointer_whole(tmp_path: Path, monkeypatch) -> None:
    _checkpoint(tmp_path, 2)
    root = checkpoints_root(tmp_path)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_latest(root, 4)
    assert read_latest(root) == 2


def test_latest_falls_back_to_the_newest_complete_checkpoint_when_the_pointer_is_stale(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 2)
    newest = _checkpoint(tmp_path, 4)
    root = checkpoints_root(tmp_path)
    (root / LATEST_FILE).write_text("6\n")  # names a checkpoint that is not there
    assert latest_checkpoint(root) == newest
    (root / LATEST_FILE).unlink()
    assert latest_checkpoint(root) == newest


# --- pruning ---------------------------------------------------------------------------------------

def test_pruning_keeps_the_newest_checkpoints_of_each_model(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        _checkpoint(tmp_path, step, ("actor", "critic"))
    root = checkpoints_root(tmp_path)
    prune_checkpoints(root, {"actor": 2, "critic": 3})
    assert [step for step in (2, 4, 6, 8) if (root / f"global_step_{step}" / "actor").is_dir()] == [6, 8]
    assert [step for step in (2, 4, 6, 8) if (root / f"global_step_{step}" / "critic").is_dir()] == [4, 6, 8]
    # global_step_2 lost both models, so it is gone whole; nothing is left half-deleted.
    assert _steps(tmp_path) == [4, 6, 8]
    assert not [p for p in root.rglob(".deleting-*")]


def test_pruning_removes_a_step_whose_models_are_gone_with_the_rollout_state_beside_them(tmp_path: Path) -> None:
    """Off-policy checkpoints also hold the rollout pool's state (rollout/) and the batches in flight: without the
    model they belong to they are no checkpoint, and they go with it."""
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step, ("actor", "rollout"))
    root = checkpoints_root(tmp_path)
    prune_checkpoints(root, {"actor": 1, "critic": None})
    assert _steps(tmp_path) == [6]
    assert (root / "global_step_6" / "rollout").is_dir()


def test_pruning_with_no_limit_keeps_everything(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step)
    prune_checkpoints(checkpoints_root(tmp_path), {"actor": None, "critic": None})
    assert _steps(tmp_path) == [2, 4, 6]


# --- resume modes ----------------------------------------------------------------------------------

def test_auto_resumes_from_the_latest_checkpoint_of_the_run_directory(tmp_path: Path) -> None:
    assert resolve_resume("auto", None, tmp_path) is None  # nothing yet: start at step 1
    _checkpoint(tmp_path, 2)
    latest = _checkpoint(tmp_path, 4)
    assert resolve_resume("auto", None, tmp_path) == latest
    assert resolve_resume("disable", None, tmp_path) is None


def test_resume_path_takes_a_step_directory_or_a_run_directory(tmp_path: Path) -> None:
    other_run = tmp_path / "other"
    older = _checkpoint(other_run, 2)
    latest = _checkpoint(other_run, 4)
    assert resolve_resume("resume_path", str(older), tmp_path / "new") == older
    assert resolve_resume("resume_path", str(other_run), tmp_path / "new") == latest
    assert resolve_resume("resume_path", str(checkpoints_root(other_run)), tmp_path / "new") == latest


def test_resume_mode_may_itself_be_a_checkpoint_path_as_in_verl(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "other", 2)
    assert resolve_resume(str(checkpoint), None, tmp_path / "new") == checkpoint


@pytest.mark.parametrize(("mode", "path", "message"), [
    ("resume_path", "missing", "trainer.resume_from_path=.*missing: no such directory"),
    ("resume_path", None, "needs trainer.resume_from_path"),
    ("resume_path", "empty", "no complete global_step_\\* checkpoint"),
    ("latest", None, "trainer.resume_mode=latest: no such directory \\(expected auto, disable, resume_path or a "
                     "checkpoint directory\\)"),
])
def test_a_resume_that_cannot_happen_says_why(tmp_path: Path, mode: str, path: str | None, message: str) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=message):
        resolve_resume(mode, None if path is None else str(tmp_path / path), tmp_path / "run")


def test_resume_path_to_an_incomplete_checkpoint_names_the_problem(tmp_path: Path) -> None:
    broken = checkpoints_root(tmp_path) / "global_step_4"
    (broken / "actor").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_resume("resume_path", str(broken), tmp_path)


# --- bringing the run directory back to the checkpoint's step --------------------------------------

def test_resuming_after_step_2_sets_later_metrics_lines_and_checkpoints_aside(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    _write_metrics(tmp_path, [0, 1, 2, 3, 4, 5])
    (checkpoints_root(tmp_path) / ".tmp-step_6").mkdir()  # a crash while step 6 was being written

    notes = start_timeline(tmp_path, 2)

    assert _metric_steps(tmp_path) == [0, 1, 2]  # the step-0 validation line stays: it is before the checkpoint
    assert _steps(tmp_path) == [2]
    assert read_latest(checkpoints_root(tmp_path)) == 2
    (aside,) = (tmp_path / "abandoned").iterdir()
    assert [json.loads(line)["step"] for line in (aside / "metrics.jsonl").read_text().splitlines()] == [3, 4, 5]
    assert (aside / "global_step_4" / STATE_FILE).is_file()
    assert not (checkpoints_root(tmp_path) / ".tmp-step_6").exists()
    assert len(notes) == 3


def test_a_fresh_start_in_a_used_run_directory_keeps_nothing_of_the_old_run_in_place(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 2)
    _write_metrics(tmp_path, [0, 1, 2])
    start_timeline(tmp_path, 0)
    assert _metric_steps(tmp_path) == [] and _steps(tmp_path) == []
    assert not (checkpoints_root(tmp_path) / LATEST_FILE).exists()


def test_resuming_after_step_2_sets_later_validation_generations_aside(tmp_path: Path) -> None:
    # Two picked samples per validation at steps 0, 2 and 4 (test_freq 2); the run resumes from step 2.
    rows = [{"step": step, "prompt": f"p{step}", "response": f"r{i}", "score": 1.0} for step in (0, 2, 4) for i in (0, 1)]
    (tmp_path / "val_generations.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    notes = start_timeline(tmp_path, 2)
    kept = [json.loads(line)["step"] for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert kept == [0, 0, 2, 2]  # step 4's validation is written again by the resumed run
    (aside,) = (tmp_path / "abandoned").iterdir()
    assert [json.loads(line)["step"] for line in (aside / "val_generations.jsonl").read_text().splitlines()] == [4, 4]
    assert any("2 line(s) of val_generations.jsonl" in note for note in notes), notes


def test_a_torn_last_metrics_line_is_dropped_on_resume(tmp_path: Path) -> None:
    _write_metrics(tmp_path, [1, 2])
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 3, "rew')  # the process died mid-write
    start_timeline(tmp_path, 2)
    assert _metric_steps(tmp_path) == [1, 2]


# --- checkpoint.save_contents / load_contents --------------------------------------------------------

def test_checkpoint_contents_the_engine_cannot_honour_are_refused_with_the_key_and_the_fix() -> None:
    from engine.checkpoint import checkpoint_problems
    from rlconf.compile import compile_plan

    quickstart = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"

    def problems(*overrides: str) -> list[str]:
        result = compile_plan(quickstart, list(overrides))
        assert result.resolved is not None, [d.message for d in result.diagnostics]
        return checkpoint_problems(result.resolved)

    assert problems() == []
    assert problems("actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]") == []
    assert problems("actor_rollout_ref.actor.checkpoint.load_contents=[model]") == []
    (message,) = problems("actor_rollout_ref.actor.checkpoint.save_contents=[model]")
    assert message.startswith("actor_rollout_ref.actor.checkpoint.save_contents leaves out extra, optimizer")
    (message,) = problems("actor_rollout_ref.actor.checkpoint.load_contents=[optimizer,extra]")
    assert "load_contents has no model" in message
    # verl loads no HF export either: hf_model in load_contents (which follows save_contents) is ignored on resume.
    assert problems("actor_rollout_ref.actor.checkpoint.load_contents=[model,hf_model]") == []


def test_a_run_directory_that_cannot_be_used_is_one_error_line_before_ray_starts(tmp_path: Path, capsys) -> None:
    from engine.launch import EXIT_FAILED, run_launch
    from rlconf.compile import compile_plan

    resolved = compile_plan(Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml", []).resolved
    assert resolved is not None
    taken = tmp_path / "a_file"
    taken.write_text("not a directory")
    assert run_launch(resolved, run_dir=taken) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "error: " in err and "Not a directory" in err and "Traceback" not in err, err
