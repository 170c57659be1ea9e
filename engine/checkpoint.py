"""Checkpoints on disk, controller side: layout, atomic commit, the latest pointer, pruning, resume.

    <run_dir>/checkpoints/
        latest_checkpointed_iteration.txt    newest complete step, e.g. "20" (verl's file name)
        global_step_20/
            trainer_state.json               step, data order, KL coefficient, metrics history length
            controller_rng.pt                the controller process's RNG streams
            actor/                           DCP shards of model + optimizer, per-rank scheduler + RNG,
                                             huggingface/ with checkpoint.save_contents: [..., hf_model]
            critic/                          the same for PPO plans (engine.workers.fsdp.checkpointing)
        .tmp-step_22/                        a checkpoint being written (or left by a crash)
    <run_dir>/abandoned/<time>/              what a resumed run superseded: later checkpoints, metrics lines

Atomicity: a checkpoint is written into `.tmp-step_<k>`, fsynced, and only then renamed to
`global_step_<k>`; the latest pointer is replaced (write a temporary file, `os.replace`) after
the rename, and pruning runs after that. A crash at any point leaves the previous checkpoint
complete and the pointer naming a complete checkpoint. Only one run writes into a run directory.

Most functions here touch only the filesystem, so they are unit-tested without torch.distributed;
`save_checkpoint`, `load_checkpoint` and `export_hf_model` drive the worker groups.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlconf.resolved import ResolvedPlan

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
CONTROLLER_RNG_FILE = "controller_rng.pt"
ABANDONED_DIR = "abandoned"
METRICS_FILE = "metrics.jsonl"
# trainer.log_val_generations: the picked validation samples, one JSON line each (with its step).
VAL_GENERATIONS_FILE = "val_generations.jsonl"
RESUME_MODES = ("auto", "disable", "resume_path")

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_TMP_PREFIX, _DELETING_PREFIX = ".tmp-", ".deleting-"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be found, read or resumed from; the message says what to change."""


def checkpoint_problems(resolved: ResolvedPlan) -> list[str]:
    """Messages for people about `checkpoint.save_contents` / `load_contents` this engine cannot honour."""
    plan = resolved.config
    sections = {"actor_rollout_ref.actor.checkpoint": plan.actor_rollout_ref.actor.checkpoint}
    if resolved.roles.critic is not None:
        sections["critic.checkpoint"] = plan.critic.checkpoint
    problems = []
    for key, section in sections.items():
        missing = sorted({"model", "optimizer", "extra"} - set(section.save_contents))
        if missing:
            problems.append(f"{key}.save_contents leaves out {', '.join(missing)}: this engine's checkpoints always "
                            "hold model, optimizer and extra (LR scheduler, RNG), which an exact resume needs; "
                            "list all three (add hf_model for an HF export in every checkpoint)")
        if "model" not in section.load_contents:
            problems.append(f"{key}.load_contents has no model: a resume always loads the model; add model "
                            "(optimizer and extra may be left out to start them fresh)")
        # hf_model in load_contents (it follows save_contents) is an export only: a resume loads the DCP
        # shards, as verl's checkpoint managers do.
    return problems


# --- names and schedule --------------------------------------------------------------------------

def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def step_dir_name(step: int) -> str:
    return f"global_step_{step}"


def step_of(path: Path) -> int | None:
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def should_save(step: int, total_steps: int, save_freq: int) -> bool:
    """verl's rule (ray_trainer.fit): with save_freq > 0, after every save_freq-th step and after the last one;
    save_freq -1 never saves (verl's default: a run that asks for no checkpoint pays for none)."""
    return saves_checkpoints(save_freq) and (step % save_freq == 0 or step == total_steps)


def saves_checkpoints(save_freq: int) -> bool:
    return save_freq > 0


def no_checkpoint_note(save_freq: int) -> str | None:
    """What the launch says when the plan writes no checkpoint (None when it does), so that nobody looks for one."""
    if saves_checkpoints(save_freq):
        return None
    return (f"no checkpoint written: trainer.save_freq={save_freq} never saves (as in verl); set trainer.save_freq=N "
            "to save after every N steps and after the last")


# --- small durable writes ------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    # A rename is durable only once its directory entry is; not every platform can open a directory.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Readers see the old content or the new one, never a partial file."""
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _remove_tree(path: Path) -> None:
    """Rename first, then delete: an interrupted delete leaves a `.deleting-` name nothing loads."""
    doomed = path.with_name(f"{_DELETING_PREFIX}{path.name}")
    if doomed.exists():
        shutil.rmtree(doomed)
    os.replace(path, doomed)
    shutil.rmtree(doomed)


def _replace_dir(new: Path, target: Path) -> None:
    """Move the finished directory `new` to `target`, replacing an existing one."""
    if target.exists():
        _remove_tree(target)
    os.replace(new, target)
    _fsync_dir(target.parent)


# --- the latest pointer and the list of checkpoints ----------------------------------------------

def write_latest(root: Path, step: int) -> None:
    write_text_atomic(root / LATEST_FILE, f"{step}\n")


def read_latest(root: Path) -> int | None:
    try:
        return int((root / LATEST_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def is_complete(step_dir: Path) -> bool:
    # trainer_state.json is the last file written before the rename: its presence marks a whole checkpoint.
    return step_of(step_dir) is not None and (step_dir / STATE_FILE).is_file()


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(step_of(path), path) for path in root.iterdir() if path.is_dir() and is_complete(path)]
    return sorted((step, path) for step, path in found if step is not None)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint the pointer names; the newest complete one if the pointer is missing or stale."""
    step = read_latest(root)
    if step is not None and is_complete(root / step_dir_name(step)):
        return root / step_dir_name(step)
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


# --- writing one checkpoint ----------------------------------------------------------------------

def remove_leftovers(root: Path) -> list[Path]:
    """Delete what interrupted saves and prunes left behind (`.tmp-*`, `.deleting-*`)."""
    if not root.is_dir():
        return []
    leftovers = [p for p in root.iterdir() if p.name.startswith((_TMP_PREFIX, _DELETING_PREFIX))]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return leftovers


def begin_checkpoint(root: Path, step: int) -> Path:
    """A fresh, empty `.tmp-step_<step>` directory to write the checkpoint into."""
    root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(root)
    tmp = root / f"{_TMP_PREFIX}step_{step}"
    tmp.mkdir()
    return tmp


def commit_checkpoint(root: Path, tmp: Path, step: int) -> Path:
    """Publish a fully written `tmp` as `global_step_<step>`, then point `latest` at it."""
    if not (tmp / STATE_FILE).is_file():
        raise CheckpointError(f"{tmp} has no {STATE_FILE}: the checkpoint was not fully written")
    final = root / step_dir_name(step)
    _replace_dir(tmp, final)
    write_latest(root, step)
    return final


def prune_checkpoints(root: Path, keep: Mapping[str, int | None]) -> list[Path]:
    """Keep the newest `keep[role]` `<role>/` subdirectories (None: all); returns what was removed.

    Roles are pruned separately (max_actor_ckpt_to_keep, max_critic_ckpt_to_keep); a step directory
    left without any of these model roles is removed whole, with what only makes sense beside them (the
    rollout pool's RNG and weight version, the generated batches in flight). The newest checkpoint is
    never pruned (keep >= 1).
    """
    removed: list[Path] = []
    checkpoints = complete_checkpoints(root)
    for role, count in keep.items():
        if count is None:
            continue
        with_role = [path / role for _, path in checkpoints if (path / role).is_dir()]
        for role_dir in with_role[:max(0, len(with_role) - max(1, count))]:
            _remove_tree(role_dir)
            removed.append(role_dir)
    for _, path in checkpoints:
        for child in path.iterdir():  # role directories whose delete was interrupted
            if child.name.startswith(_DELETING_PREFIX):
                shutil.rmtree(child)
        if not [name for name in role_dirs(path) if name in keep]:
            _remove_tree(path)
            removed.append(path)
    return removed


def role_dirs(step_dir: Path) -> list[str]:
    """The model subdirectories (actor, critic) of a checkpoint."""
    return sorted(child.name for child in step_dir.iterdir() if child.is_dir() and not child.name.startswith("."))


def write_controller_files(tmp: Path, step: int, controller_state: Mapping[str, Any],
                           worker_groups: Mapping[str, Any]) -> None:
    """trainer_state.json (last file of a checkpoint: it marks it complete) and controller_rng.pt."""
    from engine.workers.fsdp.checkpointing import capture_rng_state, save_torch_file

    save_torch_file(capture_rng_state(), tmp / CONTROLLER_RNG_FILE)
    state = {"step": step, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "worker_groups": dict(worker_groups),
             "controller": dict(controller_state)}
    with open(tmp / STATE_FILE, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def save_checkpoint(run_dir: Path, step: int, groups: Sequence[Any], controller_state: Mapping[str, Any],
                    keep: Mapping[str, int | None], tokenizer: Any,
                    controller_files: Mapping[str, Any] | None = None) -> Path:
    """Every worker group writes its shards, the controller its state; then commit and prune.

    `controller_files`: name -> object the controller saves beside its state (torch.save, read back with
    weights_only=True), such as the off-policy schedule's generated batches not trained yet.

    `groups` are worker groups (engine.workers.cluster.group) whose workers mix in CheckpointingWorker.
    The tokenizer completes the HF exports that `checkpoint.save_contents: [..., hf_model]` asks for.
    """
    from engine.workers.fsdp.checkpointing import HF_SUBDIR

    root = checkpoints_root(run_dir)
    tmp = begin_checkpoint(root, step)
    worker_groups = {}
    for group in groups:
        results = group.call_all("save_checkpoint", str(tmp))
        models = sorted(results[0]["seconds"])
        worker_groups[group.role] = {"world_size": group.world_size, "models": models}
        for model in models:
            if (tmp / model / HF_SUBDIR).is_dir():
                tokenizer.save_pretrained(tmp / model / HF_SUBDIR)
    from engine.workers.fsdp.checkpointing import save_torch_file

    for name, obj in (controller_files or {}).items():
        save_torch_file(obj, tmp / name)
    write_controller_files(tmp, step, controller_state, worker_groups)
    final = commit_checkpoint(root, tmp, step)
    prune_checkpoints(root, keep)
    return final


# --- resuming ------------------------------------------------------------------------------------

def read_trainer_state(step_dir: Path) -> dict[str, Any]:
    try:
        state = json.loads((step_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{step_dir} is not a complete checkpoint (no {STATE_FILE}); a crash while it was "
                              f"written leaves it incomplete: resume from an earlier global_step_* directory") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{step_dir / STATE_FILE} is not valid JSON ({exc})") from None
    return state


def resolve_resume(resume_mode: str, resume_from_path: str | None, run_dir: Path) -> Path | None:
    """The checkpoint directory a launch continues from, or None to start at step 1.

    auto: the latest checkpoint of this run directory, if any. disable: none. resume_path: the
    directory `trainer.resume_from_path` names, either a `global_step_<k>` directory or a
    directory holding checkpoints (a run directory or its `checkpoints/`), whose latest is used.
    Any other resume_mode is itself such a path (verl accepts that too; the compiler's RL514
    rejects values that do not look like one).
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return latest_checkpoint(checkpoints_root(run_dir))
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise CheckpointError("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_<k> "
                                  "directory); or use resume_mode=auto to continue from this run directory")
        key, given = "trainer.resume_from_path", resume_from_path
    else:
        key, given = "trainer.resume_mode", resume_mode
    path = Path(given).expanduser()
    if not path.is_dir():
        if key == "trainer.resume_mode":
            raise CheckpointError(f"{key}={given}: no such directory (expected {', '.join(RESUME_MODES)} "
                                  "or a checkpoint directory)")
        raise CheckpointError(f"{key}={given}: no such directory")
    if step_of(path) is not None:
        read_trainer_state(path)  # raises with a message when the checkpoint is incomplete
        return path
    for root in (path, checkpoints_root(path)):
        found = latest_checkpoint(root)
        if found is not None:
            return found
    raise CheckpointError(f"{key}={given}: no complete global_step_* checkpoint in it or in its "
                          f"{CHECKPOINTS_DIR}/ directory")


def truncate_metrics(path: Path, last_step: int, dropped_to: Path) -> int:
    """Keep the metrics.jsonl lines of steps up to `last_step` (none when 0); returns the lines dropped.

    A resumed run rewrites the steps after its checkpoint, so their old lines must go, or the file
    would hold two lines for those steps. Dropped lines (a torn last write too) are kept in `dropped_to`.
    """
    if not path.is_file():
        return 0
    kept, dropped = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            step = None
        # A fresh start (last_step 0) keeps nothing, not even a step-0 validation line: it writes its own.
        if last_step > 0 and step is not None and step <= last_step:
            kept.append(line)
        else:
            dropped.append(line)
    if dropped:
        dropped_to.parent.mkdir(parents=True, exist_ok=True)
        dropped_to.write_text("".join(f"{line}\n" for line in dropped), encoding="utf-8")
        write_text_atomic(path, "".join(f"{line}\n" for line in kept))
    return len(dropped)


def set_aside_newer(root: Path, last_step: int, aside: Path) -> list[Path]:
    """Move checkpoints after `last_step` into `aside`: a run continuing from `last_step` would
    otherwise mix its checkpoints with those of the timeline it left (and prune by step number)."""
    moved = []
    for step, path in complete_checkpoints(root):
        if step > last_step:
            aside.mkdir(parents=True, exist_ok=True)
            os.replace(path, aside / path.name)
            moved.append(aside / path.name)
    if moved:
        remaining = complete_checkpoints(root)
        if remaining:
            write_latest(root, remaining[-1][0])
        else:
            (root / LATEST_FILE).unlink(missing_ok=True)
    return moved


def _unused_path(path: Path) -> Path:
    suffix = 1
    candidate = path
    while candidate.exists():
        suffix += 1
        candidate = path.with_name(f"{path.name}-{suffix}")
    return candidate


def start_timeline(run_dir: Path, start_step: int) -> list[str]:
    """Make the run directory agree with a run that continues after `start_step` (0: a fresh start).

    What the new run supersedes (checkpoints, metrics and validation-generation lines after `start_step`) is moved to
    `<run_dir>/abandoned/<time>/`, not deleted. Returns notes for the launch log.
    """
    notes = []
    root = checkpoints_root(run_dir)
    aside = _unused_path(Path(run_dir) / ABANDONED_DIR / time.strftime("%Y%m%d-%H%M%S"))
    removed = remove_leftovers(root)
    if removed:
        notes.append(f"removed what an interrupted checkpoint write left: {', '.join(p.name for p in removed)}")
    moved = set_aside_newer(root, start_step, aside)
    if moved:
        notes.append(f"moved {len(moved)} checkpoint(s) after step {start_step} to {aside}")
    # Both files hold one JSON line per (step, ...): the resumed run writes the later steps again.
    for name in (METRICS_FILE, VAL_GENERATIONS_FILE):
        dropped = truncate_metrics(Path(run_dir) / name, start_step, aside / name)
        if dropped:
            notes.append(f"moved {dropped} line(s) of {name} after step {start_step} to {aside / name}; "
                         "this run writes those steps again")
    return notes


# What a resume without part of checkpoint.load_contents means for the run, said in the launch log.
LEFT_OUT_ON_LOAD = {
    "optimizer": "the optimizer starts with fresh moments",
    "extra": "the LR schedule restarts and the random streams (sampling, shuffling) are reseeded",
}


def load_checkpoint(step_dir: Path, groups: Sequence[Any], resolved: ResolvedPlan) -> tuple[dict[str, Any], list[str]]:
    """Load every worker group and the controller's RNG; returns (trainer_state.json, notes)."""
    import torch

    from engine.workers.fsdp.checkpointing import checkpoint_contents, restore_rng_state

    state = read_trainer_state(step_dir)
    notes = []
    for group in groups:
        saved = state["worker_groups"].get(group.role)
        if saved is None:
            raise CheckpointError(f"{step_dir} was written by a run without {group.role} workers; resume it with "
                                  "the plan that wrote it, or start over with trainer.resume_mode=disable")
        for model in saved["models"]:
            if not (step_dir / model).is_dir():
                raise CheckpointError(f"{step_dir} has no {model}/ directory (pruned by max_{model}_ckpt_to_keep); "
                                      "resume from a newer checkpoint")
        group.call_all("load_checkpoint", str(step_dir))
        if saved["world_size"] != group.world_size:
            notes.append(f"{group.role}: checkpoint written by {saved['world_size']} ranks, loaded on "
                         f"{group.world_size}; weights and optimizer are resharded, and ranks the checkpoint "
                         "did not have start fresh sampling streams")
    for model in [model for saved in state["worker_groups"].values() for model in saved["models"]]:
        left_out = sorted({"optimizer", "extra"} - set(checkpoint_contents(resolved, model).load_contents))
        if left_out:
            notes.append(f"{model}: checkpoint.load_contents leaves out {' and '.join(left_out)}: "
                         + "; ".join(LEFT_OUT_ON_LOAD[item] for item in left_out))
    # The controller's own state (data order, KL coefficient, RNG) is the trainer's, always restored.
    restore_rng_state(torch.load(step_dir / CONTROLLER_RNG_FILE, weights_only=True))
    return state, notes


# --- export --------------------------------------------------------------------------------------

def export_hf_model(group: Any, name: str, tokenizer: Any, out_dir: Path) -> Path:
    """`out_dir` as a HF model directory (weights gathered on rank 0, config, tokenizer), replaced whole."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f"{_TMP_PREFIX}{out_dir.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    group.call_all("export_hf", name, str(tmp))
    tokenizer.save_pretrained(tmp)
    _replace_dir(tmp, out_dir)
    return out_dir
