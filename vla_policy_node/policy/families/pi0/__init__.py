"""pi0: config and field table, model, PaliGemma tokenizer, FLOP counter, adapter; pi0.5 is built on them.

lerobot ``src/lerobot/policies/pi0/`` at 7427f318. ``adapter.py`` is the family (``Pi0Family``); ``config.py``
is pi0's config class, whose ``TRAITS`` say what the model does (pi0.5's config subclass has its own),
``model.py`` runs any PaliGemma type as its config's traits say, ``tokenizer.py`` is the PaliGemma tokenizer
with pi0's prompt; ``training.py`` is pi0's training forward (the embedded demo's trainer).
"""
