"""GR00T N1.7's prompt: the backbone's chat template rendered with jinja2, tokenised with ``tokenizers``.

lerobot ``policies/groot/processor_groot.py`` (7427f318) GrootN17VLMEncodeStep: one user message per observation
holding every frame (time-major, then the checkpoint's camera order) and then the task text, rendered with
``apply_chat_template(tokenize=False, add_generation_prompt=False)`` and encoded by ``Qwen3VLProcessor`` with
padding (one prompt: none). The pack step before it formalises the task (lowercase; letters, digits, whitespace and
``_`` kept) unless the checkpoint turns that off, and uses "Perform the task." for an empty one
(``utils.prepare_n1_7_language_batch``).

transformers 5.5.4 renders a template in a jinja2 ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with ``raise_exception``, ``strftime_now`` and a ``tojson`` filter, given ``messages``,
``tools=None``, ``documents=None``, ``add_generation_prompt`` and the tokenizer's special tokens
(``utils/chat_template_utils.py``, ``processing_utils.py`` apply_chat_template); the same here. Qwen3VLProcessor then
replaces every ``<|image_pad|>`` with grid_t * grid_h * grid_w / merge^2 of them and tokenises; expanding the one
image id into that many ids after tokenising is the same (a special token is split off before BPE).

The folder (``tokenizer_path``, or the pre-processor's ``model_name`` when it is a folder on disk) is what a Qwen3-VL
checkpoint ships: tokenizer.json, tokenizer_config.json (its ``chat_template``, or chat_template.jinja / .json
beside it) and preprocessor_config.json (the image processor; read by the config, folder.py).
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ....observation import ObservationError, SkipReason
from ...tokenizer import HF_TOKENIZER_FILE, TokenizerError, _digest, _read_bytes, load_hf_tokenizer
from .tiny_tokenizer import TOKENIZER_CONFIG_FILE

DEFAULT_TASK = 'Perform the task.'
IMAGE_PAD = '<|image_pad|>'
# The id a prompt is right-padded with (Qwen's <|endoftext|>, its pad token): masked, never embedded.
PROMPT_PAD_ID = 151643
CHAT_TEMPLATE_FILES = ('chat_template.jinja', 'chat_template.json')


def formalize(task: str) -> str:
    """utils.prepare_n1_7_language_batch with formalize_language: lowercase, keep alnum / whitespace / ``_``."""
    text = task.lower()
    return ''.join(ch for ch in text if ch.isalnum() or ch.isspace() or ch == '_')


def _compile(template: str, source: Path) -> Any:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters['tojson'] = tojson
    environment.globals['raise_exception'] = raise_exception
    environment.globals['strftime_now'] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return environment.from_string(template)
    except jinja2.exceptions.TemplateError as exc:
        raise TokenizerError(f'the chat template of {source} does not compile: {exc}') from exc


def _special_token(value: Any) -> Optional[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get('content'), str):
        return value['content']
    return None


class QwenChatTokenizer:
    """A Qwen3-VL tokenizer folder: ``tokenizers`` for the ids, jinja2 for the chat template."""

    def __init__(self, folder: Path, json_bytes: bytes, tokenizer_config: Dict[str, Any], template: str) -> None:
        self._tok, self.image_token_id = load_hf_tokenizer(json_bytes, folder / HF_TOKENIZER_FILE, IMAGE_PAD,
                                                           'a Qwen3-VL tokenizer has it')
        self.folder = folder
        self._template = _compile(template, folder)
        # The special tokens transformers hands the template (tokenizer.special_tokens_map).
        self._template_tokens = {name: token for name in ('bos_token', 'eos_token', 'unk_token', 'pad_token')
                                 for token in [_special_token(tokenizer_config.get(name))] if token is not None}
        added = json.loads(json_bytes.decode('utf-8')).get('added_tokens') or []
        self._special = [entry['content'] for entry in added if entry.get('special') and 'content' in entry]
        self.vocab_size = int(max(self._tok.get_vocab(with_added_tokens=True).values()) + 1)
        self.identity = _digest(json_bytes + b'\0' + template.encode('utf-8'))

    @classmethod
    def from_path(cls, path: Union[str, Path]) -> 'QwenChatTokenizer':
        """A Qwen3-VL tokenizer folder, or its tokenizer.json (the folder around it is read)."""
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        file_path = folder / HF_TOKENIZER_FILE
        if not file_path.is_file():
            raise TokenizerError(f'no {HF_TOKENIZER_FILE} in {folder}: GR00T N1.7 needs its backbone\'s tokenizer '
                                 'folder (tokenizer.json, tokenizer_config.json with the chat template, '
                                 'preprocessor_config.json)')
        config_path = folder / TOKENIZER_CONFIG_FILE
        try:
            tokenizer_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        except json.JSONDecodeError as exc:
            raise TokenizerError(f'{config_path} is not valid JSON: {exc}') from exc
        template = tokenizer_config.get('chat_template')
        for name in CHAT_TEMPLATE_FILES:
            candidate = folder / name
            if template is None and candidate.is_file():
                text = candidate.read_text()
                template = json.loads(text).get('chat_template') if name.endswith('.json') else text
        if isinstance(template, list):                      # named templates: transformers takes "default"
            template = next((entry.get('template') for entry in template if entry.get('name') == 'default'), None)
        if not isinstance(template, str) or not template:
            raise TokenizerError(f'{folder} has no chat template ({TOKENIZER_CONFIG_FILE} "chat_template" or '
                                 f'{" / ".join(CHAT_TEMPLATE_FILES)}): GR00T renders its prompt with it')
        return cls(folder, _read_bytes(file_path), tokenizer_config, template)

    def render(self, task: str, images: int) -> str:
        """The chat template over one user message: ``images`` image parts, then the task text."""
        content: List[Dict[str, Any]] = [{'type': 'image'} for _ in range(images)]
        content.append({'type': 'text', 'text': task})
        return self._template.render(messages=[{'role': 'user', 'content': content}], tools=None, documents=None,
                                     add_generation_prompt=False, **self._template_tokens)

    def encode_prompt(self, task: str, images: int, tokens_per_image: int, formalize_language: bool,
                      max_length: int) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int64 [L], mask bool [L], all True): the rendered prompt with each image token expanded to
        ``tokens_per_image``; an ObservationError when it exceeds ``max_length`` (lerobot never truncates)."""
        task = task or DEFAULT_TASK
        if formalize_language:
            task = formalize(task)
        elif any(token in task for token in self._special):
            # Unformalised text would reach the tokenizer's special tokens (an image token among the text).
            raise ObservationError('instruction', 'contains a special token of the tokenizer', SkipReason.BAD_INPUT)
        ids = self._tok.encode(self.render(task, images), add_special_tokens=True).ids
        found = sum(1 for token in ids if token == self.image_token_id)
        if found != images:
            raise TokenizerError(f'the chat template of {self.folder} renders {found} {IMAGE_PAD} tokens for '
                                 f'{images} images')
        expanded = expand_image_tokens(ids, self.image_token_id, tokens_per_image)
        if len(expanded) > max_length:
            raise ObservationError('instruction', f'the prompt is {len(expanded)} tokens, more than the '
                                   f'{max_length} this policy takes', SkipReason.INSTRUCTION_TOO_LONG)
        return np.asarray(expanded, dtype=np.int64), np.ones(len(expanded), dtype=bool)


def expand_image_tokens(ids: Sequence[int], image_token_id: int, count: int) -> List[int]:
    out: List[int] = []
    for token in ids:
        out.extend([token] * count if token == image_token_id else [token])
    return out
