"""The one way out to the controllers: what the safety supervisor lets out, split per output (``outputs.py``)
and published (or logged in dry_run); and the operator's way back in after an e-stop."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from rclpy.duration import Duration
from rclpy.lifecycle import LifecycleNode
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from ..observation import OperatorInputs
from ..outputs import Output, split
from ..safety import PlanKind, Review, SafetySupervisor
from ..tick import ThrottledReporter, TickStats
from .messages import trajectory_msg

TRAJECTORY_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


class TrajectoryOutput:
    """Logs every supervisor transition, says loudly when there is nothing to hold to, and publishes a
    review's trajectory through ``SafetySupervisor.release`` (so an e-stop cannot be overtaken) on one
    lifecycle publisher per output (they publish only while the node is active). Every output of a
    review comes from its one plan, under the supervisor's lock."""

    def __init__(self, node: LifecycleNode, outputs: Sequence[Output], supervisor: SafetySupervisor,
                 stats: TickStats, reporter: ThrottledReporter) -> None:
        self._node, self._logger, self._supervisor = node, node.get_logger(), supervisor
        self._stats, self._reporter = stats, reporter
        self._outputs = tuple(outputs)
        self._publishers = [node.create_lifecycle_publisher(
            JointTrajectory if output.kind == 'joint_trajectory' else Float64MultiArray, output.topic,
            TRAJECTORY_QOS) for output in self._outputs]

    @property
    def active(self) -> bool:
        return self._publishers[0].is_activated

    @property
    def topic(self) -> str:
        """The resolved names (namespace, remappings), comma-separated with several outputs."""
        return ', '.join(publisher.topic_name for publisher in self._publishers)

    def wait_for_delivery(self, timeout_sec: float = 1.0) -> bool:
        """Until every subscriber acknowledged what was published (reliable QoS): a hold published on the way
        out must reach the controllers before the process ends and takes its DDS writers with it."""
        timeout = Duration(nanoseconds=int(timeout_sec * 1e9))
        return all([publisher.wait_for_all_acked(timeout) for publisher in self._publishers])

    def destroy(self) -> None:
        for publisher in self._publishers:
            self._node.destroy_lifecycle_publisher(publisher)

    def emit(self, review: Review, dry_run: bool) -> None:
        for line in review.transitions:
            self._logger.warning(line)
        # Once per hold (the supervisor says it once; cannot_hold_count in /diagnostics counts them). No joint
        # state yet, as at start-up before the first messages, is no error. rclpy ties one severity to each
        # logging call site: two calls.
        if review.cannot_hold and review.cannot_hold_waiting:
            self._logger.warning(review.cannot_hold)
        elif review.cannot_hold:
            self._logger.error(review.cannot_hold)
        plan = review.plan
        if plan is None:
            return
        if dry_run:
            if review.kind is PlanKind.HOLD or self._reporter.should_report('dry_run'):
                points = len(plan.times_sec)
                self._logger.info(f'dry_run: would publish a {review.kind.value} trajectory of {points} '
                                  f'point{"s" if points != 1 else ""}; first '
                                  f'{[round(float(v), 3) for v in plan.positions[0]]}')
            return
        if self._supervisor.release(review, self._publish):
            self._stats.record_published(review.kind)

    def reset_estop(self, operator: OperatorInputs, now_ns: int) -> Tuple[bool, str]:
        """The ~/reset_estop service: the supervisor decides, every call is logged."""
        success, message = self._supervisor.reset_estop(operator, now_ns)
        # rclpy ties one severity to each logging call site: two calls, not one with a chosen method.
        if success:
            self._logger.warning(f'reset_estop: {message}')
        else:
            self._logger.info(f'reset_estop refused: {message}')
        return success, message

    def _publish(self, plan) -> None:
        now_ns = self._node.get_clock().now().nanoseconds
        for publisher, (output, command) in zip(self._publishers, split(plan, self._outputs, now_ns)):
            if output.kind == 'joint_trajectory':
                publisher.publish(trajectory_msg(command))
            else:
                publisher.publish(Float64MultiArray(data=[float(v) for v in command]))


def answer_reset_estop(output: Optional[TrajectoryOutput], operator: OperatorInputs, now_ns: int,
                       response: Any) -> Any:
    """The ~/reset_estop service (std_srvs/Trigger): refused until configured, else the supervisor's answer."""
    response.success, response.message = (output.reset_estop(operator, now_ns) if output is not None
                                          else (False, 'not configured'))
    return response
