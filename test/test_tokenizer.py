"""pi0's PaliGemma tokenizer (families/pi0/tokenizer.py) and pi0.5's prompt on it (families/pi05/tokenizer.py)."""
import time

import numpy as np
import pytest

from tokenizer_fixtures import export_tokenizer_json
from vla_policy_node.policy.families.pi0.tiny_tokenizer import build_test_tokenizer
from vla_policy_node.policy.families.pi0.tokenizer import PromptTokenizer, TokenizerError, format_pi0_prompt
from vla_policy_node.policy.families.pi05.tokenizer import discretize_state, encode_pi05, format_pi05_prompt

STATE = np.array([-1.0, 0.999, 0.0, 0.5, -0.25], dtype=np.float32)


@pytest.fixture(scope='module')
def model_path(tmp_path_factory):
    return build_test_tokenizer(tmp_path_factory.mktemp('spm'))


@pytest.fixture(scope='module')
def json_path(model_path, tmp_path_factory):
    return export_tokenizer_json(model_path, tmp_path_factory.mktemp('hf') / 'tokenizer.json')


@pytest.fixture(scope='module')
def tok(model_path):
    return PromptTokenizer.from_path(model_path)


@pytest.fixture(scope='module')
def hf_tok(json_path):
    return PromptTokenizer.from_path(json_path)


def _real_ids(ids, mask):
    return ids[mask].tolist()


# -- shapes, BOS, padding, truncation ------------------------------------------

@pytest.mark.parametrize('which', ['pi0', 'pi05'])
def test_shapes_and_dtypes(tok, which):
    ids, mask = (tok.encode_pi0('pick up the cube', 48) if which == 'pi0'
                 else encode_pi05(tok, 'pick up the cube', STATE, 48))
    assert ids.shape == (48,) and mask.shape == (48,)
    assert ids.dtype == np.int64
    assert mask.dtype == np.bool_


def test_special_ids_follow_paligemma(tok):
    assert (tok.pad_id, tok.bos_id, tok.vocab_size) == (0, 2, 512)


@pytest.mark.parametrize('which', ['pi0', 'pi05'])
def test_bos_first(tok, which):
    ids, _ = (tok.encode_pi0('open the drawer', 32) if which == 'pi0'
              else encode_pi05(tok, 'open the drawer', STATE, 64))
    assert ids[0] == tok.bos_id == 2
    assert tok.bos_id not in ids[1:].tolist()


def test_right_padding_and_mask(tok):
    ids, mask = tok.encode_pi0('push the red block', 48)
    length = 1 + len(tok.encode_text('push the red block\n'))
    assert 1 < length < 48
    assert mask[:length].all() and not mask[length:].any()
    assert (ids[length:] == 0).all()
    assert (ids[:length] != 0).all()


@pytest.mark.parametrize('which', ['pi0', 'pi05'])
def test_truncation_keeps_head(tok, which):
    def encode(max_length):
        if which == 'pi0':
            return tok.encode_pi0('stack the green cup on the blue plate', max_length)
        return encode_pi05(tok, 'stack the green cup on the blue plate', STATE, max_length)

    full_ids, full_mask = encode(200)
    full = _real_ids(full_ids, full_mask)
    ids, mask = encode(6)
    assert len(full) > 6
    assert mask.all()
    assert ids.tolist() == full[:6]


def test_bad_max_length(tok):
    with pytest.raises(TokenizerError):
        tok.encode_pi0('open the drawer', 0)


# -- pi0 format ------------------------------------------------------------------

def test_pi0_prompt_ends_with_newline_token(tok):
    newline_id = tok.encode_text('\n')
    assert len(newline_id) == 1
    ids, mask = tok.encode_pi0('pick up the cube', 48)
    assert _real_ids(ids, mask)[-1] == newline_id[0]


def test_pi0_adds_exactly_one_newline(tok):
    with_newline = tok.encode_pi0('pick up the cube\n', 48)
    without = tok.encode_pi0('pick up the cube', 48)
    assert with_newline[0].tolist() == without[0].tolist()
    assert format_pi0_prompt('a') == 'a\n' and format_pi0_prompt('a\n') == 'a\n'


def test_pi0_is_bos_plus_task_and_newline_uncleaned(tok):
    # lerobot's pi0 processor does not clean the text: underscores stay.
    ids, mask = tok.encode_pi0('fold_the towel', 48)
    assert _real_ids(ids, mask) == [2] + tok.encode_text('fold_the towel\n')
    cleaned, _ = tok.encode_pi0('fold the towel', 48)
    assert ids.tolist() != cleaned.tolist()


# -- pi0.5 format ----------------------------------------------------------------

def test_pi05_prompt_text_exact():
    prompt = format_pi05_prompt('  pick_up the\ncube  ', np.array([-1.0, 0.0, 0.999]))
    assert prompt == 'Task: pick up the cube, State: 0 128 255;\nAction: '


def test_state_bins_edges():
    bins = discretize_state(np.array([-1.0, 0.999, 0.0, -1.5, 1.0, 1.5, -0.9921875]))
    # No clipping, as lerobot: below -1 is bin -1, 1 and above is 255.
    assert bins.tolist() == [0, 255, 128, -1, 255, 255, 1]
    assert bins.dtype == np.int64


def test_a_short_state_is_binned_at_its_own_dimension_by_default():
    # floor((x + 1) * 128), clamped to [-1, 255]: -1 -> 0, -0.5 -> 64, 0 -> 128, 0.25 -> 160, 0.999 -> 255,
    # 1.2 -> 255, -1.3 -> -1, 0.7 -> 217.
    state = np.array([-1.0, -0.5, 0.0, 0.25, 0.999, 1.2, -1.3, 0.7], dtype=np.float32)
    assert format_pi05_prompt('go', state) == 'Task: go, State: 0 64 128 160 255 255 -1 217;\nAction: '


def test_the_legacy_prompt_pads_the_state_with_zeros_that_bin_to_128():
    state = np.array([-1.0, -0.5, 0.0, 0.25, 0.999, 1.2, -1.3, 0.7], dtype=np.float32)
    legacy = format_pi05_prompt('go', state, pad_state_to=32)
    assert legacy == 'Task: go, State: 0 64 128 160 255 255 -1 217' + ' 128' * 24 + ';\nAction: '
    # Padding only grows the vector.
    assert format_pi05_prompt('go', np.array([1.0, -1.0]), pad_state_to=1) == 'Task: go, State: 255 0;\nAction: '


def test_pi05_ids_are_bos_plus_prompt(tok):
    ids, mask = encode_pi05(tok, 'pick up the cube', STATE, 128)
    expected = [2] + tok.encode_text(format_pi05_prompt('pick up the cube', STATE))
    assert _real_ids(ids, mask) == expected


def test_pi05_state_changes_ids(tok):
    base, _ = encode_pi05(tok, 'pick up the cube', STATE, 128)
    changed_state = STATE.copy()
    changed_state[3] = -0.5
    changed, _ = encode_pi05(tok, 'pick up the cube', changed_state, 128)
    assert base.tolist() != changed.tolist()


def test_pi05_rejects_bad_state(tok):
    with pytest.raises(TokenizerError):
        encode_pi05(tok, 'go', np.array([0.0, np.nan]), 64)
    with pytest.raises(TokenizerError):
        encode_pi05(tok, 'go', np.zeros((2, 2)), 64)


# -- loading, identity, backends ----------------------------------------------------

def test_identity_tracks_file_content(model_path, tmp_path):
    same = PromptTokenizer.from_path(model_path)
    from_dir = PromptTokenizer.from_path(model_path.parent)
    other = PromptTokenizer.from_path(build_test_tokenizer(tmp_path / 'small', vocab_size=400))
    assert same.identity == from_dir.identity
    assert len(same.identity) == 32
    assert other.identity != same.identity
    assert other.vocab_size == 400


def test_directory_prefers_sentencepiece(model_path, json_path, tmp_path):
    (tmp_path / 'tokenizer.model').write_bytes(model_path.read_bytes())
    (tmp_path / 'tokenizer.json').write_bytes(json_path.read_bytes())
    loaded = PromptTokenizer.from_path(tmp_path)
    assert loaded.source.name == 'tokenizer.model'


def test_json_only_directory(json_path):
    assert PromptTokenizer.from_path(json_path.parent).source.name == 'tokenizer.json'


PROMPTS = ['pick up the red cube', 'fold_the towel  twice\n', 'Put it back: then stop; done.',
           'Wörld café 🤖 ZEBRA 1234', '']


@pytest.mark.parametrize('instruction', PROMPTS)
def test_backends_give_equal_ids(tok, hf_tok, instruction):
    assert hf_tok.vocab_size == tok.vocab_size
    assert (hf_tok.bos_id, hf_tok.pad_id) == (tok.bos_id, tok.pad_id)
    for max_length in (8, 96):
        sp_ids, sp_mask = tok.encode_pi0(instruction, max_length)
        hf_ids, hf_mask = hf_tok.encode_pi0(instruction, max_length)
        assert sp_ids.tolist() == hf_ids.tolist() and sp_mask.tolist() == hf_mask.tolist()
        sp_ids, _ = encode_pi05(tok, instruction, STATE, max_length)
        hf_ids, _ = encode_pi05(hf_tok, instruction, STATE, max_length)
        assert sp_ids.tolist() == hf_ids.tolist()


def test_training_is_deterministic_and_fast(tmp_path):
    start = time.monotonic()
    first = build_test_tokenizer(tmp_path / 'a').read_bytes()
    assert time.monotonic() - start < 5.0
    second = build_test_tokenizer(tmp_path / 'b').read_bytes()
    assert first == second


def test_missing_path_error_names_path_and_files(tmp_path):
    missing = tmp_path / 'nowhere' / 'tokenizer.model'
    with pytest.raises(TokenizerError) as info:
        PromptTokenizer.from_path(missing)
    message = str(info.value)
    assert str(missing) in message
    assert 'tokenizer.model' in message and 'tokenizer.json' in message


def test_empty_directory_error(tmp_path):
    with pytest.raises(TokenizerError, match='tokenizer.model or tokenizer.json'):
        PromptTokenizer.from_path(tmp_path)


def test_corrupt_file_error(tmp_path):
    bad = tmp_path / 'tokenizer.model'
    bad.write_bytes(b'not a sentencepiece model')
    with pytest.raises(TokenizerError, match=str(bad)):
        PromptTokenizer.from_path(bad)
