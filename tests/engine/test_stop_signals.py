"""engine.interrupt in this process: what the first and second SIGINT / SIGTERM do, with no Ray (fast)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from engine.interrupt import (
    INJECT_SIGNAL_ENV,
    Interrupted,
    StopSignals,
    owned_signals,
    stop_point,
    with_injected_signal,
)


def deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # Python runs the handler at the next check, within this sleep


def test_the_first_signal_requests_a_stop_that_the_next_stop_point_raises() -> None:
    notices: list[str] = []
    with owned_signals(notify=notices.append) as signals:
        deliver(signal.SIGINT)
        assert signals.requested and signals.exit_code(0) == 130
        with pytest.raises(Interrupted) as stopped:
            stop_point("generate (step 2)")
    assert stopped.value.stage == "generate (step 2)" and stopped.value.signum == signal.SIGINT
    assert notices == ["Ctrl-C: stopping after the current stage (Ctrl-C again to stop at once)"]


def test_the_second_signal_stops_at_once_and_sigterm_exits_143() -> None:
    with owned_signals() as signals:
        deliver(signal.SIGTERM)
        with pytest.raises(Interrupted):
            deliver(signal.SIGINT)
        assert signals.exit_code(0) == 143  # the first signal decides
        deliver(signal.SIGINT)  # a third: the run is already stopping; nothing more is raised


def test_signals_that_reach_one_handler_call_count_each_in_the_order_they_arrived() -> None:
    """A SIGTERM then a SIGINT during one blocking Ray call: Python runs a handler once, the SIGINT's (the lower
    number) first. The C-level handler has written a byte per signal into the wakeup fd; simulated here."""
    with owned_signals() as signals:
        assert signals._wakeup is not None
        os.write(signals._wakeup[1], bytes([signal.SIGTERM, signal.SIGINT]))
        with pytest.raises(Interrupted):  # two signals: the second stops at once
            signals.handle(signal.SIGINT)
        assert signals.count == 2 and signals.exit_code(0) == 143  # the first to arrive decides
        signals.handle(signal.SIGTERM)  # the SIGTERM's own handler call: its byte was taken already
        assert signals.count == 2


def test_a_signal_while_a_completed_run_shuts_down_still_exits_with_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.launch

    def completed_run(resolved, run_dir, address, dashboard, console, signals, startup) -> int:
        assert isinstance(signals, StopSignals)
        with signals.cleanup():  # past the last stop point: Ray is shutting down
            deliver(signal.SIGTERM)
        return engine.launch.EXIT_OK

    monkeypatch.setattr(engine.launch, "_launch", completed_run)
    assert engine.launch.run_launch(None) == 143  # type: ignore[arg-type]


def test_signals_during_the_clean_up_are_only_counted() -> None:
    with owned_signals() as signals:
        deliver(signal.SIGINT)
        with signals.cleanup():
            deliver(signal.SIGINT)
            deliver(signal.SIGINT)
            stop_point("anything")  # no raise while Ray shuts down
        assert signals.count == 3


def test_an_ignored_sigint_inherited_from_the_parent_is_taken_back_and_restored_after() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with owned_signals() as signals:
            deliver(signal.SIGINT)
            assert signals.requested
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd went back to none
    finally:
        signal.signal(signal.SIGINT, previous)


def test_stop_points_do_nothing_outside_a_launch() -> None:
    stop_point("generate (step 1)")


class Worker:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def generate(self, prompts: list[str]) -> list[str]:
        return prompts


def test_worker_classes_are_unchanged_unless_a_test_injects_a_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INJECT_SIGNAL_ENV, raising=False)
    assert with_injected_signal(Worker) is Worker
    monkeypatch.setenv(INJECT_SIGNAL_ENV, "generate@1:SIGINT")  # no process group yet: nothing is sent
    injected = with_injected_signal(Worker)
    assert injected is not Worker and injected.__name__ == "Worker"
    assert injected(rank=0).generate(["a"]) == ["a"]
