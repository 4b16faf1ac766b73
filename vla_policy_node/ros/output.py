"""The one way out to the controller: what the safety supervisor lets out, published (or logged in dry_run)."""
from __future__ import annotations

from typing import Any

from trajectory_msgs.msg import JointTrajectory

from ..safety import PlanKind, Review, SafetySupervisor
from ..tick import ThrottledReporter, TickStats
from .messages import trajectory_msg


class TrajectoryOutput:
    """Logs every supervisor transition, says loudly when there is nothing to hold to, and publishes a
    review's trajectory through ``SafetySupervisor.release`` (so an e-stop cannot be overtaken)."""

    def __init__(self, logger: Any, publisher: Any, supervisor: SafetySupervisor, stats: TickStats,
                 reporter: ThrottledReporter) -> None:
        self._logger, self._publisher, self._supervisor = logger, publisher, supervisor
        self._stats, self._reporter = stats, reporter

    def emit(self, review: Review, dry_run: bool) -> None:
        for line in review.transitions:
            self._logger.warning(line)
        if review.cannot_hold and self._reporter.should_report('cannot_hold'):
            self._logger.error(review.cannot_hold)
        plan = review.plan
        if plan is None:
            return
        if dry_run:
            if review.kind is PlanKind.HOLD or self._reporter.should_report('dry_run'):
                self._logger.info(f'dry_run: would publish a {review.kind.value} trajectory of {len(plan.times_sec)} '
                                  f'points; first {[round(float(v), 3) for v in plan.positions[0]]}')
            return
        if self._supervisor.release(review, self._publish):
            self._stats.record_published()

    def _publish(self, plan) -> None:
        msg: JointTrajectory = trajectory_msg(plan)
        self._publisher.publish(msg)
