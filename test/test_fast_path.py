"""The fast path without a GPU (fast_path.py, graph_capture.py): the static-workspace denoise, the code a CUDA
graph replays, run eagerly, is bit-identical to today's denoise; no stale K/V across entries; graphs captured
and replayed through the strict capture stand-in (test/capture_standin.py): only inside the warm-up's capture
window, a failed capture undone and logged once, on the configured device, their bytes counted as the pools
they hold; graph-cache bounds; prompt buckets; cuda_graphs refused without CUDA; the stage timer's clocks."""
import contextlib
import logging

import numpy as np
import pytest
import torch

from capture_standin import CaptureStandIn, CaptureViolation
from runtime_fixtures import make_observation, tiny_checkpoint, tiny_checkpoints  # noqa: F401
from vla_policy_node.fast_path import (NOT_CAPTURED, TOO_LARGE, CapturedGraph, EntryToken, FastPathError,
                                       GraphCache, PrefixGraphs, StaticDenoiser, build_fast_path, capture_window,
                                       check_buckets, fit_to_bucket, prompt_bucket, resolve_cuda_graphs,
                                       tree_nbytes)
from vla_policy_node.graph_capture import GraphCapturer, failure_reason, pool_reserved_bytes
from vla_policy_node.params import problems, resolve_values
from vla_policy_node.policy.families import family_class, known_types
from vla_policy_node.policy.families.pi0.model import PiZeroModel
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.policy.tiny_default import write_tiny_default
from vla_policy_node.runtime import PolicyRuntime, stage_timer
from vla_policy_node.runtime.warmup import chunking_modes

CPU = torch.device('cpu')
PROMPT = 12


def tiny_model(policy_type: str) -> PiZeroModel:
    config = family_class(policy_type).tiny_config(tokenizer_max_length=PROMPT, chunk_size=6, n_action_steps=6,
                                                   rtc_training_max_delay=3)
    model = PiZeroModel(config).eval()
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.15)
    return model


def prefix_inputs(config, seed: int, valid_tokens: int = 7, length: int = PROMPT):
    generator = torch.Generator().manual_seed(seed)
    height, width = config.image_resolution
    cameras = len(config.all_camera_names)
    images = torch.rand(1, cameras, 3, height, width, generator=generator) * 2 - 1
    image_masks = torch.ones(1, cameras, dtype=torch.bool)
    image_masks[0, -1] = False
    tokens = torch.randint(3, config.vocab_size, (1, length), generator=generator)
    token_masks = torch.zeros(1, length, dtype=torch.bool)
    token_masks[0, :valid_tokens] = True
    tokens[~token_masks] = 0
    return images, image_masks, tokens, token_masks


def chunk_inputs(config, seed: int):
    generator = torch.Generator().manual_seed(100 + seed)
    state = torch.randn(1, config.max_state_dim, generator=generator)
    noise = torch.randn(1, config.chunk_size, config.max_action_dim, generator=generator)
    leftover = torch.randn(4, config.action_dim, generator=generator)
    return state, noise, leftover


CONTINUATIONS = {
    'plain': {},
    'guided': dict(inference_delay=2, rtc=RTCSettings(mode='guided', execution_horizon=4)),
    'trained': dict(inference_delay=2, rtc=RTCSettings(mode='trained')),
}


def continuation(kind: str, leftover: torch.Tensor):
    extra = dict(CONTINUATIONS[kind])
    if extra:
        extra['prev_chunk_left_over'] = leftover
    return extra


@pytest.fixture
def standin():
    """CUDA capture on the CPU, strict (test/capture_standin.py): fast_path.py's own capture code runs."""
    with CaptureStandIn() as installed:
        yield installed


class LoopReadingAValue:
    """A family whose loop reads a tensor value on the host: its capture fails (as ``.item()`` fails a CUDA
    capture); everything else is the wrapped model's."""

    def __init__(self, model):
        self.model, self.config = model, model.config

    def __getattr__(self, name):
        return getattr(self.model, name)

    def euler_loop(self, chunk):
        if float(chunk.noise.abs().max()) > 1e9:
            raise AssertionError('unreachable')
        return self.model.euler_loop(chunk)


@pytest.fixture(scope='module', params=['pi0', 'pi05'])
def model(request):
    return tiny_model(request.param)


# ---- the static workspace, eagerly: bit-identical to today's path --------------------------------------

@pytest.mark.parametrize('kind', list(CONTINUATIONS))
@pytest.mark.parametrize('valid_tokens, bucket', [(7, PROMPT), (7, 8), (3, 4)])
def test_static_workspace_is_bit_identical_to_the_denoise(model, kind, valid_tokens, bucket):
    config = model.config
    images, image_masks, tokens, token_masks = prefix_inputs(config, 0, valid_tokens)
    ids, mask = fit_to_bucket(tokens[0].numpy(), token_masks[0].numpy(), check_buckets([bucket], PROMPT))
    assert len(ids) == bucket
    with torch.no_grad():
        context = model.fill_prefix(images, image_masks, torch.from_numpy(ids)[None], torch.from_numpy(mask)[None])
    kv = context['kv'].clone()
    state, noise, leftover = chunk_inputs(config, 0)
    fast = StaticDenoiser(model, family_name=config.policy_type, graphs=False)
    expected = model.denoise(context, state, noise, 3, **continuation(kind, leftover))
    got = fast.denoise(context, EntryToken('a', 1), state, noise, 3, **continuation(kind, leftover))
    assert torch.equal(got, expected)
    assert torch.equal(context['kv'], kv), 'the entry must never be written'
    # The same entry again: no copy, same actions.
    again = fast.denoise(context, EntryToken('a', 1), state, noise, 3, **continuation(kind, leftover))
    assert torch.equal(again, expected) and fast.describe()['workspace_copies'] == 1


def test_a_bucket_changes_the_actions_by_rounding_only(model):
    """Masked padding is invisible: a prompt fitted to a smaller bucket gives the unpadded result up to fp32
    rounding (the max difference is what bench/gpu_checks.py reports on the GPU)."""
    config = model.config
    images, image_masks, tokens, token_masks = prefix_inputs(config, 1, valid_tokens=5)
    state, noise, _ = chunk_inputs(config, 1)
    results = []
    for bucket in (PROMPT, 8, 5):
        ids, mask = fit_to_bucket(tokens[0].numpy(), token_masks[0].numpy(), check_buckets([bucket], PROMPT))
        with torch.no_grad():
            context = model.fill_prefix(images, image_masks, torch.from_numpy(ids)[None],
                                        torch.from_numpy(mask)[None])
        results.append(model.denoise(context, state, noise, 3))
    assert (results[0] - noise).abs().max() > 0.1
    for other in results[1:]:
        assert (other - results[0]).abs().max() < 1e-5


def test_alternating_entries_through_the_workspace_give_fresh_results(model):
    config = model.config
    state, noise, _ = chunk_inputs(config, 2)
    contexts = {}
    with torch.no_grad():
        for name, seed in (('A', 3), ('B', 4)):
            contexts[name] = model.fill_prefix(*prefix_inputs(config, seed))
    fresh = {name: model.denoise(context, state, noise, 3) for name, context in contexts.items()}
    assert not torch.equal(fresh['A'], fresh['B'])
    fast = StaticDenoiser(model, family_name=config.policy_type, graphs=False)
    tokens = {'A': EntryToken('key-a', 1), 'B': EntryToken('key-b', 2)}
    for name in ('A', 'B', 'A', 'A', 'B'):
        assert torch.equal(fast.denoise(contexts[name], tokens[name], state, noise, 3), fresh[name]), name
    assert fast.describe()['workspace_copies'] == 4
    # The token decides, never the object: B under A's token, right after A, is (wrongly) served A's K/V. That
    # is the stale result the tokens exist to prevent, and what this test would see if the copy-in were skipped.
    assert torch.equal(fast.denoise(contexts['A'], tokens['A'], state, noise, 3), fresh['A'])
    stale = fast.denoise(contexts['B'], tokens['A'], state, noise, 3)
    assert not torch.equal(stale, fresh['B'])
    # A recomputed entry under the same key has a new generation: copied again.
    assert torch.equal(fast.denoise(contexts['B'], EntryToken('key-a', 3), state, noise, 3), fresh['B'])


# ---- graphs, captured through the strict stand-in ------------------------------------------------------

@pytest.mark.parametrize('kind', list(CONTINUATIONS))
def test_graph_replays_give_the_eager_results(standin, model, kind):
    config = model.config
    fast = StaticDenoiser(model, family_name=config.policy_type, graphs=True)
    with torch.no_grad():
        contexts = [model.fill_prefix(*prefix_inputs(config, seed)) for seed in (5, 6)]
    for i, (c, seed) in enumerate([(0, 0), (1, 1), (0, 2), (1, 3)]):
        state, noise, leftover = chunk_inputs(config, seed)
        expected = model.denoise(contexts[c], state, noise, 3, **continuation(kind, leftover))
        with capture_window([fast], strict=True) if i == 0 else contextlib.nullcontext():
            got = fast.denoise(contexts[c], EntryToken(str(c), c), state, noise, 3, **continuation(kind, leftover))
        assert torch.equal(got, expected), f'chunk {i}'
    assert standin.captures == 1 and fast.replays == 4 and fast.eager_runs == 0
    # Another step count is another graph, captured only inside the window.
    state, noise, leftover = chunk_inputs(config, 9)
    fast.denoise(contexts[0], EntryToken('0', 0), state, noise, 2, **continuation(kind, leftover))
    assert standin.captures == 1 and fast.describe()['eager_fallback_reasons'] == f'{NOT_CAPTURED} x1'
    with capture_window([fast], strict=True):
        fast.denoise(contexts[0], EntryToken('0', 0), state, noise, 2, **continuation(kind, leftover))
    assert standin.captures == 2 and len(fast.cache) == 2


def test_a_graph_per_chunking_mode(standin, model):
    config = model.config
    fast = StaticDenoiser(model, family_name=config.policy_type, graphs=True)
    with torch.no_grad():
        context = model.fill_prefix(*prefix_inputs(config, 7))
    state, noise, leftover = chunk_inputs(config, 7)
    with capture_window([fast], strict=True):
        for kind in CONTINUATIONS:
            fast.denoise(context, EntryToken('c', 1), state, noise, 3, **continuation(kind, leftover))
    assert standin.captures == 3 and len(fast.cache) == 3


def test_a_failed_capture_logs_once_and_that_shape_stays_eager(standin, model, caplog):
    config = model.config
    family = LoopReadingAValue(model)
    fast = StaticDenoiser(family, family_name=config.policy_type, graphs=True)
    with torch.no_grad():
        context = model.fill_prefix(*prefix_inputs(config, 8))
    state, noise, _ = chunk_inputs(config, 8)
    expected = model.denoise(context, state, noise, 3)
    with caplog.at_level(logging.WARNING, logger='vla_policy_node.fast_path'), capture_window([fast], strict=False):
        for _ in range(3):
            assert torch.equal(fast.denoise(context, EntryToken('c', 1), state, noise, 3), expected)
    logged = [r.getMessage() for r in caplog.records if 'capture failed' in r.getMessage()]
    assert len(logged) == 1 and '.__float__() of a tensor' in logged[0], logged
    assert fast.eager_runs == 3 and fast.describe()['graph_capture_failures'] == 1 and standin.captures == 0
    strict = StaticDenoiser(family, family_name=config.policy_type, graphs=True)
    with pytest.raises(FastPathError, match='capture failed'), capture_window([strict], strict=True):
        strict.denoise(context, EntryToken('c', 1), state, noise, 3)


def test_a_failed_capture_leaves_the_thread_on_its_stream_and_the_allocator_as_it_was(standin):
    """torch's graph.__exit__ raises from capture_end() before it restores the stream, and the C++ capture_end
    throws before it stops routing into the graph's pool; graph_capture.GraphCapturer undoes both."""
    before_stream, before_pools = torch.cuda.current_stream(), standin.allocator_state()
    static = torch.ones(4)
    with pytest.raises(RuntimeError, match='cudaErrorStreamCaptureInvalidated') as failure:
        GraphCapturer().capture(lambda x: x * float(x.sum()), static)
    assert isinstance(failure.value.__context__, CaptureViolation), 'the cause is chained'
    assert failure_reason(failure.value).startswith('CaptureViolation: operation not permitted')
    assert torch.cuda.current_stream() is before_stream, 'later work would run on the capture stream'
    assert standin.allocator_state() == before_pools, 'the failed graph\'s pool is still routing / held'
    graph = GraphCapturer().capture(lambda x: x * 3, static)       # the next capture works as usual
    static.fill_(2.0)
    graph.graph.replay()
    assert torch.equal(graph.output, torch.full((4,), 6.0)) and torch.cuda.current_stream() is before_stream


def test_the_capture_its_streams_and_the_chunk_timer_use_the_configured_device(standin):
    """device cuda:1: the capture, its side stream, its pool and the stage timer's events are on cuda:1, not
    on the current device (cuda:0). Captured on cuda:0, the graph would be empty and its replays stale."""
    standin.device_index = 1                                       # the CPU tensors stand for cuda:1's
    static = torch.ones(4)
    graph = GraphCapturer(torch.device('cuda', 1)).capture(lambda x: x * 3, static)
    made = {(what, index) for what, index in standin.records if what in ('stream', 'capture')}
    assert made == {('stream', 1), ('capture', 1)}, standin.records
    static.fill_(2.0)
    graph.graph.replay()
    assert torch.equal(graph.output, torch.full((4,), 6.0)), 'an empty graph replays nothing'
    standin.records.clear()
    timer = stage_timer.StageTimer(torch.device('cuda', 1))
    timer.start('hash')
    timer.start('denoise')
    timer.stop()
    assert [index for what, index in standin.records if what == 'event'] == [1, 1, 1, 1]


def test_prefix_graph_output_is_copied_into_a_fresh_context(standin, model):
    config = model.config
    graphs = PrefixGraphs(model, graphs=True)
    first_inputs, second_inputs = prefix_inputs(config, 9), prefix_inputs(config, 10)
    with torch.no_grad():
        expected = [model.fill_prefix(*first_inputs), model.fill_prefix(*second_inputs)]
        with capture_window([graphs], strict=True):
            first = graphs.fill_prefix(*first_inputs)
        first_kv = first['kv'].clone()
        second = graphs.fill_prefix(*second_inputs)
    assert torch.equal(first['kv'], expected[0]['kv']) and torch.equal(second['kv'], expected[1]['kv'])
    assert torch.equal(first['kv'], first_kv), 'a later replay must not overwrite an earlier entry'
    assert torch.equal(first['pad_mask'], expected[0]['pad_mask'])
    assert len(graphs.cache) == 1 and graphs.replays == 2


def test_graph_cache_bounds_hold():
    def entry(nbytes):
        return CapturedGraph(graph=None, inputs=None, output=None, nbytes=nbytes)

    cache = GraphCache(max_graphs=2, max_bytes=100)
    assert cache.put('a', entry(10)) and cache.put('b', entry(10))
    cache.get('a')                                   # 'b' is now the least recently used
    cache.put('c', entry(10))
    assert cache.keys() == ['a', 'c'] and cache.evictions == 1
    cache.put('d', entry(85))                        # bytes: evicts from the LRU end until it fits
    assert cache.keys() == ['c', 'd'] and cache.bytes == 95 and cache.evictions == 2
    assert not cache.put('e', entry(101)) and cache.keys() == ['c', 'd']
    assert not GraphCache(max_graphs=0).put('a', entry(1))
    with pytest.raises(ValueError):
        GraphCache(max_graphs=-1)
    held = GraphCache(max_graphs=4, max_bytes=100, held=lambda: 60)      # e.g. the workspaces
    assert held.put('a', entry(30)) and not held.put('b', entry(41))
    assert held.put('c', entry(40)) and held.keys() == ['c'] and held.bytes == 40


def test_pool_bytes_are_the_pools_reserved_segments(monkeypatch):
    """What a graph holds is its private pool's reserved segments on its device, not an allocated delta."""
    segments = [{'device': 0, 'segment_pool_id': (0, 7), 'total_size': 2 << 20, 'allocated_size': 1000},
                {'device': 0, 'segment_pool_id': (0, 7), 'total_size': 20 << 20, 'allocated_size': 5},
                {'device': 1, 'segment_pool_id': (0, 7), 'total_size': 2 << 20, 'allocated_size': 0},
                {'device': 0, 'segment_pool_id': (0, 0), 'total_size': 64 << 20, 'allocated_size': 1 << 20}]
    monkeypatch.setattr(torch.cuda, 'memory_snapshot', lambda: segments)
    assert pool_reserved_bytes((0, 7), 0) == 22 << 20
    assert pool_reserved_bytes((0, 8), 0) == 0
    monkeypatch.setattr(torch.cuda, 'memory_snapshot', lambda: [{'device': 0, 'total_size': 1}])
    assert pool_reserved_bytes((0, 7), 0) is None, 'no pool ids: the caller falls back to the reserved delta'


def test_graph_bytes_count_each_pool_and_the_shared_workspace_once(standin, model):
    config = model.config
    fast, prefix = build_fast_path(model, model, family_name=config.policy_type, graphs=True, device=CPU)
    with torch.no_grad():
        context = model.fill_prefix(*prefix_inputs(config, 11))
    state, noise, leftover = chunk_inputs(config, 11)
    with capture_window([fast], strict=True):
        for steps in (1, 2, 3):                      # three graphs over the one workspace of this bucket
            fast.denoise(context, EntryToken('c', 1), state, noise, steps)
    (workspace,) = fast.workspaces.values()
    pools = {segment['segment_pool_id']: segment['total_size'] for segment in torch.cuda.memory_snapshot()}
    entries = [fast.cache.get(key) for key in fast.cache.keys()]
    inputs = sum(tree_nbytes(entry.inputs, exclude=workspace.buffers) for entry in entries)
    assert len(pools) == 3 and inputs > 0
    described = fast.describe()
    assert described['graph_bytes'] == sum(pools.values()) + inputs
    assert described['workspace_bytes'] == workspace.nbytes > 0
    assert fast.cache.bytes + workspace.nbytes + prefix.cache.bytes == described['graph_bytes'] + workspace.nbytes
    # The budget holds the workspace once beside the graphs: one byte less and the next graph is refused.
    tight, _ = build_fast_path(model, model, family_name=config.policy_type, graphs=True, device=CPU,
                               max_graph_bytes=described['graph_bytes'] + workspace.nbytes - 1)
    with capture_window([tight], strict=False):
        for steps in (1, 2, 3):
            tight.denoise(context, EntryToken('c', 1), state, noise, steps)
    assert len(tight.cache) == 2 and tight.describe()['graph_bytes'] + workspace.nbytes <= tight.cache.max_bytes


# ---- buckets ------------------------------------------------------------------------------------------

def test_prompt_buckets():
    assert check_buckets(None, 48) == (48,)
    assert check_buckets([32, 16, 32], 48) == (16, 32, 48)
    with pytest.raises(ValueError):
        check_buckets([0], 48)
    with pytest.raises(ValueError):
        check_buckets([64], 48)
    assert [prompt_bucket(n, (16, 32, 48)) for n in (1, 16, 17, 48)] == [16, 16, 32, 48]
    ids, mask = np.arange(10), np.arange(10) < 6
    short, short_mask = fit_to_bucket(ids, mask, (8, 10))
    assert short.tolist() == list(range(8)) and short_mask.sum() == 6
    assert fit_to_bucket(ids, mask, (10,))[0] is ids
    with pytest.raises(ValueError):
        fit_to_bucket(ids, ~mask, (4, 10))           # not right-padded


# ---- the runtime --------------------------------------------------------------------------------------

def test_cuda_graphs_on_is_refused_without_cuda(tiny_checkpoint):  # noqa: F811
    with pytest.raises(FastPathError, match='CUDA graphs need a CUDA device'):
        resolve_cuda_graphs('on', torch.device('cpu'))
    assert resolve_cuda_graphs('auto', torch.device('cpu')) is False
    assert resolve_cuda_graphs('off', torch.device('cpu')) is False
    with pytest.raises(ValueError):
        resolve_cuda_graphs('yes', torch.device('cpu'))
    with pytest.raises(FastPathError, match='cuda_graphs is "on"'):
        PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32', cuda_graphs='on')
    values = resolve_values({'joint_names': [f'j{i}' for i in range(6)], 'cuda_graphs': 'sometimes'})
    assert any('cuda_graphs' in problem for problem in problems(values))
    assert resolve_values({})['cuda_graphs'] == 'off'


FAMILIES = known_types()


@pytest.fixture(scope='module')
def family_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp('fast_path_checkpoints')
    return {kind: write_tiny_default(root / kind, kind) for kind in FAMILIES}


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('graphs', [False, True], ids=['eager', 'replayed'])
def test_every_family_through_the_fast_path_gives_the_plain_actions(family_checkpoints, family, graphs):
    """Static workspace (eager, and replayed through the strict capture stand-in) == the plain path, bit for
    bit, entries A, B, A, B, plain and RTC; hit == miss; a prompt bucket only rounds differently."""
    with CaptureStandIn() if graphs else contextlib.nullcontext():
        check_the_fast_path_gives_the_plain_actions(family_checkpoints[family], graphs)


def check_the_fast_path_gives_the_plain_actions(folder, graphs):
    plain = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32')
    fast = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32', static_workspace=True,
                                         cuda_graphs='on' if graphs else 'off')
    fast.warmup()
    obs, other = make_observation(), make_observation(instruction='put the cube in the box')
    longest = max(int(plain._prepare(o).token_mask.sum()) for o in (obs, other))
    bucketed = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32', static_workspace=True,
                                             prompt_buckets=[longest + 1])
    leftover = np.linspace(-0.5, 0.5, 4 * plain.config.action_dim).reshape(4, -1)
    rtc = dict(prev_actions=leftover, inference_delay=1, rtc=RTCSettings(mode='auto'))    # the family's own
    for extra in ({}, rtc):
        expected = {name: plain.infer(o, seed=1, **extra).actions for name, o in (('A', obs), ('B', other))}
        assert not np.array_equal(expected['A'], expected['B'])
        for runtime in (fast, bucketed):
            runtime.cache.clear()
            for name, o in (('A', obs), ('B', other), ('A', obs), ('B', other)):
                chunk = runtime.infer(o, seed=1, **extra)
                if runtime is fast:
                    assert np.array_equal(chunk.actions, expected[name]), name
                else:
                    assert np.abs(chunk.actions - expected[name]).max() < 1e-4
            miss = runtime.infer(obs, seed=2, use_cache=False, **extra)
            hit = runtime.infer(obs, seed=2, **extra)
            assert hit.cache_hit and np.array_equal(hit.actions, miss.actions)
    assert bucketed.cache.get(bucketed.prefix_key(obs)).prefix_len < plain.config.prefix_len
    summary = fast.fast_path_summary()
    assert summary['cuda_graphs'] is graphs
    assert summary['graph_replays'] > 0 if graphs else summary['graph_replays'] == 0
    copies = summary['workspace_copies']
    for seed in range(3):
        fast.infer(other, seed=seed)
    assert fast.fast_path_summary()['workspace_copies'] == copies + 1, 'hits on the resident entry copy nothing'


# ---- the stage timer ----------------------------------------------------------------------------------

def test_cpu_chunks_say_their_timings_are_host_timers(tiny_checkpoint):  # noqa: F811
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    chunk = runtime.infer(make_observation(), seed=0)
    assert chunk.timings_clock == 'host' and chunk.timings_ms['denoise'] > 0


def test_the_cuda_timer_sums_event_intervals_per_stage(monkeypatch):
    clock = {'now': 0.0}

    class FakeEvent:
        def __init__(self, enable_timing):
            assert enable_timing
            self.at = None

        def record(self):
            clock['now'] += 1.5
            self.at = clock['now']

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    monkeypatch.setattr(stage_timer.torch.cuda, 'Event', FakeEvent)
    monkeypatch.setattr(stage_timer.torch.cuda, 'device', lambda device: contextlib.nullcontext())
    timer = stage_timer.StageTimer(torch.device('cuda'))
    timer.start('hash')
    timer.start('denoise')       # stops 'hash'
    timer.stop()
    timer.start('denoise')
    ms = timer.ms
    assert timer.clock == 'cuda_events'
    assert ms == {'hash': 1.5, 'preprocess': 0.0, 'prefix': 0.0, 'denoise': 3.0}


def test_diagnostics_label_the_clock_and_show_the_fast_path(tiny_checkpoint):  # noqa: F811
    pytest.importorskip('diagnostic_msgs')
    from vla_policy_node.ros.diagnostics import PolicyReport, diagnostics_msg
    from vla_policy_node.tick import TickStats
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32', static_workspace=True)
    stats = TickStats()

    class Outcome:
        skip = plan = handover = assembled = None
        clock_events = ()
        chunk = runtime.infer(make_observation(), seed=0)
        delay = 0

    stats.record(Outcome())
    report = PolicyReport(name='policy', lifecycle='active', configure_error='', new_skips=0,
                          stats=stats.snapshot()).with_runtime(runtime)
    values = {pair.key: pair.value for pair in diagnostics_msg(0, report).status[0].values}
    assert values['latency_clock'] == 'host'
    assert values['cuda_graphs_mode'] == 'off' and values['workspace_copies'] == '1'


def test_under_on_a_capture_failure_fails_the_warmup_but_never_a_tick(standin, tiny_checkpoint, monkeypatch):
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32', cuda_graphs='on')
    monkeypatch.setattr(runtime, '_fast', StaticDenoiser(LoopReadingAValue(runtime.model), family_name='pi',
                                                         graphs=True))
    with pytest.raises(FastPathError, match='capture failed: CaptureViolation'):
        runtime.warmup()
    chunk = runtime.infer(make_observation(), seed=0)    # after configure: eager, counted, never captured
    assert chunk.actions.shape == (runtime.config.chunk_size, runtime.config.action_dim)
    figures = runtime.fast_path_summary()
    assert figures['graph_capture_failures'] == 1 and figures['graph_captures'] == 0
    assert figures['eager_fallback_reasons'].startswith('capture failed: CaptureViolation')


def test_warm_up_captures_every_bucket_and_mode_and_a_tick_never_captures(standin, tiny_checkpoints):
    buckets = [8, 12, 16]                               # the tiny pi0's prompts: 3 to 16 tokens
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoints['pi0'], device='cpu', dtype='float32',
                                            cuda_graphs='auto', prompt_buckets=buckets)
    runtime.warmup()
    figures = runtime.fast_path_summary()
    modes = chunking_modes(runtime.config, runtime.policy.capabilities.rtc_modes)
    assert figures['prefix_graphs'] == 3 and figures['graphs_cached'] == 3 * len(modes)
    captures = standin.captures
    for steps in (runtime.num_steps, 4, 4):             # 4 steps: a shape warm-up did not capture (a live change)
        for instruction in ('pick', 'pick up the red cube and put it in the box'):
            runtime.infer(make_observation(instruction=instruction), seed=0, num_steps=steps)
    figures = runtime.fast_path_summary()
    assert standin.captures == captures, 'a tick never captures'
    assert figures['eager_fallbacks'] == 4 and figures['eager_fallback_reasons'] == f'{NOT_CAPTURED} x4'
    assert figures['prefix_eager_fallbacks'] == 0


@pytest.mark.parametrize('mode', ['auto', 'on'])
def test_graphs_the_budget_cannot_hold_are_never_captured_again(standin, tiny_checkpoint, mode, caplog):
    options = dict(device='cpu', dtype='float32', max_graph_bytes=200_000, cuda_graphs=mode)
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoint, **options)
    if mode == 'on':
        with pytest.raises(FastPathError, match='have no graph: .*larger than the graph budget'):
            runtime.warmup()
        return
    with caplog.at_level(logging.WARNING, logger='vla_policy_node'):
        runtime.warmup()
    captures = standin.captures
    for seed in range(3):
        runtime.infer(make_observation(), seed=seed)
    figures = runtime.fast_path_summary()
    assert standin.captures == captures, 'a rejected graph is not captured again on every chunk'
    assert TOO_LARGE in figures['eager_fallback_reasons'] + figures['prefix_eager_fallback_reasons']
    assert figures['fast_path_bytes'] <= 200_000
    assert any('max_graph_bytes' in record.getMessage() for record in caplog.records)
