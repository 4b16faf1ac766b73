"""The node's control timer on bag time: when ticks fall due among a bag's messages.

    messages (time order) --on_bag_time--> msg, msg, Due(t), msg, Due(t + period), ...

One rule for everything that runs the node's ticks over a recording (the offline replay, the
LeRobotDataset converter): the first tick is one period after the first message (the node activates, then
its timer fires), the next ones every period on the grid, and a tick due at a message's time runs before
that message is delivered, as a message stamped at the tick has not reached the node's callbacks yet.
No tick runs after the last message.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Optional, Set, Union

from ..observation import InputLayout
from .bag_io import BagMessage


# The topic of the recorded command (what the arm was told) that the replay scores against and the converter
# takes as the action, unless told another.
DEFAULT_COMMAND_TOPIC = '/joint_command'


@dataclass(frozen=True)
class Due:
    """A control tick that falls due at ``time_ns`` (bag time)."""

    time_ns: int


def on_bag_time(messages: Iterable[BagMessage], period_ns: int) -> Iterator[Union[BagMessage, Due]]:
    """The messages in order, with a ``Due`` before each message for every tick due up to its time."""
    next_tick: Optional[int] = None
    for message in messages:
        if next_tick is None:
            next_tick = message.timestamp_ns + period_ns
        while next_tick <= message.timestamp_ns:
            yield Due(next_tick)
            next_tick += period_ns
        yield message


def replayed_topics(layout: InputLayout, available: Mapping[str, str], extra: Optional[str] = None) -> Set[str]:
    """The topics a replay reads: every input of the layout the bag has, plus ``extra`` (a command topic).
    They set the tick grid (its first message), so everything ticking over one bag reads the same set."""
    wanted = set(layout.by_topic()) & set(available)
    if extra:
        wanted.add(extra)
    return wanted
