"""The embedded default's tokenizer: a tiny PaliGemma-like SentencePiece model, trained deterministically.

``builtin:tiny`` and the test checkpoints need a real ``tokenizer.model`` and no download is possible, so one
is trained from the fixed corpus of ``policy/tiny_corpus.py``. Real checkpoints bring PaliGemma's tokenizer.
"""
from __future__ import annotations

import io
from pathlib import Path

from ...tiny_corpus import training_corpus
from .tokenizer import (PALIGEMMA_BOS_ID, PALIGEMMA_EOS_ID, PALIGEMMA_PAD_ID, PALIGEMMA_UNK_ID, SENTENCEPIECE_FILE,
                        PathLike)


def build_test_tokenizer(out_dir: PathLike, vocab_size: int = 512) -> Path:
    """Train a small deterministic PaliGemma-like SentencePiece model.

    Special ids match PaliGemma (pad 0, eos 1, bos 2, unk 3); byte fallback,
    identity normalisation, no dummy prefix, no whitespace squeezing, split
    digits and '\\n' as a user-defined piece, like Gemma's tokenizer.
    """
    import sentencepiece as spm
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(0)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=training_corpus(), model_writer=model,
        model_type='unigram', vocab_size=vocab_size,
        pad_id=PALIGEMMA_PAD_ID, eos_id=PALIGEMMA_EOS_ID,
        bos_id=PALIGEMMA_BOS_ID, unk_id=PALIGEMMA_UNK_ID,
        pad_piece='<pad>', eos_piece='<eos>', bos_piece='<bos>', unk_piece='<unk>',
        user_defined_symbols=['\n'], byte_fallback=True, split_digits=True,
        normalization_rule_name='identity', add_dummy_prefix=False,
        remove_extra_whitespaces=False, character_coverage=1.0,
        num_threads=1, minloglevel=2)
    path = out / SENTENCEPIECE_FILE
    path.write_bytes(model.getvalue())
    return path
