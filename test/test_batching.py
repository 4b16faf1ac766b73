"""Batching several robots' chunks in one server: each robot's chunk is its own ``infer``'s, for every family.

runtime/batch.py against PolicyRuntime.infer (fp32 on the CPU): prefixes of different lengths (prompt buckets),
misses and hits, step counts, seeds, RTC leftovers in each family's own mode (guided for the pi families, inpainting
for GR00T: rtc mode "auto") and trained ones, robots sending identical frames, bad
requests that fail alone; remote/batching.py's queue (batches close when full or when the window ends, the
bound refuses as busy); and vla_policy_serve's answers over real WebSockets, each connection its own.
"""
import asyncio
import threading
import time

import numpy as np
import pytest
import websockets.sync.client as sync_client

from runtime_fixtures import spy_batch_sizes
from vla_policy_node.observation import Observation, ObservationError
from vla_policy_node.policy.families import family_class, known_types
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.policy.tiny_default import write_random_checkpoint
from vla_policy_node.remote.batching import BatchingQueue, QueueFull
from vla_policy_node.remote.server import PolicyServer
from vla_policy_node.runtime import PolicyRuntime
from vla_policy_node.runtime.batch import infer_batch
from vla_policy_node.wire import codec

TOLERANCE = 1e-5        # fp32: a batched matrix product sums in another order than a single one


@pytest.fixture(scope='module', params=known_types())
def checkpoint(request, tmp_path_factory):
    """A tiny checkpoint of each registered family, trained for RTC where the family keeps that field."""
    config = family_class(request.param).tiny_config(rtc_training_max_delay=3)
    return write_random_checkpoint(tmp_path_factory.mktemp(request.param) / 'ckpt', config)


def load(checkpoint):
    runtime = PolicyRuntime.from_pretrained(checkpoint, device='cpu', dtype='float32')
    # Buckets every 4 tokens: prompts of different lengths give prefixes of different lengths.
    return PolicyRuntime.from_pretrained(checkpoint, device='cpu', dtype='float32',
                                         prompt_buckets=range(4, runtime.config.tokenizer_max_length, 4))


def frames(cameras, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.integers(0, 256, size=(24, 40, 3), dtype=np.uint8) for name in cameras}


def observation(cfg, seed, prompt):
    state = np.random.default_rng(100 + seed).normal(0, 0.3, cfg.state_dim)
    return Observation(images=frames(cfg.camera_names, seed), state=state, instruction=prompt)


def leftover(cfg, seed, length):
    return np.random.default_rng(200 + seed).normal(0, 0.1, (length, cfg.action_dim))


def fleet(cfg):
    """Robots as a fleet sends them: prompts of several lengths, two step counts, RTC in the family's own mode with
    leftovers of different lengths, delays and schedules, trained RTC where the checkpoint has it, and a robot whose
    frames, prompt and state equal another's (only its seed and leftover differ)."""
    guided = RTCSettings(mode='auto')              # the family's own first mode
    items = [
        (observation(cfg, 0, 'pick'), dict(seed=1)),
        (observation(cfg, 1, 'pick up the red cube and place it in the box'), dict(seed=2)),
        (observation(cfg, 2, 'go'), dict(seed=3, num_steps=3)),
        (observation(cfg, 3, 'stack the blocks'), dict(seed=4, num_steps=3)),
        (observation(cfg, 4, 'stack the blocks'), dict(seed=5, prev_actions=leftover(cfg, 4, 4), inference_delay=1,
                                                       rtc=guided)),
        (observation(cfg, 5, 'open the drawer'), dict(seed=6, prev_actions=leftover(cfg, 5, 7), inference_delay=2,
                                                      rtc=RTCSettings(mode='auto', schedule='exp',
                                                                      execution_horizon=5))),
        # robot 6 sends exactly robot 0's observation
        (observation(cfg, 0, 'pick'), dict(seed=7, prev_actions=leftover(cfg, 6, 5), inference_delay=1, rtc=guided)),
    ]
    if cfg.rtc_training_max_delay > 0:
        trained = RTCSettings(mode='trained')
        items += [(observation(cfg, 7, 'pick'), dict(seed=8, prev_actions=leftover(cfg, 7, 6), inference_delay=1,
                                                     rtc=trained)),
                  (observation(cfg, 8, 'push it'), dict(seed=9, prev_actions=leftover(cfg, 8, 6), inference_delay=3,
                                                        rtc=trained))]
    return items


def test_a_batch_gives_every_robot_its_own_chunk_for_every_family(checkpoint):
    batched, alone = load(checkpoint), load(checkpoint)
    items = fleet(batched.config)
    lengths = {len(batched._prepare(obs).tokens) for obs, _ in items}
    assert len(lengths) > 1, 'the fleet must batch prefixes of different lengths'
    expected = [alone.infer(obs, **options) for obs, options in items]
    fills, loops = spy_batch_sizes(batched.policy)
    for round_ in ('misses', 'hits'):
        chunks = infer_batch(batched, items)
        for robot, (chunk, own) in enumerate(zip(chunks, expected)):
            assert not isinstance(chunk, Exception), (robot, chunk)
            assert chunk.cache_hit == (round_ == 'hits'), (round_, robot)
            np.testing.assert_allclose(chunk.actions, own.actions, rtol=0, atol=TOLERANCE, err_msg=f'robot {robot}')
            assert chunk.num_steps == own.num_steps and chunk.continued == own.continued
    # Misses of one prompt length share a fill; each step count and RTC mode one loop (no robot ran alone).
    assert sum(fills) == len(items) - 1 and max(fills) > 1 and min(loops) > 1 and sum(loops) == 2 * len(items)
    # Robot 6 sent robot 0's observation: one prefix, yet its own noise and leftover, so its own actions.
    assert chunks[6].key == chunks[0].key
    assert np.abs(chunks[6].actions - chunks[0].actions).max() > 100 * TOLERANCE


def test_a_batch_of_one_is_infer_bit_for_bit(checkpoint):
    batched, alone = load(checkpoint), load(checkpoint)
    for obs, options in fleet(batched.config)[3:6]:
        for _ in range(2):                          # a miss, then a hit
            (chunk,) = infer_batch(batched, [(obs, options)])
            own = alone.infer(obs, **options)
            assert np.array_equal(chunk.actions, own.actions) and chunk.cache_hit == own.cache_hit


def test_a_bad_request_fails_alone_with_its_own_error(checkpoint):
    batched, alone = load(checkpoint), load(checkpoint)
    cfg = batched.config
    good = fleet(cfg)[:3]
    nan_state = observation(cfg, 9, 'pick')
    nan_state.state[0] = np.nan
    corrupt = observation(cfg, 10, 'pick')
    corrupt.images[cfg.camera_names[0]] = b'\xff\xd8 not a jpeg'
    items = [good[0], (nan_state, dict(seed=1)), good[1], (corrupt, dict(seed=1)), good[2],
             (good[0][0], dict(seed=1, num_steps=-1))]
    chunks = infer_batch(batched, items)
    for index in (1, 3, 5):
        assert isinstance(chunks[index], ObservationError), (index, chunks[index])
        with pytest.raises(ObservationError) as alone_error:
            alone.infer(items[index][0], **items[index][1])
        assert chunks[index].reason == alone_error.value.reason
    for index, (obs, options) in zip((0, 2, 4), good):
        np.testing.assert_allclose(chunks[index].actions, alone.infer(obs, **options).actions, rtol=0,
                                   atol=TOLERANCE)


# ---- the queue -----------------------------------------------------------------------------------------------

def run_queue(queue, items, gate=None):
    async def main():
        tasks = [asyncio.ensure_future(queue.submit(item)) for item in items]
        await asyncio.sleep(0)
        if gate is not None:
            await asyncio.sleep(0.2)
            gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        return asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        queue.close()


def test_the_queue_closes_a_batch_when_full_and_answers_each_request_its_own_row():
    batches = []

    def run_batch(items):
        batches.append(list(items))
        return [item * 10 for item in items]

    # No window: the requests already waiting when the worker is free make the batch, up to max_batch.
    queue = BatchingQueue(run_batch, max_batch=3, window_sec=0.0, max_queue=16)
    assert run_queue(queue, list(range(7))) == [item * 10 for item in range(7)]
    assert [len(batch) for batch in batches] == [3, 3, 1]
    batches.clear()
    # A window far longer than the test's timeout: only being full closes this batch.
    queue = BatchingQueue(run_batch, max_batch=2, window_sec=300.0, max_queue=16)
    assert run_queue(queue, [5, 6]) == [50, 60] and batches == [[5, 6]]


def test_a_batch_closes_once_every_client_that_could_send_is_in_it():
    batches = []

    def run_batch(items):
        batches.append(list(items))
        return list(items)

    # A window far longer than the test's timeout: only "every client is in" can close these batches.
    clients = [1]
    queue = BatchingQueue(run_batch, max_batch=8, window_sec=300.0, max_queue=16, clients=lambda: clients[0])
    assert run_queue(queue, [1]) == [1]
    clients[0] = 3
    queue = BatchingQueue(run_batch, max_batch=8, window_sec=300.0, max_queue=16, clients=lambda: clients[0])
    assert run_queue(queue, [2, 3, 4]) == [2, 3, 4]
    assert batches == [[1], [2, 3, 4]]


def test_the_queue_bound_refuses_as_busy_and_a_failed_batch_fails_each_request():
    gate = threading.Event()

    def slow(items):
        gate.wait(30)
        return list(items)

    queue = BatchingQueue(slow, max_batch=2, window_sec=0.0, max_queue=3)
    outcomes = run_queue(queue, list(range(5)), gate)
    assert [isinstance(o, QueueFull) for o in outcomes] == [False, False, False, True, True]
    assert queue.stats.refused_busy == 2 and queue.stats.pending == 0

    def broken(items):
        raise RuntimeError('the model failed')

    outcomes = run_queue(BatchingQueue(broken, max_batch=4, max_queue=8), [1, 2, 3])
    assert all(isinstance(o, RuntimeError) and 'the model failed' in str(o) for o in outcomes)


# ---- the server: identical frames on two connections -----------------------------------------------------------

class RunningServer:
    """PolicyServer.run on loopback in a thread."""

    def __init__(self, server):
        self.server = server
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(30)

    def _run(self):
        async def main():
            self._stop = asyncio.Event()

            def ready(port):
                self.port = port
                self._ready.set()

            await self.server.run('127.0.0.1', 0, ready, self._stop)

        self._loop.run_until_complete(main())

    def close(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.mark.parametrize('kind', known_types())
def test_two_robots_with_identical_frames_each_get_their_own_actions_from_one_batch(tmp_path, kind):
    """vla_policy_serve --max-batch 2 over WebSockets, every family: one batch, each robot its own actions (RTC in
    the family's own mode)."""
    checkpoint = write_random_checkpoint(tmp_path / 'ckpt', family_class(kind).tiny_config())
    alone = load(checkpoint)
    cfg = alone.config
    # A window far longer than a round: each batch closes as soon as both robots' requests are in it.
    server = PolicyServer(load(checkpoint), max_batch=2, batch_window_ms=1000.0, max_queue=8)
    running = RunningServer(server)
    message = {'images': frames(cfg.camera_names, 3), 'state': np.full(cfg.state_dim, 0.2), 'prompt': 'pick'}
    obs = Observation(images=message['images'], state=message['state'], instruction='pick')
    prev = leftover(cfg, 1, 5)
    requests = [dict(message, seed=11), dict(message, seed=12, prev_actions=prev, inference_delay=1,
                                             rtc={'mode': 'auto'})]
    expected = [alone.infer(obs, seed=11).actions,
                alone.infer(obs, seed=12, prev_actions=prev, inference_delay=1, rtc=RTCSettings(mode='auto')).actions]
    replies = [None, None]
    barrier = threading.Barrier(2)

    def robot(index):
        with sync_client.connect(f'ws://127.0.0.1:{running.port}/', compression=None, max_size=1 << 26,
                                 open_timeout=30) as ws:
            ws.recv(timeout=30)
            barrier.wait(30)
            for _ in range(3):
                ws.send(codec.packb(requests[index]))
                replies[index] = codec.unpackb(ws.recv(timeout=60), 1 << 26)

    try:
        threads = [threading.Thread(target=robot, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        running.close()
    assert server.queue.stats.largest_batch == 2, 'the two robots were never batched together'
    for reply, own in zip(replies, expected):
        np.testing.assert_allclose(reply['actions'], own, rtol=0, atol=TOLERANCE)
    assert np.abs(replies[0]['actions'] - replies[1]['actions']).max() > 100 * TOLERANCE


class GatedRuntime:
    """A real runtime whose inference waits for ``gate`` (the queue fills meanwhile)."""

    def __init__(self, runtime):
        self.runtime, self.config, self.model_revision = runtime, runtime.config, runtime.model_revision
        self.gate = threading.Event()

    def infer(self, observation, **options):
        self.gate.wait(60)
        return self.runtime.infer(observation, **options)


def test_a_full_queue_is_a_busy_error_frame_the_node_holds_on(tmp_path):
    from vla_policy_node.observation import SkipReason
    from vla_policy_node.params import resolve_values
    from vla_policy_node.remote_settings import load_remote
    from vla_policy_node.wire.errors import RemoteError

    checkpoint = write_random_checkpoint(tmp_path / 'ckpt', family_class(known_types()[0]).tiny_config())
    runtime = GatedRuntime(load(checkpoint))
    cfg = runtime.config
    running = RunningServer(PolicyServer(runtime, max_batch=1, max_queue=1))
    backend = load_remote(resolve_values({
        'backend': 'remote', 'remote_url': f'ws://127.0.0.1:{running.port}/', 'remote_key_layout': 'cameras',
        'remote_image_size': 0, 'remote_timeout_sec': 60.0, 'joint_names': [f'joint_{i}' for i in range(1, 7)],
        'instruction': 'x'}), warn=lambda _: None)
    other_robot = sync_client.connect(f'ws://127.0.0.1:{running.port}/', compression=None, open_timeout=30)
    try:
        other_robot.recv(timeout=30)
        other_robot.send(codec.packb({'images': frames(cfg.camera_names, 1), 'state': np.zeros(6), 'prompt': 'x'}))
        deadline = time.monotonic() + 60
        while running.server.queue.pending < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(RemoteError) as held:
            backend.infer(Observation(frames(cfg.camera_names, 2), np.zeros(6), 'x'), seed=0)
        runtime.gate.set()
        other_robot.recv(timeout=60)                    # the queue is free again: the next request is served
        chunk = backend.infer(Observation(frames(cfg.camera_names, 2), np.zeros(6), 'x'), seed=0)
    finally:
        runtime.gate.set()
        other_robot.close()
        backend.close()
        running.close()
    assert held.value.reason == SkipReason.REMOTE_ERROR and 'busy' in str(held.value)
    assert chunk.actions.shape == (cfg.chunk_size, 6)
