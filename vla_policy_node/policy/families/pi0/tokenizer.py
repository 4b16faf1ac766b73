"""The PaliGemma tokenizer of pi0 and pi0.5, with lerobot's prompt formats.

Prompt formats follow lerobot's processors (checked against huggingface/lerobot):

* pi0, ``src/lerobot/policies/pi0/processor_pi0.py``: ``Pi0NewLineProcessor``
  appends ``"\\n"`` to the task unless it already ends with one; the text is
  not otherwise cleaned. ``TokenizerProcessorStep`` then runs the HF PaliGemma
  tokenizer (``google/paligemma-3b-pt-224``: adds BOS, no EOS), right padded
  to ``max_length`` and truncated. Ids: ``BOS + encode(task + "\\n")``.
* pi0.5, ``src/lerobot/policies/pi05/processor_pi05.py`` at lerobot
  7427f318: ``Pi05PrepareStateTokenizerProcessorStep`` bins the normalized
  state at its own dimension (``state_dim`` numbers, no padding) with
  ``np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1`` (no clipping, so a
  value below -1 gives bin -1 and above 1 gives 255), cleans the task with
  ``strip().replace("_", " ").replace("\\n", " ")`` (no capitalisation or
  punctuation change) and writes
  ``f"Task: {cleaned}, State: {' '.join(bins)};\\nAction: "``, which the same
  PaliGemma tokenizer step encodes with BOS.

openpi's ``src/openpi/models/tokenizer.py`` writes the same pi0.5 string from
the same unpadded state; for pi0 it cleans the text and encodes ``"\\n"``
separately, which gives the same ids as lerobot only for already clean
instructions.

The legacy pi0.5 prompt: lerobot from "Add OpenPi, Pi0 and Pi0.5" (#1910,
``abde7be3``, 2025-10-02) until "remove state padding before tokenization"
(``aca4348b``, landed with the transformers v5 bump #2964, ``f0d2b37b``,
2026-03-05) zero-padded the normalized state to ``max_state_dim`` (32) before
binning, so its prompts carry a ``128`` for every padded dimension.
Checkpoints fine-tuned with those releases expect that prompt; ``pad_state_to``
reproduces it, and only when asked for (the runtime's
``pi05_padded_state_prompt``).

Both backends (``sentencepiece`` for ``tokenizer.model``, ``tokenizers`` for
``tokenizer.json``) are driven the same way: encode the prompt without special
tokens, then prepend BOS ourselves, so one tokenizer gives one id sequence.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from ...tokenizer import (HF_TOKENIZER_FILE, SENTENCEPIECE_FILE, PathLike, TokenizerError, _digest,  # noqa: F401
                          _read_bytes, pad_or_truncate, require_str as _require_str)
from ...tokenizer import newline_terminated as format_pi0_prompt  # noqa: F401  (pi0's prompt: the newline rule)

# 256 bins over [-1, 1]: the left edges of np.linspace(-1, 1, 257).
STATE_BIN_COUNT = 256
_STATE_BIN_EDGES = np.linspace(-1.0, 1.0, STATE_BIN_COUNT + 1)[:-1]

# PaliGemma's special ids, reproduced by the test tokenizer.
PALIGEMMA_PAD_ID = 0
PALIGEMMA_EOS_ID = 1
PALIGEMMA_BOS_ID = 2
PALIGEMMA_UNK_ID = 3


# --------------------------------------------------------------------------
# Prompt formats (pure string functions, so tests can check them directly).
# --------------------------------------------------------------------------

def clean_task_text(text: str) -> str:
    """pi0.5's task cleaning: strip, underscores and newlines to spaces."""
    return text.strip().replace('_', ' ').replace('\n', ' ')


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

        ``normalized_state`` is binned as given (current lerobot and openpi).
        ``pad_state_to=max_state_dim`` zero-pads it first: the legacy prompt of
        lerobot releases between 2025-10-02 and 2026-03-05 (module docstring).
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


def _load_backend(path: Path, data: bytes):
    try:
        if path.suffix == '.model':
            return _SentencePieceBackend(data)
        return _HFTokenizersBackend(data)
    except TokenizerError:
        raise
    except Exception as exc:  # both libraries raise assorted types on bad files
        raise TokenizerError(f'cannot load tokenizer {path}: {exc}') from exc
