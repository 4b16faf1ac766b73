"""The family seam carries a family that is not a K/V-prefix flow-matching VLA: what GR00T N1.7 needs of it.

``CrossFamily`` is a small stand-in with GR00T's shape (lerobot ``policies/groot/``, ../shared/reference/
groot-n1.7.md): its context is processed features with their mask plus K/V gathered to the text tokens (a
sequence of its own length and mask), not per-layer K/V; it turns raw frames and the prompt into its own
prefix inputs (patches, not [B, N, 3, H, W] images); per-embodiment state weights chosen by an embodiment id;
time running 0 -> 1 with its own real-time chunking (the leftover inpainted, its rows frozen by a velocity
mask); and its own action decode (clip, inverse min/max, cut). Through PolicyRuntime, the prefix cache, the
static workspace and the strict capture stand-in (test/capture_standin.py: the warm-up captures its prefix and
denoise as on a GPU), unchanged: hit == miss and graphs == eager, bit for bit.
"""
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime_fixtures import rgb_image, spy_batch_sizes
from capture_standin import CaptureStandIn
from vla_policy_node.cache import MASK_AXES, PREFIX, ContextAxes, PrefixContext
from vla_policy_node.observation import Observation, ObservationError
from vla_policy_node.policy.family import FamilyCapabilities, PolicyFamily, PolicyLevelConfig, PolicyModel
from vla_policy_node.policy.normalize import FeatureNormalizer
from vla_policy_node.policy.preprocess import image_to_unit_tensor
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.runtime import PolicyRuntime

PATCH = 4


@dataclass(frozen=True, kw_only=True)
class CrossConfig(PolicyLevelConfig):
    policy_type: str = 'cross_test'
    camera_names: Tuple[str, ...] = ('front', 'wrist')
    image_resolution: Tuple[int, int] = (8, 8)
    chunk_size: int = 5
    n_action_steps: int = 5
    state_dim: int = 2
    max_state_dim: int = 3
    action_dim: int = 2
    max_action_dim: int = 3
    num_inference_steps: int = 4
    tokenizer_max_length: int = 6
    vocab_size: int = 16
    width: int = 8
    embodiments: int = 2

    @property
    def tokens_per_image(self) -> int:
        return (self.image_resolution[0] // PATCH) * (self.image_resolution[1] // PATCH)

    @property
    def prefix_len(self) -> int:
        return len(self.all_camera_names) * self.tokens_per_image + self.tokenizer_max_length

    @property
    def num_prefix_layers(self) -> int:
        return 1

    def kv_entry_bytes(self, dtype_bytes: int) -> int:
        return (self.prefix_len + 2 * self.tokenizer_max_length) * self.width * 4

    def cache_entry_bytes(self, dtype_bytes: int) -> int:
        return self.kv_entry_bytes(dtype_bytes) + self.prefix_len + self.tokenizer_max_length   # two masks


@dataclass
class Inpainting:
    """GR00T-style continuation: the leftover replaces the first rows of the noise, frozen rows get no velocity."""

    target: torch.Tensor            # [B, H, A]
    frozen: torch.Tensor            # [B, H, 1] bool
    velocity_mask: torch.Tensor     # [B, H, 1]


@dataclass
class CrossChunk:
    cond: torch.Tensor
    text_kv: torch.Tensor
    text_mask: torch.Tensor
    noise: torch.Tensor
    guide: Optional[Inpainting]
    num_steps: int


class CrossModel(PolicyModel):
    def __init__(self, config: CrossConfig) -> None:
        super().__init__()
        self.config, self.compute_dtype = config, torch.float32
        width = config.width
        self.patch = nn.Linear(3 * PATCH * PATCH, width)
        self.embed = nn.Embedding(config.vocab_size, width)
        self.to_kv = nn.Linear(width, 2 * width)
        self.state_encoder = nn.Parameter(torch.zeros(config.embodiments, config.max_state_dim, width))
        self.head = nn.ModuleDict({'action_in': nn.Linear(config.max_action_dim, width),
                                   'action_out': nn.Linear(width, config.max_action_dim)})
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)

    @property
    def action_expert(self) -> nn.Module:
        return self.head

    @torch.no_grad()
    def fill_prefix(self, patches, patch_mask, ids, id_mask) -> PrefixContext:
        features = torch.cat([self.patch(patches), self.embed(ids)], dim=1)                  # [B, T, W]
        keys, values = self.to_kv(self.embed(ids)).chunk(2, dim=-1)                          # the text subset only
        return PrefixContext(
            {'features': features, 'mask': torch.cat([patch_mask, id_mask], dim=1),
             'text_kv': torch.stack([keys, values]), 'text_mask': id_mask},
            {'features': MASK_AXES, 'mask': MASK_AXES, 'text_kv': ContextAxes(batch=1, tokens=2, sequence='text'),
             'text_mask': ContextAxes(batch=0, tokens=1, sequence='text')},
            batch_size=features.shape[0], prefix_len=features.shape[1], masks={PREFIX: 'mask', 'text': 'text_mask'})

    def workspace_spec(self, context):
        return ()                                       # the loop reads the context only

    def rtc_guide(self, prev_chunk_left_over, noise, num_steps, *, inference_delay, execution_horizon, rtc):
        if rtc is None or prev_chunk_left_over is None or len(prev_chunk_left_over) == 0:
            return None
        batch, horizon, _ = noise.shape
        rows = min(len(prev_chunk_left_over), horizon)
        target = torch.zeros_like(noise)
        target[:, :rows, :prev_chunk_left_over.shape[-1]] = prev_chunk_left_over[:rows]
        frozen = (torch.arange(horizon, device=noise.device) < min(inference_delay, rows))[None, :, None]
        frozen = frozen.expand(batch, -1, 1)
        return Inpainting(target, frozen, (~frozen).float())

    @torch.no_grad()
    def chunk_setup(self, context, state, noise, num_steps=None, *, prev_chunk_left_over=None, inference_delay=0,
                    execution_horizon=None, rtc=None, embodiment=None, workspace=None) -> CrossChunk:
        start = self.start_chunk(context, noise, num_steps, workspace, prev_chunk_left_over=prev_chunk_left_over,
                                 inference_delay=inference_delay, execution_horizon=execution_horizon, rtc=rtc,
                                 embodiment=embodiment)
        if start.embodiment is None:
            raise ValueError('this family needs an embodiment')
        mask = context['mask'][..., None].float()
        pooled = (context['features'] * mask).sum(dim=1) / mask.sum(dim=1)
        cond = pooled + torch.einsum('bs,bsw->bw', state, self.state_encoder[start.embodiment])
        return CrossChunk(cond, context['text_kv'], context['text_mask'], start.noise, start.guide, start.num_steps)

    @torch.no_grad()
    def euler_loop(self, chunk: CrossChunk) -> torch.Tensor:
        guide, x_t = chunk.guide, chunk.noise
        if guide is not None:
            x_t = torch.where(guide.frozen, guide.target, x_t)
        bias = torch.zeros_like(chunk.text_mask, dtype=x_t.dtype).masked_fill(~chunk.text_mask, -1e9)[:, None]
        for step in range(chunk.num_steps):                                      # t = 0 (noise) -> 1 (actions)
            hidden = self.head['action_in'](x_t) + chunk.cond[:, None] + step / chunk.num_steps
            weights = torch.softmax(hidden @ chunk.text_kv[0].transpose(1, 2) + bias, dim=-1)
            velocity = self.head['action_out'](torch.tanh(hidden + weights @ chunk.text_kv[1]))
            if guide is not None:
                velocity = velocity * guide.velocity_mask
            x_t = x_t + velocity / chunk.num_steps
        return x_t


class WordTokenizer:
    vocab_size, identity = 16, 'words'


class CrossFamily(PolicyFamily):
    type_name: ClassVar[str] = 'cross_test'
    model_class: ClassVar[type] = CrossModel
    tokenizer_class: ClassVar[type] = WordTokenizer
    tokenizer_hint: ClassVar[str] = 'none'
    preset_names: ClassVar[Tuple[str, ...]] = ('cross_test',)
    capabilities: ClassVar[FamilyCapabilities] = FamilyCapabilities(rtc_modes=('guided',))
    option_defaults: ClassVar[Any] = {'embodiment': 0}

    @classmethod
    def build(cls, embodiment: int = 0) -> 'CrossFamily':
        config = CrossConfig()
        stats = {'min': np.array([-2.0, 0.0]), 'max': np.array([2.0, 10.0])}
        return cls(config, CrossModel(config).eval(), FeatureNormalizer('state', 'MIN_MAX', stats),
                   FeatureNormalizer('action', 'MIN_MAX', stats), WordTokenizer(), 'unused', embodiment=embodiment)

    def prompt_tokens(self, instruction, normalized_state):     # right-padded: one prompt bucket, one graph
        words = [sum(map(ord, word)) % 15 + 1 for word in instruction.split()][:self.config.tokenizer_max_length]
        ids, mask = np.zeros(self.config.tokenizer_max_length, dtype=np.int64), np.zeros(6, dtype=bool)
        ids[:len(words)], mask[:len(words)] = words, True
        return ids, mask

    def prefix_inputs(self, frames, tokens, token_mask):
        patches, masks = [], []
        for _, pixels in frames:
            if pixels is None:
                image = torch.zeros(3, *self.config.image_resolution)
            else:                                                # the family's own resize
                image = F.interpolate(image_to_unit_tensor(pixels, self.device)[None], self.config.image_resolution,
                                      mode='bilinear', antialias=True)[0]
            patches.append(F.unfold(image[None], PATCH, stride=PATCH)[0].T)     # [tokens, 3 * PATCH^2]
            masks += [pixels is not None] * self.config.tokens_per_image
        return (torch.cat(patches)[None], torch.tensor([masks]), torch.from_numpy(tokens)[None],
                torch.from_numpy(token_mask)[None])

    def processor_identity(self) -> str:
        return 'bilinear-antialias:8x8'

    def embodiment_id(self) -> Optional[int]:
        return int(self.options['embodiment'])

    def normalize_state(self, raw_state):                      # GR00T's min/max with clip_outliers
        return np.clip(self.state_normalizer.normalize(raw_state), -1.0, 1.0)

    def postprocess(self, actions, raw_state):                 # GR00T's decode: cut, clip, inverse min/max
        return self.action_normalizer.unnormalize(np.clip(actions[:, :self.config.action_dim], -1.0, 1.0))

    def _class_level(*args, **kwargs):
        raise NotImplementedError('a test family: nothing is loaded or written')

    parse_config = config_fields = load_checkpoint = tokenizer_source = tiny_config = build_test_tokenizer = \
        preprocessor_steps = save_checkpoint = preset = stage_flops = classmethod(_class_level)


def observation(seed: int, state=(0.5, 5.0), instruction: str = 'pick the red cube', masked: bool = False):
    images = {'front': rgb_image(seed, 12, 20)}
    if not masked:
        images['wrist'] = rgb_image(seed + 1, 10, 10)
    return Observation(images=images, state=np.array(state), instruction=instruction)


def test_a_feature_context_runs_through_the_cache_and_the_captured_fast_path_bit_for_bit():
    plain = PolicyRuntime(CrossFamily.build(), 'rev')
    with CaptureStandIn() as standin:
        fast = PolicyRuntime(CrossFamily.build(), 'rev', cuda_graphs='on')
        fast.warmup()                                  # captures its prefix and each chunking mode's denoise
        check_a_feature_context_runs_like_the_plain_path(plain, fast)
    assert standin.captures == 3 and not standin.violations
    assert fast._fast.replays and not fast._fast.eager_runs and fast._prefix_graphs.replays


def check_a_feature_context_runs_like_the_plain_path(plain, fast):
    leftover = np.array([[0.5, 5.0], [1.0, 6.0], [-1.0, 2.0]])
    for extra in ({}, dict(prev_actions=leftover, inference_delay=2, rtc=RTCSettings())):
        for runtime in (plain, fast):
            runtime.cache.clear()
        seen = set()
        for name, obs in (('A', observation(1)), ('D', observation(7)), ('A', observation(1)),
                          ('B', observation(3, instruction='open it')), ('C', observation(5, masked=True))):
            expected = plain.infer(obs, seed=2, use_cache=False, **extra)
            for runtime in (plain, fast):
                chunk = runtime.infer(obs, seed=2, **extra)
                assert np.array_equal(chunk.actions, expected.actions), (name, runtime is fast)
                assert chunk.cache_hit == (name in seen)
            seen.add(name)
        moved = plain.infer(observation(1, state=(-1.0, 2.0)), seed=2, **extra)       # the joints moved: a hit
        assert moved.cache_hit and not np.array_equal(moved.actions, plain.infer(observation(1), seed=2).actions)
    context = plain.cache.get(plain.prefix_key(observation(3, instruction='open it')))
    assert context.prefix_len == 2 * 4 + 6 and tuple(context['text_kv'].shape) == (2, 1, 6, 8)
    assert context.nbytes == 14 * 8 * 4 + 14 + 2 * 6 * 8 * 4 + 6 and plain.cache.stats().entries == 4


def test_the_family_owns_its_raw_frames_prompt_and_key():
    plain = PolicyRuntime(CrossFamily.build(), 'rev')
    seen = []
    inner = plain.policy.prefix_inputs
    plain.policy.prefix_inputs = lambda frames, ids, mask: seen.append((frames, ids)) or inner(frames, ids, mask)
    plain.infer(observation(1, masked=True), seed=0)
    (frames, ids), = seen
    assert [name for name, _ in frames] == ['front', 'wrist'] and frames[1][1] is None
    assert frames[0][1].dtype == np.uint8 and frames[0][1].shape == (12, 20, 3)       # the raw frame, decoded
    assert len(ids) == 6 and ids[4:].tolist() == [0, 0]                              # its own prompt
    family = CrossFamily.build()
    family.processor_identity = lambda: 'bicubic:8x8'
    other = PolicyRuntime(family, 'rev')
    assert other.prefix_key(observation(1)) != plain.prefix_key(observation(1))       # processor settings key


def test_the_embodiment_reaches_the_action_side():
    first, second = PolicyRuntime(CrossFamily.build(0), 'rev'), PolicyRuntime(CrossFamily.build(1), 'rev')
    a, b = first.infer(observation(1), seed=0), second.infer(observation(1), seed=0)
    assert a.key == b.key and not np.array_equal(a.actions, b.actions)   # one prefix, per-embodiment weights
    first.policy.embodiment_id = lambda: None
    with pytest.raises(ValueError, match='embodiment'):
        PolicyRuntime(first.policy, 'rev').infer(observation(1), seed=0)


def test_the_family_decodes_its_actions_and_continues_chunks_its_own_way():
    plain = PolicyRuntime(CrossFamily.build(), 'rev')
    chunk = plain.infer(observation(1), seed=0)
    assert chunk.actions.shape == (5, 2) and chunk.normalized.shape == (5, 2)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 10.0])
    assert (chunk.actions >= low).all() and (chunk.actions <= high).all()           # its clip, then min/max
    assert (np.abs(chunk.normalized) > 1).any(), 'the clip must be needed for this check to bite'
    assert np.allclose(chunk.actions, (np.clip(chunk.normalized, -1, 1) + 1) / 2 * (high - low) + low)
    far = plain.infer(observation(1, state=(90.0, 5.0)), seed=0)
    assert np.array_equal(far.actions, plain.infer(observation(1, state=(2.0, 5.0)), seed=0).actions)   # its clip
    leftover = np.array([[0.5, 5.0], [1.0, 6.0], [-1.0, 2.0]])
    continued = plain.infer(observation(1), seed=0, prev_actions=leftover, inference_delay=2, rtc=RTCSettings())
    assert np.allclose(continued.actions[:2], leftover[:2], atol=1e-5)             # frozen rows: inpainted
    with pytest.raises(ObservationError, match='"trained" is not one'):
        plain.infer(observation(1), seed=0, prev_actions=leftover, rtc=RTCSettings(mode='trained'))


@pytest.mark.parametrize('kind', ['pi0', 'pi05', 'smolvla'])
def test_robots_contexts_of_different_lengths_denoise_as_one_batch(kind):
    """What a batching server would do with the contexts of several robots: stack them (each token sequence
    right-padded with masked zeros) and denoise once; each row is that robot's own chunk up to fp32 rounding
    (masked padding is invisible, as a prompt bucket's is)."""
    from vla_policy_node.cache import stack_contexts
    from vla_policy_node.policy.families import family_class
    family = family_class(kind)
    config = family.tiny_config()
    model = family.model_class(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    contexts = []
    cameras, (height, width) = len(config.all_camera_names), config.image_resolution
    for length, valid in ((config.tokenizer_max_length, 5), (config.tokenizer_max_length - 3, 4)):
        image_masks = torch.tensor([[True] * (cameras - 1) + [False]])
        tokens = torch.randint(3, 100, (1, length), generator=generator)
        contexts.append(model.fill_prefix(torch.rand(1, cameras, 3, height, width, generator=generator) * 2 - 1,
                                          image_masks, tokens, torch.arange(length)[None] < valid))
    both = stack_contexts(contexts)
    assert both.batch_size == 2 and both.prefix_len == contexts[0].prefix_len > contexts[1].prefix_len
    state = torch.randn(2, config.max_state_dim, generator=generator)
    noise = torch.randn(2, config.chunk_size, config.max_action_dim, generator=generator)
    leftover = dict(prev_chunk_left_over=torch.randn(3, config.action_dim, generator=generator), inference_delay=1,
                    rtc=RTCSettings())
    for extra in ({}, leftover):
        batched = model.denoise(both, state, noise, 3, **extra)
        alone = torch.cat([model.denoise(context, state[i:i + 1], noise[i:i + 1], 3, **extra)
                           for i, context in enumerate(contexts)])
        assert (batched - noise).abs().max() > 0.1 and (batched - alone).abs().max() < 1e-5


def test_robots_of_a_feature_context_family_batch_through_its_own_hooks():
    """runtime/batch.py with the stand-in: its own prefix inputs filled as one batch (one row per miss), its
    contexts (two token sequences) stacked, its embodiment per row, its inpainting guides stacked by row and its
    own decode per robot; each robot's chunk equals its own ``infer`` within fp32 rounding, hits and misses. A
    family whose guides do not stack runs its RTC robots one at a time, still each its own chunk."""
    from vla_policy_node.runtime.batch import infer_batch
    leftover = np.array([[0.5, 5.0], [1.0, 6.0], [-1.0, 2.0]])
    items = [(observation(1), dict(seed=1)), (observation(3, instruction='open it'), dict(seed=2)),
             (observation(5, masked=True, state=(1.0, 8.0)), dict(seed=3)),
             (observation(1), dict(seed=4, prev_actions=leftover, inference_delay=2, rtc=RTCSettings())),
             (observation(7), dict(seed=5, prev_actions=leftover[:2], inference_delay=1, rtc=RTCSettings())),
             (observation(9, state=(-1.5, 1.0)), dict(seed=6, prev_actions=leftover[1:], inference_delay=0,
                                                      rtc=RTCSettings()))]
    for stackable in (True, False):
        alone, batched = PolicyRuntime(CrossFamily.build(1), 'rev'), PolicyRuntime(CrossFamily.build(1), 'rev')
        if not stackable:
            batched.model.stack_guides = lambda guides: None
        fills, loops = spy_batch_sizes(batched.policy)
        expected = [alone.infer(obs, **options) for obs, options in items]
        for round_ in ('misses', 'hits'):
            chunks = infer_batch(batched, items)
            for robot, (chunk, own) in enumerate(zip(chunks, expected)):
                assert not isinstance(chunk, Exception), (robot, chunk)
                assert chunk.cache_hit == (round_ == 'hits') and chunk.continued == own.continued
                np.testing.assert_allclose(chunk.actions, own.actions, rtol=0, atol=1e-5, err_msg=f'robot {robot}')
        assert chunks[3].key == chunks[0].key and np.abs(chunks[3].actions - chunks[0].actions).max() > 1e-3
        assert fills == [5]                                   # five distinct misses, one fill_prefix
        assert loops == ([3, 3] * 2 if stackable else [3, 1, 1, 1] * 2)
        (one,) = infer_batch(batched, items[4:5])
        assert np.array_equal(one.actions, alone.infer(*items[4][:1], **items[4][1]).actions)
