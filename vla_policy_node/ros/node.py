"""The lifecycle node: cameras, instruction and joint states in; JointTrajectory out.

    configure   read parameters, load the checkpoint, warm up, subscribe
    activate    start the control timer, publish trajectories
    deactivate  stop the timer (inputs keep flowing into the buffer)
    cleanup     drop subscriptions, publisher, model and cache

Subscriptions only store the latest message; the timer only wakes a
dedicated tick thread (TickWorker), so the GPU never blocks input.
/diagnostics is published in every state, so an unconfigured node says why.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rcl_interfaces.msg import SetParametersResult
from rclpy.exceptions import (InvalidParameterTypeException, InvalidParameterValueException,
                              ParameterUninitializedException)
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from ..observation import InputBuffer, SkipTick
from ..runtime import PolicyRuntime
from ..settings import NODE_NAME, camera_layout, load_runtime, tick_settings
from ..tick import (ThrottledReporter, TickEngine, TickOutcome, TickSettings, TickStats,
                    check_settings_against_model)
from ..trajectory import limits_problem
from .messages import diagnostics_msg, trajectory_msg
from .params import BUILTIN_TINY, PARAMETERS, SPECS, descriptor, validate_value
from .tick_worker import TickWorker

TRAJECTORY_QOS_DEPTH = 10


class VlaPolicyNode(LifecycleNode):
    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        self._param_errors: List[str] = []
        self._declare_parameters()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.buffer = InputBuffer()
        self.stats = TickStats()
        self._reporter = ThrottledReporter()
        self.runtime: Optional[PolicyRuntime] = None
        self._engine: Optional[TickEngine] = None
        self._input_subscriptions: list = []
        self._trajectory_pub = None
        self._timer = None
        self._timer_rate_hz = 0.0
        self._camera_topics: Dict[str, str] = {}
        self._lifecycle_label = 'unconfigured'
        self._configure_error = ''
        self._skips_at_last_diagnostics = 0
        self._worker: Optional[TickWorker] = None
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._diagnostics_timer = self.create_timer(self._param('diagnostics_period_sec'), self._publish_diagnostics)

    # ---- parameters ------------------------------------------------------------------------
    def _declare_parameters(self) -> None:
        for spec in PARAMETERS:
            spec_descriptor = descriptor(spec)
            # No default: declare by type only (an empty list would be inferred as a byte array).
            value = Parameter.Type(spec_descriptor.type) if spec.default is None else spec.default
            try:
                self.declare_parameter(spec.name, value, spec_descriptor)
            except (InvalidParameterValueException, InvalidParameterTypeException) as exc:
                # A bad value in the params file must not kill the process: keep the
                # default, refuse to configure, and say why.
                self._param_errors.append(f'{spec.name}: {exc}')
                self.get_logger().error(f'parameter {spec.name} refused: {exc}; using the default')
                self.declare_parameter(spec.name, value, spec_descriptor, ignore_override=True)
            else:
                reason = self._value_problem(spec.name, self._param(spec.name))
                if reason:
                    self._param_errors.append(reason)
                    self.get_logger().error(f'parameter refused: {reason}')

    def _param(self, name: str) -> Any:
        """Current value; None for a typed parameter that was never set."""
        try:
            return self.get_parameter(name).value
        except ParameterUninitializedException:
            return None

    def _value_problem(self, name: str, value: Any) -> Optional[str]:
        spec = SPECS.get(name)
        return validate_value(spec, value) if spec is not None and value is not None else None

    def _on_set_parameters(self, parameters: Sequence[Parameter]) -> SetParametersResult:
        """Validation only; values are read at the next tick (works on Humble, which lacks post-set callbacks)."""
        incoming = {p.name: p.value for p in parameters}
        for name, value in incoming.items():
            reason = self._value_problem(name, value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        if {'joint_lower_limits', 'joint_upper_limits'} & set(incoming):
            lower = incoming.get('joint_lower_limits', self._param('joint_lower_limits')) or []
            upper = incoming.get('joint_upper_limits', self._param('joint_upper_limits')) or []
            joints = len(self._param('joint_names') or [])
            reason = limits_problem(list(lower), list(upper), joints)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        if 'execute_steps' in incoming and self.runtime is not None:
            chunk = self.runtime.config.chunk_size
            if incoming['execute_steps'] > chunk:
                return SetParametersResult(successful=False,
                                           reason=f'execute_steps must be <= the chunk size {chunk}')
        return SetParametersResult(successful=True)

    # ---- settings -------------------------------------------------------------------------
    def _values(self) -> Dict[str, Any]:
        return {spec.name: self._param(spec.name) for spec in PARAMETERS}

    def _tick_settings(self) -> TickSettings:
        return tick_settings(self._values(), self._camera_topics)

    # ---- lifecycle -----------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self._configure()
        except Exception as exc:  # any failure leaves the node unconfigured, with the reason
            self._configure_error = f'{type(exc).__name__}: {exc}'
            self.get_logger().error(f'configure failed: {self._configure_error}')
            self._release()
            return TransitionCallbackReturn.FAILURE
        self._configure_error = ''
        self._lifecycle_label = 'inactive'
        return TransitionCallbackReturn.SUCCESS

    def _configure(self) -> None:
        if self._param_errors:
            raise ValueError('invalid parameters: ' + '; '.join(self._param_errors))
        if not self._param('joint_names'):
            raise ValueError('joint_names is not set: list the joints the trajectory commands, one per action')
        checkpoint = self._param('checkpoint_path')
        if checkpoint == BUILTIN_TINY:
            self.get_logger().warning('checkpoint_path is builtin:tiny: a tiny pi0 with RANDOM weights; its actions '
                                      'are meaningless. Set checkpoint_path to a real lerobot pretrained_model folder.')
        self.runtime = load_runtime(self._values())
        config = self.runtime.config
        cameras = camera_layout(self._values(), config.camera_names)
        self._camera_topics = {name: topic for name, (topic, _) in cameras.items()}
        check_settings_against_model(self._tick_settings(), config)
        self.get_logger().info(f'loaded {config.policy_type} from {checkpoint} on {self.runtime.device} '
                               f'({self.runtime.dtype}); cameras {list(self._camera_topics.values())}; '
                               f'one cached prefix = {self.runtime.prefix_bytes() / 2**20:.2f} MiB')
        if self._param('warmup'):
            chunk = self.runtime.warmup()
            self.get_logger().info(f'warm-up chunk in {chunk.total_ms:.1f} ms')
        self._engine = TickEngine(self.runtime, self.stats)
        self._subscribe(cameras)
        self._trajectory_pub = self.create_lifecycle_publisher(
            JointTrajectory, self._param('trajectory_topic'),
            QoSProfile(depth=TRAJECTORY_QOS_DEPTH, reliability=ReliabilityPolicy.RELIABLE))

    def _subscribe(self, cameras: Dict[str, tuple]) -> None:
        for name, (topic, kind) in cameras.items():
            msg_type = CompressedImage if kind == 'compressed' else Image
            self._input_subscriptions.append(self.create_subscription(
                msg_type, topic, self._camera_callback(name), qos_profile_sensor_data))
        self._input_subscriptions.append(self.create_subscription(
            JointState, self._param('joint_states_topic'), self._on_joint_state, qos_profile_sensor_data))
        durability = (DurabilityPolicy.TRANSIENT_LOCAL if self._param('instruction_durability') == 'transient_local'
                      else DurabilityPolicy.VOLATILE)
        self._input_subscriptions.append(self.create_subscription(
            String, self._param('instruction_topic'), self._on_instruction,
            QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=durability)))

    def _camera_callback(self, name: str):
        def store(msg: Any) -> None:
            self.buffer.put_camera(name, msg, self._now_ns())
        return store

    def _on_joint_state(self, msg: JointState) -> None:
        self.buffer.put_joint_state(msg, self._now_ns())

    def _on_instruction(self, msg: String) -> None:
        self.buffer.put_instruction(msg.data, self._now_ns())

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._timer_rate_hz = float(self._param('control_rate_hz'))
        self._worker = TickWorker(self._on_tick, self._on_tick_error)
        self._timer = self.create_timer(1.0 / self._timer_rate_hz, self._on_timer)
        self._lifecycle_label = 'active'
        self.get_logger().info(f'active: {self._timer_rate_hz:g} Hz on {self._param("trajectory_topic")}'
                               + (' (dry_run: nothing is published)' if self._param('dry_run') else ''))
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_timer()
        self._lifecycle_label = 'inactive'
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._lifecycle_label = 'unconfigured'
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._lifecycle_label = 'finalized'
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """A transition raised: drop everything and go back to unconfigured, ready to configure again."""
        self._release()
        self._lifecycle_label = 'unconfigured'
        return TransitionCallbackReturn.SUCCESS

    def stop_ticks(self) -> None:
        """Before destroying the node: no tick may use its publisher or clock afterwards."""
        self._stop_timer()

    def _stop_timer(self) -> None:
        """No more ticks: the timer goes, and the tick in flight (if any) finishes first."""
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
        if self._worker is not None:
            if not self._worker.stop():
                self.get_logger().error('the tick in flight did not finish within 30 s')
            self._worker = None

    def _release(self) -> None:
        """Undo configure: subscriptions, publisher, buffered inputs, model and device memory."""
        self._stop_timer()
        for subscription in self._input_subscriptions:
            self.destroy_subscription(subscription)
        self._input_subscriptions = []
        if self._trajectory_pub is not None:
            self.destroy_lifecycle_publisher(self._trajectory_pub)
            self._trajectory_pub = None
        self.buffer.clear()
        self._engine = None
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

    # ---- the control tick -----------------------------------------------------------------
    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _on_timer(self) -> None:
        """Executor thread: apply live settings that touch ROS objects, then wake the tick thread."""
        self._apply_live_settings()
        if self._worker is not None:
            self._worker.request()

    def _on_tick(self) -> None:
        """Tick thread: one observation -> one trajectory (or a counted, logged skip)."""
        engine = self._engine
        if engine is None:
            return
        outcome = engine.run(self.buffer, self._tick_settings(), self._now_ns())
        if outcome.skip is not None:
            self._report_skip(outcome.skip)
            return
        plan = outcome.plan
        if self._param('dry_run'):
            if self._reporter.should_report('dry_run'):
                self.get_logger().info(f'dry_run: would publish {len(plan.times_sec)} points; first '
                                       f'{[round(float(v), 3) for v in plan.positions[0]]}')
            return
        self._trajectory_pub.publish(trajectory_msg(plan))
        self.stats.record_published()

    def _on_tick_error(self, exc: BaseException) -> None:
        self.stats.record(TickOutcome(now_ns=self._now_ns(), skip=SkipTick('internal_error', repr(exc))))
        if self._reporter.should_report('internal_error'):
            self.get_logger().error(f'tick failed, nothing published: {exc!r}')

    def _apply_live_settings(self) -> None:
        """Live parameters that are more than a value read at the tick (executor thread only)."""
        runtime = self.runtime
        if runtime is not None:
            runtime.cache.resize(self._param('cache_max_bytes'), self._param('cache_max_entries'))
        rate = float(self._param('control_rate_hz'))
        if rate != self._timer_rate_hz and self._timer is not None:
            self._timer.timer_period_ns = int(1e9 / rate)
            self._timer_rate_hz = rate
        diagnostics_ns = int(1e9 * float(self._param('diagnostics_period_sec')))
        if diagnostics_ns != self._diagnostics_timer.timer_period_ns:
            self._diagnostics_timer.timer_period_ns = diagnostics_ns

    def _report_skip(self, skip: SkipTick) -> None:
        if self._reporter.should_report(f'{skip.reason}:{skip.topic}'):
            where = f' on {skip.topic}' if skip.topic else ''
            self.get_logger().warning(f'tick skipped [{skip.reason}]{where}: {skip}')

    # ---- diagnostics ---------------------------------------------------------------------
    def _publish_diagnostics(self) -> None:
        self._apply_live_settings()
        runtime = self.runtime
        now_ns = self._now_ns()
        stats = self.stats.snapshot()
        new_skips = stats.skipped_total - self._skips_at_last_diagnostics
        self._skips_at_last_diagnostics = stats.skipped_total
        if self._configure_error:
            level, message = DiagnosticStatus.ERROR, f'unconfigured: {self._configure_error}'
        elif new_skips:
            level = DiagnosticStatus.WARN
            message = f'{self._lifecycle_label}; {new_skips} tick(s) skipped, last: {stats.last_skip}'
        else:
            level, message = DiagnosticStatus.OK, self._lifecycle_label
        info: Dict[str, object] = {'lifecycle_state': self._lifecycle_label,
                                   'dry_run': self._param('dry_run')}
        if runtime is not None:
            info.update(policy_type=runtime.config.policy_type, device=str(runtime.device),
                        dtype=str(runtime.dtype).replace('torch.', ''), model_revision=runtime.model_revision,
                        prefix_entry_bytes=runtime.prefix_bytes())
        self._diagnostics_pub.publish(diagnostics_msg(
            now_ns, f'{self.get_name()}: policy', str(runtime.device) if runtime else 'none', level, message, info,
            stats, runtime.cache.stats() if runtime else None, self.buffer.camera_ages(now_ns)))


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
            node.stop_ticks()
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
