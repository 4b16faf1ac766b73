"""The fleet over real Ray Serve on the CPU, everything on loopback: the wire and the key at the ingress, four
robots (the node's RemoteBackend, its own fault path) kept on their replicas, a replica killed mid-request (its
robots hold, then resume on another replica without a restart, the others never notice), and no TCP traffic of
any process of the run to an address other than 127.0.0.1.

One Ray instance and one Serve application (two replicas of a tiny model) for the whole module: Ray takes tens
of seconds to start on a 2-core machine. Waits are generous and nothing asserts a time.
"""
import os
import re
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

from vla_policy_node.fleet.cluster import use_loopback

use_loopback()                      # before ray is imported: Ray reads it at import
pytest.importorskip('ray')
pytest.importorskip('fastapi')

from remote_helpers import free_port  # noqa: E402
from vla_policy_node.observation import Observation, SkipReason  # noqa: E402
from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.runtime import PolicyRuntime  # noqa: E402
from vla_policy_node.wire.errors import RemoteError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
KEY = 'fleet-test-key'
HOLD_REASONS = (SkipReason.REMOTE_ERROR, SkipReason.REMOTE_DISCONNECTED, SkipReason.REMOTE_TIMEOUT)
TOLERANCE = 1e-5


@pytest.fixture(scope='module')
def fleet(tmp_path_factory):
    import ray
    from ray import serve

    from vla_policy_node.fleet.app import build_app
    from vla_policy_node.fleet.cluster import start_ray, start_serve
    from vla_policy_node.fleet.config import FleetConfig

    root = tmp_path_factory.mktemp('fleet')
    checkpoint = write_tiny_default(root / 'ckpt', 'pi0')
    (root / 'key').write_text(KEY + '\n')
    cfg = FleetConfig(checkpoint=str(checkpoint), replicas=2, cpus_per_replica=0.5, ingress_cpus=0.1,
                      port=free_port(), api_key_file=str(root / 'key'), max_batch=4, batch_window_ms=2.0,
                      request_timeout_sec=120.0)
    start_ray(num_cpus=2)
    try:
        start_serve(cfg.host, cfg.port)
        serve.run(build_app(cfg), name=cfg.name, route_prefix='/')
        yield cfg, checkpoint
    finally:
        serve.shutdown()
        ray.shutdown()


def robot_backend(cfg, robot, key=KEY):
    """A robot's remote backend, built from parameters as the node builds it."""
    from vla_policy_node.params import resolve_values
    from vla_policy_node.remote_settings import load_remote

    backend = load_remote(resolve_values({
        'backend': 'remote', 'remote_url': f'ws://127.0.0.1:{cfg.port}/?robot={robot}', 'remote_api_key': key,
        'remote_key_layout': 'cameras', 'remote_image_size': 0, 'remote_timeout_sec': 60.0,
        'joint_names': [f'joint_{i}' for i in range(1, 7)], 'instruction': 'x'}), warn=lambda _: None)
    backend.replicas = []                  # which replica answered each reply (a spy; the reply carries it)
    actions = backend._actions

    def spy(frame):
        result = actions(frame)
        backend.replicas.append(result[1].get('replica'))
        return result

    backend._actions = spy
    return backend


def frames(seed):
    rng = np.random.default_rng(seed)
    cameras = ('base_0_rgb', 'left_wrist_0_rgb')
    return {name: rng.integers(0, 256, size=(24, 40, 3), dtype=np.uint8) for name in cameras}


def test_the_fleet_speaks_the_wire_and_checks_the_key_at_the_ingress(fleet):
    import urllib.request

    cfg, checkpoint = fleet
    with urllib.request.urlopen(f'http://127.0.0.1:{cfg.port}/healthz', timeout=30) as response:
        assert response.read() == b'OK\n'
    observation = Observation(frames(1), np.full(6, 0.1), 'pick')
    expected = PolicyRuntime.from_pretrained(checkpoint, device='cpu', dtype='float32').infer(observation, seed=3)
    backend = robot_backend(cfg, 'wire')
    try:
        assert backend.metadata['server'] == 'vla_policy_serve' and backend.metadata['fleet']['routing'] == 'affinity'
        chunk = backend.infer(observation, seed=3)
        assert backend.infer(observation, seed=3).cache_hit
        assert_metrics_exported()            # while the robot is connected
    finally:
        backend.close()
    np.testing.assert_allclose(chunk.actions, expected.actions, rtol=0, atol=TOLERANCE)
    intruder = robot_backend(cfg, 'intruder', key='wrong')
    try:
        with pytest.raises(RemoteError) as refused:
            intruder.infer(observation, seed=3)
    finally:
        intruder.close()
    assert refused.value.reason == SkipReason.REMOTE_AUTH


def assert_metrics_exported():
    """The replicas' and the ingress's Ray Serve metrics reach Ray's Prometheus endpoint (on loopback)."""
    import urllib.request

    import ray

    port = ray.nodes()[0]['MetricsExportPort']
    wanted = ('ray_vla_fleet_served', 'ray_vla_fleet_cache_hits', 'ray_vla_fleet_batch_size_count',
              'ray_vla_fleet_replica_healthy', 'ray_vla_fleet_requests_total', 'ray_vla_fleet_connections')
    seen = set()

    def exported():
        with urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=30) as response:
            text = response.read().decode()
        seen.update(name for name in wanted if re.search(rf'^{name}{{.*}} [1-9]', text, re.MULTILINE))
        return len(seen) == len(wanted)

    wait_for(exported, 180, f'metrics exported: {sorted(set(wanted) - seen)} missing')


class Robot(threading.Thread):
    """Sends its own observation back to back (a robot at its control rate, frames unchanged: hits) until told to
    stop; records each request's outcome: (replica or the hold reason, cache hit, start time)."""

    def __init__(self, backend, index):
        super().__init__(daemon=True)
        self.backend, self.index = backend, index
        self.observation = Observation(frames(10 + index), np.full(6, 0.1 * index), f'task {index}')
        self.outcomes = []
        self.stop = threading.Event()
        self.in_flight_since = None          # when the request now on its way started, or None
        self.seconds = []                    # how long each request took, start to reply

    def run(self):
        while not self.stop.is_set():
            self.in_flight_since = started = time.monotonic()
            try:
                # 100 steps: each request spends long enough in its replica to be caught there by the kill.
                chunk = self.backend.infer(self.observation, seed=self.index, num_steps=100)
                outcome = (self.backend.replicas[-1], chunk.cache_hit)
            except RemoteError as exc:
                outcome = (exc.reason, False)
            self.in_flight_since = None
            self.seconds.append(time.monotonic() - started)
            self.outcomes.append(outcome)
            if isinstance(outcome[0], SkipReason):
                time.sleep(0.05)

    def in_flight_for(self, seconds):
        since = self.in_flight_since
        return since is not None and time.monotonic() - since > seconds


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def replica_actor(replica_id):
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor['name'].endswith(replica_id) and 'PolicyReplica' in actor['name']:
            return ray.get_actor(actor['name'], namespace=actor['namespace'])
    raise AssertionError(f'no actor for replica {replica_id}')


def test_four_robots_keep_their_replicas_and_a_killed_replica_is_a_hold_then_a_resume(fleet):
    import ray

    cfg, _ = fleet
    robots = [Robot(robot_backend(cfg, f'arm{i}'), i) for i in range(4)]
    try:
        for robot in robots:
            robot.start()
        wait_for(lambda: all(len(r.outcomes) >= 4 for r in robots), 300, 'every robot served 4 times')
        homes = {}
        for robot in robots:
            seen = robot.outcomes[:4]
            assert all(not isinstance(replica, SkipReason) for replica, _ in seen), seen
            assert len({replica for replica, _ in seen}) == 1, f'robot {robot.index} moved between replicas: {seen}'
            assert all(hit for _, hit in seen[1:]), f'robot {robot.index} missed on its own replica: {seen}'
            homes[robot.index] = seen[0][0]
        # Balanced by robots (the earlier tests' robots count while recent): both replicas serve some of these.
        assert len(set(homes.values())) == 2, f'robots not spread over both replicas: {homes}'

        # Kill the replica of robot 0 while robot 0's request is in it: half way through a request of a hundred
        # steps, by the median of its requests so far (the machine's load sets how long one takes).
        victim = homes[0]
        affected = [r for r in robots if homes[r.index] == victim]
        others = [r for r in robots if homes[r.index] != victim]
        halfway = 0.5 * float(np.median(robots[0].seconds))
        wait_for(lambda: robots[0].in_flight_for(halfway), 120, 'robot 0 has a request on its way')
        before = {r.index: len(r.outcomes) for r in robots}
        ray.kill(replica_actor(victim), no_restart=True)

        def resumed(robot):
            after = robot.outcomes[before[robot.index]:]
            moved = [i for i, (replica, _) in enumerate(after) if replica not in (victim, *HOLD_REASONS)]
            return bool(moved) and len(after) - moved[0] >= 3

        wait_for(lambda: all(resumed(r) for r in affected), 300, 'the robots of the killed replica resumed')
        for robot in others:
            wait_for(lambda: len(robot.outcomes) - before[robot.index] >= 3, 120, 'the other robots went on')
    finally:
        for robot in robots:
            robot.stop.set()
        for robot in robots:
            robot.join(120)
            robot.backend.close()
    # Robot 0's request was in the killed replica: its node holds. (Only a reply that had already left the replica
    # when the kill landed, a stall of the test thread, can spare it: then that reply names the victim.) Its
    # neighbour holds too unless its next request already found the router told of the death. Either way both
    # resume on another replica, where their requests are hits again (affinity to the new replica); faults are
    # only of the kinds the node holds on.
    in_flight = robots[0].outcomes[before[0]]
    assert in_flight[0] == victim or any(isinstance(replica, SkipReason)
                                         for replica, _ in robots[0].outcomes[before[0]:]), robots[0].outcomes
    for robot in affected:
        after = robot.outcomes[before[robot.index]:]
        assert {replica for replica, _ in after if isinstance(replica, SkipReason)} <= set(HOLD_REASONS), after
        # A reply already on its way when the replica was killed may still arrive; after the first reply from
        # another replica, every reply comes from that one.
        moved = next(i for i, (replica, _) in enumerate(after) if replica not in (victim, *HOLD_REASONS))
        resumed_on = after[moved:]
        assert len({replica for replica, _ in resumed_on}) == 1, after
        assert all(hit for _, hit in resumed_on[1:]), after
    for robot in others:
        after = robot.outcomes[before[robot.index]:]
        assert all(replica == homes[robot.index] for replica, _ in after), f'robot {robot.index}: {after}'
    assert_traffic_stays_on_loopback()


# ---- loopback --------------------------------------------------------------------------------------------------

def our_processes():
    """This process and every process below it (Ray's GCS, raylet, workers, replicas, proxy)."""
    children = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                stat = open(f'/proc/{entry}/stat').read()
            except OSError:
                continue
            parent = int(stat[stat.rindex(')') + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def is_loopback(address):
    host = address.rsplit(':', 1)[0].strip('[]')
    return host in ('127.0.0.1', '::1') or host.startswith('::ffff:127.') or host.startswith('127.')


def assert_traffic_stays_on_loopback():
    if shutil.which('ss') is None:
        pytest.skip('needs ss (iproute2) to list connections')
    listing = subprocess.run(['ss', '-tnpH'], capture_output=True, text=True, timeout=60).stdout
    ours = our_processes()
    checked, outside = 0, []
    for line in listing.splitlines():
        pids = {int(pid) for pid in re.findall(r'pid=(\d+)', line)}
        if not pids & ours:
            continue
        fields = line.split()
        local, peer = fields[3], fields[4]
        checked += 1
        if not (is_loopback(local) and is_loopback(peer)):
            outside.append(line)
    assert checked > 10, f'expected the run\'s own connections (Ray, Serve, robots) in ss, saw {checked}'
    assert not outside, 'traffic off loopback:\n' + '\n'.join(outside)


def test_every_connection_of_the_run_is_on_loopback(fleet):
    cfg, _ = fleet
    backend = robot_backend(cfg, 'loopback')
    try:
        backend.infer(Observation(frames(2), np.zeros(6), 'pick'), seed=1)
        assert_traffic_stays_on_loopback()
    finally:
        backend.close()
