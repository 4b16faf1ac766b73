"""SmolVLA's prompt: SmolVLM2's tokenizer.json, lerobot's processor steps.

lerobot ``processor_smolvla.py`` (7427f318): ``NewLineTaskProcessorStep`` appends "\\n" unless the task ends
with one, then ``TokenizerProcessorStep(tokenizer_name=vlm_model_name, padding=pad_language_to,
padding_side="right", max_length=tokenizer_max_length, truncation=True)``. SmolVLM2's tokenizer adds no BOS or
EOS (its post-processor is plain ByteLevel) and pads with ``<|im_end|>``. The processor saves the tokenizer into
the checkpoint's ``tokenizer/`` folder.

Padding: lerobot pads to the longest prompt of the batch ("longest", one prompt: no padding) or to
``tokenizer_max_length`` ("max_length"). Here every prompt is padded to ``tokenizer_max_length`` with masked
``<|im_end|>`` tokens: masked tokens take no position (cumsum of the mask) and nothing attends to them, so the
actions are lerobot's either way and every prefix has one shape.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple, Union

import numpy as np

from ...tokenizer import (HF_TOKENIZER_FILE, TokenizerError, _digest, _read_bytes, load_hf_tokenizer,
                          newline_terminated, pad_or_truncate)

PAD_TOKEN = '<|im_end|>'


class SmolVLMTokenizer:
    """tokenizer.json through ``tokenizers`` (as transformers' fast tokenizer runs it)."""

    def __init__(self, json_bytes: bytes, source: Path) -> None:
        self._tok, self.pad_id = load_hf_tokenizer(json_bytes, source, PAD_TOKEN, 'SmolVLM2 pads with it')
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.identity = _digest(json_bytes)
        self.source = source

    @classmethod
    def from_path(cls, path: Union[str, Path]) -> 'SmolVLMTokenizer':
        """A tokenizer.json, or a folder holding one."""
        path = Path(path)
        file_path = path / HF_TOKENIZER_FILE if path.is_dir() else path
        if not file_path.is_file():
            raise TokenizerError(f'no SmolVLM tokenizer at {file_path}: expected a {HF_TOKENIZER_FILE} (SmolVLM2\'s, '
                                 'as lerobot saves it in tokenizer/)')
        return cls(_read_bytes(file_path), file_path)

    def encode_text(self, text: str) -> List[int]:
        """Ids with the tokenizer's own special-token template (none for SmolVLM2)."""
        return list(self._tok.encode(text).ids)

    def encode_task(self, instruction: str, max_length: int) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int64 [max_length], mask bool [max_length]): task + "\\n", truncated, right padded."""
        return pad_or_truncate(self.encode_text(newline_terminated(instruction)), max_length, self.pad_id)
