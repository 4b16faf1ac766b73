"""pi0: PaliGemma prefix (SigLIP + Gemma 2B), a Gemma 300M action expert, the state as one suffix token.

lerobot ``src/lerobot/policies/pi0/`` at 7427f318 (``modeling_pi0.py``, ``processor_pi0.py``). The model
(``model.py`` here, on the shared blocks ``policy/gemma.py``, ``siglip.py``, ``layers.py``), the config class
and the tokenizer of this folder are what pi0.5 is built on (``families/pi05/``: its config subclass, prompt,
presets and field table, and its family, a subclass of this one).

    prompt   BOS + task + "\\n", right padded to tokenizer_max_length (PaliGemma tokenizer)
    images   resize-with-pad to image_resolution, centred (lerobot resize_with_pad_torch), x*2-1
    prefix   [image tokens ; language tokens]                            -> PrefixContext (K/V per layer)
    denoise  [state token ; action tokens] against it, Euler over num_steps
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ...checkpoint import (CheckpointError, LoadedCheckpoint, WeightKeys, common_steps, device_step, load_parts,
                           normalizer_step, relative_step, write_folder)
from .config import CONFIG_FIELDS, PolicyConfig, preset
from ...config_fields import ConfigError
from ...family import Frames, PolicyFamily, TokenizerSource
from .model import PiZeroModel
from ...preprocess import ImagePromptInputs, image_prompt_inputs, resize_with_pad, to_model_range
from .tiny_tokenizer import build_test_tokenizer
from .flops import stage_flops
from .tokenizer import SENTENCEPIECE_FILE, PromptTokenizer

HUB_TOKENIZER_NAME = 'google/paligemma-3b-pt-224'
PALIGEMMA_LICENCE_NOTE = ('PaliGemma is gated on the Hugging Face Hub: accept its licence at '
                          'https://huggingface.co/{name} and log in (`hf auth login`; before huggingface_hub '
                          '1.0 `huggingface-cli login`) first.')
LM_HEAD_KEYS = ('paligemma_with_expert.paligemma.lm_head.weight',
                'paligemma_with_expert.gemma_expert.lm_head.weight')
EMBED_KEY = 'paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight'
# Key spellings written by other transformers versions and exports -> ours.
KEY_RENAMES: Tuple[Tuple[str, str], ...] = (
    (r'^paligemma_with_expert\.paligemma\.(language_model|vision_tower|multi_modal_projector)\.',
     r'paligemma_with_expert.paligemma.model.\1.'),
    (r'\.vision_tower\.(embeddings|encoder|post_layernorm)', r'.vision_tower.vision_model.\1'),
)


class Pi0Family(PolicyFamily):
    """pi0 behind the family interface; pi0.5's family (families/pi05/adapter.py) is built on it."""

    type_name: ClassVar[str] = 'pi0'
    weight_keys: ClassVar[WeightKeys] = WeightKeys(renames=KEY_RENAMES,
                                                   known_unused=lambda key: key in LM_HEAD_KEYS,
                                                   stand_ins={EMBED_KEY: LM_HEAD_KEYS[0]})
    model_class: ClassVar[Any] = PiZeroModel
    tokenizer_hint: ClassVar[str] = 'the PaliGemma tokenizer.model (see docs/checkpoints.md)'
    tokenizer_class: ClassVar[Any] = PromptTokenizer
    preset_names: ClassVar[Tuple[str, ...]] = ('tiny', 'pi0_shallow', 'pi0')
    model: PiZeroModel

    # ---- loading ---------------------------------------------------------------------------------
    @classmethod
    def parse_config(cls, raw: Mapping[str, Any]) -> PolicyConfig:
        return PolicyConfig.from_lerobot_dict(raw)

    @classmethod
    def config_fields(cls) -> Mapping[str, Any]:
        return CONFIG_FIELDS

    @classmethod
    def tokenizer_source(cls, config: PolicyConfig, hub_name: Optional[str] = None) -> TokenizerSource:
        """PaliGemma's tokenizer.model; its repository is gated (the licence note), another one may not be."""
        name = hub_name or HUB_TOKENIZER_NAME
        note = PALIGEMMA_LICENCE_NOTE.format(name=name) if 'paligemma' in name.lower() else ''
        return TokenizerSource(SENTENCEPIECE_FILE, name, note)

    @classmethod
    def load_checkpoint(cls, folder: Path, raw: Mapping[str, Any], device: torch.device,
                        dtype: torch.dtype, tokenizer_path: Optional[Path] = None) -> LoadedCheckpoint:
        try:
            config = cls.parse_config(raw)
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from exc
        return load_parts(folder, config, cls.model_class, device, dtype, cls.weight_keys)

    # ---- saving (the tiny default and tests write lerobot folders) ----------------------------------
    @classmethod
    def tiny_config(cls, **overrides: Any) -> PolicyConfig:
        return preset('tiny', **overrides)

    @classmethod
    def build_test_tokenizer(cls, folder: Path, vocab_size: int) -> Path:
        return build_test_tokenizer(folder, vocab_size=vocab_size)

    @classmethod
    def preprocessor_steps(cls, config: PolicyConfig) -> List[Dict[str, Any]]:
        """lerobot processor_pi0's step order: new line, tokenizer, device, relative actions, normalizer."""
        return common_steps() + [{'registry_name': 'pi0_new_line_processor', 'config': {}},
                                 tokenizer_step(config), device_step(), relative_step(config),
                                 normalizer_step(config)]

    @classmethod
    def save_checkpoint(cls, folder: Path, model: PiZeroModel, state_stats: Mapping[str, np.ndarray],
                        action_stats: Mapping[str, np.ndarray], tokenizer_file: Optional[Path] = None) -> Path:
        config = model.config
        tensors = dict(model.state_dict())
        # Real folders carry both LM heads (the PaliGemma one tied to the embedding).
        tensors[LM_HEAD_KEYS[0]] = tensors[EMBED_KEY].clone()
        tensors[LM_HEAD_KEYS[1]] = torch.zeros(config.vocab_size, config.expert.width)
        return write_folder(folder, config, config.to_lerobot_dict(), tensors, cls.preprocessor_steps(config),
                            state_stats, action_stats, tokenizer_files=[tokenizer_file] if tokenizer_file else [])

    # ---- benchmarks ------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, depth: Optional[int] = None) -> PolicyConfig:
        if name not in cls.preset_names:
            raise ConfigError(f'unknown {cls.type_name} preset {name!r}; known: {", ".join(cls.preset_names)}')
        overrides = {'depth': depth} if name == 'pi0_shallow' and depth is not None else {}
        return preset(name, **overrides)

    @classmethod
    def stage_flops(cls, config: PolicyConfig, num_steps: int) -> Dict[str, int]:
        return stage_flops(config, num_steps)

    # ---- the model calls -----------------------------------------------------------------------------
    def prompt_tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self.tokenizer.encode_pi0(instruction, self.config.tokenizer_max_length)

    def prefix_inputs(self, frames: Frames, tokens: np.ndarray, token_mask: np.ndarray) -> ImagePromptInputs:
        return image_prompt_inputs(frames, tokens, token_mask, self.image_to_model, self.config.image_resolution,
                                   self.device)

    def image_to_model(self, unit: torch.Tensor) -> torch.Tensor:
        """A frame [3, H, W] in [0, 1] -> [3, h, w] in [-1, 1]: lerobot's resize with pad, centred."""
        return to_model_range(resize_with_pad(unit, self.config.image_resolution))


def tokenizer_step(config: PolicyConfig) -> Dict[str, Any]:
    return {'registry_name': 'tokenizer_processor',
            'config': {'max_length': config.tokenizer_max_length, 'task_key': 'task', 'padding_side': 'right',
                       'padding': 'max_length', 'truncation': True, 'tokenizer_name': HUB_TOKENIZER_NAME}}
