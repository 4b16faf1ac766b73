"""A chat template with Qwen3-VL's structure, for the tiny test tokenizers (tiny_tokenizer.py).

GR00T N1.7 renders its prompt with the chat template of ``nvidia/Cosmos-Reason2-2B`` (lerobot
``policies/groot/processor_groot.py`` _build_n1_7_processor: ``chat_template=tokenizer.chat_template``). That
repository is gated, so its exact text could not be checked here; real checkpoints use the template in the folder
the user passes (``tokenizer_path``), never this one. This template renders what Qwen3-VL's does for GR00T's one
user message (every image, then the text): ``<|im_start|>user\\n``, per image
``<|vision_start|><|image_pad|><|vision_end|>``, the text, ``<|im_end|>\\n``; a system message first when
one is given, no default system prompt, and ``<|im_start|>assistant\\n`` only under ``add_generation_prompt``.
"""
from __future__ import annotations

QWEN3_VL_CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'image' or 'image' in part or 'image_url' in part -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part.type == 'video' or 'video' in part -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in part -%}{{- part.text -}}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}{{- render(message.content) -}}{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
