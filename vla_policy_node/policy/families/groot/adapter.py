"""GR00T N1.7: a Qwen3-VL backbone cut at select_layer, an AlternateVLDiT action head, time 0 -> 1 over 4 steps.

lerobot ``src/lerobot/policies/groot/`` at 7427f318. In this folder: the model ``model.py`` (its docstring has the
pipeline, the cache split and the precision), the backbone ``qwen3vl.py``, the head's blocks ``dit.py``, the image
path ``images.py``, the prompt ``tokenizer.py`` (``tiny_tokenizer.py`` / ``chat_template.py`` for random-weight
checkpoints), the processor files ``processor.py``, the folder on disk ``folder.py``, the config and its field tables
``config.py``, the state normalisation / action decode / GR00T's own RTC ``transforms.py``, the FLOP counter
``flops.py``.

    folder     config.json (type groot), model.safetensors (lerobot's keys, ``_groot_model.``), the two processor
               files with their state files; base_model_path (its config.json) and the backbone's processor folder
               (tokenizer_path or the pre-processor's model_name) on disk -- nothing is downloaded
    prompt     one user message through the backbone's chat template: every camera's image, then the task
               (formalised), each image token expanded to the image's LLM tokens; never padded
    images     uint8, square resize, 230/256 centre crop, resize (bicubic, antialias), smart_resize, (x - 127.5) /
               127.5; each camera on its own, so cameras of different sizes are each computed as lerobot would
               compute that camera (lerobot itself stacks the raw frames and fails on mixed sizes)
    cache      keyed on the frames and the prompt: the state only reaches the state token (``state_in_prompt``
               False), so a joint-state change with the same frames and task is a hit

The seam as it is (policy/family.py at main) carries GR00T as follows; where it cannot express a GR00T need, the
piece is family-private here: the context is a PrefixContext whose ``kv`` holds the text cross blocks' K/V (the
image blocks' K/V, the features and the token mask in ``extra``); the embodiment id is fixed per checkpoint (in the
config); GR00T's RTC replaces pi-style guidance inside ``chunk_setup`` whenever ``rtc`` is given; the post-processor
is the action normaliser's ``unnormalize`` (transforms.ActionDecoder).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Dict, Optional, Tuple

import numpy as np
import torch

from ...checkpoint import CheckpointError, LoadedCheckpoint, build_model, read_config_json
from ...config_fields import ConfigError
from ...family import PolicyFamily, TokenizerSource
from ...tokenizer import HF_TOKENIZER_FILE, TokenizerError, _digest
from .config import GROOT_CONFIG_FIELDS, GrootConfig
from .flops import stage_flops
from .folder import WEIGHT_KEYS, build_config, processor_folder, write_groot_folder
from .images import frame_to_model
from .model import GrootModel
from .presets import groot_preset
from .processor import read_processors
from .tiny_tokenizer import build_qwen_test_tokenizer
from .tokenizer import QwenChatTokenizer
from .transforms import ActionDecoder, MinMaxStateNormalizer


class GrootFamily(PolicyFamily):
    type_name: ClassVar[str] = 'groot'
    state_in_prompt: ClassVar[bool] = False
    model_class: ClassVar[Any] = GrootModel
    tokenizer_class: ClassVar[Any] = QwenChatTokenizer
    tokenizer_hint: ClassVar[str] = ("the backbone's processor folder (nvidia/Cosmos-Reason2-2B's tokenizer.json, "
                                     'tokenizer_config.json, preprocessor_config.json; see docs/groot.md)')
    preset_names: ClassVar[Tuple[str, ...]] = ('groot_tiny', 'groot')
    weight_keys = WEIGHT_KEYS
    model: GrootModel

    # ---- loading ---------------------------------------------------------------------------------
    @classmethod
    def parse_config(cls, raw, folder: Optional[Path] = None, processor_dir: Optional[Path] = None) -> GrootConfig:
        """config.json needs the folder around it (the processor files, base_model_path): without ``folder`` the
        current directory's files are read."""
        return build_config(Path(folder or '.'), raw, processor_dir)

    @classmethod
    def config_fields(cls):
        return GROOT_CONFIG_FIELDS

    @classmethod
    def folder_config(cls, folder: Path, raw) -> GrootConfig:
        """The config without a tokenizer path: the pre-processor's processor folder when it is on disk, else
        Qwen3-VL's image-processor defaults (the doctor's view)."""
        return build_config(Path(folder), raw, cls._processor_dir_if_present(Path(folder)))

    @classmethod
    def _processor_dir_if_present(cls, folder: Path) -> Optional[Path]:
        try:
            return processor_folder(read_processors(folder), None)
        except ConfigError:
            return None

    @classmethod
    def tokenizer_source(cls, config: GrootConfig, hub_name: Optional[str] = None) -> TokenizerSource:
        return TokenizerSource(HF_TOKENIZER_FILE, hub_name or config.tokenizer_name,
                               'a gated repository: accept its licence on huggingface.co first')

    @classmethod
    def load_checkpoint(cls, folder: Path, raw, device: torch.device, dtype: torch.dtype,
                        processor_dir: Optional[Path] = None) -> LoadedCheckpoint:
        folder = Path(folder)
        if dtype not in (torch.float32, torch.bfloat16):
            raise CheckpointError(f'GR00T runs in float32 or bfloat16 (lerobot\'s autocast recipe), not {dtype}')
        try:
            config = build_config(folder, raw, processor_dir or cls._processor_dir_if_present(folder))
            processors = read_processors(folder)
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from exc
        state = MinMaxStateNormalizer('observation.state', processors.state_stats, processors.normalize_state,
                                      processors.clip_state)
        decode = config.decode
        action = ActionDecoder('action', processors.action_stats, decode.normalize, decode.clip,
                               decode.gripper_index if decode.libero_gripper else None, decode.libero_binarize)
        for normalizer, dim in ((state, config.state_dim), (action, config.action_dim)):
            if normalizer.dim not in (-1, dim):
                raise CheckpointError(f'{folder}: {normalizer.feature} statistics have {normalizer.dim} values, '
                                      f'config.json says {dim}')
        weights = folder / 'model.safetensors'
        model = build_model(cls.model_class, config, weights, device, dtype, cls.weight_keys)
        return LoadedCheckpoint(model=model, config=config, state_normalizer=state, action_normalizer=action,
                                weights_path=weights, tokenizer_path=processor_dir)

    @classmethod
    def load(cls, folder: Path, device: torch.device, dtype: torch.dtype,
             tokenizer_path: Optional[Path] = None, **options: Any) -> 'GrootFamily':
        """As PolicyFamily.load, with the processor folder resolved first: the image processor's settings in it
        are part of the config."""
        options = cls.checked_options(options)
        folder = Path(folder)
        raw = read_config_json(folder)
        try:
            processor_dir = processor_folder(read_processors(folder), tokenizer_path)
        except ConfigError as exc:
            raise TokenizerError(str(exc)) from exc
        loaded = cls.load_checkpoint(folder, raw, device, dtype, processor_dir)
        tokenizer = cls.tokenizer_class.from_path(processor_dir)
        config: GrootConfig = loaded.config
        if tokenizer.vocab_size > config.vocab_size:
            raise TokenizerError(f'tokenizer {processor_dir} has {tokenizer.vocab_size} tokens, more than the model '
                                 f'embedding ({config.vocab_size})')
        if tokenizer.image_token_id != config.backbone.image_token_id:
            raise TokenizerError(f'tokenizer {processor_dir} has <|image_pad|> at {tokenizer.image_token_id}, the '
                                 f'backbone expects {config.backbone.image_token_id}')
        # The cache key holds the tokenizer's identity: make it cover the image settings too.
        tokenizer.identity = _digest((tokenizer.identity + repr(config.geometry)).encode())
        return cls(config, loaded.model, loaded.state_normalizer, loaded.action_normalizer, tokenizer,
                   loaded.weights_path, **options)

    # ---- writing random-weight checkpoints -----------------------------------------------------------------
    @classmethod
    def tiny_config(cls, **overrides: Any) -> GrootConfig:
        return groot_preset('groot_tiny', **overrides)

    @classmethod
    def build_test_tokenizer(cls, folder: Path, vocab_size: int) -> Path:
        return build_qwen_test_tokenizer(folder, vocab_size=min(int(vocab_size), 512))

    @classmethod
    def save_checkpoint(cls, folder: Path, model: GrootModel, state_stats, action_stats,
                        tokenizer_file: Optional[Path] = None) -> Path:
        return write_groot_folder(Path(folder), model.config, model.state_dict(), state_stats, action_stats,
                                  tokenizer_file)

    # ---- benchmarks -------------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, depth: Optional[int] = None) -> GrootConfig:
        if name not in cls.preset_names:
            raise ConfigError(f'unknown {cls.type_name} preset {name!r}; known: {", ".join(cls.preset_names)}')
        return groot_preset(name)

    @classmethod
    def stage_flops(cls, config: GrootConfig, num_steps: int) -> Dict[str, int]:
        return stage_flops(config, num_steps)

    # ---- the model calls ---------------------------------------------------------------------------------------
    def prompt_tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        cfg = self.config
        return self.tokenizer.encode_prompt(instruction, len(cfg.camera_names), cfg.tokens_per_image,
                                            cfg.formalize_language, cfg.tokenizer_max_length)

    def image_to_model(self, unit: torch.Tensor) -> torch.Tensor:
        return frame_to_model(unit, self.config.geometry)

    def empty_image(self) -> torch.Tensor:
        raise ValueError('GR00T has no empty cameras')

    def describe(self) -> Dict[str, Any]:
        cfg = self.config
        return dict(super().describe(), backbone=cfg.head.model_name, select_layer=cfg.head.select_layer,
                    dit_layers=cfg.head.dit.num_layers, embodiment=cfg.embodiment_tag)
