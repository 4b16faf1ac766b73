"""pi0.5's configuration: pi0's towers and policy-level settings (``families/pi0/config.py``) with pi0.5's
traits, defaults, field table and presets.

lerobot ``src/lerobot/policies/pi05/configuration_pi05.py`` at 7427f318. What the model does differently is
in ``PI05_TRAITS``: no state token (the state is binned into the prompt, families/pi05/tokenizer.py) and the
time enters the action expert through adaptive RMSNorm; lerobot's defaults are a 200-token prompt and
quantile normalisation. PI05Config has PI0Config's fields plus MEM video/state memory (not implemented:
refused when on) and the trained real-time-chunking delay.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Tuple

from ...config_fields import DEFAULT_ONLY, IMPLEMENTED, METADATA, ConfigError, ConfigField, table
from ..pi0.config import PaliGemmaTraits, PolicyConfig, paligemma_fields, paligemma_preset

PI05_TRAITS = PaliGemmaTraits(policy_type='pi05', lerobot_class='PI05Config', state_token=False,
                              adaptive_expert=True, tokenizer_max_length=200, tiny_tokenizer_max_length=200,
                              normalization_mapping={'VISUAL': 'IDENTITY', 'STATE': 'QUANTILES',
                                                     'ACTION': 'QUANTILES'})


@dataclass(frozen=True, kw_only=True)
class Pi05Config(PolicyConfig):
    """A pi0.5 model and its pre/post-processing: pi0's config class with pi0.5's traits and field table."""

    TRAITS: ClassVar[PaliGemmaTraits] = PI05_TRAITS

    policy_type: str = 'pi05'

    @classmethod
    def field_table(cls) -> Dict[str, ConfigField]:
        return CONFIG_FIELDS


# ---- every config.json field, classified: PI0Config's and PI05Config's own, where lerobot declares them ------

_MEMORY_OFF = 'read only with MEM, which loads only when off'
LEROBOT_CONFIG_FIELDS: Tuple[ConfigField, ...] = paligemma_fields(
    ConfigField('type', IMPLEMENTED, 'pi05; any other type is another family (or refused)'),
    inserted={
        'n_action_steps': (
            ConfigField('use_visual_memory', DEFAULT_ONLY, 'MEM video memory is not implemented', accepted=(False,)),
            ConfigField('use_proprioceptive_memory', DEFAULT_ONLY, 'MEM state memory is not implemented',
                        accepted=(False,)),
            ConfigField('memory_frames', METADATA, _MEMORY_OFF),
            ConfigField('memory_stride', METADATA, _MEMORY_OFF),
            ConfigField('memory_temporal_attention_every', METADATA, _MEMORY_OFF)),
        'rtc_config': (
            ConfigField('rtc_training_max_delay', IMPLEMENTED, 'trained real-time chunking: the largest clamped '
                        'prefix (rtc_mode trained)'),),
    })
CONFIG_FIELDS: Dict[str, ConfigField] = table(LEROBOT_CONFIG_FIELDS)

# ---- presets ---------------------------------------------------------------------------------------------

PRESETS = {'tiny': 'tiny', 'pi05': 'full'}


def preset(name: str, **overrides: Any) -> Pi05Config:
    """pi0.5's named configurations: ``tiny`` (tests) and ``pi05`` (the real sizes), pi0's towers."""
    if name not in PRESETS:
        raise ConfigError(f'unknown pi05 preset {name!r}; known: {", ".join(PRESETS)}')
    return paligemma_preset(Pi05Config, PRESETS[name], **overrides)
