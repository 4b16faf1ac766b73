"""A tiny Qwen3-VL-style tokenizer folder, trained deterministically, for random-weight GR00T checkpoints.

Real GR00T N1.7 checkpoints take Cosmos-Reason2-2B's tokenizer (a gated repository: the user passes its folder as
``tokenizer_path``). The tiny ones (tests, benchmarks, ``vla_policy_make_checkpoint --type groot``) need one
without a download, shaped like Qwen's so lerobot's own ``AutoTokenizer`` / ``Qwen3VLProcessor`` read the same
folder: byte-level BPE behind Qwen2's split regex and NFC, no BOS/EOS template, and Qwen's special tokens at
their real ids 151643-151656 (``<|image_pad|>`` 151655, ``<|vision_start|>`` 151652, ...), the ids the backbone
config names. The folder holds what a Qwen3-VL processor folder holds:

    tokenizer.json            the tokenizer (ids 0..vocab_size-1 trained, the special tokens at 151643+)
    tokenizer_config.json     Qwen2Tokenizer, the special tokens, the chat template (chat_template.py)
    preprocessor_config.json  the Qwen2-VL image processor: patch 16, merge 2, temporal 2, mean/std 0.5
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ...tiny_corpus import training_corpus
from ...tokenizer import HF_TOKENIZER_FILE, PathLike
from .chat_template import QWEN3_VL_CHAT_TEMPLATE

# Qwen2/Qwen3's special tokens and ids (Qwen/Qwen3-VL-2B-Instruct tokenizer_config.json added_tokens_decoder).
QWEN_SPECIAL_TOKENS: Tuple[Tuple[str, int], ...] = (
    ('<|endoftext|>', 151643), ('<|im_start|>', 151644), ('<|im_end|>', 151645), ('<|object_ref_start|>', 151646),
    ('<|object_ref_end|>', 151647), ('<|box_start|>', 151648), ('<|box_end|>', 151649), ('<|quad_start|>', 151650),
    ('<|quad_end|>', 151651), ('<|vision_start|>', 151652), ('<|vision_end|>', 151653), ('<|vision_pad|>', 151654),
    ('<|image_pad|>', 151655), ('<|video_pad|>', 151656),
)
# Qwen2's pre-tokenizer split pattern (tokenizer.json of every Qwen2/2.5/3 tokenizer).
QWEN_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                      r"\s*[\r\n]+|\s+(?!\S)|\s+")
PREPROCESSOR_CONFIG_FILE = 'preprocessor_config.json'
TOKENIZER_CONFIG_FILE = 'tokenizer_config.json'


def qwen_image_processor_config(patch_size: int = 16, merge_size: int = 2, temporal_patch_size: int = 2,
                                min_pixels: int = 1024, max_pixels: int = 16777216) -> Dict[str, Any]:
    """preprocessor_config.json of a Qwen3-VL checkpoint: Qwen/Qwen3-VL-2B-Instruct's values (patch 16, merge 2,
    temporal 2, mean/std 0.5, longest_edge 16777216 pixels) but shortest_edge 1024 (Qwen's 65536 would upscale the
    tiny checkpoints' 64 x 64 frames; at 256 x 256 both leave the frame as it is)."""
    return {'image_processor_type': 'Qwen2VLImageProcessor', 'processor_class': 'Qwen3VLProcessor',
            'do_resize': True, 'resample': 3, 'do_rescale': True, 'rescale_factor': 1 / 255, 'do_normalize': True,
            'image_mean': [0.5, 0.5, 0.5], 'image_std': [0.5, 0.5, 0.5], 'do_convert_rgb': True,
            'size': {'shortest_edge': min_pixels, 'longest_edge': max_pixels},
            'patch_size': patch_size, 'temporal_patch_size': temporal_patch_size, 'merge_size': merge_size}


def build_qwen_test_tokenizer(out_dir: PathLike, vocab_size: int = 512,
                              image_processor: Optional[Dict[str, Any]] = None) -> Path:
    """``out_dir`` with tokenizer.json, tokenizer_config.json and preprocessor_config.json; returns tokenizer.json.

    ``vocab_size``: the trained ids (below Qwen's special ids; the model's embedding must still cover 151657 rows).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior='isolated', invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([line + '\n' for line in training_corpus()], trainer=trainer)
    # The special tokens go in at Qwen's ids, past the trained vocabulary (the ids between stay unused): in the
    # model's vocabulary (which keeps the ids it is given) and as added tokens (which would renumber them alone).
    document = json.loads(tokenizer.to_str())
    document['model']['vocab'].update({token: token_id for token, token_id in QWEN_SPECIAL_TOKENS})
    document['added_tokens'] = [{'id': token_id, 'content': token, 'single_word': False, 'lstrip': False,
                                 'rstrip': False, 'normalized': False, 'special': True}
                                for token, token_id in QWEN_SPECIAL_TOKENS]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / HF_TOKENIZER_FILE
    path.write_text(json.dumps(document, ensure_ascii=False))
    added = {str(token_id): {'content': token, 'lstrip': False, 'normalized': False, 'rstrip': False,
                             'single_word': False, 'special': True} for token, token_id in QWEN_SPECIAL_TOKENS}
    (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps({
        'tokenizer_class': 'Qwen2Tokenizer', 'add_bos_token': False, 'add_prefix_space': False,
        'added_tokens_decoder': added, 'bos_token': None, 'eos_token': '<|im_end|>', 'pad_token': '<|endoftext|>',
        'unk_token': None, 'errors': 'replace', 'split_special_tokens': False, 'model_max_length': 262144,
        'clean_up_tokenization_spaces': False, 'chat_template': QWEN3_VL_CHAT_TEMPLATE}, indent=2))
    (out / PREPROCESSOR_CONFIG_FILE).write_text(json.dumps(image_processor or qwen_image_processor_config(), indent=2))
    return path
