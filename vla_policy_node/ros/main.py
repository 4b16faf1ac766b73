"""The ``vla_policy_node`` process: init, the node, one executor, shutdown."""
from __future__ import annotations

import sys
from typing import List, Optional

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn

from .node import VlaPolicyNode


def main(args: Optional[List[str]] = None) -> int:
    rclpy.init(args=args if args is not None else sys.argv)
    node = None
    try:
        node = VlaPolicyNode()
        # Inputs are cheap callbacks and ticks run on the TickWorker thread: one executor thread is enough.
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        if node.get_parameter('autostart').value:
            if node.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                node.trigger_activate()
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            try:
                node.hold_and_stop()          # the arm stays where it is, not at the end of the last chunk
            except Exception as exc:          # the context may already be shut down by the signal
                node.get_logger().warning(f'no hold published at shutdown: {exc!r}')
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
