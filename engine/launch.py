"""`rlconf launch`: run directory, resolved plan on disk, a Ray cluster, the trainer, a clean exit.

Every way out (success, Ctrl-C, a failed worker, a non-finite loss) ends with ray.shutdown(), so
no worker process outlives the command; failures print one line that names the role.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlconf.resolved import ResolvedPlan

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


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


def start_ray(address: str | None, dashboard: bool, num_cpus: int) -> None:
    import ray

    if address:
        ray.init(address=address, log_to_driver=True)
        return
    with _loopback_node_ip():
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=dashboard, num_cpus=num_cpus, num_gpus=0,
                 log_to_driver=True, configure_logging=False)


def run_launch(resolved: ResolvedPlan, run_dir: Path | None = None, address: str | None = None,
               dashboard: bool = False) -> int:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    from engine.trainer import NonFiniteError, build_trainer, unsupported_features

    problems = unsupported_features(resolved)
    if problems:
        for problem in problems:
            console.print(f"[bold red]error[/bold red]: {problem}")
        console.print("[bold red]not launching[/bold red]: the plan is valid, but this engine cannot run it yet")
        return EXIT_FAILED

    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(resolved)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.resolved.json").write_text(resolved.model_dump_json(indent=2) + "\n")
    console.print(f"run dir: {run_dir}  (plan.resolved.json, metrics.jsonl)")

    import ray

    from engine.workers.group import RayWorkerGroup, WorkerFailure

    world = resolved.world.world_size
    started = time.perf_counter()
    trainer = None
    try:
        start_ray(address, dashboard, num_cpus=world + 1)
        trainer = build_trainer(resolved, run_dir, RayWorkerGroup, log=console.print)
        columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("steps", total=trainer.total_steps)
            trainer.log = progress.console.print
            trainer.train(on_step=lambda step: progress.update(task, completed=step))
        console.print(summary(trainer.history, time.perf_counter() - started))
        return EXIT_OK
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/bold red]: stopping the workers (Ctrl-C)")
        return EXIT_INTERRUPTED
    except WorkerFailure as exc:
        console.print(f"[bold red]error[/bold red]: {exc}")
        return EXIT_FAILED
    except NonFiniteError as exc:
        console.print(f"[bold red]error[/bold red]: {exc}")
        return EXIT_FAILED
    except Exception as exc:  # the controller itself failed (data, tokenizer, reward function, ...)
        (run_dir / "error.log").write_text(traceback.format_exc())
        console.print(f"[bold red]error[/bold red]: controller failed: {type(exc).__name__}: {exc} "
                      f"(traceback in {run_dir / 'error.log'})")
        return EXIT_FAILED
    finally:
        if trainer is not None:
            trainer.metrics_file.close()
        ray.shutdown()


def summary(history: list[dict], seconds: float) -> str:
    if not history:
        return f"done: no steps in {seconds:.1f}s"
    k = min(5, len(history))
    first = sum(m["reward/mean"] for m in history[:k]) / k
    last = sum(m["reward/mean"] for m in history[-k:]) / k
    return (f"done: {len(history)} steps in {seconds:.1f}s; mean reward first {k} steps {first:.3f} "
            f"-> last {k} steps {last:.3f}")
