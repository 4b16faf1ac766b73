"""pi0.5's prompt: the task and the normalised state, binned, as text for pi0's PaliGemma tokenizer.

lerobot ``src/lerobot/policies/pi05/processor_pi05.py`` at 7427f318:
``Pi05PrepareStateTokenizerProcessorStep`` bins the normalized state at its own dimension (``state_dim``
numbers, no padding) with ``np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1`` (no clipping, so a value
below -1 gives bin -1 and above 1 gives 255), cleans the task with
``strip().replace("_", " ").replace("\\n", " ")`` (no capitalisation or punctuation change) and writes
``f"Task: {cleaned}, State: {' '.join(bins)};\\nAction: "``, which the PaliGemma tokenizer step encodes with
BOS (families/pi0/tokenizer.py ``PromptTokenizer.encode_prompt``). openpi's ``src/openpi/models/tokenizer.py``
writes the same string from the same unpadded state.

The legacy prompt: lerobot from "Add OpenPi, Pi0 and Pi0.5" (#1910, ``abde7be3``, 2025-10-02) until "remove
state padding before tokenization" (``aca4348b``, landed with the transformers v5 bump #2964, ``f0d2b37b``,
2026-03-05) zero-padded the normalized state to ``max_state_dim`` (32) before binning, so its prompts carry a
``128`` for every padded dimension. Checkpoints fine-tuned with those releases expect that prompt;
``pad_state_to`` reproduces it, and only when asked for (the family option ``pi05_padded_state_prompt``).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ...tokenizer import TokenizerError, require_str

# 256 bins over [-1, 1]: the left edges of np.linspace(-1, 1, 257).
STATE_BIN_COUNT = 256
_STATE_BIN_EDGES = np.linspace(-1.0, 1.0, STATE_BIN_COUNT + 1)[:-1]


def clean_task_text(text: str) -> str:
    """pi0.5's task cleaning: strip, underscores and newlines to spaces."""
    return text.strip().replace('_', ' ').replace('\n', ' ')


def discretize_state(normalized_state: np.ndarray, pad_state_to: Optional[int] = None) -> np.ndarray:
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


def format_pi05_prompt(instruction: str, normalized_state: np.ndarray, pad_state_to: Optional[int] = None) -> str:
    """pi0.5: 'Task: {cleaned}, State: {bins};\\nAction: ' (lerobot processor_pi05)."""
    require_str(instruction)
    bins = discretize_state(normalized_state, pad_state_to)
    state_text = ' '.join(str(int(b)) for b in bins)
    return f'Task: {clean_task_text(instruction)}, State: {state_text};\nAction: '


def encode_pi05(tokenizer: Any, instruction: str, normalized_state: np.ndarray, max_length: int,
                *, pad_state_to: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, mask) for a pi0.5 prompt with the state binned into the text, through ``tokenizer`` (pi0's
    PromptTokenizer). ``normalized_state`` is binned as given (current lerobot and openpi);
    ``pad_state_to=max_state_dim`` zero-pads it first: the legacy prompt (module docstring)."""
    return tokenizer.encode_prompt(format_pi05_prompt(instruction, normalized_state, pad_state_to), max_length)


def _zero_pad(state: np.ndarray, pad_state_to: Optional[int]) -> np.ndarray:
    # Like lerobot's pad_vector: only ever grows the vector, never cuts it.
    if pad_state_to is None or state.shape[0] >= pad_state_to:
        return state
    padded = np.zeros(pad_state_to, dtype=state.dtype)
    padded[:state.shape[0]] = state
    return padded
