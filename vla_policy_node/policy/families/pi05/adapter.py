"""pi0.5: pi0's towers with the state binned into the prompt and the time through adaptive expert norms.

lerobot ``src/lerobot/policies/pi05/`` at 7427f318 (``modeling_pi05.py``, ``processor_pi05.py``): the
normaliser runs before ``Pi05PrepareStateTokenizerProcessorStep``, which writes
"Task: ..., State: <256 bins>;\\nAction: " (``tokenizer.py`` here); the suffix is the action tokens only.
Because the state is in the tokens, a state change is a different prefix (``state_in_prompt``).

Built on pi0 (``families/pi0/``): the model (``PiZeroModel``, which runs pi0.5 as ``Pi05Config``'s traits say),
the PaliGemma tokenizer, the weight loading and writing; its own are the config (``config.py``: traits, field
table, presets), the prompt (``tokenizer.py``) and the pre-processor's step order.

Option ``pi05_padded_state_prompt``: bin the state zero-padded to max_state_dim, as lerobot did from
2025-10-02 (#1910) to 2026-03-05 (#2964); only for checkpoints fine-tuned with those releases.
"""
from __future__ import annotations

import re
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...checkpoint import WeightKeys, common_steps, device_step, normalizer_step, relative_step
from ...config_fields import ConfigError
from ...family import FamilyCapabilities
from ..pi0.adapter import EMBED_KEY, KEY_RENAMES, LM_HEAD_KEYS, Pi0Family, tokenizer_step
from .config import CONFIG_FIELDS, Pi05Config, preset
from .tokenizer import encode_pi05

# lerobot renamed the time MLPs between releases; pi0.5 spells them time_mlp_*.
PI05_KEY_RENAMES = KEY_RENAMES + ((r'^action_time_mlp_(in|out)\.', r'time_mlp_\1.'),)


def pi05_unused(key: str) -> bool:
    """pi0.5 takes the state through the prompt (legacy state_proj unused); its expert norms are adaptive."""
    return key in LM_HEAD_KEYS or key.startswith('state_proj.') or bool(
        re.match(r'^paligemma_with_expert\.gemma_expert\.model\.'
                 r'(layers\.\d+\.(input|post_attention)_layernorm|norm)\.weight$', key))


class Pi05Family(Pi0Family):
    type_name: ClassVar[str] = 'pi05'
    capabilities: ClassVar[FamilyCapabilities] = FamilyCapabilities(state_in_prompt=True)
    option_defaults: ClassVar[Mapping[str, Any]] = {'pi05_padded_state_prompt': False}
    preset_names: ClassVar[Tuple[str, ...]] = ('pi05',)
    weight_keys: ClassVar[WeightKeys] = WeightKeys(renames=PI05_KEY_RENAMES,
                                                   known_unused=pi05_unused,
                                                   stand_ins={EMBED_KEY: LM_HEAD_KEYS[0]})

    # ---- its config ----------------------------------------------------------------------------------------
    @classmethod
    def parse_config(cls, raw: Mapping[str, Any]) -> Pi05Config:
        return Pi05Config.from_lerobot_dict(raw)

    @classmethod
    def config_fields(cls) -> Mapping[str, Any]:
        return CONFIG_FIELDS

    @classmethod
    def tiny_config(cls, **overrides: Any) -> Pi05Config:
        return preset('tiny', **overrides)

    @classmethod
    def preset(cls, name: str, depth: Optional[int] = None) -> Pi05Config:
        if name not in cls.preset_names:
            raise ConfigError(f'unknown {cls.type_name} preset {name!r}; known: {", ".join(cls.preset_names)}')
        return preset(name)

    @classmethod
    def preprocessor_steps(cls, config: Pi05Config) -> List[Dict[str, Any]]:
        """lerobot processor_pi05's order: the normaliser before the state goes into the prompt."""
        return common_steps() + [relative_step(config), normalizer_step(config),
                                 {'registry_name': 'pi05_prepare_state_tokenizer_processor_step', 'config': {}},
                                 tokenizer_step(config), device_step()]

    # ---- its prompt ----------------------------------------------------------------------------------------
    def prompt_tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        pad_to = self.config.max_state_dim if self.options['pi05_padded_state_prompt'] else None
        return encode_pi05(self.tokenizer, instruction, normalized_state, self.config.tokenizer_max_length,
                           pad_state_to=pad_to)
