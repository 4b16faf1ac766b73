"""The fleet's routing table and configuration, without a Ray cluster: robots stay on the replica holding their
prefixes, new robots balance, the load guard spills one request, a dead replica's robots fail over, the table stays
bounded; the ingress admits plain robot names only and checks the key before the handshake; the options are checked
in one place and a Serve config file round-trips to the same FleetConfig."""
import asyncio
import hmac

import pytest
import yaml

from vla_policy_node.fleet.affinity import MAX_ROBOT_NAME, AffinityTable, robot_name
from vla_policy_node.fleet.cli import main, serve_config_yaml
from vla_policy_node.fleet.config import FleetConfig


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_robots_balance_over_replicas_and_stay_on_theirs():
    table = AffinityTable()
    replicas = ['a', 'b', 'c']
    first = {robot: table.rank(robot, replicas)[0] for robot in (f'arm{i}' for i in range(9))}
    assert sorted(table.robots_per_replica().values()) == [3, 3, 3]
    for _ in range(5):
        for robot, home in first.items():
            assert table.rank(robot, replicas, {'a': 3, 'b': 0, 'c': 1})[0] == home
    # Any router (a second ingress) agrees on ties: the tie-break is a hash both compute alike.
    assert AffinityTable().rank('arm0', replicas)[0] == AffinityTable().rank('arm0', replicas)[0]


def test_the_load_guard_spills_one_request_and_the_robot_keeps_its_replica():
    table = AffinityTable(load_guard=4)
    table.rank('arm', ['a', 'b'], {'a': 0, 'b': 0})
    home = table.home('arm')
    other = 'b' if home == 'a' else 'a'
    assert table.rank('arm', ['a', 'b'], {home: 4, other: 0})[0] == home         # within the guard: stay
    assert table.rank('arm', ['a', 'b'], {home: 5, other: 0}) == [other, home]   # past it: this request spills
    assert table.spills == 1 and table.home('arm') == home
    assert table.rank('arm', ['a', 'b'], {home: 1, other: 0})[0] == home


def test_a_dead_replicas_robots_fail_over_and_the_others_stay():
    table = AffinityTable()
    homes = {robot: table.rank(robot, ['a', 'b'])[0] for robot in ('r0', 'r1', 'r2', 'r3')}
    dead = homes['r0']
    alive = 'b' if dead == 'a' else 'a'
    after = {robot: table.rank(robot, [alive, 'c'])[0] for robot in homes}
    for robot, home in homes.items():
        if home == dead:
            assert after[robot] in (alive, 'c')
        else:
            assert after[robot] == home
    assert table.failovers == sum(home == dead for home in homes.values())
    # The failed-over robots went where fewest robots were: the new replica 'c'.
    assert all(after[robot] == 'c' for robot, home in homes.items() if home == dead)
    assert table.rank('r0', []) == []


def test_idle_robots_stop_counting_and_the_table_is_bounded():
    clock = Clock()
    table = AffinityTable(idle_sec=30, clock=clock, max_robots=50)
    for i in range(4):
        table.rank(f'old{i}', ['a', 'b'])
    clock.now = 31.0
    assert table.robots_per_replica() == {}
    assert table.home('old0') is not None               # forgotten only when the next request comes
    table.rank('new', ['a', 'b'])
    assert table.home('old0') is None and table.robots_per_replica() == {table.home('new'): 1}
    for i in range(200):
        table.rank(f'many{i}', ['a', 'b'])
    assert len(table._robots) == 50


def test_fleet_options_are_checked_in_one_place():
    FleetConfig(checkpoint='x')
    for bad, message in ((dict(routing='random'), 'routing'), (dict(min_replicas=1), 'both'),
                         (dict(min_replicas=3, max_replicas=2), 'min_replicas <= max_replicas'),
                         (dict(max_batch=20, max_queue=16), 'max_batch'), (dict(replicas=0), 'replicas'),
                         (dict(batch_window_ms=-1), 'batch_window_ms'), (dict(cpus_per_replica=0), 'cpus')):
        with pytest.raises(ValueError, match=message):
            FleetConfig(checkpoint='x', **bad)
    with pytest.raises(ValueError, match='unknown fleet option'):
        FleetConfig.from_args({'checkpoint': 'x', 'replica': '2'})


def test_the_serve_config_file_gives_back_the_same_fleet(capsys):
    cfg = FleetConfig(checkpoint='/models/pi0', replicas=3, max_batch=4, batch_window_ms=2.5, gpus_per_replica=1.0,
                      host='0.0.0.0', api_key_file='/etc/vla/key', cache_max_bytes=1 << 30)
    document = yaml.safe_load(serve_config_yaml(cfg))
    (application,) = document['applications']
    assert application['import_path'] == 'vla_policy_node.fleet.app:app_builder'
    assert document['http_options'] == {'host': '0.0.0.0', 'port': 8000}
    assert FleetConfig.from_args(application['args']) == cfg
    # `serve run ... key=value` hands every value over as text
    assert FleetConfig.from_args({name: str(value) for name, value in application['args'].items()}) == cfg
    assert main(['config', '--checkpoint', '/models/pi0', '--replicas', '3', '--max-batch', '4',
                 '--batch-window-ms', '2.5', '--gpus-per-replica', '1', '--host', '0.0.0.0',
                 '--api-key-file', '/etc/vla/key', '--cache-max-bytes', str(1 << 30)]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == document
    assert main(['config', '--checkpoint', 'x', '--max-batch', '99']) == 2


def test_a_robot_name_is_short_and_plain_or_refused():
    for good in ('arm3', 'cell-2.arm_1', 'site:arm@7', 'a' * MAX_ROBOT_NAME):
        assert robot_name(good) == good
    for bad in ('', 'a' * (MAX_ROBOT_NAME + 1), 'arm 3', 'arm3\n[WARN] forged', 'arm/../3', 'arm\u00e9', 'a\x00'):
        with pytest.raises(ValueError, match=r'robot name \(\?robot=.*not 1 to 128 letters'):
            robot_name(bad)


class FakeSocket:
    """What FleetIngress.robot uses of a Starlette WebSocket; records what the ingress did."""

    def __init__(self, query=None, authorization=None):
        self.query_params = {} if query is None else {'robot': query}
        self.headers = {} if authorization is None else {'authorization': authorization}
        self.events = []

    async def accept(self):
        self.events.append('accept')

    async def send_text(self, text):
        self.events.append(('text', text))

    async def send_bytes(self, data):
        self.events.append('metadata')

    async def close(self, code):
        self.events.append(('close', code))


class FakeIngress:
    """FleetIngress's state as the route reads it, without Serve; ``served`` is the robot its requests go as."""

    def __init__(self, api_key=''):
        self._api_key, self._open, self.served = api_key, 0, None
        self._connections = type('Gauge', (), {'set': lambda gauge, value: None})()

    async def metadata(self):
        return {'server': 'vla_policy_serve'}

    async def _serve(self, websocket, robot):
        self.served = robot


def _connect(ingress, socket):
    from vla_policy_node.fleet.ingress import FleetIngress
    asyncio.run(FleetIngress.robot(ingress, socket))
    return socket.events


def test_the_ingress_refuses_a_bad_robot_name_and_a_wrong_key_before_any_request(monkeypatch):
    pytest.importorskip('ray.serve')
    compared = []
    real_compare = hmac.compare_digest
    monkeypatch.setattr(hmac, 'compare_digest', lambda a, b: compared.append((type(a), type(b))) or real_compare(a, b))
    ingress = FakeIngress()
    events = _connect(ingress, FakeSocket('arm3\nforged log line'))
    assert events[0] == 'accept' and events[-1] == ('close', 1008) and ingress.served is None
    assert events[1][0] == 'text' and events[1][1].startswith('error: bad request: the robot name')
    assert 'forged' not in events[1][1]                   # the client's bytes are not echoed
    _connect(ingress, FakeSocket('x' * 10_000))
    assert ingress.served is None
    assert _connect(ingress, FakeSocket('arm3')) == ['accept', 'metadata'] and ingress.served == 'arm3'
    _connect(ingress, FakeSocket())
    assert ingress.served.startswith('connection-')       # no name: the connection is a robot of its own
    # The key: refused before the handshake (HTTP 403), whatever the header holds; the right one gets in.
    keyed = FakeIngress(api_key='s3cret')
    for header in (None, '', 'Api-Key s3cre', 'Api-Key s3cret ', 'Api-Key \u00e9\udcff'):
        assert _connect(keyed, FakeSocket('arm3', header)) == [('close', 1008)] and keyed.served is None
    assert _connect(keyed, FakeSocket('arm3', 'Api-Key s3cret'))[0] == 'accept' and keyed.served == 'arm3'
    # Each key check took constant time: hmac.compare_digest on bytes (a str == leaks where the bytes differ).
    assert compared == [(bytes, bytes)] * 6


class Handle:
    """A replica handle's ``metadata.remote()``: answers, or raises as Serve does while no replica is running."""

    def __init__(self, ready):
        self.ready = ready
        self.metadata = self

    async def remote(self):
        if not self.ready:
            raise RuntimeError('no running replica')
        return {'server': 'vla_policy_serve'}


def test_healthz_says_ok_only_once_a_replica_answers():
    pytest.importorskip('ray.serve')
    from vla_policy_node.fleet.ingress import FleetIngress

    ingress = FakeIngress()
    for ready, status in ((False, 503), (True, 200), (False, 503)):   # loading; serving; every replica gone
        ingress.policy = Handle(ready)
        response = asyncio.run(FleetIngress.healthz(ingress))
        assert response.status_code == status, (ready, response.body)


def test_autoscaling_follows_the_queue_length_and_serve_accepts_the_options():
    pytest.importorskip('ray.serve')
    from ray import serve

    from vla_policy_node.fleet.app import replica_options
    from vla_policy_node.fleet.replica import PolicyReplica

    fixed = replica_options(FleetConfig(checkpoint='x', replicas=3))
    assert fixed['num_replicas'] == 3 and 'autoscaling_config' not in fixed
    scaled = replica_options(FleetConfig(checkpoint='x', min_replicas=1, max_replicas=4, target_queue=2.0))
    assert 'num_replicas' not in scaled
    assert scaled['autoscaling_config'] == {'min_replicas': 1, 'max_replicas': 4, 'initial_replicas': 1,
                                            'target_ongoing_requests': 2.0}
    deployment = serve.deployment(**scaled)(PolicyReplica)         # Serve's own validation of every option
    autoscaling = deployment._deployment_config.autoscaling_config
    assert (autoscaling.min_replicas, autoscaling.max_replicas, autoscaling.target_ongoing_requests) == (1, 4, 2.0)
