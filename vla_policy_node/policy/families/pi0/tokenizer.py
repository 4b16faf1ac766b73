"""The PaliGemma tokenizer of pi0 (and of pi0.5, built on it), with pi0's prompt format.

Prompt format follows lerobot's processor (checked against huggingface/lerobot):
``src/lerobot/policies/pi0/processor_pi0.py``: ``Pi0NewLineProcessor`` appends
``"\\n"`` to the task unless it already ends with one; the text is not
otherwise cleaned. ``TokenizerProcessorStep`` then runs the HF PaliGemma
tokenizer (``google/paligemma-3b-pt-224``: adds BOS, no EOS), right padded to
``max_length`` and truncated. Ids: ``BOS + encode(task + "\\n")``. openpi's
``src/openpi/models/tokenizer.py`` cleans the text and encodes ``"\\n"``
separately, which gives the same ids as lerobot only for already clean
instructions. pi0.5's prompt (the state binned into it) is
``families/pi05/tokenizer.py``, through ``encode_prompt``.

Both backends (``sentencepiece`` for ``tokenizer.model``, ``tokenizers`` for
``tokenizer.json``) are driven the same way: encode the prompt without special
tokens, then prepend BOS ourselves, so one tokenizer gives one id sequence.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

import numpy as np

from ...tokenizer import (HF_TOKENIZER_FILE, SENTENCEPIECE_FILE, PathLike, TokenizerError, _digest,  # noqa: F401
                          _read_bytes, pad_or_truncate)
from ...tokenizer import newline_terminated as format_pi0_prompt  # noqa: F401  (pi0's prompt: the newline rule)

# PaliGemma's special ids, reproduced by the test tokenizer.
PALIGEMMA_PAD_ID = 0
PALIGEMMA_EOS_ID = 1
PALIGEMMA_BOS_ID = 2
PALIGEMMA_UNK_ID = 3


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
    """The PaliGemma tokenizer: pi0's prompt (``encode_pi0``) and any prompt text (``encode_prompt``)."""

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
        return self.encode_prompt(format_pi0_prompt(instruction), max_length)

    def encode_text(self, text: str) -> List[int]:
        """Ids of text, no special tokens (for tests and debugging)."""
        return self._backend.encode(text)

    def encode_prompt(self, prompt: str, max_length: int) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int64 [max_length], mask bool [max_length]): BOS + the prompt's ids, right padded or truncated."""
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


def _load_backend(path: Path, data: bytes):
    try:
        if path.suffix == '.model':
            return _SentencePieceBackend(data)
        return _HFTokenizersBackend(data)
    except TokenizerError:
        raise
    except Exception as exc:  # both libraries raise assorted types on bad files
        raise TokenizerError(f'cannot load tokenizer {path}: {exc}') from exc
