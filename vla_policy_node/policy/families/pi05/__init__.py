"""pi0.5: pi0's config, model and tokenizer (``families/pi0/``) with its own adapter (``Pi05Family``).

lerobot ``src/lerobot/policies/pi05/`` at 7427f318.
"""
