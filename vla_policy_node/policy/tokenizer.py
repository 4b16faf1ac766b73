"""What every family's tokenizer shares: the error, the file names, the newline rule, padding, reading a file.

The tokenizers themselves belong to their families (``families/pi0/tokenizer.py``: PaliGemma's, with the
pi0 and pi0.5 prompt formats; ``families/smolvla/tokenizer.py``: SmolVLM2's). Each family names its
tokenizer class (``PolicyFamily.tokenizer_class``) and where to get the file (``tokenizer_source``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence, Tuple, Union

import numpy as np

PathLike = Union[str, os.PathLike]

SENTENCEPIECE_FILE = 'tokenizer.model'
HF_TOKENIZER_FILE = 'tokenizer.json'


class TokenizerError(ValueError):
    """A tokenizer that cannot be found, read or used, or a bad prompt input."""


def require_str(instruction: object) -> None:
    if not isinstance(instruction, str):
        raise TokenizerError(f'instruction must be a str, got {type(instruction).__name__}')


def newline_terminated(instruction: str) -> str:
    """The task as given, ending in one '\\n' (lerobot's Pi0NewLineProcessor, processor_pi0.py, and
    NewLineTaskProcessorStep, processor_smolvla.py: the same rule); the text is not otherwise cleaned."""
    require_str(instruction)
    return instruction if instruction.endswith('\n') else instruction + '\n'


def pad_or_truncate(ids: Sequence[int], max_length: int, pad_id: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Right pad (mask False) or cut the tail (mask all True) to max_length."""
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise TokenizerError(f'max_length must be a positive int, got {max_length!r}')
    kept = list(ids)[:max_length]
    token_ids = np.full(max_length, pad_id, dtype=np.int64)
    token_ids[:len(kept)] = kept
    mask = np.zeros(max_length, dtype=bool)
    mask[:len(kept)] = True
    return token_ids, mask


def load_hf_tokenizer(json_bytes: bytes, source: Path, required_token: str, why: str) -> Tuple[Any, int]:
    """A tokenizer.json through ``tokenizers`` (as transformers' fast tokenizer runs it), and the id of the token
    the family cannot work without (``why`` says what it is for, in the error when the file lacks it)."""
    from tokenizers import Tokenizer
    try:
        tokenizer = Tokenizer.from_str(json_bytes.decode('utf-8'))
    except Exception as exc:  # tokenizers raises its own exception types for bad files
        raise TokenizerError(f'cannot load tokenizer {source}: {exc}') from exc
    token_id = tokenizer.token_to_id(required_token)
    if token_id is None:
        raise TokenizerError(f'tokenizer {source} has no {required_token} token ({why})')
    return tokenizer, int(token_id)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f'cannot read tokenizer {path}: {exc}') from exc


def _digest(data: bytes) -> str:
    """The tokenizer's identity in the prefix-cache key: xxh3-128 of the file's bytes."""
    import xxhash
    return xxhash.xxh3_128(data).hexdigest()
