"""PolicyRuntime on the embedded tiny checkpoint (pi0 and pi0.5): cache semantics, inputs, errors."""
import io

import numpy as np
import pytest
import torch
from PIL import Image

from runtime_fixtures import (CAMERAS, INSTRUCTION, make_observation, rgb_image, runtime,  # noqa: F401
                              tiny_checkpoint, tiny_checkpoints)
from vla_policy_node.images import CompressedFrame, RawImage
from vla_policy_node.observation import ObservationError, SkipReason
from vla_policy_node.runtime import STAGES, PolicyRuntime


def noise_for(runtime, seed: int) -> np.ndarray:
    cfg = runtime.config
    return np.random.default_rng(seed).standard_normal((cfg.chunk_size, cfg.max_action_dim)).astype(np.float32)


def cache_snapshot(runtime):
    return runtime.cache.stats(), len(runtime.cache)


# ---- hit == miss -----------------------------------------------------------------------------

def test_hit_returns_exactly_the_miss_actions_for_the_same_seed(runtime):
    obs = make_observation()
    miss = runtime.infer(obs, seed=3)
    hit = runtime.infer(obs, seed=3)
    assert (miss.cache_hit, hit.cache_hit) == (False, True)
    assert miss.key == hit.key and miss.key is not None
    assert np.array_equal(miss.actions, hit.actions)
    assert set(hit.timings_ms) == set(STAGES)
    assert hit.timings_ms['preprocess'] == 0.0 and hit.timings_ms['prefix'] == 0.0
    stats = runtime.cache.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.insertions) == (1, 1, 1, 1)


def test_hit_returns_exactly_the_miss_actions_for_the_same_noise(runtime):
    obs = make_observation()
    noise = noise_for(runtime, 11)
    miss = runtime.infer(obs, noise=noise)
    hit = runtime.infer(obs, noise=noise.copy())
    assert (miss.cache_hit, hit.cache_hit) == (False, True)
    assert np.array_equal(miss.actions, hit.actions)
    other = runtime.infer(obs, noise=noise_for(runtime, 12))
    assert other.cache_hit and not np.allclose(other.actions, miss.actions)


def test_seed_is_the_same_as_the_equivalent_explicit_noise(runtime):
    obs = make_observation()
    cfg = runtime.config
    noise = torch.randn((1, cfg.chunk_size, cfg.max_action_dim), generator=torch.Generator().manual_seed(5))
    assert np.array_equal(runtime.infer(obs, seed=5).actions, runtime.infer(obs, noise=noise.numpy()).actions)


def _swap(images):
    return {CAMERAS[0]: images[CAMERAS[1]], CAMERAS[1]: images[CAMERAS[0]]}


def _flip_byte(images):
    changed = images[CAMERAS[0]].copy()
    changed[5, 7, 1] ^= 0x40
    return {CAMERAS[0]: changed, CAMERAS[1]: images[CAMERAS[1]]}


@pytest.mark.parametrize('change', ['image_byte', 'camera_swap', 'instruction', 'missing_camera', 'extra_camera'])
def test_changed_prefix_input_misses(runtime, change):
    base = make_observation()
    images = dict(base.images)
    changed = {
        'image_byte': lambda: make_observation(_flip_byte(images)),
        'camera_swap': lambda: make_observation(_swap(images)),
        'instruction': lambda: make_observation(images, instruction=INSTRUCTION + ' now'),
        'missing_camera': lambda: make_observation({CAMERAS[0]: images[CAMERAS[0]]}),
        'extra_camera': lambda: make_observation(dict(images, **{CAMERAS[2]: rgb_image(3)})),
    }[change]()
    first = runtime.infer(base, seed=0)
    second = runtime.infer(changed, seed=0)
    assert not first.cache_hit and not second.cache_hit
    assert second.key != first.key
    assert not np.array_equal(first.actions, second.actions)
    # Both are now cached, independently.
    assert runtime.infer(base, seed=0).cache_hit and runtime.infer(changed, seed=0).cache_hit
    assert len(runtime.cache) == 2


def test_state_enters_the_prefix_only_for_pi05(runtime):
    base = make_observation(state=np.zeros(runtime.config.state_dim))
    moved = make_observation(state=np.full(runtime.config.state_dim, 0.4))
    first = runtime.infer(base, seed=0)
    second = runtime.infer(moved, seed=0)
    assert not np.array_equal(first.actions, second.actions)
    if runtime.config.policy_type == 'pi0':
        # pi0: the state is a suffix token, so the prefix (images + text) is reused.
        assert second.cache_hit and second.key == first.key
    else:
        # pi0.5: the discretised state is part of the prompt.
        assert not second.cache_hit and second.key != first.key


def test_dtype_is_part_of_the_key(tiny_checkpoint):
    obs = make_observation()
    fp32 = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    bf16 = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='bfloat16')
    assert fp32.model_revision == bf16.model_revision
    assert fp32.prefix_key(obs) != bf16.prefix_key(obs)
    assert fp32.prefix_key(obs) == fp32.infer(obs, seed=0).key


def test_prefix_key_is_stable_across_runtimes(tiny_checkpoint):
    obs = make_observation()
    one = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    two = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    assert one.prefix_key(obs) == two.prefix_key(obs)


# ---- the prefix is read-only ------------------------------------------------------------------

def test_cached_prefix_is_bit_identical_after_denoising(runtime):
    obs = make_observation()
    first = runtime.infer(obs, seed=0)
    context = runtime.cache.get(first.key)
    assert context is not None
    kv_before, pad_before = context['kv'].clone(), context['pad_mask'].clone()
    hits = [runtime.infer(obs, seed=s) for s in (1, 2)]
    assert all(chunk.cache_hit for chunk in hits)
    assert runtime.cache.get(first.key) is context
    assert torch.equal(context['kv'], kv_before)
    assert torch.equal(context['pad_mask'], pad_before)
    # And the hit still reproduces the miss.
    assert np.array_equal(runtime.infer(obs, seed=0).actions, first.actions)


def test_disabled_cache_gives_the_same_actions_and_stores_nothing(tiny_checkpoint):
    obs = make_observation()
    cached = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    uncached = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    uncached.cache_enabled = False
    reference = cached.infer(obs, seed=4)
    for _ in range(2):
        chunk = uncached.infer(obs, seed=4)
        assert not chunk.cache_hit
        assert np.array_equal(chunk.actions, reference.actions)
    stats = uncached.cache.stats()
    assert len(uncached.cache) == 0
    assert (stats.hits, stats.misses, stats.insertions, stats.bytes) == (0, 0, 0, 0)
    # The cached runtime hits on its second call and still agrees.
    assert np.array_equal(cached.infer(obs, seed=4).actions, reference.actions)


# ---- bad input ---------------------------------------------------------------------------------

def _bad_observations():
    img = rgb_image(1)
    good_images = {CAMERAS[0]: img}
    data = img.tobytes()
    return {
        'state_shape': (make_observation(good_images, state=np.zeros(5)), 'state'),
        'state_2d': (make_observation(good_images, state=np.zeros((1, 6))), 'state'),
        'state_nan': (make_observation(good_images, state=np.array([0, 0, np.nan, 0, 0, 0.0])), 'state'),
        'state_inf': (make_observation(good_images, state=np.array([0, 0, 0, 0, 0, np.inf])), 'state'),
        'unknown_camera': (make_observation({CAMERAS[0]: img, 'front_cam': img}), 'images'),
        'no_camera': (make_observation({}), 'images'),
        'all_cameras_none': (make_observation({name: None for name in CAMERAS}), 'images'),
        'empty_instruction': (make_observation(good_images, instruction=''), 'instruction'),
        'blank_instruction': (make_observation(good_images, instruction='   \n'), 'instruction'),
        'none_instruction': (make_observation(good_images, instruction=None), 'instruction'),
        'huge_instruction': (make_observation(good_images, instruction='x' * 5000), 'instruction'),
        'truncated_raw': (make_observation({CAMERAS[0]: RawImage(24, 40, 'rgb8', 120, False, data[:-1])}),
                          f'images.{CAMERAS[0]}'),
        'short_step': (make_observation({CAMERAS[0]: RawImage(24, 40, 'rgb8', 100, False, data)}),
                       f'images.{CAMERAS[0]}'),
        'unsupported_encoding': (make_observation({CAMERAS[0]: RawImage(24, 40, 'yuv422', 80, False, data)}),
                                 f'images.{CAMERAS[0]}'),
        'ambiguous_encoding': (make_observation({CAMERAS[0]: RawImage(24, 40, '8UC3', 120, False, data)}),
                               f'images.{CAMERAS[0]}'),
        'empty_compressed': (make_observation({CAMERAS[0]: CompressedFrame('jpeg', b'')}), f'images.{CAMERAS[0]}'),
        'depth_32fc1': (make_observation({CAMERAS[0]: RawImage(24, 40, '32FC1', 160, False,
                                                               np.full(24 * 40, np.nan, np.float32).tobytes())}),
                        f'images.{CAMERAS[0]}'),
        'oversized_raw': (make_observation({CAMERAS[0]: RawImage(5000, 5000, 'rgb8', 15000, False, data)}),
                          f'images.{CAMERAS[0]}'),
        'oversized_array': (make_observation({CAMERAS[0]: np.zeros((4097, 4096, 3), np.uint8)}),
                            f'images.{CAMERAS[0]}'),
        'float_array': (make_observation({CAMERAS[0]: img.astype(np.float32)}), f'images.{CAMERAS[0]}'),
        'grey_array': (make_observation({CAMERAS[1]: img[:, :, :1]}), f'images.{CAMERAS[1]}'),
    }


BAD = _bad_observations()


@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input_names_the_field_and_leaves_the_cache_untouched(runtime, case):
    good = make_observation()
    warm = runtime.infer(good, seed=0)
    runtime.infer(good, seed=0)
    before = cache_snapshot(runtime)
    observation, field = BAD[case]
    with pytest.raises(ObservationError) as info:
        runtime.infer(observation, seed=0)
    assert info.value.field == field
    assert str(info.value).startswith(field)
    with pytest.raises(ObservationError):
        runtime.prefix_key(observation)
    assert cache_snapshot(runtime) == before
    assert warm.key in runtime.cache
    # The runtime still works and still hits after refusing the input.
    assert runtime.infer(good, seed=0).cache_hit


def test_bad_noise_and_steps_are_refused_before_the_cache(runtime):
    good = make_observation()
    runtime.infer(good, seed=0)
    before = cache_snapshot(runtime)
    with pytest.raises(ObservationError) as info:
        runtime.infer(good, noise=np.zeros((3, 3), dtype=np.float32))
    assert info.value.field == 'noise'
    with pytest.raises(ObservationError) as info:
        runtime.infer(good, seed=0, num_steps=-1)
    assert info.value.field == 'num_steps'
    assert cache_snapshot(runtime) == before


def test_corrupt_jpeg_is_an_observation_error_and_is_not_cached(runtime):
    obs = make_observation({CAMERAS[0]: CompressedFrame('jpeg', b'\xff\xd8\xff\xe0 definitely not a jpeg')})
    with pytest.raises(ObservationError) as info:
        runtime.infer(obs, seed=0)
    assert info.value.field == f'images.{CAMERAS[0]}'
    stats = runtime.cache.stats()
    assert stats.entries == 0 and stats.insertions == 0 and stats.bytes == 0


# ---- instruction default, seeds ----------------------------------------------------------------

def test_instruction_length_bound_is_per_call_and_capped(runtime):
    long_text = 'pick ' * 30                                     # 150 characters
    assert not runtime.infer(make_observation(instruction=long_text), seed=0).cache_hit
    with pytest.raises(ObservationError) as info:
        runtime.infer(make_observation(instruction=long_text), seed=0, max_instruction_length=100)
    assert (info.value.field, info.value.reason) == ('instruction', SkipReason.INSTRUCTION_TOO_LONG)
    # No parameter can lift the bound past MAX_INSTRUCTION_CHARS.
    with pytest.raises(ObservationError):
        runtime.infer(make_observation(instruction='x' * 5000), seed=0, max_instruction_length=10 ** 6)


def test_seeds(tiny_checkpoint):
    obs = make_observation()
    one = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    two = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    a, b = one.infer(obs, seed=1), one.infer(obs, seed=2)
    assert not np.allclose(a.actions, b.actions)
    assert np.array_equal(two.infer(obs, seed=1).actions, a.actions)  # a miss in another runtime
    assert np.array_equal(two.infer(obs, seed=2).actions, b.actions)  # a hit there


# ---- shapes and input formats ----------------------------------------------------------------------

def test_actions_shape_and_slots(runtime):
    cfg = runtime.config
    chunk = runtime.infer(make_observation(), seed=0)
    assert chunk.actions.shape == (cfg.chunk_size, cfg.action_dim)
    assert chunk.actions.dtype == np.float32
    assert np.all(np.isfinite(chunk.actions))
    assert chunk.num_steps == cfg.num_inference_steps
    # Present cameras first (config order), masked ones after.
    only_wrist = runtime.infer(make_observation({CAMERAS[2]: rgb_image(4)}), seed=0)
    assert only_wrist.camera_slots == (CAMERAS[2], CAMERAS[0], CAMERAS[1])
    assert np.all(np.isfinite(only_wrist.actions))


def _padded_raw(img: np.ndarray, encoding: str, pad: int) -> RawImage:
    height, width, _ = img.shape
    rows = np.random.default_rng(9).integers(0, 256, size=(height, width * 3 + pad), dtype=np.uint8)
    rows[:, :width * 3] = img.reshape(height, width * 3)
    return RawImage(height=height, width=width, encoding=encoding, step=width * 3 + pad, is_bigendian=False,
                    data=rows.tobytes())


def _encoded(img: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(img).save(out, format=fmt.upper(), **({'quality': 90} if fmt == 'jpeg' else {}))
    return out.getvalue()


def test_input_formats_decode_to_the_same_actions(runtime):
    img = rgb_image(21, height=30, width=20)
    wrist = rgb_image(22)

    def run(frame):
        chunk = runtime.infer(make_observation({CAMERAS[0]: frame, CAMERAS[1]: wrist}), seed=7)
        assert chunk.actions.shape == (runtime.config.chunk_size, runtime.config.action_dim)
        assert np.all(np.isfinite(chunk.actions))
        assert not chunk.cache_hit
        return chunk.actions

    reference = run(img)  # RGB uint8 ndarray
    assert np.array_equal(run(_padded_raw(img, 'rgb8', 0)), reference)
    assert np.array_equal(run(_padded_raw(img, 'rgb8', 7)), reference)  # row padding, step > width*3
    assert np.array_equal(run(_padded_raw(img[:, :, ::-1], 'bgr8', 5)), reference)
    assert np.array_equal(run(CompressedFrame('png', _encoded(img, 'png'))), reference)
    jpeg = _encoded(img, 'jpeg')
    decoded = np.asarray(Image.open(io.BytesIO(jpeg)).convert('RGB'))
    assert np.array_equal(run(CompressedFrame('jpeg', jpeg)), run(decoded.copy()))
    # bgr8 read as rgb8 would be a different image: the decoder must honour the encoding.
    assert not np.array_equal(run(_padded_raw(img, 'bgr8', 0)), reference)
    assert len(runtime.cache) >= 7


def test_model_resolution_image_works(runtime):
    height, width = runtime.config.image_resolution
    chunk = runtime.infer(make_observation({CAMERAS[0]: rgb_image(5, height, width)}), seed=0)
    assert np.all(np.isfinite(chunk.actions))


# ---- sizes ------------------------------------------------------------------------------------

@pytest.mark.parametrize('dtype, element', [('float32', 4), ('bfloat16', 2)])
def test_cached_context_size_is_analytic(tiny_checkpoint, dtype, element):
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype=dtype)
    cfg = runtime.config
    chunk = runtime.infer(make_observation(), seed=0)
    assert np.all(np.isfinite(chunk.actions))
    context = runtime.cache.get(chunk.key)
    lm = cfg.language
    assert tuple(context['kv'].shape) == (lm.depth, 2, 1, lm.num_kv_heads, cfg.prefix_len, lm.head_dim)
    kv_bytes = context['kv'].numel() * context['kv'].element_size()
    assert kv_bytes == cfg.kv_bytes_per_token(element) * cfg.prefix_len
    assert kv_bytes == 2 * lm.depth * lm.num_kv_heads * lm.head_dim * cfg.prefix_len * element
    assert kv_bytes == runtime.prefix_bytes()
    assert context.nbytes == kv_bytes + cfg.prefix_len  # + the bool pad mask [1, P]
    assert runtime.cache.stats().bytes == context.nbytes
    # Pad mask: two present cameras, one masked, then the real prompt tokens.
    per_image = cfg.tokens_per_image
    pad = context['pad_mask'][0]
    assert pad[:2 * per_image].all() and not pad[2 * per_image:3 * per_image].any()
    assert pad[3 * per_image] and not pad[-1]


def test_cache_budget_smaller_than_one_prefix_stores_nothing_but_works(tiny_checkpoint):
    probe = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32',
                                            cache_max_bytes=probe.prefix_bytes() - 1)
    obs = make_observation()
    first = runtime.infer(obs, seed=0)
    second = runtime.infer(obs, seed=0)
    assert not first.cache_hit and not second.cache_hit
    assert np.array_equal(first.actions, second.actions)
    stats = runtime.cache.stats()
    assert stats.entries == 0 and stats.rejected_oversize == 2
