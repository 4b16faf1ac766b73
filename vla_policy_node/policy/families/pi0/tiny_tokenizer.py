"""The embedded default's tokenizer: a tiny PaliGemma-like SentencePiece model, trained deterministically.

``builtin:tiny`` and the test checkpoints need a real ``tokenizer.model`` and
no download is possible, so one is trained from a fixed corpus. Only the
embedded default uses this; real checkpoints bring PaliGemma's tokenizer.
"""
from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Iterator

from .tokenizer import (PALIGEMMA_BOS_ID, PALIGEMMA_EOS_ID, PALIGEMMA_PAD_ID, PALIGEMMA_UNK_ID, SENTENCEPIECE_FILE,
                        PathLike)

# --------------------------------------------------------------------------

_VERBS = ('pick up', 'put', 'place', 'move', 'push', 'pull', 'open', 'close', 'grasp',
          'lift', 'drop', 'stack', 'rotate', 'slide', 'fold', 'wipe', 'pour', 'insert',
          'hang', 'flip', 'turn on', 'turn off', 'unplug', 'sweep', 'carry', 'hand over')
_ADJECTIVES = ('red', 'green', 'blue', 'yellow', 'black', 'white', 'orange', 'purple',
               'small', 'large', 'wooden', 'metal', 'plastic', 'empty', 'striped', 'shiny')
_OBJECTS = ('cube', 'block', 'cup', 'bowl', 'plate', 'sponge', 'towel', 'bottle',
            'drawer', 'lid', 'marker', 'spoon', 'box', 'can', 'banana', 'apple',
            'shirt', 'cable', 'switch', 'kettle', 'basket', 'pen', 'book', 'tray')
_PLACES = ('on the table', 'in the bin', 'into the drawer', 'onto the plate',
           'next to the bowl', 'to the left', 'to the right', 'in the sink',
           'on the shelf', 'inside the box', 'behind the cup', 'near the robot',
           'under the chair', 'beside the laptop', 'in front of the camera')
# Extra words so a unigram model has enough distinct pieces to fill 512 ids.
_SCENE_WORDS = ('kitchen', 'counter', 'cabinet', 'fridge', 'microwave', 'oven', 'stove',
                'faucet', 'window', 'curtain', 'door', 'handle', 'button', 'knob', 'lamp',
                'pillow', 'blanket', 'sock', 'glove', 'hammer', 'screwdriver', 'wrench',
                'tape', 'scissors', 'folder', 'keyboard', 'mouse', 'phone', 'charger',
                'carrot', 'tomato', 'potato', 'onion', 'pepper', 'lemon', 'grape', 'bread',
                'cheese', 'napkin', 'fork', 'knife', 'glass', 'mug', 'teapot', 'pan', 'pot',
                'vase', 'flower', 'plant', 'toy', 'ball', 'doll', 'puzzle', 'domino',
                'triangle', 'circle', 'square', 'cylinder', 'sphere', 'pyramid', 'bucket',
                'ladder', 'helmet', 'jacket', 'wallet', 'candle', 'mirror', 'brush',
                'stapler', 'envelope', 'notebook', 'tablet', 'remote', 'speaker')
_ADVERBS = ('', ' slowly', ' carefully', ' quickly', ' gently', ' with the left gripper',
            ' with the right arm', ' and then stop', ' without spilling')


def _training_corpus() -> Iterator[str]:
    """A fixed, ordered corpus: instructions, pi0.5 prompts and state numbers."""
    combos = itertools.product(_VERBS, _ADJECTIVES, _OBJECTS, _PLACES)
    # A fixed stride walks all four axes without emitting every combination.
    for index, (verb, adjective, obj, place) in enumerate(combos):
        if index % 97 != 0:
            continue
        adverb = _ADVERBS[index % len(_ADVERBS)]
        yield f'{verb} the {adjective} {obj} {place}{adverb}'
        yield f'Task: {verb} the {adjective} {obj} {place}, State: {index % 256} {(index * 7) % 256};'
    for index, word in enumerate(_SCENE_WORDS):
        yield f'the robot sees the {word}, {_ADJECTIVES[index % len(_ADJECTIVES)]} and {word}s'
    for value in range(256):
        yield f'State: {value} {255 - value} {(value * 13) % 256}; Action: '
    yield 'Task: fold_the_towel, State: 0 128 255;'
    yield 'Please, put it back: then stop; done.'


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
        sentence_iterator=_training_corpus(), model_writer=model,
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
