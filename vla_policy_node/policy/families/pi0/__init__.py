"""pi0 (and what pi0.5 shares with it): config and field table, model, PaliGemma tokenizer, adapter.

lerobot ``src/lerobot/policies/pi0/`` at 7427f318. ``adapter.py`` is the family (``Pi0Family``); ``config.py``
describes both PaliGemma types (``PALIGEMMA_TRAITS``: what pi0.5 does differently), ``model.py`` runs both,
``tokenizer.py`` writes both prompts; ``training.py`` is pi0's training forward (the embedded demo's trainer).
"""
