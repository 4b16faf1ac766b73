"""In-process tests of VlaPolicyNode (no subprocess): parameters, params files, validation."""
import json
import subprocess
import sys
import threading

import pytest

from dds_helpers import JOINTS, REPO_ROOT, isolate, pick_domain_id, ros_env, write_params

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rcl_interfaces.msg import ParameterType  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.replay.make_bag import SampleBagSpec, write_sample_bag  # noqa: E402
from vla_policy_node.replay.offline import replay  # noqa: E402
from vla_policy_node.ros.node import VlaPolicyNode  # noqa: E402
from vla_policy_node.params import PARAMETERS, SPECS, ParameterError  # noqa: E402

TYPES = {'bool': ParameterType.PARAMETER_BOOL, 'int': ParameterType.PARAMETER_INTEGER,
         'double': ParameterType.PARAMETER_DOUBLE, 'string': ParameterType.PARAMETER_STRING,
         'string_array': ParameterType.PARAMETER_STRING_ARRAY,
         'double_array': ParameterType.PARAMETER_DOUBLE_ARRAY}


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_pi0', 'pi0')


@pytest.fixture
def ctx():
    context = Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    yield context
    context.try_shutdown()


@pytest.fixture
def make_node(ctx, tmp_path):
    nodes = []

    def factory(params=None, cli_args_extra=(), **kwargs):
        if params is not None:
            path = write_params(tmp_path / f'params{len(nodes)}.yaml', params)
            kwargs['cli_args'] = ['--ros-args', '--params-file', str(path), *cli_args_extra]
        node = VlaPolicyNode(context=ctx, **kwargs)
        nodes.append(node)
        return node

    yield factory
    for node in nodes:
        node.destroy_node()


@pytest.mark.timeout(30)
def test_every_parameter_is_declared_with_its_descriptor(make_node):
    node = make_node()
    for spec in PARAMETERS:
        assert node.has_parameter(spec.name), spec.name
        descriptor = node.describe_parameter(spec.name)
        assert descriptor.name == spec.name
        assert descriptor.type == TYPES[spec.type_name], spec.name
        assert descriptor.read_only == spec.read_only, spec.name
        assert spec.description in descriptor.description
        for choice in spec.choices:
            assert choice in descriptor.description
        if spec.min_value is not None and spec.type_name == 'double':
            (bounds,) = descriptor.floating_point_range
            assert (bounds.from_value, bounds.to_value) == (spec.min_value, spec.max_value)
        elif spec.min_value is not None and spec.type_name == 'int':
            (bounds,) = descriptor.integer_range
            assert (bounds.from_value, bounds.to_value) == (spec.min_value, spec.max_value)
        else:
            assert not descriptor.floating_point_range and not descriptor.integer_range
        if spec.default is None:
            assert node.params.value(spec.name) == []        # typed and empty: ros2 param get/dump show it
        else:
            assert node.get_parameter(spec.name).value == spec.default
    read_only = {spec.name for spec in PARAMETERS if spec.read_only}
    assert {'checkpoint_path', 'joint_names', 'camera_topics', 'trajectory_topic', 'autostart'} <= read_only
    assert not {'control_rate_hz', 'execute_steps', 'stamp_mode', 'seed'} & read_only


@pytest.mark.timeout(30)
def test_set_parameters_validation_in_process(make_node):
    node = make_node(parameter_overrides=[Parameter('joint_names', value=list(JOINTS))])
    ok = node.set_parameters([Parameter('stamp_mode', value='observation')])[0]
    assert ok.successful
    for name, value in [('stamp_mode', 'bogus'), ('control_rate_hz', 1000.0), ('control_rate_hz', float('nan')),
                        ('joint_lower_limits', [0.0]), ('joint_upper_limits', [1.0, float('nan')] + [0.0] * 4),
                        ('checkpoint_path', '/x'), ('execute_steps', -1)]:
        result = node.set_parameters([Parameter(name, value=value)])[0]
        assert not result.successful and result.reason, (name, value)
    # lower > upper is refused too, checked across the two arrays of one call.
    result = node.set_parameters_atomically([Parameter('joint_lower_limits', value=[1.0] * 6),
                                             Parameter('joint_upper_limits', value=[0.0] * 6)])
    assert not result.successful and 'exceed' in result.reason
    assert node.get_parameter('stamp_mode').value == 'observation'


def wait_diagnostics(ctx, node, predicate, timeout=5.0):
    listener = Node('diag_listener', context=ctx)
    found = {}
    done = threading.Event()

    def on_msg(msg):
        for status in msg.status:
            if status.name == '/vla_policy: policy' and predicate(status):
                found['status'] = status
                done.set()

    listener.create_subscription(DiagnosticArray, '/diagnostics', on_msg, 10)
    executor = MultiThreadedExecutor(num_threads=2, context=ctx)
    executor.add_node(node)
    executor.add_node(listener)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        done.wait(timeout)
    finally:
        executor.shutdown(timeout_sec=2)
        listener.destroy_node()
    return found.get('status')


@pytest.mark.timeout(60)
@pytest.mark.parametrize('name, value', [
    ('control_rate_hz', 1000.0),          # out of the descriptor range
    ('num_steps', -1),
    ('stamp_mode', 'bogus'),              # not one of the choices
    ('execute_steps', 'ten'),             # wrong type
    ('joint_lower_limits', [0.0, 1.0]),   # wrong length (found at configure)
    ('execute_steps', 999),               # above the chunk size (found at configure)
])
def test_bad_params_file_value_refuses_configure_and_names_it(make_node, ctx, checkpoint, name, value):
    params = {'checkpoint_path': str(checkpoint), 'joint_names': list(JOINTS), 'instruction': 'go',
              'diagnostics_period_sec': 0.1, 'warmup': False, name: value}
    node = make_node(params)                   # must not raise
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert node._state_machine.current_state[1] == 'unconfigured'
    status = wait_diagnostics(ctx, node, lambda s: s.level == DiagnosticStatus.ERROR)
    assert status is not None, 'no ERROR diagnostics'
    assert name in status.message, status.message
    assert status.message.startswith('unconfigured')


@pytest.mark.timeout(60)
@pytest.mark.parametrize('name, value', [('control_rate_hz', -3.0), ('control_rate_hz', 0.0), ('num_steps', -1),
                                         ('action_period_sec', -0.1), ('max_image_pixels', 0)])
def test_node_and_replay_refuse_a_value_with_the_same_message(make_node, tmp_path, name, value):
    params = {'joint_names': list(JOINTS), 'instruction': 'go', name: value}
    node = make_node(params)                    # the descriptor refuses it; the reason given is the table's
    bag = write_sample_bag(tmp_path / 'bag', SampleBagSpec(duration_sec=0.5))
    with pytest.raises(ParameterError) as refused:
        replay(bag, write_params(tmp_path / 'replay.yaml', params), tmp_path / 'out')
    assert node.params.errors == [str(refused.value)]
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert node._configure_error.endswith(str(refused.value))


@pytest.mark.timeout(60)
def test_every_parameter_is_gettable_even_unset_arrays(make_node):
    # rclpy's get_parameters answers nothing for a whole request when one parameter is uninitialised:
    # `ros2 param dump` printed {} and `ros2 param get` "Parameter not set".
    node = make_node()
    names = [spec.name for spec in PARAMETERS]
    values = node.get_parameters(names)
    assert [p.name for p in values] == names
    assert node.get_parameter('camera_names').type_ == Parameter.Type.STRING_ARRAY
    assert node.get_parameter('joint_lower_limits').type_ == Parameter.Type.DOUBLE_ARRAY
    # Still read-only, and a params-file value still applies.
    assert not node.set_parameters([Parameter('camera_names', value=['a'])])[0].successful
    assert make_node({'camera_names': ['base_0_rgb']}).params.value('camera_names') == ['base_0_rgb']


@pytest.mark.timeout(60)
def test_topics_resolve_in_the_namespace_and_remappings_apply(make_node, checkpoint):
    node = make_node({'checkpoint_path': str(checkpoint), 'joint_names': list(JOINTS), 'warmup': False,
                      'camera_names': ['base_0_rgb'], 'camera_topics': ['/front/image_raw']},
                     namespace='arm', cli_args_extra=['-r', 'instruction:=/task/instruction'])
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    layout = node.configured.layout
    assert [camera.topic for camera in layout.cameras] == ['/front/image_raw']       # absolute: as written
    assert layout.joint_states.topic == '/arm/joint_states'
    assert layout.instruction.topic == '/task/instruction'                            # remapped
    assert [entry.topic for entry in layout.operator] == ['/arm/enable', '/arm/estop']
    assert node._output.topic == '/arm/joint_trajectory_controller/joint_trajectory'
    assert node._diagnostics.name == '/arm/vla_policy: policy'


@pytest.mark.timeout(60)
def test_good_params_file_configures_and_activates(make_node, checkpoint):
    node = make_node({'checkpoint_path': str(checkpoint), 'joint_names': list(JOINTS), 'instruction': 'go',
                      'warmup': False, 'execute_steps': 5})
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.runtime is not None and node.runtime.config.chunk_size == 10
    # Live validation now knows the chunk size.
    result = node.set_parameters([Parameter('execute_steps', value=11)])[0]
    assert not result.successful and '10' in result.reason
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
    assert node.runtime is None


@pytest.mark.timeout(30)
def test_missing_joint_names_refuses_configure(make_node, checkpoint):
    node = make_node({'checkpoint_path': str(checkpoint), 'warmup': False})
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert 'joint_names' in node._configure_error


@pytest.mark.timeout(60)
def test_params_module_prints_a_table_row_per_parameter(tmp_path):
    out = subprocess.run([sys.executable, '-m', 'vla_policy_node.params'], capture_output=True, text=True,
                         env=ros_env(DOMAIN_ID, tmp_path), cwd=str(REPO_ROOT), timeout=50, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith('| `') and not line.startswith('| `<output>.')]
    assert len(rows) == len(PARAMETERS)
    for spec, row in zip(PARAMETERS, rows):
        cells = [c.strip() for c in row.strip('|').split('|')]
        assert cells[0] == f'`{spec.name}`'
        assert cells[1] == spec.type_name
        assert cells[3] == ('restart' if SPECS[spec.name].read_only else 'yes')


@pytest.mark.timeout(60)
@pytest.mark.parametrize('policy_type, field, value', [
    ('pi05', 'use_visual_memory', True),
    ('pi0', 'n_obs_steps', 2),
    ('pi0', 'some_future_lerobot_field', 1),
])
def test_checkpoint_with_an_unimplemented_field_refuses_configure(make_node, ctx, tmp_path, policy_type, field,
                                                                  value):
    folder = write_tiny_default(tmp_path / 'ckpt', policy_type)
    raw = json.loads((folder / 'config.json').read_text())
    raw[field] = value
    (folder / 'config.json').write_text(json.dumps(raw))
    node = make_node({'checkpoint_path': str(folder), 'joint_names': list(JOINTS), 'instruction': 'go',
                      'diagnostics_period_sec': 0.1, 'warmup': False})
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert node.runtime is None
    status = wait_diagnostics(ctx, node, lambda s: s.level == DiagnosticStatus.ERROR)
    assert status is not None, 'no ERROR diagnostics'
    assert status.message.startswith('unconfigured') and field in status.message, status.message


@pytest.mark.timeout(60)
def test_the_padded_pi05_prompt_option_reaches_the_runtime_and_is_refused_for_pi0(make_node, tmp_path, checkpoint):
    pi05 = write_tiny_default(tmp_path / 'pi05', 'pi05')
    node = make_node({'checkpoint_path': str(pi05), 'joint_names': list(JOINTS), 'warmup': False,
                      'pi05_padded_state_prompt': True})
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.runtime.policy.options['pi05_padded_state_prompt']
    node = make_node({'checkpoint_path': str(checkpoint), 'joint_names': list(JOINTS), 'warmup': False,
                      'pi05_padded_state_prompt': True})
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert 'pi05_padded_state_prompt' in node._configure_error
