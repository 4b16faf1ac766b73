"""Thin, ROS-free helpers around ``rosbags`` for reading and writing rosbag2 bags.

Nothing here imports rclpy, so bags can be generated and inspected on machines
without a ROS install (CI, laptops). Messages are CDR, which is byte-compatible
with rclpy's serialisation, so raw bytes read here can be published as-is.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Union

from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

PathLike = Union[str, Path]

STORAGE_PLUGINS = {
    'sqlite3': StoragePlugin.SQLITE3,
    'mcap': StoragePlugin.MCAP,
}

# rosbag2 writes this version; ``Writer`` insists on the keyword.
BAG_VERSION = 9


class BagError(RuntimeError):
    """A bag is missing, malformed, or lacks the topics/types a caller needs."""


@functools.lru_cache(maxsize=None)
def get_kilted_typestore():
    """Return the shared ROS 2 Kilted typestore (built on first use: it is slow-ish)."""
    return get_typestore(Stores.ROS2_KILTED)


def __getattr__(name: str) -> Any:
    # Module-level ``TYPESTORE`` built lazily (PEP 562), so importing this
    # module stays cheap for callers that never touch a bag.
    if name == 'TYPESTORE':
        return get_kilted_typestore()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _bag_dir(path: PathLike) -> Path:
    """Resolve ``path`` to a rosbag2 folder, or raise a BagError that says what is expected."""
    candidate = Path(path)
    # Accept the storage file itself (bag/bag_0.db3) as a convenience.
    if candidate.is_file() and (candidate.parent / 'metadata.yaml').is_file():
        candidate = candidate.parent
    if not (candidate / 'metadata.yaml').is_file():
        raise BagError(f'no rosbag2 bag at {path} (expected a folder with metadata.yaml)')
    return candidate


@contextlib.contextmanager
def open_bag_reader(path: PathLike) -> Iterator[AnyReader]:
    """Open a rosbag2 bag (sqlite3 or mcap) and yield a rosbags ``AnyReader``.

    AnyReader registers message definitions embedded in the bag, so custom types
    deserialise too; Kilted's built-ins cover bags without embedded definitions.
    """
    bag_dir = _bag_dir(path)
    try:
        reader = AnyReader([bag_dir], default_typestore=get_kilted_typestore())
        reader.open()
    except BagError:
        raise
    except Exception as err:  # rosbags raises several unrelated error types
        raise BagError(f'cannot open bag {bag_dir}: {_one_line(str(err))}') from err
    try:
        yield reader
    finally:
        reader.close()


def _one_line(text: str) -> str:
    """A foreign error message on one line (YAML errors span several, with a caret under the column)."""
    return ' '.join(part for part in (line.strip().lstrip('^').strip() for line in text.splitlines()) if part)


def storage_of(path: PathLike) -> str:
    """Return the bag's storage plugin name: 'sqlite3' or 'mcap'."""
    bag_dir = _bag_dir(path)
    suffixes = {p.suffix for p in bag_dir.iterdir() if p.is_file()}
    # The file suffix is authoritative and avoids parsing metadata.yaml here.
    if '.mcap' in suffixes:
        return 'mcap'
    if '.db3' in suffixes:
        return 'sqlite3'
    raise BagError(f'bag {bag_dir} has neither a .db3 nor an .mcap file')


def bag_topics(path: PathLike) -> Dict[str, str]:
    """Return ``{topic: msgtype}`` for every topic in the bag."""
    with open_bag_reader(path) as reader:
        return {conn.topic: conn.msgtype for conn in reader.connections}


def message_count(path: PathLike, topics: Iterable[str]) -> int:
    """How many messages the bag holds on ``topics`` (from its metadata; for progress bars)."""
    wanted = set(topics)
    with open_bag_reader(path) as reader:
        return sum(int(conn.msgcount) for conn in reader.connections if conn.topic in wanted)


def _describe_topics(topics: Mapping[str, str]) -> str:
    if not topics:
        return '(no topics)'
    return ', '.join(f'{name} ({msgtype})' for name, msgtype in sorted(topics.items()))


def require_topics(path: PathLike, topics: Mapping[str, Optional[str]]) -> Dict[str, str]:
    """Check the bag has each topic (with the expected type, when one is given).

    Returns the bag's full ``{topic: msgtype}`` map; raises BagError naming the
    problem and listing what the bag does have, so a typo is easy to spot.
    """
    available = bag_topics(path)
    for topic, expected_type in topics.items():
        if topic not in available:
            raise BagError(
                f'topic {topic} is not in the bag; it has: {_describe_topics(available)}')
        actual_type = available[topic]
        if expected_type is not None and actual_type != expected_type:
            raise BagError(
                f'topic {topic} has type {actual_type} in the bag, expected {expected_type}')
    return available


@dataclass
class BagMessage:
    """One recorded message: raw CDR bytes plus a lazily deserialised view."""

    topic: str
    msgtype: str
    timestamp_ns: int
    raw: bytes
    _deserialize: Any = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def msg(self) -> Any:
        """The rosbags message object (deserialised on first access, then cached)."""
        if self._deserialize is None:
            return get_kilted_typestore().deserialize_cdr(self.raw, self.msgtype)
        return self._deserialize(self.raw, self.msgtype)


def read_messages(path: PathLike, topics: Optional[Iterable[str]] = None) -> Iterator[BagMessage]:
    """Yield the bag's messages in timestamp order, optionally only some topics.

    Requested topics that the bag lacks raise BagError rather than silently
    yielding nothing.
    """
    wanted = None if topics is None else list(topics)
    # Validate now, not on the first next(), so a bad path/topic fails at the call site.
    if wanted is None:
        _bag_dir(path)
    else:
        require_topics(path, {topic: None for topic in wanted})
    return _iter_messages(path, wanted)


def _iter_messages(path: PathLike, wanted: Optional[list]) -> Iterator[BagMessage]:
    with open_bag_reader(path) as reader:
        connections = [
            conn for conn in reader.connections if wanted is None or conn.topic in wanted
        ]
        if not connections:
            return
        # AnyReader swaps in an empty typestore on close, so keep the one that
        # knows this bag's types for BagMessage.msg accessed after iteration.
        deserialize = reader.typestore.deserialize_cdr
        for conn, timestamp_ns, raw in reader.messages(connections=connections):
            # mcap storage may hand out memoryviews; rclpy's publish() needs bytes.
            yield BagMessage(
                topic=conn.topic,
                msgtype=conn.msgtype,
                timestamp_ns=int(timestamp_ns),
                raw=bytes(raw),
                _deserialize=deserialize,
            )


class BagWriter:
    """Context manager that writes a new rosbag2 bag with rosbags' Writer.

    Usage::

        with BagWriter('out_bag', storage='mcap') as bag:
            bag.add_topic('/instruction', 'std_msgs/msg/String')
            bag.write('/instruction', t_ns, String(data='hi'))
    """

    def __init__(self, path: PathLike, storage: str = 'sqlite3') -> None:
        if storage not in STORAGE_PLUGINS:
            raise BagError(
                f'unknown storage {storage!r}; expected one of {sorted(STORAGE_PLUGINS)}')
        self.path = Path(path)
        if self.path.exists():
            # Refuse early with our own message; rosbags would also refuse.
            raise BagError(f'{self.path} already exists; refusing to overwrite a bag')
        self.storage = storage
        self._writer: Optional[Writer] = None
        self._connections: Dict[str, Any] = {}

    def __enter__(self) -> 'BagWriter':
        self.open()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def open(self) -> None:
        """Create the bag folder; called by ``__enter__``."""
        self._writer = Writer(
            self.path, version=BAG_VERSION, storage_plugin=STORAGE_PLUGINS[self.storage])
        self._writer.open()

    def close(self) -> None:
        """Finish the bag (writes metadata.yaml); safe to call twice."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _require_open(self) -> Writer:
        if self._writer is None:
            raise BagError('BagWriter is not open; use it as a context manager')
        return self._writer

    def add_topic(self, topic: str, msgtype: str) -> None:
        """Register ``topic`` with a message type known to the Kilted typestore."""
        writer = self._require_open()
        if topic in self._connections:
            raise BagError(f'topic {topic} was already added')
        typestore = get_kilted_typestore()
        if msgtype not in typestore.types:
            raise BagError(f'unknown message type {msgtype} (not in the ROS 2 Kilted typestore)')
        self._connections[topic] = writer.add_connection(topic, msgtype, typestore=typestore)

    def write(self, topic: str, timestamp_ns: int, msg: Any) -> None:
        """Write a rosbags message object (or already-serialised CDR bytes)."""
        writer = self._require_open()
        connection = self._connections.get(topic)
        if connection is None:
            raise BagError(f'topic {topic} was not added; call add_topic first')
        if isinstance(msg, (bytes, bytearray, memoryview)):
            raw = bytes(msg)
        else:
            raw = get_kilted_typestore().serialize_cdr(msg, connection.msgtype)
        writer.write(connection, int(timestamp_ns), raw)
