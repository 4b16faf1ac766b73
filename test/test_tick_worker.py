"""The tick thread: requests coalesce while a tick runs, a failing tick does not stop it, stop waits."""
import threading
import time

from vla_policy_node.ros.tick_worker import TickWorker


def _wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


def test_requests_during_a_tick_coalesce_into_one():
    started, release = threading.Event(), threading.Event()
    ticks = []

    def tick():
        ticks.append(1)
        started.set()
        release.wait(5)

    worker = TickWorker(tick, on_error=lambda exc: None)
    worker.request()
    assert started.wait(5)
    for _ in range(10):  # the timer keeps firing while inference is slow
        worker.request()
    release.set()
    assert _wait_for(lambda: len(ticks) == 2)
    time.sleep(0.1)
    assert len(ticks) == 2  # one more tick for all ten requests, not ten
    assert worker.stop()


def test_a_failing_tick_is_reported_and_the_worker_goes_on():
    errors, ticks = [], []

    def tick():
        ticks.append(1)
        if len(ticks) == 1:
            raise RuntimeError('model exploded')

    worker = TickWorker(tick, on_error=errors.append)
    worker.request()
    assert _wait_for(lambda: len(errors) == 1)
    worker.request()
    assert _wait_for(lambda: len(ticks) == 2)
    assert [str(e) for e in errors] == ['model exploded']
    assert worker.stop()


def test_stop_lets_the_tick_in_flight_finish_and_runs_no_more():
    finished, ticks = [], []

    def tick():
        ticks.append(1)
        time.sleep(0.2)
        finished.append(1)

    worker = TickWorker(tick, on_error=lambda exc: None)
    worker.request()
    assert _wait_for(lambda: ticks)
    assert worker.stop()
    assert finished == [1]
    worker.request()
    time.sleep(0.1)
    assert ticks == [1]
