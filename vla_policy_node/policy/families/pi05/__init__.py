"""pi0.5: its config and field table (``config.py``), its prompt (``tokenizer.py``) and its family
(``adapter.py``), built on pi0's model, PaliGemma tokenizer and weight handling (``families/pi0/``).

lerobot ``src/lerobot/policies/pi05/`` at 7427f318.
"""
