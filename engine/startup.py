"""What a launch does before its first step, announced as each phase begins and timed.

A GPU launch can be quiet for a minute (vLLM's start, compiling layers on the first step); a person
cannot tell that from a hang unless each phase says so as it begins. Each phase's seconds go to the
console once the run reaches its first step, and to that step's line of metrics.jsonl as
`timing/startup_<phase>` (docs/metrics.md), with `timing/startup_total` from the command's start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The actor workers' own account of `actor_load` (the pieces of the rank that finished last): what a worker
# process spends before the model exists is invisible from the driver. Piece -> (metric key, what the line says).
ACTOR_LOAD_PIECES = {
    "worker_start": ("timing/startup_actor_worker_start", "worker start"),
    "process_group": ("timing/startup_actor_process_group", "process group"),
    "model_load": ("timing/startup_actor_model_load", "weights"),
    "build": ("timing/startup_actor_build", "FSDP and optimizer"),
}


def last_ranks_pieces(infos: list[dict[str, Any]], created_at: float) -> dict[str, float]:
    """The pieces of the rank whose pieces add up to the most (a rank without `startup_s` is skipped): the rank
    that held the phase up, so the pieces add up to no more than the phase. Each piece's largest over the ranks
    would not: two ranks slowest at different pieces counted twice (a 2-core CI run saw 32.5 s of such pieces
    in a 31.0 s phase). `worker_start`: from `created_at` (the driver's time.time() as it called for the
    workers) to the rank's constructor (its `constructed_at`): what was left of placing and starting it, and of
    its imports (engine.launch spawns every worker group as soon as Ray is up)."""
    ranks = []
    for info in infos:
        account = info.get("startup_s")
        if not account:
            continue
        ranks.append({("worker_start" if piece == "constructed_at" else piece):
                      (max(0.0, value - created_at) if piece == "constructed_at" else value)
                      for piece, value in account.items()})
    return max(ranks, key=lambda pieces: sum(pieces.values()), default={})


class StartupClock:
    def __init__(self, log: Callable[[str], None] = lambda line: None, started: float | None = None) -> None:
        self.log = log
        self.started = time.perf_counter() if started is None else started  # the command's start
        self.seconds: dict[str, float] = {}
        self.actor_pieces: dict[str, float] = {}  # ACTOR_LOAD_PIECES, from the workers

    @contextmanager
    def phase(self, name: str, doing: str) -> Iterator[None]:
        """`name`: the metric's suffix; `doing`: what a person reads while it runs ("starting Ray")."""
        self.log(f"start-up: {doing} …")
        begun = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - begun

    def so_far(self, name: str) -> None:
        """Time the span from the command's start to now as phase `name`: what happened before the first
        announced phase (the plan compiled, the launch's checks)."""
        self.seconds[name] = time.perf_counter() - self.started - sum(self.seconds.values())

    def metrics(self) -> dict[str, float]:
        """timing/startup_<phase> per phase, the actor workers' pieces, and the total from the command's start to now."""
        out = {f"timing/startup_{name}": seconds for name, seconds in self.seconds.items()}
        out.update({ACTOR_LOAD_PIECES[piece][0]: seconds for piece, seconds in self.actor_pieces.items()
                    if piece in ACTOR_LOAD_PIECES})
        out["timing/startup_total"] = time.perf_counter() - self.started
        return out

    def summary(self, metrics: dict[str, float], step_seconds: float) -> str:
        """One line: the total, then each phase and the first step itself."""
        phases = [f"{name.replace('_', ' ')} {metrics[f'timing/startup_{name}']:.1f}s" for name in self.seconds]
        pieces = [f"{label} {metrics[key]:.1f}s" for key, label in ACTOR_LOAD_PIECES.values() if key in metrics]
        if pieces and "actor_load" in self.seconds:  # "actor load 17.6s (worker start 8.1s, ...)"
            at = list(self.seconds).index("actor_load")
            phases[at] += f" ({', '.join(pieces)})"
        return (f"start-up: {metrics['timing/startup_total']:.1f}s from the command to the first step's metrics "
                f"({', '.join([*phases, f'the step {step_seconds:.1f}s'])})")


def first_step_compiles(resolved) -> list[str]:
    """What torch.compile compiles on the first step's first use (empty: nothing), for the announcement."""
    plan = resolved.config
    arr = plan.actor_rollout_ref
    what = []
    if arr.model.compile_layers:
        what.append("the actor's decoder layers")
    if resolved.roles.critic is not None and plan.critic.model.compile_layers:
        what.append("the critic's decoder layers")
    # The loss head is not here: with use_torch_compile it runs Triton kernels, not torch.compile (rlconf.loss_head).
    return what


def step_one_note(resolved) -> str:
    """The start-up line that opens the first step: what compiles in it."""
    compiles = first_step_compiles(resolved)
    return f"; it compiles {', '.join(compiles)} (torch.compile) on first use, so it takes longer" if compiles else ""
