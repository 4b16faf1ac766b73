"""PrefixCache (byte/entry-bounded LRU), PrefixContext and PrefixKeyBuilder."""
import random
import threading

import numpy as np
import pytest
import torch

from vla_policy_node.cache import (KV, MASK_AXES, PAD_MASK, PREFIX, PREFIX_LAYOUT_VERSION, ContextAxes, PrefixCache,
                                   PrefixContext, PrefixKeyBuilder, can_stack, context_row, kv_prefix_context,
                                   stack_contexts)
from vla_policy_node.images import CompressedFrame, RawImage


def make_context(tokens: int, layers: int = 1, head_dim: int = 4, fill: float = 0.0) -> PrefixContext:
    """kv [L, 2, 1, 1, P, D] fp32 + pad [1, P] bool: nbytes = L*2*P*D*4 + P."""
    kv = torch.full((layers, 2, 1, 1, tokens, head_dim), fill, dtype=torch.float32)
    return kv_prefix_context(kv, torch.ones(1, tokens, dtype=torch.bool))


def expected_nbytes(tokens: int, layers: int = 1, head_dim: int = 4) -> int:
    return layers * 2 * tokens * head_dim * 4 + tokens


# ---- PrefixContext ---------------------------------------------------------------------------

def test_context_nbytes_and_properties():
    ctx = make_context(10, layers=3, head_dim=8)
    assert ctx.nbytes == expected_nbytes(10, layers=3, head_dim=8) == 3 * 2 * 10 * 8 * 4 + 10
    assert ctx.prefix_len == 10 and ctx.batch_size == 1 and ctx[KV].dtype == torch.float32
    assert set(ctx) == {KV, PAD_MASK} and ctx.masks == {PREFIX: PAD_MASK}
    bf16 = kv_prefix_context(torch.zeros(2, 2, 1, 1, 5, 4, dtype=torch.bfloat16), torch.ones(1, 5, dtype=torch.bool),
                             cross=torch.zeros(1, 2, 1, 2, 5, 3))
    assert bf16.nbytes == 2 * 2 * 5 * 4 * 2 + 5 + 2 * 2 * 5 * 3 * 4     # every tensor, the extra one too


def test_context_rejects_bad_shapes():
    with pytest.raises(ValueError):
        kv_prefix_context(torch.zeros(2, 3, 1, 1, 5, 4), torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError):
        kv_prefix_context(torch.zeros(2, 2, 1, 1, 5), torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError):
        kv_prefix_context(torch.zeros(2, 2, 1, 1, 5, 4), torch.ones(1, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match='cross'):           # an extra tensor of another token length
        kv_prefix_context(torch.zeros(2, 2, 1, 1, 5, 4), torch.ones(1, 5, dtype=torch.bool),
                          cross=torch.zeros(1, 2, 1, 1, 4, 4))
    features, mask = torch.zeros(2, 7, 3), torch.ones(1, 7, dtype=torch.bool)
    with pytest.raises(ValueError, match='batch'):           # features of 2 robots in a context of one
        PrefixContext({'features': features, 'mask': mask}, {'features': MASK_AXES, 'mask': MASK_AXES},
                      batch_size=1, prefix_len=7, masks={PREFIX: 'mask'})
    with pytest.raises(ValueError, match='axes'):            # a tensor without its axes
        PrefixContext({'features': features, 'mask': mask}, {'mask': MASK_AXES}, batch_size=1, prefix_len=7,
                      masks={PREFIX: 'mask'})


def feature_context(tokens: int, text: int, fill: float) -> PrefixContext:
    """A context that is no K/V prefix: features [B, T, D] with their mask, and per-layer K/V gathered to a
    token subset ('text', of its own length, with a mask of its own): the layout of a cross-attention family."""
    return PrefixContext(
        {'features': torch.full((1, tokens, 3), fill), 'mask': torch.ones(1, tokens, dtype=torch.bool),
         'text_kv': torch.full((2, 2, 1, 4, text, 5), fill), 'text_mask': torch.ones(1, text, dtype=torch.bool)},
        {'features': MASK_AXES, 'mask': MASK_AXES, 'text_kv': ContextAxes(batch=2, tokens=4, sequence='text'),
         'text_mask': ContextAxes(batch=0, tokens=1, sequence='text')},
        batch_size=1, prefix_len=tokens, masks={PREFIX: 'mask', 'text': 'text_mask'})


def test_a_feature_context_is_cached_like_a_kv_prefix():
    context = feature_context(6, 2, 1.0)
    assert context.prefix_len == 6 and context.batch_size == 1
    assert context.nbytes == 6 * 3 * 4 + 6 + 2 * 2 * 4 * 2 * 5 * 4 + 2
    cache = PrefixCache(max_bytes=context.nbytes, max_entries=4)
    assert cache.put('a', context) and cache.get('a') is context and cache.stats().bytes == context.nbytes


def test_contexts_of_different_lengths_stack_padded_and_masked():
    """A batching server's step: two robots' contexts, each sequence right-padded to its longest with masked
    zeros, stacked along every tensor's own batch axis."""
    short, long = feature_context(4, 3, 1.0), feature_context(6, 2, 2.0)
    both = stack_contexts([short, long])
    assert both.batch_size == 2 and both.prefix_len == 6
    assert tuple(both['features'].shape) == (2, 6, 3) and tuple(both['text_kv'].shape) == (2, 2, 2, 4, 3, 5)
    assert both['mask'].tolist() == [[True] * 4 + [False] * 2, [True] * 6]
    assert both['text_mask'].tolist() == [[True] * 3, [True, True, False]]
    assert torch.equal(both['features'][0, :4], short['features'][0]) and not both['features'][0, 4:].any()
    assert torch.equal(both['text_kv'][:, :, 1, :, :2], long['text_kv'][:, :, 0])
    assert not both['text_kv'][:, :, 1, :, 2:].any()
    kv = stack_contexts([make_context(3, fill=1.0), make_context(5, fill=2.0)])
    assert tuple(kv[KV].shape) == (1, 2, 2, 1, 5, 4) and kv[PAD_MASK].sum().item() == 8
    with pytest.raises(ValueError, match='layouts'):
        stack_contexts([make_context(3), short])


def test_only_contexts_that_differ_in_batch_and_tokens_stack_and_a_row_comes_back_as_its_own_entry():
    short, long = feature_context(4, 3, 1.0), feature_context(6, 2, 2.0)
    assert can_stack([short, long]) and can_stack([make_context(3), make_context(5)])
    assert not can_stack([make_context(3), short])                                  # other names and axes
    assert not can_stack([make_context(3, head_dim=4), make_context(3, head_dim=8)])  # a size besides the tokens
    assert not can_stack([make_context(3), make_context(3).map(lambda t: t if t.dtype == torch.bool else t.half())])
    with pytest.raises(ValueError, match='layouts'):
        stack_contexts([make_context(3, head_dim=4), make_context(3, head_dim=8)])
    both = stack_contexts([short, long])
    row = context_row(both, 0)
    assert row.batch_size == 1 and row.prefix_len == 6 and row.masks == short.masks
    assert torch.equal(row['features'][:, :4], short['features']) and not row['mask'][0, 4:].any()
    padded = torch.cat([long['text_kv'], torch.zeros(2, 2, 1, 4, 1, 5)], dim=4)     # its 'text' padded to 3
    assert torch.equal(context_row(both, 1)['text_kv'], padded)
    assert row.nbytes == both.nbytes // 2           # a copy: the row's entry does not hold the batch's storage
    assert row['features'].untyped_storage().data_ptr() != both['features'].untyped_storage().data_ptr()
    with pytest.raises(ValueError, match='row 2'):
        context_row(both, 2)


# ---- LRU semantics -----------------------------------------------------------------------------

def test_get_put_roundtrip_and_miss():
    cache = PrefixCache(max_bytes=1 << 20, max_entries=4)
    ctx = make_context(4)
    assert cache.get('a') is None
    assert cache.put('a', ctx) is True
    assert cache.get('a') is ctx  # shared, not copied
    assert 'a' in cache and 'b' not in cache
    assert len(cache) == 1
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.insertions, stats.entries, stats.bytes) == (1, 1, 1, 1, ctx.nbytes)


def test_eviction_by_entry_count_is_lru_and_get_refreshes():
    cache = PrefixCache(max_bytes=1 << 20, max_entries=3)
    for key in 'abc':
        assert cache.put(key, make_context(2))
    assert cache.get('a') is not None  # 'a' becomes most recent; 'b' is now the oldest
    assert cache.put('d', make_context(2))
    assert 'b' not in cache
    assert all(k in cache for k in 'acd')
    assert cache.put('e', make_context(2))  # oldest now 'c'
    assert 'c' not in cache
    assert all(k in cache for k in 'ade')
    stats = cache.stats()
    assert stats.evictions == 2 and stats.entries == 3


def test_contains_does_not_refresh_or_count():
    cache = PrefixCache(max_bytes=1 << 20, max_entries=2)
    cache.put('a', make_context(2))
    cache.put('b', make_context(2))
    before = cache.stats()
    assert 'a' in cache  # must not make 'a' most recent
    assert cache.stats() == before
    cache.put('c', make_context(2))
    assert 'a' not in cache and 'b' in cache and 'c' in cache


def test_eviction_by_bytes():
    size = expected_nbytes(10)  # 330 bytes
    cache = PrefixCache(max_bytes=3 * size, max_entries=100)
    for key in 'abc':
        assert cache.put(key, make_context(10))
    assert cache.stats().bytes == 3 * size and len(cache) == 3
    cache.get('a')
    # A double-size entry needs two slots: the two least recently used ('b', 'c') go.
    assert cache.put('big', make_context(20))
    assert 'b' not in cache and 'c' not in cache
    assert 'a' in cache and 'big' in cache
    stats = cache.stats()
    assert stats.bytes == size + expected_nbytes(20) <= stats.max_bytes
    assert stats.evictions == 2


def test_oversize_entry_is_rejected_not_flushing():
    size = expected_nbytes(10)
    cache = PrefixCache(max_bytes=size, max_entries=10)
    assert cache.put('fits', make_context(10))
    assert cache.put('huge', make_context(11)) is False
    stats = cache.stats()
    assert stats.rejected_oversize == 1
    assert 'huge' not in cache
    assert 'fits' in cache, 'an oversize put must not evict what is stored'
    assert stats.entries == 1 and stats.bytes == size and stats.evictions == 0


def test_budget_smaller_than_one_entry_stores_nothing():
    cache = PrefixCache(max_bytes=expected_nbytes(4) - 1, max_entries=10)
    for i in range(3):
        assert cache.put(f'k{i}', make_context(4)) is False
    stats = cache.stats()
    assert stats.entries == 0 and stats.bytes == 0 and stats.rejected_oversize == 3 and stats.insertions == 0
    assert cache.get('k0') is None


def test_zero_entries_stores_nothing():
    cache = PrefixCache(max_bytes=1 << 20, max_entries=0)
    assert cache.put('a', make_context(2)) is False
    assert len(cache) == 0 and cache.stats().bytes == 0


def test_replacing_a_key_accounts_bytes_once():
    cache = PrefixCache(max_bytes=1 << 20, max_entries=4)
    cache.put('a', make_context(4))
    cache.put('a', make_context(8))
    stats = cache.stats()
    assert stats.entries == 1 and stats.bytes == expected_nbytes(8)
    assert cache.get('a').prefix_len == 8


def test_resize_evicts_down_oldest_first():
    size = expected_nbytes(5)
    cache = PrefixCache(max_bytes=10 * size, max_entries=10)
    for key in 'abcde':
        cache.put(key, make_context(5))
    cache.get('a')  # order (oldest first): b c d e a
    cache.resize(max_bytes=10 * size, max_entries=3)
    assert [k for k in 'abcde' if k in cache] == ['a', 'd', 'e']
    cache.resize(max_bytes=2 * size, max_entries=3)
    assert [k for k in 'abcde' if k in cache] == ['a', 'e']
    stats = cache.stats()
    assert stats.bytes == 2 * size and stats.evictions == 3
    assert (stats.max_bytes, stats.max_entries) == (2 * size, 3)
    cache.resize(0, 0)
    assert len(cache) == 0 and cache.stats().bytes == 0
    with pytest.raises(ValueError):
        cache.resize(-1, 3)
    with pytest.raises(ValueError):
        PrefixCache(max_bytes=10, max_entries=-1)


def test_stats_counters_and_hit_rate():
    cache = PrefixCache(max_bytes=1 << 20, max_entries=2)
    assert cache.stats().hit_rate == 0.0  # no lookups: no division by zero
    cache.put('a', make_context(2))
    cache.get('a')
    cache.get('a')
    cache.get('a')
    cache.get('x')
    stats = cache.stats()
    assert stats.hits == 3 and stats.misses == 1 and stats.lookups == 4
    assert stats.hit_rate == pytest.approx(0.75)
    cache.put('b', make_context(2))
    cache.put('c', make_context(2))
    stats = cache.stats()
    assert stats.insertions == 3 and stats.evictions == 1 and stats.entries == 2
    assert stats.bytes == 2 * expected_nbytes(2)


def test_clear_empties_but_keeps_bounds():
    cache = PrefixCache(max_bytes=1 << 20, max_entries=4)
    cache.put('a', make_context(2))
    cache.clear()
    stats = cache.stats()
    assert stats.entries == 0 and stats.bytes == 0 and stats.max_entries == 4
    assert cache.get('a') is None


def test_thread_safety_invariants():
    sizes = [2, 3, 5, 8]
    max_entries = 6
    max_bytes = 4 * expected_nbytes(8)
    cache = PrefixCache(max_bytes=max_bytes, max_entries=max_entries)
    contexts = {n: make_context(n) for n in sizes}
    keys = [f'key{i}' for i in range(20)]
    # Each key always stores contexts of one size, so any stored context can be checked by key.
    size_of = {key: sizes[i % len(sizes)] for i, key in enumerate(keys)}
    counts = {'gets': 0, 'stored': 0}
    count_lock = threading.Lock()
    errors = []
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        gets = stored = 0
        try:
            barrier.wait()
            for _ in range(400):
                key = rng.choice(keys)
                if rng.random() < 0.5:
                    ctx = cache.get(key)
                    gets += 1
                    if ctx is not None and ctx.prefix_len != size_of[key]:
                        errors.append(f'{key} returned a context of the wrong size')
                else:
                    stored += cache.put(key, contexts[size_of[key]])
                if rng.random() < 0.05:
                    stats = cache.stats()
                    if stats.entries > max_entries or stats.bytes > max_bytes:
                        errors.append(f'bounds exceeded: {stats}')
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))
        with count_lock:
            counts['gets'] += gets
            counts['stored'] += stored

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:5]
    stats = cache.stats()
    assert stats.hits + stats.misses == counts['gets']
    assert stats.insertions == counts['stored']
    assert stats.entries <= max_entries and stats.bytes <= max_bytes
    stored = [key for key in keys if key in cache]
    assert len(stored) == stats.entries
    assert stats.bytes == sum(contexts[size_of[key]].nbytes for key in stored)


# ---- keys --------------------------------------------------------------------------------------

def rgb(seed: int, height: int = 4, width: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def raw(pixels: np.ndarray, encoding: str = 'rgb8', step=None, width=None, height=None, bigendian=False) -> RawImage:
    h, w, _ = pixels.shape
    return RawImage(height=height or h, width=width or w, encoding=encoding, step=step or w * 3,
                    is_bigendian=bigendian, data=pixels.tobytes())


TOKENS = np.array([2, 17, 30, 9, 0, 0], dtype=np.int64)
TOKEN_MASK = np.array([1, 1, 1, 1, 0, 0], dtype=bool)


@pytest.fixture
def builder() -> PrefixKeyBuilder:
    return PrefixKeyBuilder('rev-1', 'tok-1', 'float32')


def cams(a=None, b=None, c=None):
    return [('base_0_rgb', a), ('left_wrist_0_rgb', b), ('right_wrist_0_rgb', c)]


def test_key_is_deterministic_and_content_based(builder):
    img_a, img_b = rgb(1), rgb(2)
    key = builder.key(cams(raw(img_a), raw(img_b)), TOKENS, TOKEN_MASK)
    # Equal content in fresh buffers (another builder for the same model) gives the same key.
    again = PrefixKeyBuilder('rev-1', 'tok-1', 'float32').key(
        cams(raw(img_a.copy()), raw(img_b.copy())), TOKENS.copy(), TOKEN_MASK.copy())
    assert key == again
    assert isinstance(key, str) and len(key) == 32  # 128-bit hex
    # Different buffer types with the same bytes hash the same.
    as_bytearray = RawImage(4, 5, 'rgb8', 15, False, bytearray(img_a.tobytes()))
    as_array = RawImage(4, 5, 'rgb8', 15, False, np.frombuffer(img_a.tobytes(), dtype=np.uint8))
    assert builder.key(cams(as_bytearray, raw(img_b)), TOKENS, TOKEN_MASK) == key
    assert builder.key(cams(as_array, raw(img_b)), TOKENS, TOKEN_MASK) == key
    # Token dtypes do not matter, values do.
    assert builder.key(cams(raw(img_a), raw(img_b)), TOKENS.astype(np.int32), TOKEN_MASK.astype(np.uint8)) == key


@pytest.mark.parametrize('position', [0, 7, 59])
def test_any_changed_image_byte_changes_key(builder, position):
    img = rgb(3)
    base = builder.key(cams(raw(img)), TOKENS, TOKEN_MASK)
    changed = img.copy().reshape(-1)
    changed[position] ^= 1
    assert builder.key(cams(raw(changed.reshape(img.shape))), TOKENS, TOKEN_MASK) != base
    # Same for ndarray and compressed inputs.
    changed_img = changed.reshape(img.shape)
    assert builder.key(cams(img), TOKENS, TOKEN_MASK) != builder.key(cams(changed_img), TOKENS, TOKEN_MASK)
    jpeg = bytearray(b'\xff\xd8' + bytes(range(60)))
    key_c = builder.key(cams(CompressedFrame('jpeg', bytes(jpeg))), TOKENS, TOKEN_MASK)
    jpeg[position] ^= 0x10
    assert builder.key(cams(CompressedFrame('jpeg', bytes(jpeg))), TOKENS, TOKEN_MASK) != key_c


def test_camera_order_and_mask_change_key(builder):
    a, b = raw(rgb(1)), raw(rgb(2))
    base = builder.key(cams(a, b), TOKENS, TOKEN_MASK)
    assert builder.key(cams(b, a), TOKENS, TOKEN_MASK) != base             # frames swapped between cameras
    assert builder.key(cams(a, None), TOKENS, TOKEN_MASK) != base          # camera masked
    assert builder.key(cams(None, b), TOKENS, TOKEN_MASK) != base
    assert builder.key(cams(a, None), TOKENS, TOKEN_MASK) != builder.key(cams(None, a), TOKENS, TOKEN_MASK)
    # Slot order (lerobot puts present cameras first): same frames, different slot list order.
    swapped_slots = [('left_wrist_0_rgb', b), ('base_0_rgb', a), ('right_wrist_0_rgb', None)]
    assert builder.key(swapped_slots, TOKENS, TOKEN_MASK) != base
    # Fewer slots.
    assert builder.key(cams(a, b)[:2], TOKENS, TOKEN_MASK) != base


def test_image_metadata_changes_key(builder):
    img = rgb(4, height=4, width=6)
    data = img.tobytes()
    base = builder.key(cams(RawImage(4, 6, 'rgb8', 18, False, data)), TOKENS, TOKEN_MASK)
    variants = [
        RawImage(4, 6, 'bgr8', 18, False, data),          # encoding
        RawImage(8, 3, 'rgb8', 9, False, data),           # geometry (same bytes)
        RawImage(4, 5, 'rgb8', 18, False, data),          # width only (step padding)
        RawImage(3, 6, 'rgb8', 24, False, data[:72]),     # step
        RawImage(4, 6, 'rgb8', 18, True, data),           # endianness flag
    ]
    keys = {builder.key(cams(v), TOKENS, TOKEN_MASK) for v in variants}
    assert base not in keys and len(keys) == len(variants)
    # Same bytes as raw, as an array and as a compressed payload are three different inputs.
    others = {builder.key(cams(img), TOKENS, TOKEN_MASK),
              builder.key(cams(CompressedFrame('jpeg', data)), TOKENS, TOKEN_MASK),
              builder.key(cams(CompressedFrame('png', data)), TOKENS, TOKEN_MASK)}
    assert base not in others and len(others) == 3
    # Array shape is part of the key (same bytes, different layout).
    assert builder.key(cams(img.reshape(6, 4, 3)), TOKENS, TOKEN_MASK) != builder.key(cams(img), TOKENS, TOKEN_MASK)


def test_tokens_and_token_mask_change_key(builder):
    frames = cams(raw(rgb(1)))
    base = builder.key(frames, TOKENS, TOKEN_MASK)
    tokens = TOKENS.copy()
    tokens[2] += 1
    assert builder.key(frames, tokens, TOKEN_MASK) != base
    mask = TOKEN_MASK.copy()
    mask[4] = True
    assert builder.key(frames, TOKENS, mask) != base
    assert builder.key(frames, TOKENS[:-1], TOKEN_MASK[:-1]) != base


@pytest.mark.parametrize('changed', [
    dict(model_revision='rev-2'),
    dict(tokenizer_identity='tok-2'),
    dict(dtype='bfloat16'),
    dict(layout_version=PREFIX_LAYOUT_VERSION + 1),
])
def test_model_level_fields_change_key(builder, changed):
    frames = cams(raw(rgb(1)), raw(rgb(2)))
    args = dict(model_revision='rev-1', tokenizer_identity='tok-1', dtype='float32')
    layout = changed.pop('layout_version', PREFIX_LAYOUT_VERSION)
    args.update(changed)
    other = PrefixKeyBuilder(args['model_revision'], args['tokenizer_identity'], args['dtype'], layout_version=layout)
    assert other.key(frames, TOKENS, TOKEN_MASK) != builder.key(frames, TOKENS, TOKEN_MASK)


def test_model_level_fields_are_length_prefixed():
    frames = cams(raw(rgb(1)))
    one = PrefixKeyBuilder('ab', 'c', 'float32').key(frames, TOKENS, TOKEN_MASK)
    two = PrefixKeyBuilder('a', 'bc', 'float32').key(frames, TOKENS, TOKEN_MASK)
    assert one != two


def test_fields_are_length_prefixed(builder):
    # The concatenated camera bytes are equal, only the split between cameras differs.
    one = [('base_0_rgb', CompressedFrame('jpeg', b'xxab')), ('left_wrist_0_rgb', CompressedFrame('jpeg', b'c'))]
    two = [('base_0_rgb', CompressedFrame('jpeg', b'xxa')), ('left_wrist_0_rgb', CompressedFrame('jpeg', b'bc'))]
    assert builder.key(one, TOKENS, TOKEN_MASK) != builder.key(two, TOKENS, TOKEN_MASK)
    # Camera names split differently.
    frame = CompressedFrame('jpeg', b'payload')
    assert builder.key([('ab', frame), ('c', frame)], TOKENS, TOKEN_MASK) != \
        builder.key([('a', frame), ('bc', frame)], TOKENS, TOKEN_MASK)
    # Bytes moved between the token stream and the mask stream (equal concatenation).
    tokens_a, mask_a = np.array([1, 1], dtype=np.int64), np.array([1], dtype=bool)
    tokens_b, mask_b = np.array([1], dtype=np.int64), np.array([1, 0, 0, 0, 0, 0, 0, 0, 1], dtype=bool)
    assert tokens_a.tobytes() + mask_a.tobytes() == tokens_b.tobytes() + mask_b.tobytes()
    assert builder.key(one, tokens_a, mask_a) != builder.key(one, tokens_b, mask_b)


def test_key_rejects_unknown_camera_input(builder):
    with pytest.raises(TypeError):
        builder.key([('base_0_rgb', 'not an image')], TOKENS, TOKEN_MASK)
