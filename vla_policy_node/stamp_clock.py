"""One timed input's stamps against the node's receive times: the delay the node can know, and clock jumps.

Every message of a camera (and of the joint states) with a header stamp gives a delay: receive time - header
stamp, the input's clock offset plus how long delivery took. ``StampClock`` keeps, per input:

- the floor: a low order statistic of the recent delays (the (OUTLIERS + 1)-th smallest of the messages of
  the last FLOOR_SEC, at least MIN_MESSAGES and at most DELAY_WINDOW of them): the clock offset plus the
  fastest delivery, the delay the node can know. A message or two with a glitched stamp do not move it (the
  plain smallest did, for DELAY_WINDOW messages); a clock drifting behind is followed within FLOOR_SEC.
- jumps: a message whose delay departs from the floor by more than JUMP_SEC, either way, starts a run. A
  delivery stall only ever raises delays, and only for as long as the stall; a clock step (NTP, PTP, a
  driver restart) moves every later delay by the same amount. So once a run has lasted CONFIRM_SEC of
  receive time over CONFIRM_MESSAGES messages (the new offset holds), it is a jump: the window restarts on
  the run, the jump is reported, and messages are timed on the new offset. A message back within JUMP_SEC
  of the floor ends a run early: its messages were outliers (a glitched stamp, a stall), set aside.

While a run is open its messages are *unsettled*: the floor is the last one that held, and a message it
would judge too old or from the future is refused as a clock jump (observation.py), never timed from the
floor the jump made stale. Steps smaller than JUMP_SEC are absorbed by the floor: one ahead at once (after
OUTLIERS + 1 messages), one behind as the window turns over.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Deque, List, Optional, Tuple

NS_PER_SEC = 1_000_000_000
# Per input, the floor is taken over the messages of the last FLOOR_SEC, at least MIN_MESSAGES (a slow
# camera) and at most DELAY_WINDOW of them.
FLOOR_SEC = 2.0
DELAY_WINDOW = 100
# The floor ignores this many of the smallest delays in the window: a glitched stamp or two.
OUTLIERS = 2
MIN_MESSAGES = 2 * OUTLIERS + 1
# A delay this far from the floor is no delivery jitter: larger than the stalls of a loaded machine's
# executor, smaller than any useful max_image_age_sec.
JUMP_SEC = 0.5
# A departure is a jump (not a glitch, not a stall) once it has held this long over this many messages.
CONFIRM_SEC = 0.5
CONFIRM_MESSAGES = 3


@dataclass(frozen=True)
class ClockEvent:
    """A confirmed jump, or a run of outliers that ended: which input, how far its stamps moved against their
    receive times (positive: stamped later, i.e. ahead) and over how many messages."""

    input: str             # camera name, or 'joint_states'
    topic: str
    jump: bool             # True: a jump (the estimate restarted); False: outliers set aside
    shift_ns: int
    messages: int

    def describe(self) -> str:
        shift = self.shift_ns / NS_PER_SEC
        direction = 'ahead of' if shift > 0 else 'behind'
        if self.jump:
            return (f'the stamps on {self.topic} jumped {abs(shift):.3f} s {direction} their receive times (a clock '
                    f'step, held over {self.messages} messages): its clock estimate restarts on the new offset')
        return (f'{self.messages} message(s) on {self.topic} stamped {abs(shift):.3f} s {direction} the clock of '
                'the messages around them were set aside (a glitched stamp, or a delivery stall)')


class StampClock:
    """The floor of one input's delays and its open run of departures (see the module docstring)."""

    def __init__(self) -> None:
        self._window: Deque[Tuple[int, int]] = collections.deque(maxlen=DELAY_WINDOW)   # (receive, delay)
        self._run: List[Tuple[int, int]] = []
        self.floor: Optional[int] = None

    @property
    def departure_ns(self) -> int:
        """How far the open run's delays sit from the floor (0 without a run)."""
        return min(delay for _, delay in self._run) - self.floor if self._run and self.floor is not None else 0

    def observe(self, header_ns: int, receive_ns: int, input_name: str = '',
                topic: str = '') -> Optional[ClockEvent]:
        """Account for one message; returns the event it completes (a jump, or outliers that ended)."""
        delay = receive_ns - header_ns
        if self.floor is None or not self._settled():
            self._accept(receive_ns, delay)
            return None
        if abs(delay - self.floor) <= JUMP_SEC * NS_PER_SEC:
            event = self._end_run(input_name, topic)
            self._accept(receive_ns, delay)
            return event
        event = None
        if self._run and abs(delay - min(d for _, d in self._run)) > JUMP_SEC * NS_PER_SEC:
            event = self._end_run(input_name, topic)         # not the same offset as the run: outliers, a new run
        self._run.append((receive_ns, delay))
        if len(self._run) >= CONFIRM_MESSAGES and receive_ns - self._run[0][0] >= CONFIRM_SEC * NS_PER_SEC:
            shift = self.floor - min(d for _, d in self._run)
            messages = len(self._run)
            self._window.clear()
            for entry in self._run:
                self._window.append(entry)
            self._run = []
            self._update_floor()
            return ClockEvent(input_name, topic, True, shift, messages)
        return event

    def _settled(self) -> bool:
        """The window is a floor to judge by: CONFIRM_MESSAGES over CONFIRM_SEC (before that, at start-up, every
        message shapes the floor: the first ones may well have been delivered slowly)."""
        return (len(self._window) >= CONFIRM_MESSAGES
                and self._window[-1][0] - self._window[0][0] >= CONFIRM_SEC * NS_PER_SEC)

    def _end_run(self, input_name: str, topic: str) -> Optional[ClockEvent]:
        if not self._run:
            return None
        event = ClockEvent(input_name, topic, False, -self.departure_ns, len(self._run))
        self._run = []
        return event

    def _accept(self, receive_ns: int, delay: int) -> None:
        self._window.append((receive_ns, delay))
        while len(self._window) > MIN_MESSAGES and receive_ns - self._window[0][0] > FLOOR_SEC * NS_PER_SEC:
            self._window.popleft()
        self._update_floor()

    def _update_floor(self) -> None:
        delays = sorted(delay for _, delay in self._window)
        # A lower median while the window is small (a slow first message must not set the floor), then the
        # (OUTLIERS + 1)-th smallest.
        self.floor = delays[min(OUTLIERS, (len(delays) - 1) // 2)]
