"""A dedicated thread for control ticks, woken by the node's timer.

Inference never runs on an executor thread: the executor only stores inputs
and wakes this worker, so no subscription ever waits on the GPU, and a slow
tick cannot starve the executor (or be starved by it: on small machines a
busy multi-threaded rclpy executor holds the GIL for much of the time).
Wake-ups that arrive while a tick runs coalesce into one, as an overrunning
ROS timer would. An exception in a tick is reported and the worker goes on.
"""
from __future__ import annotations

import threading
from typing import Callable


class TickWorker:
    def __init__(self, tick: Callable[[], None], on_error: Callable[[BaseException], None],
                 name: str = 'vla_policy_tick') -> None:
        self._tick = tick
        self._on_error = on_error
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Ask for one tick (called from the timer callback; returns at once)."""
        self._wake.set()

    def stop(self, timeout_sec: float = 30.0) -> bool:
        """Finish the tick in flight, run no more; returns whether the thread ended in time."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_sec)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            if self._stopping:
                return
            self._wake.clear()
            try:
                self._tick()
            except Exception as exc:  # a bug in one tick must not stop the robot's control loop
                try:
                    self._on_error(exc)
                except Exception:  # noqa: S110 - the report itself failed (e.g. during shutdown)
                    pass
