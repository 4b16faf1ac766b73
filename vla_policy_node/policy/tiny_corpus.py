"""The fixed corpus the tiny tokenizers of random-weight checkpoints are trained on.

``builtin:tiny``, the demo and the test checkpoints need a real tokenizer and no download is possible, so
each family trains a small one from this corpus (``families/<type>/tiny_tokenizer.py``), deterministically.
Real checkpoints bring their own tokenizer.
"""
from __future__ import annotations

import itertools
from typing import Iterator

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


def training_corpus() -> Iterator[str]:
    """A fixed, ordered corpus: instructions, prompts with state bins and state numbers."""
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
