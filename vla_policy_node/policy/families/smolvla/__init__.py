"""SmolVLA: config and field table, model, SmolVLM2 backbone, tokenizer, adapter (``SmolVLAFamily``).

lerobot ``src/lerobot/policies/smolvla/`` at 7427f318.
"""
