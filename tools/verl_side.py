"""The verl side of tools/verl_diff.py: run inside a Python that has verl 0.9.1 (never rlconf's).

    /tmp/verlenv/bin/python tools/verl_side.py < plans.json > verdicts.json

Reads a JSON list of {"name": ..., "values": {dotted verl key: value}} and writes, for each, verl's
verdict: {"name", "valid", "error", "numbers"}. A plan's values go onto verl's own composed
`ppo_trainer` config (hydra, as `verl.trainer.main_ppo` composes it) in struct mode, so a key verl
does not declare fails as it does on verl's command line. Then it runs what verl runs before any
GPU is touched, and the per-GPU arithmetic of its workers:

- verl/utils/config.py `validate_config` (main_ppo.py calls it first), with its ActorConfig and
  CriticConfig `__post_init__` / `validate`;
- the rollout and algorithm sections as dataclasses (their `__post_init__` checks);
- the numbers of verl 0.9.1's v1 trainer and FSDP engine workers, which need a process group to run
  and are written out here instead, each with its line: the mini batch is `ppo_mini_batch_size × n`
  sequences (trainer/ppo/v1/trainer_base.py L1829-1830), split over the data-parallel ranks with an
  assert (workers/engine_workers.py L267-270), dp = GPUs ÷ Ulysses sp
  (workers/engine/fsdp/transformer_impl.py L651-652); the per-GPU micro batches must be set without
  dynamic batch size (engine_workers.py L636-637) and divide what each rank holds
  (workers/engine/utils.py L123-128), for training and log-prob passes alike.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path
from typing import Any


def compose_verl_config() -> Any:
    from hydra import compose, initialize_config_dir

    import verl

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer")


def apply_values(base: Any, values: dict[str, Any]) -> Any:
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(base)
    OmegaConf.set_struct(cfg, True)
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=True, force_add=False)
    return cfg


def _divides(total: int, part: int | None, what: str) -> None:
    assert part is not None and part > 0, f"{what} is not set"
    assert total % part == 0, f"{what} {part} does not divide {total}"


def worker_numbers(cfg: Any, use_reference_policy: bool, use_critic: bool) -> dict[str, Any]:
    """The per-GPU sizes verl 0.9.1's workers use (module docstring: where each comes from)."""
    arr = cfg.actor_rollout_ref
    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    n = arr.rollout.n
    sequences = cfg.data.train_batch_size * n
    numbers: dict[str, Any] = {}

    def trained(role: str, section: Any, sp: int) -> None:
        dp = n_gpus // sp
        mini = section.ppo_mini_batch_size * n
        assert mini % dp == 0, f"{role} mini batch {mini} sequences does not split over {dp} data-parallel ranks"
        numbers[f"{role}.ppo_mini_batch_size_per_gpu"] = mini // dp
        if not section.use_dynamic_bsz:
            _divides(mini // dp, section.ppo_micro_batch_size_per_gpu, f"{role}.ppo_micro_batch_size_per_gpu")
            numbers[f"{role}.ppo_micro_batch_size_per_gpu"] = section.ppo_micro_batch_size_per_gpu

    def forward(role: str, micro: int | None, dynamic: bool, sp: int) -> None:
        if not dynamic:
            _divides(sequences // (n_gpus // sp), micro, f"{role} micro batch per GPU")
            numbers[f"{role}.micro_batch_size_per_gpu"] = micro

    sp = arr.actor.ulysses_sequence_parallel_size
    trained("actor", arr.actor, sp)
    if not cfg.algorithm.get("rollout_correction", {}).get("bypass_mode", False):  # bypass: no old log-prob pass
        forward("rollout.log_prob", arr.rollout.log_prob_micro_batch_size_per_gpu, arr.rollout.log_prob_use_dynamic_bsz, sp)
    if use_reference_policy:
        forward("ref", arr.ref.log_prob_micro_batch_size_per_gpu, arr.ref.log_prob_use_dynamic_bsz,
                arr.ref.ulysses_sequence_parallel_size)
    if use_critic:
        critic_sp = cfg.critic.ulysses_sequence_parallel_size
        trained("critic", cfg.critic, critic_sp)
        forward("critic.values", cfg.critic.forward_micro_batch_size_per_gpu, cfg.critic.use_dynamic_bsz, critic_sp)
    return numbers


def verdict(base: Any, values: dict[str, Any]) -> dict[str, Any]:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    note = ""
    try:
        cfg = apply_values(base, values)
        use_reference_policy, use_critic = bool(need_reference_policy(cfg)), bool(need_critic(cfg))
        try:
            validate_config(cfg, use_reference_policy=use_reference_policy, use_critic=use_critic)
        except Exception as exc:
            # verl's CriticConfig builds an HFModelConfig, which reads the critic model's files (or the hub):
            # without them here, check the rest and leave the critic to the worker arithmetic below.
            if not use_critic or "HFModelConfig" not in _chain(exc):
                raise
            validate_config(cfg, use_reference_policy=use_reference_policy, use_critic=False)
            note = "critic section checked by the worker arithmetic only (verl's CriticConfig reads the model's files)"
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(cfg.algorithm)
        numbers = worker_numbers(cfg, use_reference_policy, use_critic)
    except Exception as exc:  # anything verl raises refuses the plan, as it would stop the run
        return {"valid": False, "error": _chain(exc)[:400], "numbers": {}, "note": note}
    return {"valid": True, "error": "", "numbers": numbers, "note": note}


def _chain(exc: BaseException) -> str:
    """The exception and its causes, one line each (hydra wraps a dataclass's own error in its cause)."""
    lines = []
    while exc is not None and len(lines) < 4:
        lines.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(lines)


def main() -> None:
    import contextlib
    import io

    plans = json.load(sys.stdin)
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints its NOTICE lines; only JSON goes out
        base = compose_verl_config()
        out = [{"name": plan["name"], **verdict(base, plan["values"])} for plan in plans]
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
