"""A tiny SmolVLM2-style tokenizer.json (byte-level BPE), trained deterministically, for random-weight checkpoints.

Real SmolVLA checkpoints carry SmolVLM2's tokenizer in ``tokenizer/``; the tiny ones (``vla_policy_make_checkpoint
--type smolvla``, tests, benchmarks) need one without a download. Like SmolVLM2's: the special tokens come first
with its ids (``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2 = the pad), no BOS/EOS template.
"""
from __future__ import annotations

import json
from pathlib import Path

from ...tiny_corpus import training_corpus
from ...tokenizer import HF_TOKENIZER_FILE, PathLike

SPECIAL_TOKENS = ('<|endoftext|>', '<|im_start|>', '<|im_end|>', '<fake_token_around_image>', '<global-img>',
                  '<image>', '<end_of_utterance>')


def build_smolvlm_test_tokenizer(out_dir: PathLike, vocab_size: int = 512) -> Path:
    """``out_dir/tokenizer.json`` (+ the tokenizer_config.json transformers' save_pretrained writes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([line + '\n' for line in training_corpus()], trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / HF_TOKENIZER_FILE
    tokenizer.save(str(path))
    (out / 'tokenizer_config.json').write_text(json.dumps({
        'tokenizer_class': 'GPT2Tokenizer', 'add_bos_token': False, 'add_eos_token': False,
        'bos_token': '<|im_start|>', 'eos_token': '<end_of_utterance>', 'pad_token': '<|im_end|>',
        'unk_token': '<|endoftext|>'}, indent=2))
    return path
