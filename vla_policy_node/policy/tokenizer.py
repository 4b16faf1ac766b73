"""Prompt tokenization for pi0 / pi0.5: PaliGemma tokenizer, lerobot prompt formats.

Prompt formats follow lerobot's processors (checked against huggingface/lerobot):

* pi0, ``src/lerobot/policies/pi0/processor_pi0.py``: ``Pi0NewLineProcessor``
  appends ``"\\n"`` to the task unless it already ends with one; the text is
  not otherwise cleaned. ``TokenizerProcessorStep`` then runs the HF PaliGemma
  tokenizer (``google/paligemma-3b-pt-224``: adds BOS, no EOS), right padded
  to ``max_length`` and truncated. Ids: ``BOS + encode(task + "\\n")``.
* pi0.5, ``src/lerobot/policies/pi05/processor_pi05.py``:
  ``Pi05PrepareStateTokenizerProcessorStep`` pads the normalized state to
  ``max_state_dim`` with zeros, bins it with
  ``np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1`` (no clipping, so a
  value below -1 gives bin -1 and above 1 gives 255), cleans the task with
  ``strip().replace("_", " ").replace("\\n", " ")`` (no capitalisation or
  punctuation change) and writes
  ``f"Task: {cleaned}, State: {' '.join(bins)};\\nAction: "``, which the same
  PaliGemma tokenizer step encodes with BOS.

openpi's ``src/openpi/models/tokenizer.py`` writes the same pi0.5 string; for
pi0 it cleans the text and encodes ``"\\n"`` separately, which gives the same
ids as lerobot only for already clean instructions.

Both backends (``sentencepiece`` for ``tokenizer.model``, ``tokenizers`` for
``tokenizer.json``) are driven the same way: encode the prompt without special
tokens, then prepend BOS ourselves, so one tokenizer gives one id sequence.
"""
from __future__ import annotations

import io
import itertools
import os
import struct
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

PathLike = Union[str, os.PathLike]

SENTENCEPIECE_FILE = 'tokenizer.model'
HF_TOKENIZER_FILE = 'tokenizer.json'

# 256 bins over [-1, 1]: the left edges of np.linspace(-1, 1, 257).
STATE_BIN_COUNT = 256
_STATE_BIN_EDGES = np.linspace(-1.0, 1.0, STATE_BIN_COUNT + 1)[:-1]

# PaliGemma's special ids, reproduced by the test tokenizer.
PALIGEMMA_PAD_ID = 0
PALIGEMMA_EOS_ID = 1
PALIGEMMA_BOS_ID = 2
PALIGEMMA_UNK_ID = 3


class TokenizerError(ValueError):
    """A tokenizer that cannot be found, read or used, or a bad prompt input."""


# --------------------------------------------------------------------------
# Prompt formats (pure string functions, so tests can check them directly).
# --------------------------------------------------------------------------

def clean_task_text(text: str) -> str:
    """pi0.5's task cleaning: strip, underscores and newlines to spaces."""
    return text.strip().replace('_', ' ').replace('\n', ' ')


def format_pi0_prompt(instruction: str) -> str:
    """pi0: the task as given, ending in one '\\n' (lerobot Pi0NewLineProcessor)."""
    _require_str(instruction)
    return instruction if instruction.endswith('\n') else instruction + '\n'


def discretize_state(normalized_state: np.ndarray,
                     pad_state_to: Optional[int] = None) -> np.ndarray:
    """Bin a normalized state into 256 bins over [-1, 1], as int64.

    lerobot does not clip: values below -1 map to -1 and values >= 1 to 255.
    The state is taken as float32 first because lerobot bins a float32 tensor;
    a float64 value just below a bin edge could otherwise land in another bin.
    """
    state = np.asarray(normalized_state)
    if state.ndim != 1:
        raise TokenizerError(f'state must be 1-D, got shape {state.shape}')
    if not np.issubdtype(state.dtype, np.number) or np.issubdtype(state.dtype, np.complexfloating):
        raise TokenizerError(f'state must be real numbers, got dtype {state.dtype}')
    state = state.astype(np.float32)
    if not np.all(np.isfinite(state)):
        # digitize would silently put NaN in the top bin; a robot should not act on that.
        raise TokenizerError('state contains NaN or infinite values')
    state = _zero_pad(state, pad_state_to)
    return (np.digitize(state, _STATE_BIN_EDGES) - 1).astype(np.int64)


def format_pi05_prompt(instruction: str, normalized_state: np.ndarray,
                       pad_state_to: Optional[int] = None) -> str:
    """pi0.5: 'Task: {cleaned}, State: {bins};\\nAction: ' (lerobot processor_pi05)."""
    _require_str(instruction)
    bins = discretize_state(normalized_state, pad_state_to)
    state_text = ' '.join(str(int(b)) for b in bins)
    return f'Task: {clean_task_text(instruction)}, State: {state_text};\nAction: '


def _zero_pad(state: np.ndarray, pad_state_to: Optional[int]) -> np.ndarray:
    # Like lerobot's pad_vector: only ever grows the vector, never cuts it.
    if pad_state_to is None or state.shape[0] >= pad_state_to:
        return state
    padded = np.zeros(pad_state_to, dtype=state.dtype)
    padded[:state.shape[0]] = state
    return padded


def _require_str(instruction: object) -> None:
    if not isinstance(instruction, str):
        raise TokenizerError(f'instruction must be a str, got {type(instruction).__name__}')


def pad_or_truncate(ids: Sequence[int], max_length: int,
                    pad_id: int = PALIGEMMA_PAD_ID) -> Tuple[np.ndarray, np.ndarray]:
    """Right pad (mask False) or cut the tail (mask all True) to max_length."""
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise TokenizerError(f'max_length must be a positive int, got {max_length!r}')
    kept = list(ids)[:max_length]
    token_ids = np.full(max_length, pad_id, dtype=np.int64)
    token_ids[:len(kept)] = kept
    mask = np.zeros(max_length, dtype=bool)
    mask[:len(kept)] = True
    return token_ids, mask


# --------------------------------------------------------------------------
# Backends: each encodes plain text without adding any special token.
# --------------------------------------------------------------------------

class _SentencePieceBackend:
    def __init__(self, model_bytes: bytes):
        import sentencepiece as spm
        self._sp = spm.SentencePieceProcessor(model_proto=model_bytes)
        self.vocab_size = int(self._sp.get_piece_size())
        self.bos_id = int(self._sp.bos_id())
        self.pad_id = int(self._sp.pad_id())

    def encode(self, text: str) -> List[int]:
        return list(self._sp.encode(text, out_type=int, add_bos=False, add_eos=False))


class _HFTokenizersBackend:
    def __init__(self, json_bytes: bytes):
        from tokenizers import Tokenizer
        # Default `tokenizers` behaviour, as lerobot's HF tokenizer: literal
        # special-token text such as '<bos>' in an instruction becomes that
        # token, while sentencepiece spells it out. Real instructions never hit this.
        self._tok = Tokenizer.from_str(json_bytes.decode('utf-8'))
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.bos_id = _token_id_or(self._tok, '<bos>', -1)
        self.pad_id = _token_id_or(self._tok, '<pad>', -1)

    def encode(self, text: str) -> List[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def _token_id_or(tok, token: str, default: int) -> int:
    found = tok.token_to_id(token)
    return default if found is None else int(found)


# --------------------------------------------------------------------------
# PromptTokenizer
# --------------------------------------------------------------------------

class PromptTokenizer:
    """PaliGemma tokenizer plus the pi0 / pi0.5 prompt formats."""

    def __init__(self, backend, identity: str, source: Path):
        if backend.bos_id < 0:
            raise TokenizerError(f'tokenizer {source} has no BOS token')
        self._backend = backend
        self.identity = identity
        self.source = source
        self.vocab_size = backend.vocab_size
        self.bos_id = backend.bos_id
        # PaliGemma pads with 0; fall back to it when a tokenizer names no pad.
        self.pad_id = backend.pad_id if backend.pad_id >= 0 else PALIGEMMA_PAD_ID

    @classmethod
    def from_path(cls, path: PathLike) -> 'PromptTokenizer':
        """Load tokenizer.model / tokenizer.json, or a directory holding one."""
        file_path = _resolve_tokenizer_file(Path(path))
        data = _read_bytes(file_path)
        backend = _load_backend(file_path, data)
        return cls(backend, _digest(data), file_path)

    def encode_pi0(self, instruction: str, max_length: int) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int64 [max_length], mask bool [max_length]) for a pi0 prompt."""
        return self._encode_prompt(format_pi0_prompt(instruction), max_length)

    def encode_pi05(self, instruction: str, normalized_state: np.ndarray, max_length: int,
                    *, pad_state_to: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(ids, mask) for a pi0.5 prompt with the state binned into the text.

        lerobot zero-pads the state to ``max_state_dim`` (32) before binning;
        pass ``pad_state_to`` (or an already padded state) to reproduce that.
        """
        prompt = format_pi05_prompt(instruction, normalized_state, pad_state_to)
        return self._encode_prompt(prompt, max_length)

    def encode_text(self, text: str) -> List[int]:
        """Ids of text, no special tokens (for tests and debugging)."""
        return self._backend.encode(text)

    def _encode_prompt(self, prompt: str, max_length: int) -> Tuple[np.ndarray, np.ndarray]:
        ids = [self.bos_id] + self._backend.encode(prompt)
        return pad_or_truncate(ids, max_length, self.pad_id)


def _resolve_tokenizer_file(path: Path) -> Path:
    looked_for = f'{SENTENCEPIECE_FILE} or {HF_TOKENIZER_FILE}'
    if path.is_dir():
        # tokenizer.model first: it is the file openpi and PaliGemma ship.
        for name in (SENTENCEPIECE_FILE, HF_TOKENIZER_FILE):
            if (path / name).is_file():
                return path / name
        raise TokenizerError(f'no tokenizer in directory {path}: looked for {looked_for}')
    if not path.exists():
        raise TokenizerError(f'tokenizer path {path} does not exist: expected a file '
                             f'{looked_for}, or a directory containing one')
    if path.suffix not in ('.model', '.json'):
        raise TokenizerError(f'unknown tokenizer file {path}: expected {looked_for}')
    return path


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f'cannot read tokenizer {path}: {exc}') from exc


def _load_backend(path: Path, data: bytes):
    try:
        if path.suffix == '.model':
            return _SentencePieceBackend(data)
        return _HFTokenizersBackend(data)
    except TokenizerError:
        raise
    except Exception as exc:  # both libraries raise assorted types on bad files
        raise TokenizerError(f'cannot load tokenizer {path}: {exc}') from exc


def _digest(data: bytes) -> str:
    import xxhash
    return xxhash.xxh3_128(data).hexdigest()


# --------------------------------------------------------------------------
# Test tokenizer: a tiny PaliGemma-like SentencePiece model.
# --------------------------------------------------------------------------

_VERBS = ('pick up', 'put', 'place', 'move', 'push', 'pull', 'open', 'close', 'grasp',
          'lift', 'drop', 'stack', 'rotate', 'slide', 'fold', 'wipe', 'pour', 'insert',
          'hang', 'flip', 'turn on', 'turn off', 'unplug', 'sweep', 'carry', 'hand over')
_ADJECTIVES = ('red', 'green', 'blue', 'yellow', 'black', 'white', 'orange', 'purple',
               'small', 'large', 'wooden', 'metal', 'plastic', 'empty', 'striped', 'shiny')
_OBJECTS = ('cube', 'block', 'cup', 'bowl', 'plate', 'sponge', 'towel', 'bottle',
            'drawer', 'lid', 'marker', 'spoon', 'box', 'can', 'banana', 'apple',
            'shirt', 'cable', 'switch', 'kettle', 'basket', 'pen', 'book', 'tray')
_PLACES = ('on the table', 'in the bin', 'into the drawer', 'onto the plate',
           'next to the bowl', 'to the left', 'to the right', 'in the sink',
           'on the shelf', 'inside the box', 'behind the cup', 'near the robot',
           'under the chair', 'beside the laptop', 'in front of the camera')
# Extra words so a unigram model has enough distinct pieces to fill 512 ids.
_SCENE_WORDS = ('kitchen', 'counter', 'cabinet', 'fridge', 'microwave', 'oven', 'stove',
                'faucet', 'window', 'curtain', 'door', 'handle', 'button', 'knob', 'lamp',
                'pillow', 'blanket', 'sock', 'glove', 'hammer', 'screwdriver', 'wrench',
                'tape', 'scissors', 'folder', 'keyboard', 'mouse', 'phone', 'charger',
                'carrot', 'tomato', 'potato', 'onion', 'pepper', 'lemon', 'grape', 'bread',
                'cheese', 'napkin', 'fork', 'knife', 'glass', 'mug', 'teapot', 'pan', 'pot',
                'vase', 'flower', 'plant', 'toy', 'ball', 'doll', 'puzzle', 'domino',
                'triangle', 'circle', 'square', 'cylinder', 'sphere', 'pyramid', 'bucket',
                'ladder', 'helmet', 'jacket', 'wallet', 'candle', 'mirror', 'brush',
                'stapler', 'envelope', 'notebook', 'tablet', 'remote', 'speaker')
_ADVERBS = ('', ' slowly', ' carefully', ' quickly', ' gently', ' with the left gripper',
            ' with the right arm', ' and then stop', ' without spilling')


def _training_corpus() -> Iterator[str]:
    """A fixed, ordered corpus: instructions, pi0.5 prompts and state numbers."""
    combos = itertools.product(_VERBS, _ADJECTIVES, _OBJECTS, _PLACES)
    # A fixed stride walks all four axes without emitting every combination.
    for index, (verb, adjective, obj, place) in enumerate(combos):
        if index % 97 != 0:
            continue
        adverb = _ADVERBS[index % len(_ADVERBS)]
        yield f'{verb} the {adjective} {obj} {place}{adverb}'
        yield f'Task: {verb} the {adjective} {obj} {place}, State: {index % 256} {(index * 7) % 256};'
    for index, word in enumerate(_SCENE_WORDS):
        yield f'the robot sees the {word}, {_ADJECTIVES[index % len(_ADJECTIVES)]} and {word}s'
    for value in range(256):
        yield f'State: {value} {255 - value} {(value * 13) % 256}; Action: '
    yield 'Task: fold_the_towel, State: 0 128 255;'
    yield 'Please, put it back: then stop; done.'


def build_test_tokenizer(out_dir: PathLike, vocab_size: int = 512) -> Path:
    """Train a small deterministic PaliGemma-like SentencePiece model.

    Special ids match PaliGemma (pad 0, eos 1, bos 2, unk 3); byte fallback,
    identity normalisation, no dummy prefix, no whitespace squeezing, split
    digits and '\\n' as a user-defined piece, like Gemma's tokenizer.
    """
    import sentencepiece as spm
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(0)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=_training_corpus(), model_writer=model,
        model_type='unigram', vocab_size=vocab_size,
        pad_id=PALIGEMMA_PAD_ID, eos_id=PALIGEMMA_EOS_ID,
        bos_id=PALIGEMMA_BOS_ID, unk_id=PALIGEMMA_UNK_ID,
        pad_piece='<pad>', eos_piece='<eos>', bos_piece='<bos>', unk_piece='<unk>',
        user_defined_symbols=['\n'], byte_fallback=True, split_digits=True,
        normalization_rule_name='identity', add_dummy_prefix=False,
        remove_extra_whitespaces=False, character_coverage=1.0,
        num_threads=1, minloglevel=2)
    path = out / SENTENCEPIECE_FILE
    path.write_bytes(model.getvalue())
    return path


# --------------------------------------------------------------------------
# tokenizer.model -> tokenizer.json (no transformers, no network needed).
# --------------------------------------------------------------------------

# SentencePiece piece types (sentencepiece_model.proto).
_PIECE_NORMAL, _PIECE_UNKNOWN, _PIECE_CONTROL, _PIECE_USER, _PIECE_UNUSED, _PIECE_BYTE = 1, 2, 3, 4, 5, 6
_MODEL_UNIGRAM = 1


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _proto_fields(data: bytes) -> Iterator[Tuple[int, object]]:
    """(field number, value) pairs of one protobuf message; enough for ModelProto."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise TokenizerError(f'unsupported protobuf wire type {wire}')
        yield field, value


def _parse_sentencepiece_model(data: bytes) -> Dict[str, object]:
    """Pieces, trainer and normalizer settings of a ModelProto (proto2 defaults)."""
    pieces: List[Tuple[str, float, int]] = []
    trainer = {'model_type': _MODEL_UNIGRAM, 'byte_fallback': False}
    normalizer = {'name': '', 'add_dummy_prefix': True,
                  'remove_extra_whitespaces': True, 'escape_whitespaces': True}
    for field, value in _proto_fields(data):
        if field == 1:
            pieces.append(_parse_piece(value))
        elif field == 2:
            for sub, sub_value in _proto_fields(value):
                if sub == 3:
                    trainer['model_type'] = sub_value
                elif sub == 35:
                    trainer['byte_fallback'] = bool(sub_value)
        elif field == 3:
            names = {1: 'name', 3: 'add_dummy_prefix', 4: 'remove_extra_whitespaces',
                     5: 'escape_whitespaces'}
            for sub, sub_value in _proto_fields(value):
                if sub in names:
                    key = names[sub]
                    normalizer[key] = sub_value.decode('utf-8') if key == 'name' else bool(sub_value)
    return {'pieces': pieces, 'trainer': trainer, 'normalizer': normalizer}


def _parse_piece(data: bytes) -> Tuple[str, float, int]:
    piece, score, kind = '', 0.0, _PIECE_NORMAL
    for field, value in _proto_fields(data):
        if field == 1:
            piece = value.decode('utf-8')
        elif field == 2:
            score = struct.unpack('<f', value)[0]
        elif field == 3:
            kind = value
    return piece, score, kind


def _check_exportable(model: Dict[str, object], model_path: Path) -> None:
    trainer, normalizer = model['trainer'], model['normalizer']
    problems = []
    if trainer['model_type'] != _MODEL_UNIGRAM:
        problems.append('model type is not unigram')
    if normalizer['name'] != 'identity':
        problems.append(f"normalizer is {normalizer['name']!r}, not 'identity'")
    if normalizer['add_dummy_prefix'] or normalizer['remove_extra_whitespaces']:
        problems.append('dummy prefix or whitespace squeezing is on')
    if not normalizer['escape_whitespaces']:
        problems.append('whitespace escaping is off')
    if problems:
        raise TokenizerError(f'cannot export {model_path}: ' + '; '.join(problems))


def export_tokenizer_json(model_path: PathLike, out_path: PathLike) -> Path:
    """Write a `tokenizers` tokenizer.json equivalent to a unigram tokenizer.model.

    Supports the settings build_test_tokenizer uses (unigram, identity
    normaliser, no dummy prefix); anything else raises TokenizerError rather
    than writing a tokenizer that would silently give other ids.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    source = Path(model_path)
    model = _parse_sentencepiece_model(_read_bytes(source))
    _check_exportable(model, source)
    pieces = model['pieces']
    unk_ids = [i for i, (_, _, kind) in enumerate(pieces) if kind == _PIECE_UNKNOWN]
    tok = Tokenizer(models.Unigram(
        [(piece, score) for piece, score, _ in pieces],
        unk_ids[0] if unk_ids else None, model['trainer']['byte_fallback']))
    tok.normalizer = normalizers.Replace(' ', '\u2581')
    tok.decoder = decoders.Sequence([decoders.Replace('\u2581', ' '), decoders.ByteFallback(),
                                     decoders.Fuse()])
    # Control pieces are special (never read from text); user-defined pieces are
    # cut out of the text first, as sentencepiece does.
    tok.add_special_tokens([AddedToken(piece, special=True, normalized=False)
                            for piece, _, kind in pieces if kind in (_PIECE_CONTROL, _PIECE_UNKNOWN)])
    tok.add_tokens([AddedToken(piece, special=False, normalized=False)
                    for piece, _, kind in pieces if kind == _PIECE_USER])
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out
