"""The parameter table (``vla_policy_node.params``) as ROS parameters: descriptors, declaration, live checks.

Every check is ``params.problems``: the same rules and messages as the replay.
rclpy applies the descriptor (type, range, read-only) before our callback;
where it refuses a params-file value, the reason given is still ours.
"""
from __future__ import annotations

import array
from typing import Any, Dict, List, Optional, Sequence

from rcl_interfaces.msg import (FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType,
                                SetParametersResult)
from rclpy.exceptions import (InvalidParameterTypeException, InvalidParameterValueException,
                              ParameterUninitializedException)
from rclpy.node import Node
from rclpy.parameter import Parameter

from ..params import PARAMETERS, ParamSpec, output_specs, problems, value_problem

_TYPES = {'bool': ParameterType.PARAMETER_BOOL, 'int': ParameterType.PARAMETER_INTEGER,
          'double': ParameterType.PARAMETER_DOUBLE, 'string': ParameterType.PARAMETER_STRING,
          'string_array': ParameterType.PARAMETER_STRING_ARRAY,
          'double_array': ParameterType.PARAMETER_DOUBLE_ARRAY}


def descriptor(spec: ParamSpec) -> ParameterDescriptor:
    """rcl_interfaces ParameterDescriptor for a spec: type, description with choices, range, read-only."""
    text = spec.description + (f' One of: {", ".join(spec.choices)}.' if spec.choices else '')
    result = ParameterDescriptor(name=spec.name, type=_TYPES[spec.type_name], description=text,
                                 read_only=spec.read_only)
    if spec.min_value is not None and spec.type_name == 'double':
        result.floating_point_range = [FloatingPointRange(from_value=float(spec.min_value),
                                                          to_value=float(spec.max_value), step=0.0)]
    elif spec.min_value is not None and spec.type_name == 'int':
        result.integer_range = [IntegerRange(from_value=int(spec.min_value), to_value=int(spec.max_value), step=0)]
    return result


def plain(value: Any) -> Any:
    """rclpy gives double arrays as array.array; the table's checks take lists."""
    return list(value) if isinstance(value, (array.array, tuple)) else value


class NodeParameters:
    """Declares every parameter on ``node`` and refuses changes that ``params.problems`` refuses.

    ``errors`` lists what was wrong in the params file at start-up (configure
    refuses while any remain). ``config``, once a checkpoint is loaded, adds
    the checks against it to live changes (execute_steps <= chunk size, ...).
    """

    def __init__(self, node: Node) -> None:
        self._node = node
        self.errors: List[str] = []
        self.config: Any = None
        for spec in PARAMETERS:
            self._declare(spec)
        # `outputs` names the sub-parameters (ros2_control style: arm.joints, arm.type, arm.topic). It is
        # read-only, so they are known once it is declared: declared from the params-file overrides like
        # the others (rclpy keeps every override until its declaration, Humble .. Kilted).
        self._specs = PARAMETERS + output_specs(self.value('outputs'))
        for spec in self._specs[len(PARAMETERS):]:
            self._declare(spec)
        self.errors += self._undeclared_overrides()
        self.errors += problems(self.values())
        for error in self.errors:
            node.get_logger().error(f'parameter refused: {error}')
        node.add_on_set_parameters_callback(self._on_set)

    def _declare(self, spec: ParamSpec) -> None:
        spec_descriptor = descriptor(spec)
        if spec.default is None:
            self._declare_array(spec, spec_descriptor)
            return
        try:
            self._node.declare_parameter(spec.name, spec.default, spec_descriptor)
        except (InvalidParameterValueException, InvalidParameterTypeException) as exc:
            self._refused(spec, exc)
            self._node.declare_parameter(spec.name, spec.default, spec_descriptor, ignore_override=True)

    def _declare_array(self, spec: ParamSpec, final: ParameterDescriptor) -> None:
        """An array without a default starts as a typed empty list, never uninitialised.

        rclpy's get_parameters service answers nothing at all when one requested parameter is
        uninitialised, so `ros2 param dump` printed {} and `ros2 param get` "Parameter not set".
        A [] default cannot go to declare_parameter (rclpy infers BYTE_ARRAY from an empty list),
        and `x: []` in a params file arrives as NOT_SET (rcl's YAML parser gives an empty
        sequence no type). So: declare by type, writable (a params-file value applies), set a
        typed [] if still unset, then install the read-only descriptor (public rclpy API since
        Foxy: Humble .. Kilted).
        """
        array_type = Parameter.Type(final.type)
        writable = ParameterDescriptor(name=final.name, type=final.type, description=final.description,
                                       read_only=False)
        try:
            self._node.declare_parameter(spec.name, array_type, writable)
        except (InvalidParameterValueException, InvalidParameterTypeException) as exc:
            self._refused(spec, exc)
            self._node.declare_parameter(spec.name, array_type, writable, ignore_override=True)
        if self.value(spec.name) is None:
            self._node.set_parameters([Parameter(spec.name, array_type, [])])
        if final.read_only:
            self._node.set_descriptor(spec.name, final)

    def _refused(self, spec: ParamSpec, exc: Exception) -> None:
        # A bad value in the params file must not kill the process: keep the default, refuse to
        # configure, and say why in the words the replay uses for the same value.
        override = self._node._parameter_overrides.get(spec.name)
        ours = value_problem(spec, plain(override.value)) if override is not None else None
        self.errors.append(ours or f'{spec.name}: {exc}')

    def _undeclared_overrides(self) -> List[str]:
        """A dotted name in the params file that no output declares (a typo such as arm.joint) is refused."""
        declared = {spec.name for spec in self._specs}
        unknown = sorted(name for name in self._node._parameter_overrides
                         if '.' in name and name not in declared and not name.startswith('qos_overrides.'))
        if not unknown:
            return []
        return [f'unknown parameter(s) {unknown} (outputs is {self.value("outputs")}: <name>.joints, <name>.type '
                'and <name>.topic exist for those names)']

    def value(self, name: str) -> Any:
        """Current value (an unset array is [])."""
        try:
            return plain(self._node.get_parameter(name).value)
        except ParameterUninitializedException:
            return None

    def values(self) -> Dict[str, Any]:
        """Every parameter of the table, and ROS's use_sim_time (camera_clock auto reads it)."""
        values = {spec.name: self.value(spec.name) for spec in self._specs}
        values['use_sim_time'] = bool(self.value('use_sim_time'))
        return values

    def _on_set(self, parameters: Sequence[Parameter]) -> SetParametersResult:
        """Refuse a change that adds a problem; values are read at the next tick (Humble has no post-set hook)."""
        current = self.values()
        proposed = dict(current, **{p.name: plain(p.value) for p in parameters})
        known = set(problems(current, self.config))
        new: Optional[str] = next((p for p in problems(proposed, self.config) if p not in known), None)
        return SetParametersResult(successful=new is None, reason=new or '')
