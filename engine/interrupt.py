"""Ctrl-C and SIGTERM during `rlconf launch`: the driver owns both signals, from its start to its exit.

First signal: a stop is requested, and the run stops at the next stop point, after the stage in
progress (Ray start-up, model loading, a generate, an update, a checkpoint write): that stage
finishes, so nothing is left half-written, then the launch shuts the workers and Ray down and
exits 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
Second signal: stop at once (`Interrupted` is raised wherever the driver is).
While the launch shuts Ray down, signals are only counted: that clean-up is what keeps worker
processes from outliving the command.

Python's own KeyboardInterrupt is not enough: it is raised wherever the main thread happens to be
and can be lost there, a parent that ignores SIGINT leaves it ignored, and ray.init replaces the
SIGTERM handler with one that exits 15 at once. So the handlers here set a flag; engine.launch
keeps Ray's handler out during ray.init and calls `install` again after it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class Interrupted(KeyboardInterrupt):
    """The run stops because of a signal (`signum`); `stage`: the stage it stopped after, if it got there."""

    def __init__(self, signum: int, stage: str | None = None) -> None:
        self.signum, self.stage = signum, stage
        super().__init__(f"{NAMES.get(signum, signum)}" + (f" after {stage}" if stage else ""))


class StopSignals:
    """What the signal handlers saw; one per launch (signal handlers are per process)."""

    def __init__(self, notify: Callable[[str], None] = lambda message: None) -> None:
        self.notify = notify  # tells the user what a signal did (called from the handler, in the main thread)
        self.first: int | None = None  # the first signal's number: it decides the exit code
        self.count = 0
        self.raised = False  # the second signal raised once already; later ones only count
        self.cleaning_up = False
        self._wakeup: tuple[int, int] | None = None  # (read end, write end) of the pipe that counts signals
        self.previous_wakeup_fd = -1

    @property
    def requested(self) -> bool:
        return self.first is not None

    def exit_code(self, default: int) -> int:
        return 128 + self.first if self.first is not None else default

    def handle(self, signum: int, _frame: object = None) -> None:
        for arrived in self._arrived(signum):
            self._one(arrived)

    def _one(self, signum: int) -> None:
        self.count += 1
        name = NAMES.get(signum, str(signum))
        if self.first is None:
            self.first = signum
            if not self.cleaning_up:
                self.notify(f"{name}: stopping after the current stage ({name} again to stop at once)")
            return
        if self.cleaning_up or self.raised:
            return
        self.raised = True
        self.notify(f"{name} again: stopping now")
        raise Interrupted(self.first)

    def _arrived(self, signum: int) -> list[int]:
        """The signals this handler call stands for, in the order they arrived.

        Python runs a handler once for signals that arrive before the main thread gets to it, and
        in a blocking Ray call it gets there once a second: a quick double Ctrl-C would be one, and
        of a SIGTERM then a SIGINT the SIGINT's handler would run first (lower number). The wakeup
        fd receives a byte per signal, its number, so both the count and the order survive.
        """
        if self._wakeup is None:
            return [signum]
        try:
            arrived = [byte for byte in os.read(self._wakeup[0], 512) if byte in SIGNALS]
        except BlockingIOError:
            arrived = []
        if not arrived and signal.set_wakeup_fd(self._wakeup[1], warn_on_full_buffer=False) != self._wakeup[1]:
            return [signum]  # someone had replaced the wakeup fd (now ours again): this call is one signal
        return arrived  # []: an earlier call of the handler already took this signal's byte

    def install(self) -> None:
        """(Re)take SIGINT and SIGTERM: call at start, and after anything that may have replaced the handlers."""
        if threading.current_thread() is not threading.main_thread():
            return  # Python sets signal handlers from the main thread only
        if os.name == "posix":
            first = self._wakeup is None
            if self._wakeup is None:
                self._wakeup = os.pipe()
                for fd in self._wakeup:
                    os.set_blocking(fd, False)
            previous = signal.set_wakeup_fd(self._wakeup[1], warn_on_full_buffer=False)
            if first:  # the one to restore: not one that someone set while the launch ran
                self.previous_wakeup_fd = previous
        for signum in SIGNALS:
            signal.signal(signum, self.handle)  # also over SIG_IGN inherited from the parent (a `cmd &` in a script)
        if hasattr(signal, "pthread_sigmask"):  # and a mask inherited blocked would keep them pending forever
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)

    def uninstall(self, previous_handlers: dict[int, Any]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if self._wakeup is not None:
            signal.set_wakeup_fd(self.previous_wakeup_fd)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def stop_point(self, stage: str) -> None:
        """Raise Interrupted if a stop was requested: the run ends here, after `stage`."""
        if self.first is not None and not self.cleaning_up:
            raise Interrupted(self.first, stage)

    @contextmanager
    def cleanup(self) -> Iterator[None]:
        """Signals while the body runs (shutting Ray down) are counted, not acted on."""
        self.cleaning_up = True
        try:
            yield
        finally:
            self.cleaning_up = False


_active: StopSignals | None = None


def stop_point(stage: str) -> None:
    """Where the trainer may stop: between stages. A no-op unless a launch owns the signals."""
    if _active is not None:
        _active.stop_point(stage)


@contextmanager
def owned_signals(notify: Callable[[str], None] = lambda message: None) -> Iterator[StopSignals]:
    """SIGINT and SIGTERM handled by a StopSignals for the body; the previous handlers afterwards.

    Nested use (the CLI takes the signals before compiling, run_launch again) shares the outer one.
    """
    global _active
    if _active is not None:
        yield _active
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    signals = StopSignals(notify)
    signals.install()
    claim_injected_signal()
    _active = signals
    try:
        yield signals
    finally:
        _active = None
        signals.uninstall(previous)


# --- tests: a signal that lands inside a given stage ----------------------------------------------
#
# With RLCONF_INJECT_SIGNAL=<where>@<call>:<SIGNAL>[x2] (e.g. `generate@2:SIGINT`), the process that
# makes the <call>-th call of <where> sends SIGNAL to the launch's process group, as a terminal's
# Ctrl-C does, then waits a moment so the stage is still in progress when the driver sees it, and
# goes on; `x2` sends a second one 0.3 s later (a quick double Ctrl-C). <where> is a method of rank 0 of a worker
# group (init_model, generate, update_actor, save_checkpoint, ...: the driver sits in a blocking
# Ray call meanwhile), or, in the driver, `ray_start` (inside ray.init, when Ray's first process has
# started) or `imports` (as it imports the engine, its workers spawned). The driver adds its process group to the variable before Ray starts, and its workers
# inherit it. tests/engine/test_interrupt.py uses this; unset, nothing here runs.

INJECT_SIGNAL_ENV = "RLCONF_INJECT_SIGNAL"
INJECT_SIGNAL_SETTLE_S = 0.5
INJECT_SIGNAL_GAP_S = 0.3  # between the two signals of `x2`: a quick double Ctrl-C
_calls: dict[str, int] = {}


@dataclass(frozen=True)
class InjectedSignal:
    where: str
    call: int
    signum: int
    times: int
    pgid: int | None

    @classmethod
    def from_env(cls) -> InjectedSignal | None:
        spec = os.environ.get(INJECT_SIGNAL_ENV)
        if not spec:
            return None
        target, _, rest = spec.partition(":")
        where, _, call = target.partition("@")
        name, _, pgid = rest.partition(":")
        name, _, times = name.partition("x")
        return cls(where, int(call or 1), int(getattr(signal, name)), int(times or 1), int(pgid) if pgid else None)


def claim_injected_signal() -> None:
    """The driver: make an injected signal reach this process's group (the launch's)."""
    found = InjectedSignal.from_env()
    if found is not None and found.pgid is None:
        os.environ[INJECT_SIGNAL_ENV] += f":{os.getpgid(0)}"


def injected_signal_point(where: str) -> None:
    found = InjectedSignal.from_env()
    if found is None or found.where != where or found.pgid is None:
        return
    _calls[where] = _calls.get(where, 0) + 1
    if _calls[where] != found.call:
        return
    for i in range(found.times):
        if i:  # apart enough to be two signals for the kernel, close enough to be one handler call for Python
            time.sleep(INJECT_SIGNAL_GAP_S)
        os.killpg(found.pgid, found.signum)
    time.sleep(INJECT_SIGNAL_SETTLE_S)


def with_injected_signal(worker_cls: type) -> type:
    """`worker_cls`, or a subclass whose rank 0 calls injected_signal_point(<method>) first when a test asks for it."""
    found = InjectedSignal.from_env()
    if found is None or not callable(getattr(worker_cls, found.where, None)):
        return worker_cls
    method = getattr(worker_cls, found.where)

    def signalled(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "rank", 0) == 0:
            injected_signal_point(found.where)
        return method(self, *args, **kwargs)

    return type(worker_cls.__name__, (worker_cls,), {found.where: signalled, "__qualname__": worker_cls.__qualname__})
