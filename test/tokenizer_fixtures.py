"""Test-only tokenizer tools: export the tiny SentencePiece model as a `tokenizers` tokenizer.json.

Lets the tests drive the ``tokenizer.json`` backend with the same vocabulary
as the ``tokenizer.model`` one, without transformers or a download.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from vla_policy_node.policy.tokenizer import PathLike, TokenizerError, _read_bytes

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

    Supports the settings build_test_tokenizer (policy/families/pi0/tiny_tokenizer.py) uses (unigram, identity
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
