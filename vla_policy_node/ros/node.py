"""The lifecycle node: cameras, instruction and joint states in; JointTrajectory out.

Wiring only: parameters come from ``ros/parameters.py``, the configure path from
``settings.configure`` (shared with the replay), each tick from ``tick.TickEngine`` on a
dedicated thread (``TickWorker``), so the GPU never blocks input callbacks.
/diagnostics is published in every state, so an unconfigured node says why. Topic names
resolve in the node's namespace (with remappings) at configure; logs give the resolved names.
"""
from __future__ import annotations

from typing import Any, Optional

from std_srvs.srv import Trigger
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from ..observation import InputBuffer, SkipReason
from ..params import NODE_NAME
from ..runtime import PolicyRuntime
from ..settings import Configured, configure, tick_settings
from ..safety import Review
from ..tick import ThrottledReporter, TickEngine, TickSettings, TickStats
from .clock_jumps import watch_backward_jumps
from .inputs import InputSubscriptions
from .diagnostics import DiagnosticsPublisher
from .output import TrajectoryOutput, answer_reset_estop
from .parameters import NodeParameters
from .tick_worker import TickWorker


class VlaPolicyNode(LifecycleNode):
    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        self.params = NodeParameters(self)
        self.buffer = InputBuffer()
        self.stats = TickStats()
        self.configured: Optional[Configured] = None
        self._reporter = ThrottledReporter()
        self._engine: Optional[TickEngine] = None
        self._inputs: Optional[InputSubscriptions] = None
        self._timer = None
        self._worker: Optional[TickWorker] = None
        self._configure_error = ''
        self._output: Optional[TrajectoryOutput] = None
        self.create_service(Trigger, '~/reset_estop', lambda request, response: answer_reset_estop(
            self._output, self.buffer.operator_inputs(self._now_ns()), self._now_ns(), response))
        self._diagnostics = DiagnosticsPublisher(self, self.params.value('diagnostics_period_sec'),
                                                 self._publish_diagnostics)
        self._jumps = watch_backward_jumps(self, self._on_clock_jump)

    @property
    def runtime(self) -> Optional[PolicyRuntime]:
        return self.configured.runtime if self.configured is not None else None

    @property
    def lifecycle_label(self) -> str:
        """Derived from what exists, as ros2/demos lifecycle_py derives it from its publisher."""
        if self.configured is None:
            return 'unconfigured'
        return 'active' if self._output.active else 'inactive'

    # ---- lifecycle -----------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load the checkpoint, warm up, subscribe, create the (inactive) trajectory publishers.

        SUCCESS leaves the node inactive: inputs flow into the buffer, nothing is published.
        FAILURE leaves nothing loaded and the reason on /diagnostics."""
        try:
            if self.params.errors:
                raise ValueError('invalid parameters: ' + '; '.join(self.params.errors))
            logger = self.get_logger()
            self.configured = configure(self.params.values(), info=logger.info, warn=logger.warning,
                                        resolve=self.resolve_topic_name)
        except Exception as exc:  # any failure leaves the node unconfigured, with the reason
            if isinstance(exc.__context__, KeyboardInterrupt):
                raise exc.__context__     # Ctrl-C during configure that torch surfaced as another error
            self._configure_error = f'{type(exc).__name__}: {exc}'
            self.get_logger().error(f'configure failed: {self._configure_error}')
            return TransitionCallbackReturn.FAILURE
        self._configure_error = ''
        self.params.config = self.runtime.config
        self._engine = TickEngine(self.runtime, self.stats)
        self._inputs = InputSubscriptions(self, self.configured.layout, self.buffer,
                                          self.params.value('instruction_durability'), self._now_ns, self._supervise)
        self._output = TrajectoryOutput(self, self.configured.outputs, self._engine.supervisor,
                                        self.stats, self._reporter)
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start the tick thread and the control timer; SUCCESS leaves the node publishing trajectories."""
        rate = float(self.params.value('control_rate_hz'))
        self._emit(self._engine.activate(self._now_ns()))
        self._worker = TickWorker(self._on_tick, self._on_tick_error)
        self._timer = self.create_timer(1.0 / rate, self._on_timer)
        self.get_logger().info(f'active: {rate:g} Hz on {self._output.topic}'
                               + (' (dry_run: nothing is published)' if self.params.value('dry_run') else ''))
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop the timer, let the tick in flight finish, hold the arm; SUCCESS leaves inputs flowing, nothing
        more published."""
        self.hold_and_stop()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Drop subscriptions, publishers, buffered inputs, model and cache; leaves the node unconfigured.
        on_shutdown (from any state: finalized) and on_error (a transition raised: unconfigured, ready to
        configure again) do the same."""
        self._release()
        return TransitionCallbackReturn.SUCCESS

    on_shutdown = on_error = on_cleanup

    def hold_and_stop(self) -> None:
        """No more ticks, then (if it was publishing) one hold trajectory: before deactivating or shutting down."""
        self.stop_ticks()
        if self._engine is not None and self._output is not None and self._output.active:
            self._emit(self._engine.deactivate(self.buffer, self._settings(), self._now_ns()))
            self._output.wait_for_delivery()

    def stop_ticks(self) -> None:
        """No more ticks: the timer goes and the tick in flight finishes (also before destroying the node)."""
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
        if self._worker is not None and not self._worker.stop():
            self.get_logger().error('the tick in flight did not finish within 30 s')
        self._worker = None

    def _release(self) -> None:
        self.stop_ticks()
        for part in (self._inputs, self._output):        # subscriptions, trajectory publisher
            if part is not None:
                part.destroy()
        self._inputs = self._output = None
        self.buffer.clear()
        self._engine = None
        self.params.config = None
        if self.configured is not None:
            self.configured.runtime.close()
            self.configured = None

    # ---- inputs and ticks ------------------------------------------------------------------------
    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _settings(self) -> TickSettings:
        return tick_settings(self.params.values(), self.configured.layout)

    def _emit(self, review: Review) -> None:
        self._output.emit(review, bool(self.params.value('dry_run')))

    def _supervise(self) -> None:
        """Operator inputs and the no-trajectory timeout, also when no tick runs (a stuck inference)."""
        if self._engine is not None and self._worker is not None:
            self._emit(self._engine.supervise(self.buffer, self._settings(), self._now_ns()))

    def _on_timer(self) -> None:
        """Executor thread: live settings that touch ROS objects, supervision, then wake the tick thread."""
        self._apply_live_settings()
        self._supervise()
        if self._worker is not None:
            self._worker.request()

    def _on_tick(self) -> None:
        """Tick thread: one observation -> one trajectory, a hold, or a counted, logged skip."""
        engine = self._engine
        if engine is None or self.configured is None:
            return
        outcome = engine.run(self.buffer, self._settings(), self._now_ns(), clock=self._now_ns)
        for line in outcome.warnings(self._reporter):      # skips and clock jumps, throttled per kind and topic
            self.get_logger().warning(line)
        self._emit(outcome.review)

    def _on_clock_jump(self, back_sec: float) -> None:
        """ROS time jumped back (use_sim_time): hold while active, drop the inputs of the old timeline."""
        if self._engine is not None and self._worker is not None:
            self._emit(self._engine.clock_jumped(self.buffer, self._settings(), self._now_ns(), back_sec))
        self.buffer.drop_timed(back_sec)

    def _on_tick_error(self, exc: BaseException) -> None:
        if self._reporter.should_report(SkipReason.INTERNAL_ERROR.value):
            self.get_logger().error(f'tick failed, nothing published: {exc!r}')
        if self._engine is not None:
            self._emit(self._engine.fail(self.buffer, self._settings(), self._now_ns(), exc))

    def _apply_live_settings(self) -> None:
        """Live parameters that are more than a value read at the tick (executor thread only)."""
        if getattr(self.runtime, 'cache', None) is not None:          # a local backend
            self.runtime.cache.resize(self.params.value('cache_max_bytes'), self.params.value('cache_max_entries'))
        for timer, period_sec in ((self._timer, 1.0 / float(self.params.value('control_rate_hz'))),
                                  (self._diagnostics.timer, float(self.params.value('diagnostics_period_sec')))):
            if timer is not None and timer.timer_period_ns != int(1e9 * period_sec):
                timer.timer_period_ns = int(1e9 * period_sec)

    def _publish_diagnostics(self) -> None:
        self._apply_live_settings()
        self._diagnostics.publish(self._now_ns(), self.lifecycle_label, self._configure_error, self.stats.snapshot(),
                                  self.buffer, self.params.values(), self.runtime,
                                  self._engine.supervisor if self._engine is not None else None)
