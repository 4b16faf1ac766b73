"""The remote backend against real WebSocket servers on loopback: the codec, each profile's key layout,
metadata frame and reply form, every fault kind (skipped tick, hold, counter), never a crash."""
import logging
import os
import time
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest

from remote_helpers import WireServer, free_port, rss_bytes
from runtime_fixtures import tiny_checkpoints  # noqa: F401
from vla_policy_node.observation import InputBuffer, Observation, SkipReason
from vla_policy_node.params import ParameterError, resolve_values
from vla_policy_node.wire import codec
from vla_policy_node.remote.frames import resize_with_pad
from vla_policy_node.remote_settings import load_remote
from vla_policy_node.safety import PlanKind
from vla_policy_node.settings import input_layout, tick_settings
from vla_policy_node.tick import TickEngine

JOINTS = [f'joint_{i}' for i in range(1, 7)]
NS = 1_000_000_000
NOW = 100 * NS
SECRET = 'k3y-that-must-never-be-logged'


def frame(seed, height=48, width=64):
    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def values_for(server, **overrides):
    values = dict({'backend': 'remote', 'remote_url': server.url, 'remote_timeout_sec': 5.0, 'joint_names': JOINTS,
                   'seed': 0, 'instruction': 'pick'}, **overrides)
    return resolve_values(values)


@pytest.fixture
def servers():
    made = []

    def make(**kwargs):
        made.append(WireServer(**kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def backends():
    made = []

    def make(values):
        made.append(load_remote(values))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def observation(cameras, state=None, instruction='pick up the cube'):
    return Observation({name: frame(i) for i, name in enumerate(cameras)},
                       np.linspace(0.1, 0.6, 6) if state is None else state, instruction)


# ---- the codec ----------------------------------------------------------------------------------------------

def test_codec_round_trip_with_byte_markers_as_openpi_packs_them():
    message = {'a': np.arange(6, dtype='<f4').reshape(2, 3), 'b': np.float32(1.5), 'c': np.uint8(7),
               'nested': {'img': np.zeros((2, 2, 3), np.uint8)}, 'text': 'x', 'flag': np.bool_(True)}
    data = codec.packb(message)
    raw = msgpack.unpackb(data)          # no hook: what is really on the wire
    assert raw['a'][b'__ndarray__'] is True and raw['a'][b'dtype'] == '<f4' and raw['a'][b'shape'] == [2, 3]
    assert raw['b'][b'__npgeneric__'] is True and raw['b'][b'dtype'] == '<f4'
    back = codec.unpackb(data, 1 << 20)
    assert np.array_equal(back['a'], message['a']) and back['a'].dtype == np.float32
    assert back['b'] == 1.5 and back['c'] == 7 and back['c'].dtype == np.uint8 and back['text'] == 'x'
    assert not back['a'].flags.writeable     # decoded on the received bytes, as openpi's


@pytest.mark.parametrize('value', [np.array(3.5), np.zeros((2, 0)), np.array([True, False]),
                                   np.arange(6).reshape(2, 3).T, np.array([1, 2], '>i4'), np.float16([1, 2])])
def test_codec_round_trips_every_layout_exactly(value):
    back = codec.unpackb(codec.packb(value), 1 << 20)
    assert back.dtype == value.dtype and back.shape == value.shape and np.array_equal(back, value)


@pytest.mark.parametrize('value', [np.array([1 + 2j]), np.array([object()], dtype=object),
                                   np.zeros(2, dtype=[('x', 'f4')]), np.complex64(1j)])
def test_codec_refuses_object_void_and_complex_dtypes_when_sending(value):
    with pytest.raises(codec.CodecError):
        codec.packb({'x': value})


@pytest.mark.parametrize('dtype', ['|O', '<c8', '|V4', 'O', '(2,)f4', '<M8[s]', 'not-a-dtype'])
def test_codec_refuses_object_void_and_complex_dtypes_when_receiving(dtype):
    forged = msgpack.packb({b'__ndarray__': True, b'data': b'\0' * 8, b'dtype': dtype, b'shape': [1]})
    with pytest.raises(codec.CodecError):
        codec.unpackb(forged, 1 << 20)


@pytest.mark.parametrize('data', [
    b'\x80\x03cos\nsystem\nq\x00.',                                            # a pickle: never unpickled
    np.random.default_rng(64).bytes(64), b'', b'\xdd\xff\xff\xff\xff',   # seeded garbage, a 4-billion array header
    msgpack.packb({b'__ndarray__': True, b'data': b'\0' * 4, b'dtype': '<f4', b'shape': [1 << 40]}),
    msgpack.packb({b'__ndarray__': True, b'data': b'\0' * 4, b'dtype': '<f4', b'shape': [-1]}),
    msgpack.packb({b'__ndarray__': True, b'data': 'text', b'dtype': '<f4', b'shape': [1]}),
    msgpack.packb({b'__npgeneric__': True, b'data': [1], b'dtype': '<f4'}),
    msgpack.ExtType(42, b'x') and msgpack.packb(msgpack.ExtType(42, b'xx')),
])
def test_codec_refuses_garbage_bombs_and_forgeries_without_crashing(data):
    with pytest.raises(codec.CodecError):
        codec.unpackb(data, 1 << 20)


def test_codec_refuses_a_frame_over_the_limit_before_reading_it():
    with pytest.raises(codec.CodecError, match='exceeds'):
        codec.unpackb(codec.packb(np.zeros(1000)), 1000)


def test_resize_with_pad_keeps_the_aspect_and_pads_with_zeros_as_openpi_image_tools():
    pixels = np.full((480, 640, 3), 200, dtype=np.uint8)
    out = resize_with_pad(pixels, 224)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    # ratio 640/224: 168 rows, (224 - 168) / 2 = 28 rows of zeros above and below.
    assert not out[:28].any() and not out[-28:].any() and (out[28:196] == 200).all()
    assert resize_with_pad(pixels[:224, :224], 224) is not None


# ---- each profile's wire ------------------------------------------------------------------------------------

def test_openpi_droid_layout_split_state_metadata_first_and_dict_reply(servers, backends):
    server = servers(profile='openpi', metadata={'reset_pose': [0.0] * 6}, api_key=SECRET)
    state = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    backend = backends(values_for(server, remote_api_key=SECRET, state_joint_names=JOINTS + ['gripper']))
    assert backend.metadata == {'reset_pose': [0.0] * 6}
    chunk = backend.infer(observation(['base_0_rgb', 'left_wrist_0_rgb'], np.append(state, 0.9)), seed=3)
    request = server.requests[-1]
    assert sorted(request) == sorted(['observation/exterior_image_1_left', 'observation/wrist_image_left',
                                      'observation/joint_position', 'observation/gripper_position', 'prompt'])
    assert request['observation/exterior_image_1_left'].shape == (224, 224, 3)       # resized on the robot
    assert request['observation/exterior_image_1_left'].dtype == np.uint8
    assert np.array_equal(request['observation/joint_position'], state)
    assert np.array_equal(request['observation/gripper_position'], [0.9])
    assert request['prompt'] == 'pick up the cube' and 'seed' not in request       # openpi takes no seed
    assert server.headers[-1]['Authorization'] == f'Api-Key {SECRET}'
    assert np.array_equal(chunk.actions, server.actions.astype(np.float64)) and chunk.actions.shape == (10, 6)


def test_libero_layout_and_raw_frames(servers, backends):
    server = servers(profile='openpi')
    backend = backends(values_for(server, remote_key_layout='libero', remote_image_size=0))
    backend.infer(observation(['base_0_rgb', 'left_wrist_0_rgb']))
    request = server.requests[-1]
    assert sorted(request) == ['observation/image', 'observation/state', 'observation/wrist_image', 'prompt']
    assert np.array_equal(request['observation/image'], frame(0)) and request['observation/state'].shape == (6,)


def test_aloha_layout_nests_images_as_chw(servers, backends):
    server = servers(profile='openpi')
    backend = backends(values_for(server, remote_key_layout='aloha', camera_names=['cam_high', 'cam_left_wrist']))
    backend.infer(observation(['cam_high', 'cam_left_wrist']))
    request = server.requests[-1]
    assert sorted(request) == ['images', 'prompt', 'state']
    assert sorted(request['images']) == ['cam_high', 'cam_left_wrist']
    assert request['images']['cam_high'].shape == (3, 224, 224)


def test_custom_key_map_parameters(servers, backends):
    server = servers(profile='openpi')
    backend = backends(values_for(server, camera_names=['base_0_rgb'], remote_image_keys=['obs.cam.front'],
                                  remote_state_keys=['obs.arm:4', 'obs.hand'], remote_prompt_key='task'))
    backend.infer(observation(['base_0_rgb']))
    request = server.requests[-1]
    assert sorted(request) == ['obs', 'task'] and sorted(request['obs']) == ['arm', 'cam', 'hand']
    assert request['obs']['arm'].shape == (4,) and request['obs']['hand'].shape == (2,)


def test_a_state_split_that_does_not_add_up_is_refused_at_configure(servers):
    server = servers(profile='openpi')
    with pytest.raises(ParameterError, match='remote_state_keys'):
        load_remote(values_for(server, remote_state_keys=['a:2', 'b:2']))


def test_sglang_camera_names_and_client_side_normalisation(servers, backends, tiny_checkpoints):  # noqa: F811
    from vla_policy_node.runtime import PolicyRuntime

    runtime = PolicyRuntime.from_pretrained(tiny_checkpoints['pi0'], device='cpu', dtype='float32')
    server = servers(profile='sglang')
    backend = backends(values_for(server, remote_profile='sglang', remote_stats_path=str(tiny_checkpoints['pi0'])))
    state = np.linspace(-0.5, 0.5, 6)
    chunk = backend.infer(observation(runtime.config.camera_names, state), seed=5)
    request = server.requests[-1]
    assert sorted(request) == ['observation', 'prompt', 'seed']
    assert sorted(request['observation']['images']) == sorted(runtime.config.camera_names)
    assert np.allclose(request['observation']['state'], runtime.state_normalizer.normalize(state), atol=1e-6)
    assert np.allclose(chunk.actions, runtime.action_normalizer.unnormalize(server.actions.astype(np.float64)))


def test_a_smolvla_folder_normalises_like_a_pi0_one(servers, backends, tmp_path):
    # remote_stats_path reads the folder through the family registry: any family's processor files serve.
    from vla_policy_node.policy.tiny_default import write_tiny_default
    from vla_policy_node.runtime import PolicyRuntime

    folder = write_tiny_default(tmp_path / 'tiny_smolvla', 'smolvla')
    runtime = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32')
    server = servers(profile='sglang')
    backend = backends(values_for(server, remote_profile='sglang', remote_stats_path=str(folder),
                                  camera_names=list(runtime.config.camera_names)))
    state = np.linspace(-0.5, 0.5, 6)
    chunk = backend.infer(observation(runtime.config.camera_names, state), seed=5)
    assert np.allclose(server.requests[-1]['observation']['state'], runtime.state_normalizer.normalize(state),
                       atol=1e-6)
    assert np.allclose(chunk.actions, runtime.action_normalizer.unnormalize(server.actions.astype(np.float64)))


def test_sglang_without_stats_is_refused_at_configure(servers):
    server = servers(profile='sglang')
    with pytest.raises(ParameterError, match='remote_stats_path'):
        load_remote(values_for(server, remote_profile='sglang'))


def test_vllm_omni_bare_array_reply(servers, backends):
    server = servers(profile='vllm_omni')
    backend = backends(values_for(server, remote_profile='vllm_omni'))
    chunk = backend.infer(observation(['base_0_rgb', 'left_wrist_0_rgb']), seed=1)
    assert np.array_equal(chunk.actions, server.actions.astype(np.float64))
    assert server.requests[-1]['seed'] == 1


@pytest.mark.parametrize('profile', ['openpi', 'vllm_omni'])
def test_the_other_reply_form_is_refused(servers, backends, profile):
    server = servers(profile=profile)
    backend = backends(values_for(server, remote_profile=profile))
    server.behaviour = 'wrong_form'
    with pytest.raises(Exception) as caught:
        backend.infer(observation(['base_0_rgb', 'left_wrist_0_rgb']))
    assert caught.value.reason == SkipReason.REMOTE_BAD_REPLY


# ---- faults -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('profile', ['openpi', 'sglang', 'vllm_omni'])
def test_each_profiles_error_frame_is_a_remote_error_then_it_recovers(servers, backends, tiny_checkpoints,  # noqa
                                                                      profile):
    server = servers(profile=profile)
    extra = {'remote_stats_path': str(tiny_checkpoints['pi0'])} if profile == 'sglang' else {}
    backend = backends(values_for(server, remote_profile=profile, **extra))
    obs = observation([name for name, _ in backend.key_map.cameras])
    server.behaviour = 'error'
    with pytest.raises(Exception) as caught:
        backend.infer(obs)
    assert caught.value.reason == SkipReason.REMOTE_ERROR
    server.behaviour = 'ok'
    assert backend.wait_connected(10)      # openpi and sglang closed (1011): reconnected in the background
    for _ in range(50):
        try:
            assert backend.infer(obs).actions.shape == (10, 6)
            break
        except Exception as exc:   # the close may land just after wait_connected saw the old connection
            assert exc.reason in (SkipReason.REMOTE_UNREACHABLE, SkipReason.REMOTE_DISCONNECTED)
            backend.wait_connected(10)
    else:
        raise AssertionError('never recovered')
    assert backend.describe()['remote_errors_error'] == 1


@pytest.mark.parametrize('behaviour, reason', [
    ('wrong_shape', SkipReason.REMOTE_BAD_REPLY), ('nan', SkipReason.REMOTE_BAD_REPLY),
    ('int_dtype', SkipReason.REMOTE_BAD_REPLY), ('oversize', SkipReason.REMOTE_BAD_REPLY),
    ('garbage', SkipReason.REMOTE_BAD_REPLY), ('drop', SkipReason.REMOTE_DISCONNECTED),
])
def test_bad_replies_are_refused_with_their_reason(servers, backends, behaviour, reason):
    server = servers(profile='openpi')
    backend = backends(values_for(server, remote_max_reply_bytes=1 << 20))
    server.behaviour = behaviour
    with pytest.raises(Exception) as caught:
        backend.infer(observation(['base_0_rgb', 'left_wrist_0_rgb']))
    assert caught.value.reason == reason, caught.value
    assert backend.describe()[f'remote_errors_{reason.value[len("remote_"):]}'] == 1


def test_a_slow_server_times_out_and_its_late_reply_never_answers_the_next_request(servers, backends):
    server = servers(profile='openpi')
    backend = backends(values_for(server, remote_timeout_sec=0.5))
    obs = observation(['base_0_rgb', 'left_wrist_0_rgb'])
    server.behaviour = 'slow'
    server.delay_sec = 2.0
    with pytest.raises(Exception) as caught:
        backend.infer(obs)
    assert caught.value.reason == SkipReason.REMOTE_TIMEOUT
    server.behaviour = 'ok'
    server.actions = server.actions + 1.0          # the next reply differs from the late one
    deadline_ok = False
    for _ in range(100):
        try:
            chunk = backend.infer(obs)
            deadline_ok = True
            break
        except Exception as exc:
            assert exc.reason in (SkipReason.REMOTE_UNREACHABLE, SkipReason.REMOTE_TIMEOUT)
            backend.wait_connected(5)
    assert deadline_ok and np.array_equal(chunk.actions, server.actions.astype(np.float64))


def wait_for_connect_failure(backend, timeout=30.0):
    """The first connection attempt has failed (on a loaded machine it may take longer than the wait in
    load_remote); before it, a request is refused as not connected yet."""
    deadline = time.monotonic() + timeout
    while backend.describe()['remote_connect_failures'] < 1:
        assert time.monotonic() < deadline, 'no connection attempt failed'
        time.sleep(0.02)


def test_wrong_api_key_and_refused_connection(servers, backends, caplog):
    server = servers(profile='openpi', api_key='right')
    caplog.set_level(logging.DEBUG)
    backend = backends(values_for(server, remote_api_key=SECRET, remote_timeout_sec=0.5))
    wait_for_connect_failure(backend)
    with pytest.raises(Exception) as caught:
        backend.infer(observation(['base_0_rgb', 'left_wrist_0_rgb']))
    assert caught.value.reason == SkipReason.REMOTE_AUTH
    described = backend.describe()
    assert described['remote_errors_auth'] == 1 and described['remote_connected'] is False
    assert SECRET not in repr(described) and SECRET not in caplog.text and SECRET not in str(caught.value)
    nobody = resolve_values(dict(values_for(server), remote_url=f'ws://127.0.0.1:{free_port()}/ws',
                                 remote_timeout_sec=0.3))
    refused = backends(nobody)
    wait_for_connect_failure(refused)
    with pytest.raises(Exception) as caught:
        refused.infer(observation(['base_0_rgb', 'left_wrist_0_rgb']))
    assert caught.value.reason == SkipReason.REMOTE_UNREACHABLE


def test_url_credentials_never_shown(servers, backends):
    server = servers(profile='openpi')
    backend = backends(values_for(server, remote_url=f'ws://user:{SECRET}@127.0.0.1:{server.port}/p?token={SECRET}'))
    assert backend.describe()['remote_url'] == f'ws://127.0.0.1:{server.port}/p'
    assert backend.summary().startswith(f'remote openpi server at ws://127.0.0.1:{server.port}/p ')
    assert SECRET not in backend.summary() and 'user' not in backend.summary()


def test_garbage_replies_keep_memory_bounded(servers, backends):
    server = servers(profile='openpi')
    backend = backends(values_for(server))
    obs = observation(['base_0_rgb', 'left_wrist_0_rgb'])
    server.behaviour = 'garbage'
    for _ in range(30):                      # warm the allocator
        with pytest.raises(Exception):
            backend.infer(obs)
    before = rss_bytes(os.getpid())
    for _ in range(300):
        with pytest.raises(Exception) as caught:
            backend.infer(obs)
        assert caught.value.reason == SkipReason.REMOTE_BAD_REPLY
    assert rss_bytes(os.getpid()) - before < 32 << 20
    server.behaviour = 'ok'
    assert backend.infer(obs).actions.shape == (10, 6)


# ---- through the tick: skipped, held, counted ---------------------------------------------------------------

def _header(ns):
    return SimpleNamespace(stamp=SimpleNamespace(sec=ns // NS, nanosec=ns % NS))


def _buffer(settings, ns=NOW):
    buf = InputBuffer()
    for entry in settings.layout.cameras:
        buf.put(entry, SimpleNamespace(header=_header(ns), height=8, width=8, encoding='rgb8', step=24,
                                       is_bigendian=0, data=bytes(range(192))), ns)
    buf.put(settings.layout.joint_states, SimpleNamespace(header=_header(ns), name=JOINTS, position=[0.0] * 6), ns)
    buf.put(settings.layout.instruction, SimpleNamespace(data='pick'), ns)
    return buf


@pytest.mark.parametrize('behaviour, reason', [('error', SkipReason.REMOTE_ERROR),
                                               ('nan', SkipReason.REMOTE_BAD_REPLY),
                                               ('garbage', SkipReason.REMOTE_BAD_REPLY),
                                               ('drop', SkipReason.REMOTE_DISCONNECTED),
                                               ('slow', SkipReason.REMOTE_TIMEOUT)])
def test_a_remote_fault_skips_the_tick_and_the_supervisor_holds(servers, backends, behaviour, reason):
    server = servers(profile='vllm_omni')
    values = values_for(server, remote_profile='vllm_omni', remote_timeout_sec=2.0)
    backend = backends(values)
    settings = tick_settings(values, input_layout(values, backend.config))
    engine = TickEngine(backend)
    engine.activate(NOW - NS)
    buf = _buffer(settings)
    good = engine.run(buf, settings, NOW)
    assert good.skip is None and good.review.kind is PlanKind.POLICY
    server.behaviour, server.delay_sec = behaviour, 6.0
    # Newly stamped frames: the same observation again would carry nothing new and never reach the server.
    bad = engine.run(_buffer(settings, NOW + NS // 10), settings, NOW + NS // 10)
    assert bad.skip is not None and bad.skip.reason == reason and bad.plan is None
    assert bad.review.kind is PlanKind.HOLD and len(bad.review.plan.positions) == 1      # on_fault: hold
    assert engine.stats.skipped == {reason.value: 1}
    server.behaviour = 'ok'
    backend.wait_connected(10)
    for step in range(2, 60):
        again = engine.run(_buffer(settings, NOW + step * NS // 10), settings, NOW + step * NS // 10)
        if again.skip is None:
            break
        backend.wait_connected(5)
    assert again.review.kind is PlanKind.POLICY            # the arm is driven again, no restart


@pytest.mark.parametrize('bad, reason', [
    (dict(images={'nope': frame(0)}), SkipReason.BAD_IMAGE),
    (dict(images={'base_0_rgb': np.zeros((4, 4), np.uint8)}), SkipReason.BAD_IMAGE),
    (dict(state=np.array([0.0, np.nan, 0, 0, 0, 0])), SkipReason.JOINT_STATE_NONFINITE),
    (dict(state=np.zeros(3)), SkipReason.JOINT_STATE_MALFORMED),
    (dict(instruction=' '), SkipReason.INSTRUCTION_EMPTY),
])
def test_bad_input_is_refused_before_anything_is_sent(servers, backends, bad, reason):
    server = servers(profile='openpi')
    backend = backends(values_for(server))
    fields = dict(images={'base_0_rgb': frame(0)}, state=np.zeros(6), instruction='pick')
    fields.update(bad)
    with pytest.raises(Exception) as caught:
        backend.infer(Observation(fields['images'], fields['state'], fields['instruction']))
    assert caught.value.reason == reason and not server.requests


def test_a_url_with_a_space_is_refused_at_configure_not_reported_as_an_unreachable_server():
    from vla_policy_node.params import ParameterError
    from vla_policy_node.remote_settings import check_url

    check_url('ws://fleet:8000/?robot=arm%201')
    for bad in ('ws://fleet:8000/?robot=arm 1', 'ws://fleet:8000/\tpolicy', 'ws://fleet:8000/?robot=a\x00'):
        with pytest.raises(ParameterError, match='percent-encode'):
            check_url(bad)
    with pytest.raises(ParameterError, match='ws://host'):
        check_url('http://fleet:8000/')
