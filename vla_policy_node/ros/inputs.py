"""The node's input subscriptions: every message goes into the InputBuffer, stamped on the node's clock."""
from __future__ import annotations

from typing import Any, Callable, List

from rclpy.node import Node

from ..observation import InputBuffer, InputKind, InputLayout, InputTopic
from .messages import input_msg_class, input_qos


class InputSubscriptions:
    """One subscription per input of ``layout`` (topics already resolved). Callbacks only store; an operator
    input (enable, e-stop) also calls ``on_operator`` at once, so an e-stop holds now, not at the next tick."""

    def __init__(self, node: Node, layout: InputLayout, buffer: InputBuffer, instruction_durability: str,
                 now_ns: Callable[[], int], on_operator: Callable[[], None]) -> None:
        self._node, self._buffer, self._now_ns, self._on_operator = node, buffer, now_ns, on_operator
        self._subscriptions: List[Any] = [
            node.create_subscription(input_msg_class(entry), entry.topic, self._store_callback(entry),
                                     input_qos(entry, instruction_durability))
            for entry in layout.inputs]

    def _store_callback(self, entry: InputTopic) -> Callable[[Any], None]:
        operator = entry.kind in (InputKind.ENABLE, InputKind.ESTOP)

        def store(msg: Any) -> None:
            self._buffer.put(entry, msg, self._now_ns())
            if operator:
                self._on_operator()
        return store

    def destroy(self) -> None:
        for subscription in self._subscriptions:
            self._node.destroy_subscription(subscription)
        self._subscriptions = []
