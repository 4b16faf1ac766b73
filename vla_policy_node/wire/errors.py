"""What can go wrong with a remote policy: each kind its own SkipReason, so each is counted apart."""
from __future__ import annotations

from ..observation import ObservationError, SkipReason

TIMEOUT = SkipReason.REMOTE_TIMEOUT
UNREACHABLE = SkipReason.REMOTE_UNREACHABLE
DISCONNECTED = SkipReason.REMOTE_DISCONNECTED
ERROR_FRAME = SkipReason.REMOTE_ERROR
AUTH = SkipReason.REMOTE_AUTH
BAD_REPLY = SkipReason.REMOTE_BAD_REPLY
KINDS = (TIMEOUT, UNREACHABLE, DISCONNECTED, ERROR_FRAME, AUTH, BAD_REPLY)
MESSAGE_CHARS = 300             # how much of a server's error text a log line carries


class RemoteError(ObservationError):
    """A remote fault: the tick is skipped with ``reason`` (TickEngine turns ObservationError into SkipTick)."""

    def __init__(self, kind: SkipReason, message: str) -> None:
        text = ' '.join(str(message).split())
        super().__init__('remote', text[:MESSAGE_CHARS] + ('...' if len(text) > MESSAGE_CHARS else ''), kind)
