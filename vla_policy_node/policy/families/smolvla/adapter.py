"""SmolVLA: a SmolVLM2 backbone cut to num_vlm_layers, a Llama action expert, the state as the prefix's last token.

lerobot ``src/lerobot/policies/smolvla/`` at 7427f318. In this folder: the model ``model.py`` (its docstring has the
pipeline and the precision of each part), the backbone ``smolvlm.py``, the config and its field table
``config.py``, the tokenizer ``tokenizer.py`` (and ``tiny_tokenizer.py`` for random-weight checkpoints), the
FLOP counter ``flops.py``.

    folder     config.json (type smolvla), model.safetensors (lerobot's keys), the processor files with their
               MEAN_STD statistics, tokenizer/tokenizer.json (SmolVLM2's), vlm_config.json (optional: the
               backbone's HF config.json; without it vlm_model_name must be a known backbone)
    prompt     task + "\\n", no BOS, right padded with <|im_end|> to tokenizer_max_length (masked)
    images     resize-with-pad to resize_imgs_with_padding, padding LEFT and TOP, no clamp, x*2-1
    cache      keyed on cameras and tokens only: the state token runs per chunk (``state_in_prompt`` False),
               so a joint-state change with the same frames and instruction is a hit
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ...checkpoint import (CheckpointError, LoadedCheckpoint, WeightKeys, common_steps, device_step, load_parts,
                           normalizer_step, write_folder)
from ...config_fields import ConfigError
from ...family import Frames, PolicyFamily, TokenizerSource
from ...preprocess import ImagePromptInputs, image_prompt_inputs, resize_with_pad_left_top, to_model_range
from .flops import stage_flops
from .model import SmolVLAModel
from .config import SMOLVLA_CONFIG_FIELDS, SmolVLAConfig, smolvla_preset
from .tokenizer import SmolVLMTokenizer
from .tiny_tokenizer import build_smolvlm_test_tokenizer
from ...tokenizer import HF_TOKENIZER_FILE

VLM_CONFIG_FILE = 'vlm_config.json'
LM_HEAD_KEY = 'vlm_with_expert.vlm.lm_head.weight'


class SmolVLAFamily(PolicyFamily):
    type_name: ClassVar[str] = 'smolvla'
    model_class: ClassVar[Any] = SmolVLAModel
    tokenizer_class: ClassVar[Any] = SmolVLMTokenizer
    tokenizer_hint: ClassVar[str] = 'SmolVLM2\'s tokenizer.json (see docs/checkpoints.md)'
    preset_names: ClassVar[Tuple[str, ...]] = ('smolvla_tiny', 'smolvla')
    # lerobot saves the backbone's lm_head; inference never reads it.
    weight_keys: ClassVar[WeightKeys] = WeightKeys(known_unused=lambda key: key == LM_HEAD_KEY)
    model: SmolVLAModel

    # ---- loading ---------------------------------------------------------------------------------
    @classmethod
    def parse_config(cls, raw: Mapping[str, Any], vlm_config: Optional[Mapping[str, Any]] = None) -> SmolVLAConfig:
        return SmolVLAConfig.from_lerobot_dict(raw, vlm_config, VLM_CONFIG_FILE)

    @classmethod
    def config_fields(cls) -> Mapping[str, Any]:
        return SMOLVLA_CONFIG_FIELDS

    @classmethod
    def folder_config(cls, folder: Path, raw: Mapping[str, Any]) -> SmolVLAConfig:
        """config.json and, when present, vlm_config.json (the backbone's HF config)."""
        vlm_path = Path(folder) / VLM_CONFIG_FILE
        vlm_config = None
        if vlm_path.is_file():
            try:
                vlm_config = json.loads(vlm_path.read_text())
            except json.JSONDecodeError as exc:
                raise CheckpointError(f'{vlm_path} is not valid JSON: {exc}') from exc
        return cls.parse_config(raw, vlm_config)

    @classmethod
    def tokenizer_source(cls, config: SmolVLAConfig, hub_name: Optional[str] = None) -> TokenizerSource:
        """The backbone's tokenizer.json (lerobot's tokenizer step names vlm_model_name)."""
        return TokenizerSource(HF_TOKENIZER_FILE, hub_name or config.vlm_model_name)

    @classmethod
    def load_checkpoint(cls, folder: Path, raw: Mapping[str, Any], device: torch.device,
                        dtype: torch.dtype, tokenizer_path: Optional[Path] = None) -> LoadedCheckpoint:
        try:
            config = cls.folder_config(folder, raw)
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from exc
        loaded = load_parts(Path(folder), config, cls.model_class, device, dtype, cls.weight_keys)
        tokenizer = Path(folder) / 'tokenizer' / HF_TOKENIZER_FILE
        loaded.tokenizer_path = tokenizer if tokenizer.is_file() else None
        return loaded

    # ---- saving (random-weight checkpoints in lerobot's layout) -------------------------------------
    @classmethod
    def tiny_config(cls, **overrides: Any) -> SmolVLAConfig:
        return smolvla_preset('tiny', **overrides)

    @classmethod
    def build_test_tokenizer(cls, folder: Path, vocab_size: int) -> Path:
        return build_smolvlm_test_tokenizer(folder, vocab_size=vocab_size)

    @classmethod
    def preprocessor_steps(cls, config: SmolVLAConfig) -> List[Dict[str, Any]]:
        """lerobot processor_smolvla's order: new line, tokenizer, device, normalizer (no relative steps)."""
        tokenizer = {'registry_name': 'tokenizer_processor',
                     'config': {'max_length': config.tokenizer_max_length, 'task_key': 'task',
                                'padding_side': 'right', 'padding': config.pad_language_to, 'truncation': True,
                                'tokenizer_name': config.vlm_model_name}}
        return common_steps() + [{'registry_name': 'smolvla_new_line_processor', 'config': {}}, tokenizer,
                                 device_step(), normalizer_step(config)]

    @classmethod
    def save_checkpoint(cls, folder: Path, model: SmolVLAModel, state_stats: Mapping[str, np.ndarray],
                        action_stats: Mapping[str, np.ndarray], tokenizer_file: Optional[Path] = None) -> Path:
        config = model.config
        tensors = dict(model.state_dict())
        tensors[LM_HEAD_KEY] = torch.zeros(config.backbone.vocab_size, config.text.width)   # saved, never read
        tokenizer_files = []
        if tokenizer_file is not None:
            tokenizer_files = [Path(tokenizer_file)] + [path for path in Path(tokenizer_file).parent.glob('*.json')
                                                        if path.name != Path(tokenizer_file).name]
        folder = write_folder(folder, config, config.to_lerobot_dict(), tensors, cls.preprocessor_steps(config),
                              state_stats, action_stats, relative_steps=False, tokenizer_files=tokenizer_files)
        (Path(folder) / VLM_CONFIG_FILE).write_text(json.dumps(config.backbone.to_hf_config(), indent=2) + '\n')
        return folder

    # ---- benchmarks ------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, depth: Optional[int] = None) -> SmolVLAConfig:
        """``smolvla_tiny`` (the tiny config) or ``smolvla`` (the real shape: SmolVLM2-500M cut to 16 layers)."""
        if name not in cls.preset_names:
            raise ConfigError(f'unknown {cls.type_name} preset {name!r}; known: {", ".join(cls.preset_names)}')
        return smolvla_preset('tiny' if name == 'smolvla_tiny' else 'smolvla')

    @classmethod
    def stage_flops(cls, config: SmolVLAConfig, num_steps: int) -> Dict[str, int]:
        return stage_flops(config, num_steps)

    # ---- the model calls -----------------------------------------------------------------------------
    def prompt_tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self.tokenizer.encode_task(instruction, self.config.tokenizer_max_length)

    def prefix_inputs(self, frames: Frames, tokens: np.ndarray, token_mask: np.ndarray) -> ImagePromptInputs:
        return image_prompt_inputs(frames, tokens, token_mask, self.image_to_model, self.config.image_resolution,
                                   self.device)

    def image_to_model(self, unit: torch.Tensor) -> torch.Tensor:
        """A frame [3, H, W] in [0, 1] -> [3, h, w] in [-1, 1]: lerobot's resize with pad, left and top."""
        return to_model_range(resize_with_pad_left_top(unit, self.config.image_resolution))

    def describe(self) -> Dict[str, Any]:
        cfg = self.config
        return dict(super().describe(), backbone=cfg.vlm_model_name, vlm_layers=cfg.num_vlm_layers,
                    expert_layers=cfg.expert_depth, cross_attention_layers=cfg.cross_layer_count)
