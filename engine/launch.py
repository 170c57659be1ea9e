"""`rlconf launch`: run directory, resolved plan on disk, a Ray cluster, the trainer, a clean exit.

Before Ray starts, trainer.resume_mode picks the checkpoint to continue from (engine.checkpoint), and
the run directory is brought back to that step; after the last step the optimizers' states are released and
the actor is exported to `<run_dir>/hf_actor/` as a HF model directory.

Every way out (success, Ctrl-C, a failed worker, a non-finite loss) ends with ray.shutdown(), so
no worker process outlives the command; failures print one line that names the role. The driver
owns SIGINT and SIGTERM (engine.interrupt): the first stops the run after the stage in progress,
the second at once; Ray's own processes run in a process group of their own, so a Ctrl-C at the
terminal (or a signal to the launch's process group) reaches the driver alone.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from engine.checkpoint import (
    CheckpointError,
    no_checkpoint_note,
    read_trainer_state,
    resolve_resume,
    saves_checkpoints,
    start_timeline,
)
from engine.interrupt import NAMES, SIGNALS, Interrupted, StopSignals, injected_signal_point, owned_signals
from engine.problems import MachineShortfall, closing_line
from rlconf.device import LocalGpu
from rlconf.host_memory import host_memory_bytes, host_memory_note, host_need
from engine.startup import StartupClock
from rlconf.resolved import ResolvedPlan

if TYPE_CHECKING:
    from engine.trainer import Trainer

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130  # a signal exits 128 + its number: 130 SIGINT, 143 SIGTERM
HF_EXPORT_DIR = "hf_actor"


def default_run_dir(resolved: ResolvedPlan) -> Path:
    trainer = resolved.config.trainer
    if trainer.default_local_dir:
        return Path(trainer.default_local_dir).expanduser()
    return Path("runs") / trainer.project_name / trainer.experiment_name


@contextmanager
def _loopback_node_ip() -> Iterator[None]:
    """Keep `_node_ip_address="127.0.0.1"` as given while a local cluster starts.

    Ray 2.60 rewrites a loopback node IP to the machine's external address
    (ray._private.services.resolve_ip_for_localhost), and then its GCS, raylet and worker gRPC
    servers listen on every interface. With the IP kept as 127.0.0.1 they bind to loopback only
    (checked with `ss -ltnp`). There is no public switch for this, hence the scoped patch.
    """
    from ray._private import services

    original = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: host
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = original


@contextmanager
def _own_process_group(started: list[Any] | None = None) -> Iterator[None]:
    """Start the Ray processes (GCS, raylet, dashboard, log monitor) of a local cluster in a process group of
    their own; each one started is appended to `started`.

    They are children of the launch, and would share its process group: the one a terminal's Ctrl-C
    (or `kill -- -PGID`, `kill %1`) signals. Ray blocks SIGINT in them, but not SIGTERM, and a
    raylet that dies kills its workers before the driver decides anything. In a group of their
    own, only the driver gets the signal and stops the run (engine.interrupt); they still die with
    the driver (Ray's fate sharing, PR_SET_PDEATHSIG). The workers are the raylet's children, and
    Ray gives each its own group already. No public switch exists, hence the scoped patch.
    """
    from ray._private import services

    original = services.ConsolePopen

    class OwnGroupPopen(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if os.name != "posix":
                super().__init__(*args, **kwargs)
                return
            ray_preexec = kwargs.get("preexec_fn")
            # Between fork and setpgid the child is still in the launch's group, running the driver's
            # handlers (which would count a Ctrl-C there a second time through the shared wakeup fd).
            # The stop signals are blocked across the fork; the child drops any that reached it
            # while it was in the group, then takes the driver's mask back.
            before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)

            def preexec() -> None:
                os.setpgid(0, 0)
                for signum in SIGNALS:
                    signal.signal(signum, signal.SIG_IGN)  # discards one pending from the launch's group
                    signal.signal(signum, signal.SIG_DFL)  # what exec would have left
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
                if ray_preexec is not None:
                    ray_preexec()

            kwargs["preexec_fn"] = preexec
            try:
                super().__init__(*args, **kwargs)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)  # one that came meanwhile is handled now
            if started is not None:
                started.append(self)
            injected_signal_point("ray_start")  # tests: a Ctrl-C inside ray.init (engine.interrupt)

    services.ConsolePopen = OwnGroupPopen
    try:
        yield
    finally:
        services.ConsolePopen = original


@contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """Keep the launch's SIGTERM handler (engine.interrupt) while ray.init runs.

    Ray 2.60's ray.init sets one of its own as it begins (sys.exit(15)): a SIGTERM during the
    seconds of the start-up would end the launch with exit 15 and no orderly stop, and the handler
    would stay after it. The launch shuts Ray down itself (ray.shutdown), so Ray's setter
    (ray._private.utils.set_sigterm_handler, also used by a head node) does nothing in this scope.
    No public switch exists, hence the scoped patch.
    """
    from ray._private import utils

    original = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = original


@contextmanager
def _no_dashboard_server_or_monitor() -> Iterator[None]:
    """Start a local cluster without its dashboard server and its autoscaler monitor, two head processes
    a launch without --dashboard never uses.

    Ray 2.60 starts the dashboard server even with include_dashboard=False (its usage-stats module
    alone), and ray.init waits until it has registered; the autoscaler monitor has nothing to scale on a
    local cluster, and ray.shutdown waits out its 1 s SIGTERM grace before it kills it. Together about
    2.7 s of every launch on 2 cores (bench/ray_start.py, docs/benchmarks.md). The raylet, its agents
    and the log monitor (worker output on the console) stay. No public switch exists, hence the scoped patch.
    """
    from ray._private import node

    if not all(callable(getattr(node.Node, name, None)) for name in ("start_api_server", "start_monitor")):
        yield  # another Ray than the one measured: its own start-up, slower but whole
        return
    original_api_server, original_monitor = node.Node.start_api_server, node.Node.start_monitor
    node.Node.start_api_server = lambda self, **kwargs: None  # Node keeps webui_url None: no dashboard
    node.Node.start_monitor = lambda self: None
    try:
        yield
    finally:
        node.Node.start_api_server, node.Node.start_monitor = original_api_server, original_monitor


# Ray 2.60 waits a fixed 30 s for a new node's raylet to register with its GCS (ray/_private/node.py), and raises
# "The current node timed out during startup" after. On a loaded machine (two CPUs running other launches beside
# this one) that wait ran out once in CI; the second start, after the first one's processes are gone, is the fix
# a person would make by hand.
LOCAL_RAY_STARTS = 2


def raylet_timed_out(error: BaseException) -> bool:
    """Ray's own start-up timeout: the one a second start can get past."""
    return "timed out during startup" in str(error)


def stop_started(processes: list[Any]) -> None:
    """Kill what a failed local start left running (each process leads a group of its own: see
    _own_process_group), and reap it."""
    for process in processes:
        try:
            if os.name == "posix":
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
        except (ProcessLookupError, PermissionError):
            pass
    for process in processes:
        try:
            process.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a process that will not go is not worth failing the retry over
            pass


def start_ray(address: str | None, dashboard: bool, num_cpus: int | None, num_gpus: int | None = 0,
              say: Callable[[str], None] | None = None) -> None:
    """Join the cluster at `address`, or start a local one (None: Ray counts the machine's CPUs / GPUs).

    A local start that runs into Ray's start-up timeout is made once more (LOCAL_RAY_STARTS), with `say`
    told why.
    """
    import ray

    if address:
        # A cluster started on loopback (`ray start --node-ip-address=127.0.0.1`) is joined there too.
        with _loopback_node_ip(), _keep_sigterm_handler():
            ray.init(address=address, log_to_driver=True)
        return
    # address="local": always a cluster of our own. With None, ray.init joins the cluster that RAY_ADDRESS or
    # /tmp/ray/ray_current_cluster names (a stray one, another user's), and refuses num_cpus there.
    for attempt in range(1, LOCAL_RAY_STARTS + 1):
        started: list[Any] = []
        lean = nullcontext() if dashboard else _no_dashboard_server_or_monitor()
        try:
            with _loopback_node_ip(), _own_process_group(started), _keep_sigterm_handler(), lean:
                ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=dashboard,
                         num_cpus=num_cpus, num_gpus=num_gpus, log_to_driver=True, configure_logging=False)
            return
        except Exception as error:
            if not raylet_timed_out(error):
                raise
            # ray.shutdown cannot stop a node whose start failed: its processes are stopped here.
            ray.shutdown()
            stop_started(started)
            if attempt == LOCAL_RAY_STARTS:
                raise
            if say is not None:
                # Ray's own words name a failure; the launch goes on, so the note does not repeat them.
                say(f"note: Ray's local start timed out waiting for its raylet to register (Ray waits a fixed 30 s); "
                    f"stopped its {len(started)} processes, starting it again ({attempt + 1} of {LOCAL_RAY_STARTS})")


def device_memory_override(resolved: ResolvedPlan, gpu: LocalGpu | None) -> tuple[str | None, str | None]:
    """(the override that makes the memory checks use this machine's GPU, the note that says so).

    The plan's estimate.gpu_memory_gib describes the GPU it was written for; a launch on a GPU knows
    the real one. (None, None) for a CPU plan or where no GPU is found (the launch then says so).
    """
    if resolved.world.device != "cuda" or gpu is None:
        return None, None
    planned = resolved.config.estimate.gpu_memory_gib
    gib = round(gpu.memory_gib, 1)
    note = f"memory checks use this machine's GPU: {gpu.name}, {gib:g} GiB"
    if abs(planned - gib) >= 0.5:
        note += f" (the plan's estimate.gpu_memory_gib says {planned:g})"
    return f"estimate.gpu_memory_gib={gib:g}", note


def gpu_count() -> int:
    """The GPUs this launch may use here, without importing torch where nvidia-smi answers (the launch then
    starts Ray and the workers' imports before its own)."""
    from rlconf.device import local_gpu_count

    count = local_gpu_count()
    if count is None:
        import torch

        count = torch.cuda.device_count()
    return count


def local_gpu_shortage(resolved: ResolvedPlan) -> MachineShortfall | None:
    """A message when a local run asks for more GPUs than this machine has (None: enough, or a CPU plan)."""
    if resolved.world.device != "cuda":
        return None
    have = gpu_count()
    served = resolved.roles.served_reward_model
    own_pool = served.world_size if served is not None and not served.colocated else 0  # verl's reward_pool
    need = resolved.schedule.total_gpus  # every pool's, the served reward model's own included (rlconf.normalize)
    if have < need:
        pool_note = (f", and {own_pool} more for the served reward model's own pool (reward_model.nnodes × "
                     f"n_gpus_per_node)" if own_pool else "")
        trainer = resolved.world.world_size
        apart = resolved.schedule.rollout_gpus if resolved.schedule.off_policy else 0
        rollout_note = f", plus {apart} for the rollout pool (rollout.nnodes × n_gpus_per_node)" if apart else ""
        return MachineShortfall(
            f"trainer.device=cuda on {need} GPU(s) (trainer.nnodes × trainer.n_gpus_per_node{rollout_note}"
            f"{pool_note}), but this machine has {have}; set trainer.n_gpus_per_node={max(1, have - (need - trainer))}, launch "
            f"on a machine with more, or join a cluster that has them (--address)" if have else
            "trainer.device=cuda, but this machine has no CUDA device; launch on a GPU machine (or join a cluster "
            "with --address), or use trainer.device=cpu")
    return None


def worker_groups(resolved: ResolvedPlan) -> list[tuple[tuple[str, str], str, int, tuple[str, ...]]]:
    """(worker class by module and name, group role, ranks, modules to preload) of every worker group the plan
    starts: spawned as soon as Ray is up, before this process imports the engine's models (engine.workers.
    cluster.lazy), and built when build_trainer calls for them. A group that will start vLLM imports it while
    it waits (seconds on a GPU machine, otherwise inside the rollout engine's start)."""
    roles, roles_module = resolved.roles, "engine.workers.roles"
    vllm = ("vllm",) if resolved.config.actor_rollout_ref.rollout.name == "vllm" else ()
    apart = resolved.schedule.off_policy
    groups = [((f"{roles_module}.actor_rollout_ref", "ActorRolloutRefWorker"), "actor_rollout_ref",
               roles.actor.world_size, () if apart else vllm)]
    if roles.critic is not None:
        groups.append(((f"{roles_module}.critic", "CriticWorker"), "critic", roles.critic.world_size, ()))
    if roles.reward_model is not None:
        groups.append(((f"{roles_module}.reward_model", "RewardModelWorker"), "reward_model",
                       roles.reward_model.world_size, ()))
    if roles.served_reward_model is not None:
        groups.append(((f"{roles_module}.served_reward_model", "ServedRewardModelWorker"), "reward_model",
                       roles.served_reward_model.replicas, ("vllm",)))
    if apart:
        groups.append(((f"{roles_module}.rollout", "RolloutWorker"), "rollout", resolved.schedule.rollout_gpus, vllm))
    return groups


def run_launch(resolved: ResolvedPlan, run_dir: Path | None = None, address: str | None = None,
               dashboard: bool = False, started: float | None = None) -> int:
    """Run the plan; the exit code: 0 done, 1 failed, 130 / 143 stopped by Ctrl-C / SIGTERM (engine.interrupt).

    `started`: time.perf_counter() at the command's start, for timing/startup_total (default: now).
    """
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    with owned_signals(notify=lambda message: console.print(message, style="bold yellow", markup=False)) as signals:
        try:
            code = _launch(resolved, run_dir, address, dashboard, console, signals, StartupClock(console.print, started))
        except KeyboardInterrupt as exc:  # engine.interrupt's Interrupted, or a KeyboardInterrupt from elsewhere
            after = f" after {exc.stage}" if isinstance(exc, Interrupted) and exc.stage else ""
            console.print(f"[bold red]interrupted[/bold red] ({NAMES[signals.first or signal.SIGINT]}): "
                          f"stopped{escape(after)}; the workers and Ray are shut down")
            return signals.exit_code(EXIT_INTERRUPTED)
        if code == EXIT_OK and signals.requested:
            # The signal came after the last stop point (while Ray shut down): the run is complete, but whoever
            # sent it is told it arrived, as a shell expects of a process that got SIGINT / SIGTERM.
            console.print(f"[bold red]interrupted[/bold red] ({NAMES[signals.first or signal.SIGINT]}) while "
                          "shutting down; the run had completed")
            return signals.exit_code(code)
        return code


def _launch(resolved: ResolvedPlan, run_dir: Path | None, address: str | None, dashboard: bool, console: Console,
            signals: StopSignals, startup: StartupClock) -> int:
    # Nothing before Ray imports torch: every worker group is spawned as soon as Ray is up, and imports it (and
    # the rest of the engine) while this process does the same (worker_groups).
    from engine.capabilities import ignored_knob_notes, unsupported_features
    from engine.run_errors import NonFiniteError

    problems = unsupported_features(resolved)
    shortage = local_gpu_shortage(resolved) if address is None else None
    if shortage:
        problems.append(shortage)
    # A local run's ranks all live on this machine: so do the host copies of whatever they offload.
    host = host_memory_note(host_need(resolved), host_memory_bytes()) if address is None else None
    if host is not None and host[1]:
        problems.append(MachineShortfall(host[0]))
    if problems:
        for problem in problems:
            console.print(f"[bold red]error[/bold red]: {escape(problem)}")  # `rlconf[lora]` is no markup
        console.print(f"[bold red]not launching[/bold red]: {escape(closing_line(problems))}")
        return EXIT_FAILED
    for note in ignored_knob_notes(resolved):
        console.print(f"note: {escape(note)}")
    if host is not None:
        console.print(f"[yellow]warning[/yellow]: {escape(host[0])}")

    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(resolved)
    # Which checkpoint to continue from is settled before Ray starts: a wrong resume_from_path costs a second.
    try:
        resume_from, start_step = find_resume_checkpoint(resolved, run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "plan.resolved.json").write_text(resolved.model_dump_json(indent=2) + "\n")
    except (CheckpointError, OSError) as exc:
        console.print(f"[bold red]error[/bold red]: {escape(str(exc))}")
        return EXIT_FAILED
    save_freq = resolved.config.trainer.save_freq
    holds = "checkpoints/" if saves_checkpoints(save_freq) else f"no checkpoints: trainer.save_freq={save_freq}"
    console.print(f"run dir: {escape(str(run_dir))}  (plan.resolved.json, metrics.jsonl, {holds})")
    for note in start_timeline(run_dir, start_step):
        console.print(f"note: {escape(note)}")

    import ray

    from engine.workers.cluster.rendezvous import SharedDirError
    from engine.workers.cluster.group import WorkerFailure
    from engine.workers.cluster.placement import PlacementError, worker_group_factory

    started = time.perf_counter()
    trainer = None
    startup.so_far("plan")  # compiling the plan, the launch's checks, the run directory
    try:
        signals.stop_point("preparing the run directory")
        def note(line: str) -> None:
            console.print(line, markup=False, style="yellow")

        with startup.phase("ray", f"joining the Ray cluster at {address}" if address else "starting a local Ray cluster"):
            if resolved.world.device == "cuda":
                start_ray(address, dashboard, num_cpus=None, num_gpus=None, say=note)
            else:
                # One Ray CPU per worker process: the actor's group plus the critic's and the reward model's
                # (colocated, or on pools of their own).
                processes = sum(role.world_size for role in (resolved.roles.actor, resolved.roles.critic,
                                                             resolved.roles.reward_model) if role is not None)
                if resolved.schedule.off_policy:  # the rollout pool's worker processes
                    processes += resolved.schedule.rollout_gpus
                start_ray(address, dashboard, num_cpus=processes + 1, say=note)
        # start_ray keeps Ray's SIGTERM setter out; this takes the handlers back should Ray set them another way.
        signals.install()
        signals.stop_point("Ray start-up")
        factory = worker_group_factory(resolved, run_dir)
        for spec, role, ranks, preload in worker_groups(resolved):
            factory.spawn(spec, role, ranks, preload)
        with startup.phase("imports", "importing the engine (the workers start meanwhile)"):
            injected_signal_point("imports")  # tests: a Ctrl-C while the engine imports (engine.interrupt)
            from engine.trainer import build_trainer
        signals.stop_point("importing the engine")
        trainer = build_trainer(resolved, run_dir, factory, log=console.print, startup=startup)
        trainer.run_dir = run_dir
        if resume_from is not None:
            with startup.phase("checkpoint_load", f"loading the checkpoint {resume_from}"):
                resume(trainer, resume_from, console)
            signals.stop_point("loading the checkpoint")
        columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("steps", total=trainer.total_steps, completed=trainer.start_step)
            trainer.log = progress.console.print
            trainer.train(on_step=lambda step: progress.update(task, completed=step))
        trainer.log = console.print
        hf_dir = trainer.export_final(run_dir / HF_EXPORT_DIR)  # the optimizers released first: training is over
        console.print(f"exported the actor to {escape(str(hf_dir))} (AutoModelForCausalLM.from_pretrained loads it)")
        signals.stop_point("exporting the actor")
        note = no_checkpoint_note(save_freq)
        if note is not None:  # said last, beside the export, where a user looks for what the run left
            console.print(f"note: {escape(note)}")
        console.print(summary(trainer.history, time.perf_counter() - started))
        return EXIT_OK
    except (WorkerFailure, NonFiniteError, CheckpointError, PlacementError, SharedDirError) as exc:
        where = ""
        if isinstance(exc, WorkerFailure):  # Ray's error text carries the worker's own traceback
            (run_dir / "error.log").write_text(str(exc.cause) + "\n")
            where = f" (the worker's traceback in {run_dir / 'error.log'})"
        console.print(f"[bold red]error[/bold red]: {escape(str(exc) + where)}")
        return EXIT_FAILED
    except Exception as exc:  # the controller itself failed (data, tokenizer, reward function, ...)
        (run_dir / "error.log").write_text(traceback.format_exc())
        console.print(f"[bold red]error[/bold red]: controller failed: {type(exc).__name__}: {exc} "
                      f"(traceback in {run_dir / 'error.log'})")
        return EXIT_FAILED
    finally:
        with signals.cleanup():  # a signal now must not cut the shutdown short: it is what stops the workers
            if trainer is not None:
                trainer.close()
            ray.shutdown()


def find_resume_checkpoint(resolved: ResolvedPlan, run_dir: Path) -> tuple[Path | None, int]:
    """(checkpoint directory, its step) that trainer.resume_mode asks for; (None, 0) to start at step 1."""
    trainer = resolved.config.trainer
    checkpoint = resolve_resume(trainer.resume_mode, trainer.resume_from_path, run_dir)
    if checkpoint is None:
        return None, 0
    return checkpoint, int(read_trainer_state(checkpoint)["step"])


def resume(trainer: Trainer, checkpoint: Path, console: Console) -> None:
    """Load the checkpoint into the workers and the controller; refill the history from metrics.jsonl."""
    loaded = time.perf_counter()
    state = trainer.load_checkpoint(checkpoint)
    step = trainer.start_step
    left = max(0, trainer.total_steps - step)
    console.print(f"resumed from {escape(str(checkpoint))} after step {step} ({time.perf_counter() - loaded:.1f}s); "
                  + (f"{left} step{'s' if left > 1 else ''} to go" if left else
                     "nothing left to train (trainer.resume_mode=disable starts over)"))
    # The summary covers the whole run; metrics.jsonl holds the steps before the checkpoint (start_timeline).
    trainer.history = [m for m in read_metrics(trainer.metrics_file.path) if 1 <= m["step"] <= step]
    expected = state["controller"]["history_length"]
    if len(trainer.history) != expected:
        console.print(f"note: {trainer.metrics_file.path.name} has {len(trainer.history)} of the {expected} steps "
                      "before the checkpoint (was the checkpoint written in another run directory?)")


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def summary(history: list[dict], seconds: float) -> str:
    if not history:
        return f"done: no steps in {seconds:.1f}s"
    k = min(5, len(history))
    first = sum(m["reward/mean"] for m in history[:k]) / k
    last = sum(m["reward/mean"] for m in history[-k:]) / k
    return (f"done: {len(history)} steps in {seconds:.1f}s; mean reward first {k} steps {first:.3f} "
            f"-> last {k} steps {last:.3f}")
