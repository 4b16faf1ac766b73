"""The ``vla_policy_node`` process: init, the node, one executor, an orderly shutdown.

Ctrl-C and SIGTERM end the process quietly with status 0 in any phase, and a node that was
publishing holds the arm on its way out. rclpy's own signal handlers are not installed: they
shut the context down at once from their own thread, so no hold could be published any more
and a tick in flight failed with "publisher's context is invalid". Here a signal only asks
main() to stop, and main() stops the ticks, publishes the hold, destroys the node and shuts
the context down, in that order. By phase:

* importing (torch and its C++ extensions): the signal is noted and main() returns 0 once the
  imports are done (an exception raised inside a C++ extension's start-up can abort the process);
* starting (rclpy.init, checkpoint load, warm-up; a missing or unparsable ``--params-file`` ends here
  with one line naming it and status 2, ros/startup.py): the first signal raises KeyboardInterrupt in
  the main thread, abandoning a long configure;
* spinning: the signal sets a flag that the spin loop reads at least every SPIN_TIMEOUT_SEC;
* stopping: both signals are ignored, so a second one (a terminal's Ctrl-C reaches the node twice
  under ``ros2 launch``: the process group, then launch forwarding its own) cannot interrupt the
  clean-up. SIG_IGN rather than a handler: Python resets handlers it set to SIG_DFL at exit,
  which would turn a late SIGINT into "exit code -2".

Heavy imports (torch through .node) happen inside main(), after the handlers exist; keep
``vla_policy_node/__init__.py`` and ``ros/__init__.py`` free of imports.
"""
from __future__ import annotations

import signal
import sys
from typing import List, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SPIN_TIMEOUT_SEC = 0.1
_phase = 'importing'    # importing -> starting -> spinning -> stopping
_stop_requested = False


def _on_signal(signum: int, frame: object) -> None:
    global _phase, _stop_requested
    _stop_requested = True
    if _phase == 'starting':
        _phase = 'stopping'
        raise KeyboardInterrupt


def _ignore_signals() -> None:
    global _phase
    _phase = 'stopping'
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def main(args: Optional[List[str]] = None) -> int:
    global _phase
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)
    rclpy = node = None
    try:
        import rclpy
        from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
        from rclpy.lifecycle import TransitionCallbackReturn
        from rclpy.signals import SignalHandlerOptions

        from .node import VlaPolicyNode
        from .startup import init_rclpy

        _phase = 'starting'
        if _stop_requested:
            return 0
        status = init_rclpy('vla_policy_node', args if args is not None else sys.argv,
                            signal_handler_options=SignalHandlerOptions.NO)
        if status is not None:
            return status
        node = VlaPolicyNode()
        # Inputs are cheap callbacks and ticks run on the TickWorker thread: one executor thread is enough.
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        if node.get_parameter('autostart').value:
            if node.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                node.trigger_activate()
        _phase = 'spinning'
        try:
            while not _stop_requested and rclpy.ok():
                executor.spin_once(timeout_sec=SPIN_TIMEOUT_SEC)
        except ExternalShutdownException:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        _ignore_signals()
        if node is not None:
            try:
                node.hold_and_stop()          # no more ticks, then the arm stays where it is
            except Exception as exc:
                if rclpy.ok():                # else the context was shut down elsewhere: nothing to say
                    node.get_logger().warning(f'no hold published at shutdown: {exc!r}')
            node.destroy_node()
        if rclpy is not None:
            rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
