"""The policy-family seam: what the runtime asks of any loaded policy (pi0, pi0.5, SmolVLA, ...).

A family is one module under ``policy/families/`` with one ``PolicyFamily`` subclass
and one registry line (``families/__init__.py``). The runtime, cache, node, replay,
RTC, safety and benchmarks talk to this interface only and never test the type
string; where families differ in what the runtime must do, a capability attribute
says so (``state_in_prompt``).

    raw observation --runtime--> (cameras, normalised state, instruction)
      prompt_tokens(instruction, state)      -> ids, mask              (tokens go into the cache key)
      image_to_model(unit)                   -> [3, h, w] in [-1, 1]   (cache miss only)
      fill_prefix(images, masks, ids, mask)  -> PrefixContext          (cache miss only; read-only after)
      denoise(context, state, noise, steps)  -> normalised actions [B, H, max_action_dim] fp32

Every family config carries the policy-level fields in ``POLICY_LEVEL_FIELDS`` (the
params table, the tick and the replay read them) and ``cache_entry_bytes``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

import numpy as np
import torch

from ..cache.context import PrefixContext
from .normalize import FeatureNormalizer
from .preprocess import empty_camera_image
from .rtc import RTCSettings
from .tokenizer import TokenizerError

# lerobot names the padding cameras it adds for `empty_cameras` like this.
EMPTY_CAMERA_PREFIX = 'empty_camera_'

# The fields (or properties) every family config offers, besides cache_entry_bytes(dtype_bytes).
POLICY_LEVEL_FIELDS = (
    'policy_type', 'camera_names', 'all_camera_names', 'empty_cameras', 'image_resolution', 'chunk_size',
    'n_action_steps', 'state_dim', 'action_dim', 'max_state_dim', 'max_action_dim', 'num_inference_steps',
    'tokenizer_max_length', 'normalization_mapping', 'rtc_training_max_delay', 'use_relative_actions',
    'relative_exclude_joints', 'action_feature_names', 'tokens_per_image', 'prefix_len', 'num_prefix_layers',
    'vocab_size',
)


class PolicyLevelConfig:
    """Mixin of every family config dataclass: the derived policy-level fields and their shared checks.

    The subclass declares the fields of ``POLICY_LEVEL_FIELDS`` (dataclass fields) and
    ``tokens_per_image`` / ``prefix_len`` (properties of its architecture).
    """

    policy_type: str
    camera_names: Tuple[str, ...]
    empty_cameras: int
    chunk_size: int
    n_action_steps: int
    state_dim: int
    action_dim: int
    max_state_dim: int
    max_action_dim: int
    rtc_training_max_delay: int
    use_relative_actions: bool
    prefix_len: int

    @property
    def all_camera_names(self) -> Tuple[str, ...]:
        """Image slots in model order: the configured cameras, then the empty ones."""
        return tuple(self.camera_names) + tuple(f'{EMPTY_CAMERA_PREFIX}{i}' for i in range(self.empty_cameras))

    def policy_level_problems(self) -> Optional[str]:
        """The first inconsistency among the policy-level fields, or None (the config raises it)."""
        if self.state_dim > self.max_state_dim or self.action_dim > self.max_action_dim:
            return 'state_dim/action_dim exceed max_state_dim/max_action_dim'
        if self.n_action_steps > self.chunk_size:
            return 'n_action_steps must not exceed chunk_size'
        if not 0 <= self.rtc_training_max_delay < self.chunk_size:
            return f'rtc_training_max_delay must be in [0, chunk_size), got {self.rtc_training_max_delay}'
        if self.use_relative_actions and self.state_dim < self.action_dim:
            # lerobot adds state[:action_dim] back (to_absolute_actions); a shorter state fails there
            # with a broadcast error at the first chunk. Refuse at load instead.
            return (f'use_relative_actions needs a state at least as long as the action: state_dim '
                    f'{self.state_dim} < action_dim {self.action_dim}')
        return None

    def kv_entry_bytes(self, dtype_bytes: int) -> int:
        """Analytic bytes of the K/V tensors of one cache entry (the family's ``extra`` included)."""
        raise NotImplementedError

    def cache_entry_bytes(self, dtype_bytes: int) -> int:
        """Analytic device bytes of one cache entry, every tensor: K/V (+ extra) and the bool pad mask [1, P]."""
        return self.kv_entry_bytes(dtype_bytes) + self.prefix_len


def check_prefix_inputs(config: PolicyLevelConfig, images: torch.Tensor, image_masks: torch.Tensor,
                        tokens: torch.Tensor, token_masks: torch.Tensor) -> None:
    """fill_prefix's inputs against the config: images [B, N, 3, H, W], image_masks [B, N], tokens [B, L]."""
    cameras = len(config.all_camera_names)
    height, width = config.image_resolution
    if images.dim() != 5 or tuple(images.shape[1:]) != (cameras, 3, height, width):
        raise ValueError(f'images must be [B, {cameras}, 3, {height}, {width}], got {tuple(images.shape)}')
    if tuple(image_masks.shape) != (images.shape[0], cameras):
        raise ValueError(f'image_masks must be [B, {cameras}], got {tuple(image_masks.shape)}')
    # Up to tokenizer_max_length: a prompt bucket (fast_path.fit_to_bucket) drops masked padding only.
    if tokens.shape != token_masks.shape or not 0 < tokens.shape[1] <= config.tokenizer_max_length:
        raise ValueError(f'tokens and token_masks must be [B, <= {config.tokenizer_max_length}], '
                         f'got {tuple(tokens.shape)} and {tuple(token_masks.shape)}')


def check_chunk_inputs(config: PolicyLevelConfig, context: PrefixContext, noise: torch.Tensor,
                       num_steps: Optional[int]) -> int:
    """The denoise's step count (None: the config's) and noise [B, H, max_action_dim]; ValueError otherwise."""
    steps = int(num_steps or config.num_inference_steps)
    if steps < 1:
        raise ValueError(f'num_steps must be >= 1, got {steps}')
    expected = (context.batch_size, config.chunk_size, config.max_action_dim)
    if tuple(noise.shape) != expected:
        raise ValueError(f'noise must be {list(expected)}, got {list(noise.shape)}')
    return steps


class PolicyFamily(ABC):
    """One loaded policy of one family: config, model, normalisers, tokenizer and the four model calls.

    Subclasses set ``type_name`` (lerobot's config.json ``type``) and implement the
    class-level ``load`` and the instance calls. ``options`` are the family's own
    switches (``option_defaults`` names them); asking a family for an option it does
    not have (with a non-default value) is refused by name.
    """

    type_name: ClassVar[str] = ''
    # Capability: the normalised state is part of the prompt tokens (pi0.5), so a state change is a
    # different prefix. False: the state stays out of the prefix and its cache key.
    state_in_prompt: ClassVar[bool] = False
    # The family's own load options and their defaults (runtime keyword arguments pass through).
    option_defaults: ClassVar[Mapping[str, Any]] = {}
    # The nn.Module class the family's config builds and its tokenizer class (``from_path``), for
    # random-weight checkpoints and benchmarks.
    model_class: ClassVar[Any] = None
    tokenizer_class: ClassVar[Any] = None

    def __init__(self, config: Any, model: torch.nn.Module, state_normalizer: FeatureNormalizer,
                 action_normalizer: FeatureNormalizer, tokenizer: Any, weights_path: Path,
                 **options: Any) -> None:
        self.config = config
        self.model = model
        self.state_normalizer = state_normalizer
        self.action_normalizer = action_normalizer
        self.tokenizer = tokenizer
        self.weights_path = Path(weights_path)
        self.options: Dict[str, Any] = self.checked_options(options)

    @classmethod
    def checked_options(cls, options: Mapping[str, Any]) -> Dict[str, Any]:
        """The family's options with defaults filled in; an option of another family set away from
        its off value (False / None) is a ValueError naming it."""
        foreign = sorted(name for name, value in options.items()
                         if name not in cls.option_defaults and value not in (None, False))
        if foreign:
            raise ValueError(f'{", ".join(foreign)} is set, but the checkpoint is {cls.type_name}: '
                             'it does not apply to this policy family')
        return {name: options.get(name, default) for name, default in cls.option_defaults.items()}

    # ---- loading ---------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def parse_config(cls, raw: Mapping[str, Any]) -> Any:
        """config.json content -> the family config, every field classified (unknown ones refused)."""

    @classmethod
    @abstractmethod
    def load_checkpoint(cls, folder: Path, raw: Mapping[str, Any], device: torch.device,
                        dtype: torch.dtype) -> Any:
        """Config (from config.json ``raw``), strict weights and statistics -> checkpoint.LoadedCheckpoint."""

    # Where the tokenizer comes from, for the error when a folder has none.
    tokenizer_hint: ClassVar[str] = ''

    @classmethod
    def config_fields(cls) -> Mapping[str, Any]:
        """config.json field -> its ConfigField (how it is handled) for this family: the checkpoint doctor lists
        every refusal from it, where parse_config stops at the first."""
        return {}

    @classmethod
    def folder_config(cls, folder: Path, raw: Mapping[str, Any]) -> Any:
        """The family config of a folder, from config.json ``raw`` and whatever else the family reads beside it
        (no weights); ConfigError / CheckpointError as ``load_checkpoint`` gives them."""
        return cls.parse_config(raw)

    @classmethod
    def load(cls, folder: Path, device: torch.device, dtype: torch.dtype,
             tokenizer_path: Optional[Path] = None, **options: Any) -> 'PolicyFamily':
        """A lerobot ``pretrained_model/`` folder -> a loaded policy (strict: refusals name what is wrong)."""
        from .checkpoint import read_config_json
        options = cls.checked_options(options)     # refuse another family's option before loading anything
        loaded = cls.load_checkpoint(folder, read_config_json(folder), device, dtype)
        tokenizer_file = tokenizer_path or loaded.tokenizer_path
        if tokenizer_file is None:
            raise TokenizerError(f'{folder} has no tokenizer/ folder; pass tokenizer_path= pointing at '
                                 f'{cls.tokenizer_hint}, or run `vla_policy_check_checkpoint {folder}`: it prints '
                                 'the command that fetches it')
        tokenizer = cls.tokenizer_class.from_path(tokenizer_file)
        if tokenizer.vocab_size > loaded.config.vocab_size:
            raise TokenizerError(f'tokenizer {tokenizer_file} has {tokenizer.vocab_size} tokens, more than the '
                                 f'model embedding ({loaded.config.vocab_size})')
        return cls(loaded.config, loaded.model, loaded.state_normalizer, loaded.action_normalizer, tokenizer,
                   loaded.weights_path, **options)

    # ---- device ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.model.compute_dtype

    # ---- the model calls -----------------------------------------------------------------------
    @abstractmethod
    def prompt_tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int64 [L], mask bool [L]) as lerobot's pre-processor makes them."""

    @abstractmethod
    def image_to_model(self, unit: torch.Tensor) -> torch.Tensor:
        """A decoded frame [3, H, W] in [0, 1] on the device -> [3, h, w] in [-1, 1] at the model resolution."""

    def empty_image(self) -> torch.Tensor:
        """What a masked camera slot gets: all -1 at the model resolution (lerobot's empty cameras)."""
        return empty_camera_image(self.config.image_resolution, self.device)

    def fill_prefix(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                    token_masks: torch.Tensor) -> PrefixContext:
        """images [B, N, 3, h, w]; image_masks [B, N]; tokens, token_masks [B, L] -> read-only context.
        By default the model's own ``fill_prefix``."""
        return self.model.fill_prefix(images, image_masks, tokens, token_masks)

    def denoise(self, context: PrefixContext, state: torch.Tensor, noise: torch.Tensor, num_steps: int, *,
                prev_chunk_left_over: Optional[torch.Tensor] = None, inference_delay: int = 0,
                execution_horizon: Optional[int] = None, rtc: Optional[RTCSettings] = None) -> torch.Tensor:
        """state [B, max_state_dim] (normalised, zero-padded); noise [B, H, max_action_dim]
        -> normalised actions [B, H, max_action_dim] fp32. ``context`` is never written.

        By default the model's two halves: ``chunk_setup`` (everything fixed for the chunk: K/V workspace,
        the state part, time terms, RTC guide) then ``euler_loop`` (the per-step loop alone)."""
        chunk = self.model.chunk_setup(context, state, noise, num_steps, prev_chunk_left_over=prev_chunk_left_over,
                                       inference_delay=inference_delay, execution_horizon=execution_horizon, rtc=rtc)
        return self.model.euler_loop(chunk)

    def describe(self) -> Dict[str, Any]:
        """What /diagnostics and the replay summary show about the policy."""
        cfg = self.config
        element = torch.tensor([], dtype=self.compute_dtype).element_size()
        return {'policy_type': cfg.policy_type, 'cameras': list(cfg.all_camera_names),
                'prefix_len': cfg.prefix_len, 'cache_entry_bytes': cfg.cache_entry_bytes(element),
                'state_in_prompt': self.state_in_prompt, **{k: v for k, v in self.options.items()}}
