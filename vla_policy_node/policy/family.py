"""The policy-family seam: everything the rest of the package asks of a family, its model and its config.

A family is a folder under ``policy/families/`` (config and field table, model, tokenizer, adapter) with one
``PolicyFamily`` subclass and one registry line (``families/__init__.py``); docs/architecture.md says what a
new one adds. The runtime, fast path, cache, doctor, tiny-checkpoint writer, demo, server and benchmarks
talk to the three declarations of this module only and never test the type string; where families differ
in what the runtime must do, a capability says so (``state_in_prompt``). Nothing here knows a family.

    raw observation --runtime--> (cameras, normalised state, instruction)
      prompt_tokens(instruction, state)      -> ids, mask              (tokens go into the cache key)
      image_to_model(unit)                   -> [3, h, w] in [-1, 1]   (cache miss only)
      fill_prefix(images, masks, ids, mask)  -> PrefixContext          (cache miss only; read-only after)
      denoise(context, state, noise, steps)  -> normalised actions [B, H, max_action_dim] fp32
        = euler_loop(chunk_setup(...))       (the fast path: chunk_setup(workspace=) over workspace_spec's
                                              buffers, the loop captured as one CUDA graph)

- ``PolicyLevelConfig``: what every family config offers (``POLICY_LEVEL_FIELDS``, the byte counts); the
  parameter table, the tick, the replay, the doctor and the remote backend read these and nothing else.
- ``PolicyModel``: the nn.Module a config builds (``PolicyFamily.model_class``): the four model calls, the
  mixed precision the checkpoint reader and the doctor ask for, and the shared start of every chunk.
- ``PolicyFamily``: one loaded policy (config, model, normalisers, tokenizer, options) and the class-level
  knowledge of the family: parsing and loading, writing random-weight checkpoints, its tokenizer's source,
  presets and FLOP counts for the benchmarks.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from ..cache.context import PrefixContext
from .checkpoint import LoadedCheckpoint, WeightKeys, read_config_json
from .layers import MixedPrecisionPolicy
from .normalize import FeatureNormalizer
from .preprocess import empty_camera_image
from .rtc import RTCGuide, RTCSettings, prepare_guide
from .tokenizer import TokenizerError

# lerobot names the padding cameras it adds for `empty_cameras` like this.
EMPTY_CAMERA_PREFIX = 'empty_camera_'

# The fields (or properties) every family config offers, besides the byte counts (kv_entry_bytes,
# cache_entry_bytes): PolicyLevelConfig documents each.
POLICY_LEVEL_FIELDS = (
    'policy_type', 'camera_names', 'all_camera_names', 'empty_cameras', 'image_resolution', 'chunk_size',
    'n_action_steps', 'state_dim', 'action_dim', 'max_state_dim', 'max_action_dim', 'num_inference_steps',
    'tokenizer_max_length', 'normalization_mapping', 'rtc_training_max_delay', 'use_relative_actions',
    'relative_exclude_joints', 'action_feature_names', 'tokens_per_image', 'prefix_len', 'num_prefix_layers',
    'vocab_size',
)


# ---- the config --------------------------------------------------------------------------------------------

def _mean_std_mapping() -> Dict[str, str]:
    return {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'}


@dataclass(frozen=True, kw_only=True)
class PolicyLevelConfig:
    """Base of every family config dataclass: the policy-level fields, their shared checks, the byte counts.

    The fields every family has, declared once here (a family redeclares one only to give it its own default;
    every field is keyword-only):

    - ``policy_type``: lerobot's config.json ``type``; ``camera_names``: the checkpoint's cameras in model
      order; ``empty_cameras``: masked placeholder slots after them; ``image_resolution``: (height, width)
      at the model.
    - ``chunk_size``: actions per chunk; ``n_action_steps``: how many lerobot executes (<= chunk_size);
      ``num_inference_steps``: Euler steps by default.
    - ``state_dim`` / ``action_dim``: the robot's; ``max_state_dim`` / ``max_action_dim``: padded to, at the
      model; ``normalization_mapping``: lerobot's modes per feature type.
    - ``tokenizer_max_length``: prompt tokens (the prefix pads to it).
    - ``rtc_training_max_delay``: > 0 when trained for real-time chunking; ``use_relative_actions``,
      ``relative_exclude_joints``, ``action_feature_names``: lerobot's relative actions.

    and what the family's architecture gives (a field or a property of the subclass): ``vocab_size`` (the
    embedding's rows), ``tokens_per_image``, ``prefix_len`` (the cached prefix: image slots x tokens + prompt
    tokens), ``num_prefix_layers`` (layers of the stack the prefix runs through), ``kv_entry_bytes``.
    """

    policy_type: str
    camera_names: Tuple[str, ...]
    empty_cameras: int = 0
    image_resolution: Tuple[int, int]                       # (height, width)
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    state_dim: int
    action_dim: int
    num_inference_steps: int = 10
    tokenizer_max_length: int = 48
    normalization_mapping: Mapping[str, str] = field(default_factory=_mean_std_mapping)
    # Trained real-time chunking: the checkpoint learned to continue a clean prefix of up to this many
    # actions (lerobot PI05Config.rtc_training_max_delay); 0: only guided RTC.
    rtc_training_max_delay: int = 0
    # lerobot relative actions (policy/relative_actions.py): offsets from the raw state on masked joints.
    use_relative_actions: bool = False
    relative_exclude_joints: Tuple[str, ...] = ()
    action_feature_names: Optional[Tuple[str, ...]] = None

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
        """Analytic bytes of the K/V tensors of one cache entry (the family's ``extra`` tensors included)."""
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


# ---- the model ---------------------------------------------------------------------------------------------

# What a workspace is made of: per buffer, the entry's prefix tensor [.., P, D] and the full token length.
WorkspaceSpec = Tuple[Tuple[torch.Tensor, int], ...]


@dataclass
class ChunkStart:
    """What every chunk starts from: the checked step count, the K/V workspace (one buffer per
    ``workspace_spec`` entry, its prefix part holding the entry's), the RTC guide or None, the noise in fp32."""

    num_steps: int
    workspace: Tuple[torch.Tensor, ...]
    guide: Optional[RTCGuide]
    noise: torch.Tensor


def chunk_workspace(spec: WorkspaceSpec, workspace: Optional[Sequence[torch.Tensor]] = None
                    ) -> Tuple[torch.Tensor, ...]:
    """The buffers a chunk writes its suffix into: ``workspace`` (caller-owned, already holding the prefix:
    the static workspace of fast_path.py), checked against ``spec``; or new ones with the prefix copied in,
    so the stored context is never written."""
    shapes = [((*source.shape[:-2], int(length), source.shape[-1]), source.dtype) for source, length in spec]
    if workspace is None:
        buffers = []
        for (source, _), (shape, _) in zip(spec, shapes):
            buffer = source.new_empty(shape)
            buffer[..., :source.shape[-2], :] = source
            buffers.append(buffer)
        return tuple(buffers)
    if len(workspace) != len(spec) or any(tuple(buffer.shape) != shape or buffer.dtype != dtype
                                          for buffer, (shape, dtype) in zip(workspace, shapes)):
        raise ValueError(f'workspace must be {[(list(shape), dtype) for shape, dtype in shapes]}, got '
                         f'{[(list(buffer.shape), buffer.dtype) for buffer in workspace]}')
    return tuple(workspace)


class PolicyModel(MixedPrecisionPolicy):
    """The nn.Module a family config builds: inference only, module names as lerobot's checkpoint keys.

    The runtime and the fast path call the four model calls (``fill_prefix``, ``workspace_spec``,
    ``chunk_setup``, ``euler_loop``; ``denoise`` and ``sample_actions`` are built from them here); the
    checkpoint reader and the doctor call ``param_dtype`` (which parameters stay fp32 under a bf16 compute
    dtype) and ``set_compute_dtype``; ``device`` and ``compute_dtype`` say where and how it runs.
    ``config`` is the family config it was built from.
    """

    config: Any

    def fill_prefix(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                    token_masks: torch.Tensor) -> PrefixContext:
        """images [B, N, 3, H, W] in [-1, 1]; image_masks [B, N] bool; tokens, token_masks [B, L] -> the
        read-only context of the prefix (per-layer K/V, the pad mask, the family's named ``extra``)."""
        raise NotImplementedError

    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The K/V workspaces the loop reads: per buffer the entry's prefix tensor [.., P, D] and the length
        [.., P + suffix, D] it is extended to (fast_path.py allocates them once per shape)."""
        raise NotImplementedError

    def chunk_setup(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                    num_steps: Optional[int] = None, *, prev_chunk_left_over: Optional[torch.Tensor] = None,
                    inference_delay: int = 0, execution_horizon: Optional[int] = None,
                    rtc: Optional[RTCSettings] = None, workspace: Optional[Sequence[torch.Tensor]] = None) -> Any:
        """Everything fixed for one chunk (eager, may synchronise): ``start_chunk``'s part, then the family's
        state part in the workspace, the suffix layout and the time terms. ``workspace``: buffers as
        ``workspace_spec`` describes them whose prefix parts already hold the entry (nothing is copied then).
        Returns the chunk ``euler_loop`` takes: a dataclass of tensors and plain values (fast_path.py treats it
        as a graph's static inputs)."""
        raise NotImplementedError

    def euler_loop(self, chunk: Any) -> torch.Tensor:
        """Every Euler step (and RTC's guidance) from the chunk's tensors only -> normalised actions
        [B, H, max_action_dim] fp32. No host synchronisation, no Python branch on a tensor value: it is
        captured as one CUDA graph."""
        raise NotImplementedError

    def start_chunk(self, context: PrefixContext, noise: torch.Tensor, num_steps: Optional[int],
                    workspace: Optional[Sequence[torch.Tensor]], *, prev_chunk_left_over: Optional[torch.Tensor],
                    inference_delay: int, execution_horizon: Optional[int], rtc: Optional[RTCSettings]) -> ChunkStart:
        """The part of ``chunk_setup`` every family shares: the inputs checked, the workspace (new, with the
        prefix copied in, or the caller's, checked), the RTC guide for the previous chunk's leftover."""
        steps = check_chunk_inputs(self.config, context, noise, num_steps)
        buffers = chunk_workspace(self.workspace_spec(context), workspace)
        guide = prepare_guide(prev_chunk_left_over, noise, steps, inference_delay, execution_horizon, rtc,
                              self.config.rtc_training_max_delay)
        return ChunkStart(steps, buffers, guide, noise.float())

    @torch.no_grad()
    def denoise(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                num_steps: Optional[int] = None, *, prev_chunk_left_over: Optional[torch.Tensor] = None,
                inference_delay: int = 0, execution_horizon: Optional[int] = None,
                rtc: Optional[RTCSettings] = None) -> torch.Tensor:
        """Flow-matching Euler integration against a read-only prefix: ``chunk_setup`` then ``euler_loop``.

        state [B, max_state_dim] (normalised, zero-padded; a family that takes the state through the prompt
        ignores it); noise [B, H, max_action_dim]. With ``rtc`` and a previous chunk's unexecuted actions
        (normalised, [T, A'] or [B, T, A']), the chunk continues them (policy/rtc.py: guided or trained mode,
        d = inference_delay, E = execution_horizon); without, the loop is exactly the plain one.
        Returns normalised actions [B, H, max_action_dim] in fp32. ``context`` is never written.
        """
        chunk = self.chunk_setup(context, state, noise, num_steps, prev_chunk_left_over=prev_chunk_left_over,
                                 inference_delay=inference_delay, execution_horizon=execution_horizon, rtc=rtc)
        return self.euler_loop(chunk)

    def sample_actions(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor,
                       token_masks: torch.Tensor, state: Optional[torch.Tensor], noise: Optional[torch.Tensor] = None,
                       num_steps: Optional[int] = None, **continuation: Any) -> torch.Tensor:
        """Reference-shaped call: prefix then denoise (same RTC keywords; noise None: standard normal).
        Returns normalised actions [B, H, max_action_dim]."""
        context = self.fill_prefix(images, image_masks, tokens, token_masks)
        if noise is None:
            noise = torch.randn(images.shape[0], self.config.chunk_size, self.config.max_action_dim,
                                device=self.device)
        return self.denoise(context, state, noise, num_steps, **continuation)


# ---- the family ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenizerSource:
    """Where a family's tokenizer comes from when a folder has none (the doctor's fetch command)."""

    file_name: str          # the file the family reads from tokenizer/ (tokenizer.model, tokenizer.json)
    hub_name: str           # the Hub repository lerobot's tokenizer step names when the checkpoint does not
    access_note: str = ''   # what to do first (a gated repository's licence), or '' for a generic note


class PolicyFamily(ABC):
    """One loaded policy of one family: config, model, normalisers, tokenizer and the model calls.

    Subclasses set ``type_name`` (lerobot's config.json ``type``) and the class attributes below, and
    implement the class-level ``parse_config`` / ``load_checkpoint`` / ``save_checkpoint`` and the instance
    calls ``prompt_tokens`` / ``image_to_model``. ``options`` are the family's own switches
    (``option_defaults`` names them); an option of another family with a non-default value is refused by
    name (an option no family has is refused as unknown by the registry, ``families.load_policy``).
    """

    type_name: ClassVar[str] = ''
    # Capability: the normalised state is part of the prompt tokens (pi0.5), so a state change is a
    # different prefix. False: the state stays out of the prefix and its cache key.
    state_in_prompt: ClassVar[bool] = False
    # The family's own load options and their defaults (runtime keyword arguments pass through).
    option_defaults: ClassVar[Mapping[str, Any]] = {}
    # The PolicyModel class the family's config builds, and its tokenizer class (``from_path``, ``vocab_size``,
    # ``identity``), for loading, random-weight checkpoints, the doctor and the benchmarks.
    model_class: ClassVar[Any] = None
    tokenizer_class: ClassVar[Any] = None
    # How model.safetensors keys map onto the model's (renames, tensors known to be unused, tied stand-ins).
    weight_keys: ClassVar[WeightKeys] = WeightKeys()
    # Where the tokenizer comes from, for the error when a folder has none.
    tokenizer_hint: ClassVar[str] = ''
    # Capability: the denoise is ``chunk_setup(workspace=)`` + ``euler_loop`` over ``workspace_spec``'s buffers,
    # so the fast path can run it in its static workspace and capture the loop (fast_path.denoise_program).
    # A family whose denoise is something else overrides ``denoise`` and sets False: it then runs eagerly.
    capturable_denoise: ClassVar[bool] = True
    # The named configurations ``preset`` builds (benchmarks); names are unique across the registry. Smallest
    # first, the real shape last (bench/quant_accuracy.py measures the one or the other).
    preset_names: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, config: Any, model: PolicyModel, state_normalizer: FeatureNormalizer,
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
    def parse_config(cls, raw: Mapping[str, Any]) -> PolicyLevelConfig:
        """config.json content -> the family config, every field classified (unknown ones refused)."""

    @classmethod
    @abstractmethod
    def load_checkpoint(cls, folder: Path, raw: Mapping[str, Any], device: torch.device,
                        dtype: torch.dtype) -> LoadedCheckpoint:
        """Config (from config.json ``raw``), strict weights and statistics -> checkpoint.LoadedCheckpoint."""

    @classmethod
    def config_fields(cls) -> Mapping[str, Any]:
        """config.json field -> its ConfigField (how it is handled) for this family: the checkpoint doctor lists
        every refusal from it, where parse_config stops at the first."""
        return {}

    @classmethod
    def folder_config(cls, folder: Path, raw: Mapping[str, Any]) -> PolicyLevelConfig:
        """The family config of a folder, from config.json ``raw`` and whatever else the family reads beside it
        (no weights); ConfigError / CheckpointError as ``load_checkpoint`` gives them."""
        return cls.parse_config(raw)

    @classmethod
    def tokenizer_source(cls, config: PolicyLevelConfig, hub_name: Optional[str] = None) -> TokenizerSource:
        """The tokenizer file this family reads and the Hub repository it comes from, for ``config``:
        ``hub_name`` (what the checkpoint's pre-processor names, when it does) or the family's default, with the
        note that repository needs (a gated licence)."""
        raise NotImplementedError

    @classmethod
    def load(cls, folder: Path, device: torch.device, dtype: torch.dtype,
             tokenizer_path: Optional[Path] = None, **options: Any) -> 'PolicyFamily':
        """A lerobot ``pretrained_model/`` folder -> a loaded policy (strict: refusals name what is wrong)."""
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

    # ---- writing random-weight checkpoints (the embedded tiny default, tests, benchmarks) ---------------------
    @classmethod
    def tiny_config(cls, **overrides: Any) -> PolicyLevelConfig:
        """The family's tiny configuration (a few hundred thousand parameters): tests, the demo, builtin:tiny."""
        raise NotImplementedError

    @classmethod
    def build_test_tokenizer(cls, folder: Path, vocab_size: int) -> Path:
        """Train a small tokenizer of the family's kind into ``folder`` (deterministic, no download) and return
        its file (what ``tokenizer_class.from_path`` reads)."""
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def save_checkpoint(cls, folder: Path, model: PolicyModel, state_stats: Mapping[str, np.ndarray],
                        action_stats: Mapping[str, np.ndarray], tokenizer_file: Optional[Path] = None) -> Path:
        """Write ``model`` as a lerobot ``pretrained_model/`` folder of this family (config.json, weights with
        the tensors real folders carry, processor files with the statistics, the tokenizer under tokenizer/)."""

    # ---- benchmarks -----------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, depth: Optional[int] = None) -> PolicyLevelConfig:
        """The configuration ``name`` of ``preset_names``; ``depth``: layers per tower for a preset cut in
        depth (the others ignore it)."""
        raise NotImplementedError

    @classmethod
    def stage_flops(cls, config: PolicyLevelConfig, num_steps: int) -> Dict[str, int]:
        """{'prefix': FLOPs of a miss's prefix, 'denoise': FLOPs of one chunk's denoise}, from the config alone:
        every matrix product the implementation runs, 2 FLOPs per multiply-add (bench/flops.py)."""
        raise NotImplementedError

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

    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The model's ``workspace_spec`` (the fast path sizes its static workspace from it)."""
        return self.model.workspace_spec(context)

    def chunk_setup(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                    num_steps: Optional[int] = None, **continuation: Any) -> Any:
        """The model's ``chunk_setup`` (RTC keywords and ``workspace=`` as there)."""
        return self.model.chunk_setup(context, state, noise, num_steps, **continuation)

    def euler_loop(self, chunk: Any) -> torch.Tensor:
        """The model's ``euler_loop``: what the fast path captures as one CUDA graph."""
        return self.model.euler_loop(chunk)

    def denoise(self, context: PrefixContext, state: torch.Tensor, noise: torch.Tensor, num_steps: int, *,
                prev_chunk_left_over: Optional[torch.Tensor] = None, inference_delay: int = 0,
                execution_horizon: Optional[int] = None, rtc: Optional[RTCSettings] = None) -> torch.Tensor:
        """state [B, max_state_dim] (normalised, zero-padded); noise [B, H, max_action_dim]
        -> normalised actions [B, H, max_action_dim] fp32. ``context`` is never written.

        ``chunk_setup`` (everything fixed for the chunk: K/V workspace, the state part, time terms, RTC guide)
        then ``euler_loop`` (the per-step loop alone)."""
        chunk = self.chunk_setup(context, state, noise, num_steps, prev_chunk_left_over=prev_chunk_left_over,
                                 inference_delay=inference_delay, execution_horizon=execution_horizon, rtc=rtc)
        return self.euler_loop(chunk)

    def describe(self) -> Dict[str, Any]:
        """What /diagnostics and the replay summary show about the policy."""
        cfg = self.config
        element = torch.tensor([], dtype=self.compute_dtype).element_size()
        return {'policy_type': cfg.policy_type, 'cameras': list(cfg.all_camera_names),
                'prefix_len': cfg.prefix_len, 'cache_entry_bytes': cfg.cache_entry_bytes(element),
                'state_in_prompt': self.state_in_prompt, **{k: v for k, v in self.options.items()}}
