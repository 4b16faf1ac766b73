"""The fast path captured through a strict CUDA-capture stand-in on the CPU (test/capture_standin.py).

First the stand-in itself: every operation a CUDA graph capture forbids fails a capture, what it allows does not,
and a replay behaves as a graph's does (inputs read at replay time, Python values baked in, nothing computed
before the first replay). Then every family of the registry at every precision, through PolicyRuntime's own
path with ``cuda_graphs: on``: the warm-up captures the prefix (where the family's capabilities say it is
capturable) and the plain denoise and each of the family's RTC modes (trained RTC where trained) at every
prompt bucket without one violation, and ticks replay them bit for bit equal to the eager runtime. A new family
is one more entry in the registry, nothing here.

What the stand-in cannot see, and so only a device can still show (docs/gpu.md says the same for users):
- code that branches on ``device.type`` runs its CPU branch here: GemmaMLP splits gate/up on the CPU where a
  GPU runs the fused GEMM (``test_the_fused_gate_up_a_gpu_runs_is_capturable`` captures that branch on its
  own), SmolVLA packs its linears for MKL, fp8 runs its reference instead of ``torch._scaled_mm``;
- a host tensor mixed into a device op, or ``.to(torch.device('cpu'))`` named by object: here every tensor is a
  host tensor (the string 'cpu' and ``.cpu()`` are caught);
- synchronisation inside libraries (cuBLAS/cuDNN workspaces, some attention back-ends), the caching allocator's
  segments (the pool bytes here are the capture's storages), another thread's CUDA work during a capture;
- the numbers of CUDA kernels and the speed of a replay: bench/gpu_checks.py measures both on a device.
"""
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capture_standin import CaptureStandIn, CaptureViolation
from runtime_fixtures import make_observation
from vla_policy_node.fast_path import FastPathError
from vla_policy_node.graph_capture import GraphCapturer
from vla_policy_node.policy import rtc as rtc_module
from vla_policy_node.policy.families import family_class, known_types
from vla_policy_node.policy.gemma import GemmaStack
from vla_policy_node.policy.layers import GemmaMLP
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.policy.tiny_default import write_random_checkpoint
from vla_policy_node.runtime import PolicyRuntime
from vla_policy_node.runtime.warmup import chunking_modes

CPU = torch.device('cpu')
PRECISIONS = {                        # name -> (dtype, quantization); fp8 runs policy/quant.py's CPU reference
    'fp32': ('float32', 'none'),
    'bf16': ('bfloat16', 'none'),
    'int8_weights': ('bfloat16', 'int8_weights'),
    'fp8': ('bfloat16', 'fp8'),
}


@pytest.fixture
def standin():
    with CaptureStandIn() as installed:
        yield installed


def capture(fn, inputs):
    return GraphCapturer(CPU).capture(fn, inputs)


# ---- the stand-in forbids what a capture forbids -------------------------------------------------------

X = torch.linspace(-1.0, 1.0, 6)
MASK = X > 0

FORBIDDEN = {
    'torch.tensor of a Python float': lambda x: x * torch.tensor(2.0, device=x.device),
    'torch.as_tensor of a NumPy array': lambda x: x + torch.as_tensor(np.ones(6, dtype=np.float32)),
    'torch.from_numpy': lambda x: x + torch.from_numpy(np.ones(6, dtype=np.float32)),
    'new_tensor of a list': lambda x: x + x.new_tensor([1.0] * 6),
    '.item()': lambda x: x * x.sum().item(),
    '.tolist()': lambda x: x * len(x.tolist()),
    '.cpu()': lambda x: x.cpu() + 1,
    '.numpy()': lambda x: x + float(x.numpy()[0]),
    'bool() of a tensor': lambda x: x if bool(x.sum() > 0) else -x,
    'int() of a tensor': lambda x: x * int(x.argmax()),
    'float() of a tensor': lambda x: x * float(x.max()),
    'nonzero': lambda x: x.nonzero().float().sum() + x,
    'torch.where with one argument': lambda x: x + torch.where(x > 0)[0].sum(),
    'boolean-mask indexing': lambda x: x[x > 0].sum() + x,
    'boolean-mask assignment': lambda x: x.clone().masked_fill(x > 0, 0.0).index_put_((x < 0,), x.new_zeros(())),
    'masked_select': lambda x: torch.masked_select(x, x > 0).sum() + x,
    'unique': lambda x: torch.unique(x).sum() + x,
    'repeat_interleave by a tensor': lambda x: x.repeat_interleave(torch.ones(6, dtype=torch.long, device=x.device)),
    'torch.cuda.synchronize': lambda x: (torch.cuda.synchronize(), x + 1)[1],
    'torch.randn': lambda x: x + torch.randn(6, device=x.device),
    'torch.rand_like': lambda x: x + torch.rand_like(x),
    'normal_': lambda x: x + x.clone().normal_(),
    'bernoulli': lambda x: x * torch.bernoulli(torch.full_like(x, 0.5)),
    'dropout in training mode': lambda x: F.dropout(x, 0.5, training=True),
    'a factory without a device': lambda x: x + torch.zeros(6),
    'arange without a device': lambda x: x + torch.arange(6),
    'a factory on the host by name': lambda x: x + torch.ones(6, device='cpu'),
    '.to() the host by name': lambda x: x.to('cpu') + 1,
    '.to() another device': lambda x: (x.to('meta'), x + 1)[1],
    'a swallowed violation still breaks the capture': lambda x: _swallowed(x),
}


def _swallowed(x):
    try:
        x.sum().item()
    except CaptureViolation:
        pass
    return x + 1


@pytest.mark.parametrize('name', list(FORBIDDEN))
def test_the_standin_fails_a_capture_on_what_cuda_forbids(standin, name):
    with pytest.raises(RuntimeError, match='capture'):
        capture(FORBIDDEN[name], X.clone())
    assert standin.violations, name
    assert standin.captures == 0


ALLOWED = {
    'arithmetic, views and reductions': lambda x: (x * 2 + 1).view(2, 3).sum(-1).exp(),
    'fills and factories with the device': lambda x: x + torch.full((), 2.0, dtype=x.dtype, device=x.device)
    + torch.zeros(6, device=x.device) + torch.arange(6, device=x.device),
    'factories like a tensor': lambda x: x + torch.zeros_like(x) + x.new_ones(6),
    'torch.where with a Python scalar': lambda x: torch.where(MASK, x, 0.5),
    'a mask as data (where, masked_fill)': lambda x: x.masked_fill(MASK, 0.0) * MASK,
    'in-place writes into a view': lambda x: _written(x),
    'attention without dropout': lambda x: F.scaled_dot_product_attention(x.view(1, 1, 2, 3), x.view(1, 1, 2, 3),
                                                                          x.view(1, 1, 2, 3)).flatten(),
    '.to() a dtype and the same device': lambda x: x.to(torch.bfloat16).to(x.device).float(),
}


def _written(x):
    out = x.new_zeros(2, 6)
    out[1, 2:] = x[:4]
    return out


@pytest.mark.parametrize('name', list(ALLOWED))
def test_what_a_capture_allows_replays_the_eager_result(standin, name):
    fn = ALLOWED[name]
    static = X.clone()
    graph = capture(fn, static)
    assert not standin.violations and standin.captures == 1
    for values in (X * 3, X - 1):
        static.copy_(values)
        graph.graph.replay()
        assert torch.equal(graph.output, fn(values)), name


def test_a_replay_reads_its_inputs_then_and_bakes_python_values_in(standin):
    scale = {'now': 2.0}
    static = X.clone()
    graph = capture(lambda x: x * scale['now'], static)
    assert torch.isnan(graph.output).all(), 'a capture runs nothing: its output means nothing before a replay'
    scale['now'] = 5.0                        # a Python value is part of the graph, as a kernel argument is
    static.copy_(X + 1)
    graph.graph.replay()
    assert torch.equal(graph.output, (X + 1) * 2.0)
    outside = X.clone()                       # a tensor the capture wrote keeps what it held before the capture
    before = outside.clone()
    capture(lambda x: outside.add_(x), static)
    assert torch.equal(outside, before + (X + 1)), 'only the warm-up run wrote it'


def test_a_capture_on_another_devices_stream_is_an_empty_graph(standin):
    standin.device_index = 1                  # the CPU tensors stand for cuda:1's; the capture runs on cuda:0
    static = X.clone()
    graph = GraphCapturer(torch.device('cuda', 0)).capture(lambda x: x * 2, static)
    static.copy_(X + 1)
    graph.graph.replay()
    assert not torch.equal(graph.output, (X + 1) * 2), 'an empty graph leaves its output stale'


def test_the_fused_gate_up_a_gpu_runs_is_capturable(standin):
    """GemmaMLP runs two GEMMs on the CPU and the fused one elsewhere: its GPU branch, captured on its own."""
    mlp = GemmaMLP(8, 16).eval()
    x = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mlp.gate_up.fuse()
        graph = capture(lambda inputs: mlp.gate_up(inputs), x.clone())
        graph.graph.replay()
        assert torch.equal(graph.output, mlp.gate_up(x))
    assert not standin.violations


# ---- every family, every precision, every captured shape, through the runtime ---------------------------

@pytest.fixture(scope='module')
def family_folders(tmp_path_factory):
    """Each registered family's tiny checkpoint, trained-RTC capable where the family keeps that field."""
    root = tmp_path_factory.mktemp('standin_checkpoints')
    return {kind: write_random_checkpoint(root / kind, family_class(kind).tiny_config(rtc_training_max_delay=3))
            for kind in known_types()}


def buckets_for(runtime):
    """Three prompt buckets every prompt length of this checkpoint can reach: between the shortest prompt
    and tokenizer_max_length."""
    shortest = int(runtime.policy.prompt_tokens('a', np.zeros(runtime.config.state_dim))[1].sum())
    longest = runtime.config.tokenizer_max_length
    return sorted({shortest + (longest - shortest) // 3, shortest + 2 * (longest - shortest) // 3, longest})


def instruction_in(runtime, bucket):
    """A real instruction whose prompt lands in ``bucket``."""
    state = runtime.state_normalizer.normalize(np.zeros(runtime.config.state_dim))
    for words in range(1, 200):
        text = ' '.join(['pick'] * words)
        valid = int(runtime.policy.prompt_tokens(text, state)[1].sum())
        if min(b for b in runtime.prompt_buckets if b >= valid) == bucket:
            return text
    raise AssertionError(f'no instruction reaches bucket {bucket}')


@pytest.mark.parametrize('precision', list(PRECISIONS))
@pytest.mark.parametrize('family', known_types())
def test_every_family_and_precision_captures_every_shape_and_replays_the_eager_actions(
        standin, family_folders, family, precision, caplog):
    dtype, quantization = PRECISIONS[precision]
    folder = family_folders[family]
    probe = PolicyRuntime.from_pretrained(folder, device='cpu', dtype=dtype, quantization=quantization)
    buckets = buckets_for(probe)
    options = dict(device='cpu', dtype=dtype, quantization=quantization, prompt_buckets=buckets)
    graphs = PolicyRuntime.from_pretrained(folder, cuda_graphs='on', **options)
    eager = PolicyRuntime.from_pretrained(folder, cuda_graphs='off', **options)
    with caplog.at_level(logging.WARNING):
        graphs.warmup()                                   # cuda_graphs 'on': any violation raises here
    assert not standin.violations and not caplog.records
    modes = len(chunking_modes(graphs.config, graphs.policy.capabilities.rtc_modes))
    figures = graphs.fast_path_summary()
    prefix_graphs = graphs.policy.capabilities.capturable_prefix
    assert figures['prefix_graphs'] == (len(buckets) if prefix_graphs else 0), 'a prefix graph per bucket'
    assert figures['graphs_cached'] == len(buckets) * modes, 'a denoise graph per bucket and chunking mode'
    assert figures['graph_capture_failures'] == figures['prefix_capture_failures'] == 0
    captures = standin.captures
    leftover = np.linspace(-0.4, 0.4, 5 * graphs.config.action_dim).reshape(5, -1)
    # 'auto': the family's own first mode (guided for the pi families, inpainting for GR00T).
    continuations = [{}, dict(prev_actions=leftover, inference_delay=2,
                              rtc=RTCSettings(mode='auto', execution_horizon=4))]
    if graphs.config.rtc_training_max_delay > 0:
        continuations.append(dict(prev_actions=leftover, inference_delay=2, rtc=RTCSettings(mode='trained')))
    for bucket in buckets:
        observation = make_observation(instruction=instruction_in(graphs, bucket))
        for extra in continuations:
            graphs.cache.clear()
            expected = eager.infer(observation, seed=3, use_cache=False, **extra).actions
            miss = graphs.infer(observation, seed=3, **extra)
            hit = graphs.infer(observation, seed=3, **extra)
            assert hit.cache_hit and not miss.cache_hit
            assert np.array_equal(miss.actions, expected) and np.array_equal(hit.actions, expected), (bucket, extra)
    figures = graphs.fast_path_summary()
    assert standin.captures == captures, 'a tick never captures'
    assert figures['eager_fallbacks'] == figures['prefix_eager_fallbacks'] == 0, figures
    assert figures['graph_replays'] > 0 and (figures['prefix_replays'] > 0) == prefix_graphs


# ---- the stand-in bites through the runtime: a host copy put back into captured code --------------------

def _embed_with_a_host_copy(self, tokens):
    embedded = self.embed_tokens(tokens)
    return embedded * torch.tensor(float(self.size.width) ** 0.5, dtype=embedded.dtype, device=embedded.device)


def _guide_with_a_host_copy(self, step, x_t, velocity):
    return original_guide(self, step, x_t, velocity) * torch.tensor(1.0, device=x_t.device)


original_guide = rtc_module.RTCGuide.guide


@pytest.mark.parametrize('where', ['prefix', 'guided denoise'])
def test_a_host_copy_put_back_into_captured_code_fails_the_capture(standin, family_folders, monkeypatch, where):
    if where == 'prefix':
        monkeypatch.setattr(GemmaStack, 'embed', _embed_with_a_host_copy)     # pi0's embed as it was
    else:
        monkeypatch.setattr(rtc_module.RTCGuide, 'guide', _guide_with_a_host_copy)
    runtime = PolicyRuntime.from_pretrained(family_folders['pi0'], device='cpu', dtype='float32', cuda_graphs='on')
    with pytest.raises(FastPathError, match=r'capture failed: CaptureViolation: .*torch.tensor|tensor of a Python'):
        runtime.warmup()
    assert any('tensor' in violation for violation in standin.violations)


def test_under_auto_a_failed_capture_is_logged_once_shown_and_the_shape_runs_eagerly(
        standin, family_folders, monkeypatch, caplog):
    monkeypatch.setattr(rtc_module.RTCGuide, 'guide', _guide_with_a_host_copy)
    folder = family_folders['pi0']
    runtime = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32', cuda_graphs='auto')
    eager = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32')
    stream = torch.cuda.current_stream()
    with caplog.at_level(logging.WARNING, logger='vla_policy_node'):
        runtime.warmup()
        leftover = np.zeros((4, runtime.config.action_dim))
        for seed in range(3):
            extra = dict(prev_actions=leftover, inference_delay=1, rtc=RTCSettings())
            got = runtime.infer(make_observation(), seed=seed, **extra).actions
            assert np.array_equal(got, eager.infer(make_observation(), seed=seed, **extra).actions)
    failures = [r for r in caplog.records if 'capture failed' in r.getMessage()]
    assert len(failures) == 1 and 'torch.tensor' in failures[0].getMessage()
    assert torch.cuda.current_stream() is stream, 'the thread is back on its own stream'
    assert all(not recording for _, recording in standin.allocator_state().values()), 'no pool left routing'
    described = runtime.describe()                      # what /diagnostics shows (report.py)
    assert described['graph_capture_failures'] == 1 and described['eager_fallbacks'] == 4
    assert 'capture failed: CaptureViolation' in described['eager_fallback_reasons']
    assert described['graphs_cached'] == 1 and described['prefix_graphs'] == 1      # the others are graphs
    pytest.importorskip('diagnostic_msgs')
    from vla_policy_node.ros.diagnostics import PolicyReport, diagnostics_msg
    from vla_policy_node.tick import TickStats
    report = PolicyReport(name='policy', lifecycle='active', configure_error='', new_skips=0,
                          stats=TickStats().snapshot()).with_runtime(runtime)
    status = diagnostics_msg(0, report).status[0]
    values = {pair.key: pair.value for pair in status.values}
    assert status.level == status.WARN and '1 CUDA graph capture(s) failed' in status.message
    assert 'torch.tensor' in values['eager_fallback_reasons'] and values['graph_captures'] == '1'
    assert int(values['fast_path_bytes']) > 0 and values['prefix_captures'] == '1'
