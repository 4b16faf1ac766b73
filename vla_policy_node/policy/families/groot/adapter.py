"""GR00T N1.7: a Qwen3-VL backbone cut at select_layer, an AlternateVLDiT action head, time 0 -> 1 over 4 steps.

lerobot ``src/lerobot/policies/groot/`` at 7427f318. In this folder: the model ``model.py`` (its docstring has the
pipeline, the cache split and the precision), the backbone ``qwen3vl.py``, the head's blocks ``dit.py``, the image
path ``images.py``, the prompt ``tokenizer.py`` (``tiny_tokenizer.py`` / ``chat_template.py`` for random-weight
checkpoints), the processor files ``processor.py``, the folder on disk ``folder.py``, the config and its field tables
``config.py``, the state normalisation / action decode / GR00T's own RTC ``transforms.py``, the FLOP counter
``flops.py``.

    folder     config.json (type groot), model.safetensors (lerobot's keys, ``_groot_model.``), the two processor
               files with their state files; base_model_path (its config.json) and the backbone's processor folder
               (tokenizer_path, the pre-processor's model_name, or <folder>/tokenizer/) on disk -- nothing is
               downloaded
    prompt     one user message through the backbone's chat template: every camera's image, then the task
               (formalised), each image token expanded to the image's LLM tokens; right-padded (masked) to the
               longest prompt, so the runtime fits it to a prompt bucket; the backbone sees the real tokens only
    images     uint8, square resize, 230/256 centre crop, resize (bicubic, antialias), smart_resize, (x - 127.5) /
               127.5; each camera on its own, so cameras of different sizes are each computed as lerobot would
               compute that camera (lerobot itself stacks the raw frames and fails on mixed sizes)
    cache      keyed on the frames and the prompt: the state only reaches the state token (``state_in_prompt``
               False), so a joint-state change with the same frames and task is a hit
    seam       the context's three sequences (model.py), the embodiment id from the pre-processor's mapping, the
               min/max state normalisation and the action decode (transforms.py), GR00T's own RTC ('inpainting')
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ....observation import ObservationError, SkipReason
from ...checkpoint import CheckpointError, LoadedCheckpoint, build_model
from ...config_fields import ConfigError
from ...family import FamilyCapabilities, Frames, PolicyFamily, TokenizerSource
from ...preprocess import image_to_unit_tensor
from ...tokenizer import HF_TOKENIZER_FILE, TokenizerError
from .config import GROOT_CONFIG_FIELDS, TEXT_BUCKETS, GrootConfig
from .flops import stage_flops
from .folder import (WEIGHT_KEYS, build_config, find_processor_folder, processor_documents, processor_folder_problem,
                     write_groot_folder)
from .images import frame_to_model
from .model import GrootModel, GrootPrefixInputs
from .presets import groot_preset
from .processor import GrootProcessors, read_processors
from .qwen3vl import COSMOS_REASON2_2B
from .tiny_tokenizer import build_qwen_test_tokenizer
from .tokenizer import PROMPT_PAD_ID, QwenChatTokenizer
from .transforms import ActionDecoder, MinMaxStateNormalizer


class GrootFamily(PolicyFamily):
    type_name: ClassVar[str] = 'groot'
    model_class: ClassVar[Any] = GrootModel
    tokenizer_class: ClassVar[Any] = QwenChatTokenizer
    tokenizer_hint: ClassVar[str] = ("the backbone's processor folder (nvidia/Cosmos-Reason2-2B's tokenizer.json, "
                                     'tokenizer_config.json, preprocessor_config.json; see docs/groot.md)')
    preset_names: ClassVar[Tuple[str, ...]] = ('groot_tiny', 'groot')
    # The prefix runs at the prompt's own length (model.py: lerobot's vl_self_attention is unmasked over its
    # unpadded prompt), so its shape follows the instruction: not captured. The denoise is, per prompt bucket.
    capabilities: ClassVar[FamilyCapabilities] = FamilyCapabilities(capturable_prefix=False, rtc_modes=('inpainting',))
    weight_keys = WEIGHT_KEYS
    model: GrootModel

    # ---- loading ---------------------------------------------------------------------------------
    @classmethod
    def parse_config(cls, raw: Mapping[str, Any]) -> GrootConfig:
        raise ConfigError('a GR00T config.json is not the whole config: the processor files and the base model '
                          'folder beside it are (folder_config)')

    @classmethod
    def config_fields(cls) -> Mapping[str, Any]:
        return GROOT_CONFIG_FIELDS

    @classmethod
    def folder_config(cls, folder: Path, raw: Mapping[str, Any]) -> GrootConfig:
        """The config with the processor folder's image settings when one is found (``folder_tokenizer``), else
        Qwen3-VL's image-processor defaults (the doctor's view of a folder without it)."""
        return build_config(Path(folder), raw, find_processor_folder(Path(folder), read_processors(Path(folder))))

    @classmethod
    def folder_normalizers(cls, folder: Path, config: GrootConfig) -> Tuple[MinMaxStateNormalizer, ActionDecoder]:
        """The pack step's min/max state normalisation and the post-processor's decode, from their state files."""
        try:
            return cls._normalizers(Path(folder), config, read_processors(Path(folder)))
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from exc

    @classmethod
    def _normalizers(cls, folder: Path, config: GrootConfig,
                     processors: GrootProcessors) -> Tuple[MinMaxStateNormalizer, ActionDecoder]:
        state = MinMaxStateNormalizer('observation.state', processors.state_stats, processors.normalize_state,
                                      processors.clip_state)
        decode = config.decode
        action = ActionDecoder('action', processors.action_stats, decode.normalize, decode.clip,
                               decode.gripper_index if decode.libero_gripper else None, decode.libero_binarize)
        for normalizer, dim in ((state, config.state_dim), (action, config.action_dim)):
            if normalizer.dim not in (-1, dim):
                raise CheckpointError(f'{folder}: {normalizer.feature} statistics have {normalizer.dim} values, '
                                      f'config.json says {dim}')
        return state, action

    @classmethod
    def folder_tokenizer(cls, folder: Path, config: GrootConfig) -> Optional[Path]:
        """The processor folder: the pre-processor's model_name on disk, else <folder>/tokenizer/."""
        return find_processor_folder(Path(folder), read_processors(Path(folder)))

    @classmethod
    def tokenizer_source(cls, config: GrootConfig, hub_name: Optional[str] = None) -> TokenizerSource:
        """The backbone's whole processor folder (tokenizer, chat template, image processor: every JSON and jinja
        file, no weights) from the repository the pre-processor names, when that is a Hub id."""
        named = hub_name or config.tokenizer_name
        is_hub_id = named.count('/') == 1 and not named.startswith(('/', '.', '~'))
        return TokenizerSource(HF_TOKENIZER_FILE, named if is_hub_id else COSMOS_REASON2_2B,
                               'A gated repository: accept its licence on huggingface.co and log in first.',
                               include=('*.json', '*.jinja'))

    @classmethod
    def load_checkpoint(cls, folder: Path, raw: Mapping[str, Any], device: torch.device, dtype: torch.dtype,
                        tokenizer_path: Optional[Path] = None) -> LoadedCheckpoint:
        """The processor folder is resolved first (``tokenizer_path``, else ``folder_tokenizer``): its image
        processor settings are part of the config. Without one, Qwen3-VL's defaults and ``tokenizer_problem``
        saying where it was looked for (the load refuses then)."""
        folder = Path(folder)
        if dtype not in (torch.float32, torch.bfloat16):
            raise CheckpointError(f'GR00T runs in float32 or bfloat16 (lerobot\'s autocast recipe), not {dtype}')
        try:
            processors = read_processors(folder)
            if tokenizer_path is not None:
                processor_dir: Optional[Path] = Path(tokenizer_path)
                processor_dir = processor_dir if processor_dir.is_dir() else processor_dir.parent
            else:
                processor_dir = find_processor_folder(folder, processors)
            config = build_config(folder, raw, processor_dir)
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from exc
        state, action = cls._normalizers(folder, config, processors)
        weights = folder / 'model.safetensors'
        model = build_model(cls.model_class, config, weights, device, dtype, cls.weight_keys)
        problem = None if processor_dir is not None else processor_folder_problem(folder, processors)
        return LoadedCheckpoint(model=model, config=config, state_normalizer=state, action_normalizer=action,
                                weights_path=weights, tokenizer_path=processor_dir, tokenizer_problem=problem)

    @classmethod
    def check_tokenizer(cls, tokenizer: QwenChatTokenizer, config: GrootConfig, path: Path) -> None:
        if tokenizer.image_token_id != config.backbone.image_token_id:
            raise TokenizerError(f'tokenizer {path} has <|image_pad|> at {tokenizer.image_token_id}, the backbone '
                                 f'expects {config.backbone.image_token_id}')

    # ---- writing random-weight checkpoints -----------------------------------------------------------------
    @classmethod
    def tiny_config(cls, **overrides: Any) -> GrootConfig:
        return groot_preset('groot_tiny', **overrides)

    @classmethod
    def build_test_tokenizer(cls, folder: Path, vocab_size: int) -> Path:
        return build_qwen_test_tokenizer(folder, vocab_size=min(int(vocab_size), 512))

    @classmethod
    def preprocessor_steps(cls, config: GrootConfig) -> List[Dict[str, Any]]:
        return processor_documents(config, Path(config.tokenizer_name))[0]['steps']

    @classmethod
    def save_checkpoint(cls, folder: Path, model: GrootModel, state_stats: Mapping[str, np.ndarray],
                        action_stats: Mapping[str, np.ndarray], tokenizer_file: Optional[Path] = None) -> Path:
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

    # ---- pre-processing -----------------------------------------------------------------------------------------
    def prompt_tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The chat-template prompt (tokenizer.py) right-padded with masked <|endoftext|> to the longest prompt
        (tokenizer_max_length): the runtime drops the padding beyond the prompt's bucket."""
        cfg = self.config
        ids, mask = self.tokenizer.encode_prompt(instruction, len(cfg.camera_names), cfg.tokens_per_image,
                                                 cfg.formalize_language, cfg.tokenizer_max_length)
        padded = np.full(cfg.tokenizer_max_length, PROMPT_PAD_ID, dtype=np.int64)
        padded_mask = np.zeros(cfg.tokenizer_max_length, dtype=bool)
        padded[:len(ids)], padded_mask[:len(ids)] = ids, mask
        return padded, padded_mask

    def prefix_inputs(self, frames: Frames, tokens: np.ndarray, token_mask: np.ndarray) -> GrootPrefixInputs:
        """Every camera through GR00T's image path on its own (images.py), the prompt's real tokens, and its mask
        over the bucket. GR00T has no empty cameras: a camera missing from the observation is refused."""
        missing = [name for name, pixels in frames if pixels is None]
        if missing:
            raise ObservationError(f'images.{missing[0]}', f'GR00T needs every camera of the checkpoint '
                                   f'({", ".join(self.config.camera_names)}); {", ".join(missing)} missing',
                                   SkipReason.BAD_IMAGE)
        device = self.device
        images = torch.stack([self.image_to_model(image_to_unit_tensor(pixels, device)) for _, pixels in frames])
        length = int(np.count_nonzero(token_mask))
        return GrootPrefixInputs(images[None], torch.from_numpy(np.ascontiguousarray(tokens[:length]))[None].to(device),
                                 torch.from_numpy(np.ascontiguousarray(token_mask))[None].to(device))

    def image_to_model(self, unit: torch.Tensor) -> torch.Tensor:
        """A decoded frame [3, H, W] in [0, 1] -> the normalised model image [3, h, w] (images.frame_to_model)."""
        return frame_to_model(unit, self.config.geometry)

    def default_prompt_buckets(self) -> Tuple[int, ...]:
        """The image tokens and up to 64, 128 or MAX_TEXT_TOKENS text tokens: a task of a few words pads its text
        K/V to 64 rows, not to the longest prompt's 512 (the entry's bytes, the cross-attention's keys)."""
        images = self.config.image_tokens
        return tuple(images + text for text in TEXT_BUCKETS)

    def processor_identity(self) -> str:
        """The image processor's settings read beside the tokenizer (preprocessor_config.json and the VLM-encode
        step's geometry): part of the cache key."""
        return repr(self.config.geometry)

    def embodiment_id(self) -> Optional[int]:
        """The checkpoint's embodiment (the pre-processor's embodiment_mapping of its embodiment_tag)."""
        return int(self.config.embodiment_id)

    def normalize_state(self, raw_state: np.ndarray) -> np.ndarray:
        """The pack step's min/max normalisation, clipped to [-1, 1] (transforms.MinMaxStateNormalizer)."""
        return self.state_normalizer.normalize(raw_state)

    # ---- post-processing --------------------------------------------------------------------------------------
    def postprocess(self, actions: np.ndarray, raw_state: np.ndarray) -> np.ndarray:
        """GR00T's action decode (transforms.ActionDecoder): the cut to action_dim, clip to [-1, 1], inverse min/max,
        the LIBERO gripper sign where the checkpoint asks for it. Absolute actions: the state is not used."""
        return self.action_normalizer.unnormalize(actions[:, :self.config.action_dim])

    def to_model_space(self, actions: np.ndarray, raw_state: np.ndarray) -> np.ndarray:
        """The decode's inverse (an RTC leftover given in robot units)."""
        return self.action_normalizer.normalize(actions)

    def describe(self) -> Dict[str, Any]:
        cfg = self.config
        return dict(super().describe(), backbone=cfg.head.model_name, select_layer=cfg.head.select_layer,
                    dit_layers=cfg.head.dit.num_layers, embodiment=cfg.embodiment_tag)
