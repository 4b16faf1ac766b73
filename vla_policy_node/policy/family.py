"""The policy-family seam: everything the rest of the package asks of a family, its model and its config.

A family is a folder under ``policy/families/`` (config and field table, model, tokenizer, adapter) with one
``PolicyFamily`` subclass and one registry line (``families/__init__.py``); docs/architecture.md says what a
new one adds. The runtime, fast path, cache, doctor, tiny-checkpoint writer, demo, server and benchmarks
talk to the declarations of this module only and never test the type string; where families differ in what
the runtime must do, a capability says so (``FamilyCapabilities``). Nothing here knows a family.

    raw observation --runtime--> (decoded frames by camera, raw and normalised state, instruction)
      prompt_tokens(instruction, state)        -> ids, mask     (the cache key: frame bytes, tokens, processor)
      prefix_inputs(frames, ids, mask)         -> the family's prefix inputs         (cache miss only)
      fill_prefix(*inputs)                     -> PrefixContext (cache miss only; read-only after)
      denoise(context, state, noise, steps, embodiment=, rtc keywords)  -> model-space actions [B, H, A]
        = euler_loop(chunk_setup(...))         (the fast path: chunk_setup(workspace=) over workspace_spec's
                                                buffers, the loop captured as one CUDA graph)
      postprocess(actions[0], raw state)       -> robot-unit actions [H, action_dim]

The interface is declared once, here, and checked when a class is DEFINED (``DeclaredInterface``): every
member is either abstract (``__abstractmethods__`` of the three bases lists them) or has one default here;
``PolicyFamily``'s required class attributes are its ``ClassVar`` annotations without a value. A subclass
that misses one fails at its ``class`` statement, naming what is missing, so the registry's class-level
calls (``preset``, ``folder_config``) never meet a half-made family. An intermediate base that is abstract
on purpose says so: ``class Base(PolicyFamily, abstract=True)``.

- ``PolicyLevelFields``: the fields every policy offers, a remote one too (remote_settings.RemoteConfig); the
  parameter table, the tick, the replay, the doctor and the remote backend read these and nothing else.
- ``PolicyLevelConfig``: a family config, those fields plus what its architecture gives (sizes, bytes).
- ``PolicyModel``: the nn.Module a config builds (``PolicyFamily.model_class``): the four model calls, the
  device, the action side's modules, and what every chunk shares (start, RTC guide, denoise).
- ``PolicyFamily``: one loaded policy (config, model, normalisers, tokenizer, options) with its pre- and
  post-processing, and the class-level knowledge of the family: parsing and loading, writing random-weight
  checkpoints, its tokenizer's source, presets and FLOP counts for the benchmarks.
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ..cache.context import PrefixContext
from . import action_space
from .checkpoint import (LoadedCheckpoint, WeightKeys, check_relative_action_steps, find_tokenizer,
                         load_normalizers, read_config_json)
from .layers import MixedPrecisionPolicy
from .normalize import FeatureNormalizer
from .rtc import RTC_MODES, RTCSettings, prepare_guide, stack_guides
from .tokenizer import TokenizerError

# lerobot names the padding cameras it adds for `empty_cameras` like this.
EMPTY_CAMERA_PREFIX = 'empty_camera_'


# ---- declared once, checked at definition --------------------------------------------------------------------

def abstract_members(cls: type) -> FrozenSet[str]:
    """The members of ``cls`` still abstract (as ABCMeta computes ``__abstractmethods__``, but usable while the
    class is being created, inside ``__init_subclass__``)."""
    found = set()
    for name in {name for klass in cls.__mro__ for name in vars(klass)}:
        owner = next(klass for klass in cls.__mro__ if name in vars(klass))
        if getattr(vars(owner)[name], '__isabstractmethod__', False):
            found.add(name)
    return frozenset(found)


def required_class_attributes(cls: type) -> FrozenSet[str]:
    """The class attributes ``cls`` and its bases declare without a value (``name: ClassVar[...]`` and no
    ``= ...`` in the declaring class): every concrete subclass gives them."""
    return frozenset(name for klass in cls.__mro__ for name, kind in vars(klass).get('__annotations__', {}).items()
                     if 'ClassVar' in str(kind) and name not in vars(klass))


class DeclaredInterface:
    """Mixin of the three bases: a concrete subclass that leaves an abstract member or a required class
    attribute unset is a TypeError when its class statement runs (lerobot's ``PreTrainedPolicy.__init_subclass__``
    does the same for its class attributes: ``src/lerobot/policies/pretrained.py`` at 7427f318)."""

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        missing = sorted(abstract_members(cls)) + sorted(name for name in required_class_attributes(cls)
                                                         if getattr(cls, name, None) is None)
        if missing:
            raise TypeError(f'{cls.__qualname__} does not implement {", ".join(missing)} (declared by '
                            'policy/family.py; a dataclass field of that name needs a default; a base that is '
                            'abstract on purpose: class X(Base, abstract=True))')


# ---- capabilities ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FamilyCapabilities:
    """What the runtime and the fast path must know a family does differently: data, never a type test.

    - ``state_in_prompt``: the normalised state is part of the prompt tokens (pi0.5's bins), so a state change
      is a different prefix and cache key. False: the state stays out of the prefix and its key (it reaches
      the model through ``chunk_setup``), so a joint-state change with the same frames and prompt is a hit.
    - ``capturable_denoise``: the denoise is ``chunk_setup(workspace=)`` + ``euler_loop`` over
      ``workspace_spec``'s buffers, so the fast path may run it in its static workspace and capture the loop.
      False: it runs eagerly (``denoise`` only).
    - ``capturable_prefix``: ``fill_prefix`` over inputs of one shape is one fixed computation (no host sync,
      no shape read from a tensor's values), so the fast path may capture it per input shape.
    - ``rtc_modes``: the ``RTCSettings.mode`` values the family's ``rtc_guide`` honours (policy/rtc.py
      RTC_MODES); the runtime refuses another one by name. Empty: no real-time chunking at all.
    """

    state_in_prompt: bool = False
    capturable_denoise: bool = True
    capturable_prefix: bool = True
    rtc_modes: Tuple[str, ...] = ('guided', 'trained')

    def __post_init__(self) -> None:
        unknown = [mode for mode in self.rtc_modes if mode not in RTC_MODES]
        if unknown:
            raise ValueError(f'rtc_modes {unknown} are not modes of policy/rtc.py ({RTC_MODES})')


# ---- the config ----------------------------------------------------------------------------------------------

def _mean_std_mapping() -> Dict[str, str]:
    return {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'}


@dataclass(frozen=True, kw_only=True)
class PolicyLevelFields:
    """The fields every policy offers, local or remote, declared once (a subclass redeclares one only to give it
    its own default; every field is keyword-only):

    - ``policy_type``: lerobot's config.json ``type``; ``camera_names``: the checkpoint's cameras in model
      order; ``empty_cameras``: masked placeholder slots after them; ``image_resolution``: (height, width)
      at the model.
    - ``chunk_size``: actions per chunk; ``n_action_steps``: how many lerobot executes (<= chunk_size);
      ``num_inference_steps``: Euler steps by default.
    - ``state_dim`` / ``action_dim``: the robot's; ``max_state_dim`` / ``max_action_dim``: padded to, at the
      model; ``normalization_mapping``: lerobot's modes per feature type.
    - ``tokenizer_max_length``: prompt tokens (the prefix pads to it; a family whose prompt varies: its bound).
    - ``rtc_training_max_delay``: > 0 when trained for real-time chunking; ``use_relative_actions``,
      ``relative_exclude_joints``, ``action_feature_names``: lerobot's relative actions.
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


@dataclass(frozen=True, kw_only=True)
class PolicyLevelConfig(PolicyLevelFields, DeclaredInterface, ABC, abstract=True):
    """Base of every family config dataclass: the policy-level fields, and what the family's architecture gives.

    A subclass gives each abstract size as a property, or as a field with a default (a field without one
    cannot override a property here: the class statement says so).
    """

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Rows of the prompt embedding: a tokenizer with more tokens is refused at load."""

    @property
    @abstractmethod
    def tokens_per_image(self) -> int:
        """Prefix tokens one camera slot gives."""

    @property
    @abstractmethod
    def prefix_len(self) -> int:
        """Tokens of the largest cached prefix (its PREFIX sequence): image slots x tokens + prompt tokens."""

    @property
    @abstractmethod
    def num_prefix_layers(self) -> int:
        """Layers of the stack the prefix runs through (benchmarks, the doctor)."""

    @abstractmethod
    def kv_entry_bytes(self, dtype_bytes: int) -> int:
        """Analytic bytes of one cache entry's tensors besides its masks (K/V and the family's other tensors,
        each in the dtype the model stores it in; ``dtype_bytes``: the compute dtype's)."""

    def cache_entry_bytes(self, dtype_bytes: int) -> int:
        """Analytic device bytes of one cache entry, every tensor: ``kv_entry_bytes`` and the bool mask [1, P]
        (a family with more masks adds theirs)."""
        return self.kv_entry_bytes(dtype_bytes) + self.prefix_len


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


def check_embodiment(context: PrefixContext, embodiment: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The embodiment ids [B] int64 of a chunk (one per context row), or None; ValueError otherwise."""
    if embodiment is not None and (tuple(embodiment.shape) != (context.batch_size,)
                                   or embodiment.dtype != torch.int64):
        raise ValueError(f'embodiment must be int64 [{context.batch_size}], got {embodiment.dtype} '
                         f'{list(embodiment.shape)}')
    return embodiment


# ---- the model ---------------------------------------------------------------------------------------------

# What a workspace is made of: per buffer, one of the entry's tensors [.., P, D] and the full token length.
WorkspaceSpec = Tuple[Tuple[torch.Tensor, int], ...]
# A family's prefix inputs: its NamedTuple of tensors (batch first), passed positionally to fill_prefix.
PrefixInputs = Tuple[torch.Tensor, ...]


@dataclass
class ChunkStart:
    """What every chunk starts from: the checked step count, the workspace (one buffer per ``workspace_spec``
    entry, its prefix part holding the entry's), the family's RTC guide or None, the noise in fp32, the
    embodiment ids [B] or None."""

    num_steps: int
    workspace: Tuple[torch.Tensor, ...]
    guide: Optional[Any]
    noise: torch.Tensor
    embodiment: Optional[torch.Tensor] = None


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


class PolicyModel(MixedPrecisionPolicy, DeclaredInterface, ABC, abstract=True):
    """The nn.Module a family config builds: inference only, module names as lerobot's checkpoint keys.

    The runtime and the fast path call the four model calls (``fill_prefix``, ``workspace_spec``,
    ``chunk_setup``, ``euler_loop``; ``denoise`` and ``sample_actions`` are built from them here); the
    checkpoint reader and the doctor call ``param_dtype`` (which parameters stay fp32 under a bf16 compute
    dtype) and ``set_compute_dtype`` (layers.MixedPrecisionPolicy); ``device`` and ``compute_dtype`` say where
    and how it runs; ``action_expert`` is the action side's modules (policy/quant.py keeps them in the compute
    dtype under int8_weights).

    Time and real-time chunking are the family's: ``rtc_guide`` by default prepares policy/rtc.py's guided and
    trained modes for flow-matching time running from 1 (noise) to 0 (actions); a family integrating the
    other way, or continuing a chunk otherwise (inpainting), overrides it and lists its modes in
    ``FamilyCapabilities.rtc_modes`` (and ``stack_guides`` too, if its guide is not batch-first).
    """

    config: Any                   # the family config it was built from
    compute_dtype: torch.dtype    # set by __init__ and set_compute_dtype

    @abstractmethod
    def fill_prefix(self, *inputs: torch.Tensor) -> PrefixContext:
        """The family's prefix inputs (``PolicyFamily.prefix_inputs``, positionally, batch first) -> the
        read-only context every chunk of this observation reads (a K/V prefix, processed features, ...)."""

    @abstractmethod
    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The workspaces the loop reads: per buffer one of the entry's tensors [.., P, D] and the length
        [.., P + suffix, D] it is extended to (fast_path.py allocates them once per shape); () when the loop
        only reads the context."""

    @abstractmethod
    def chunk_setup(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                    num_steps: Optional[int] = None, *, prev_chunk_left_over: Optional[torch.Tensor] = None,
                    inference_delay: int = 0, execution_horizon: Optional[int] = None,
                    rtc: Optional[RTCSettings] = None, embodiment: Optional[torch.Tensor] = None,
                    workspace: Optional[Sequence[torch.Tensor]] = None) -> Any:
        """Everything fixed for one chunk (eager, may synchronise): ``start_chunk``'s part, then the family's
        state part in the workspace, the suffix layout and the time terms. ``embodiment`` [B] int64: each row's
        embodiment (per-embodiment action weights), None for a family with one set. ``workspace``: buffers as
        ``workspace_spec`` describes them whose prefix parts already hold the entry (nothing is copied then).
        Returns the chunk ``euler_loop`` takes: a dataclass of tensors and plain values (fast_path.py treats it
        as a graph's static inputs) whose ``guide`` field holds ``start_chunk``'s guide, nothing else in it made
        from that guide (a batch of robots sets its rows' guides, ``stack_guides``, there: runtime/batch.py)."""

    @abstractmethod
    def euler_loop(self, chunk: Any) -> torch.Tensor:
        """Every Euler step (and RTC) from the chunk's tensors only -> actions in the model's space
        [B, H, max_action_dim] fp32. No host synchronisation, no Python branch on a tensor value: it is
        captured as one CUDA graph."""

    @property
    @abstractmethod
    def action_expert(self) -> nn.Module:
        """The action side's modules (the weights every denoise step runs)."""

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return next(itertools.chain(self.parameters(), self.buffers())).device

    def rtc_guide(self, prev_chunk_left_over: Optional[torch.Tensor], noise: torch.Tensor, num_steps: int, *,
                  inference_delay: int, execution_horizon: Optional[int], rtc: Optional[RTCSettings]) -> Optional[Any]:
        """What ``euler_loop`` needs to continue the previous chunk's leftover (normalised, [T, A'] or
        [B, T, A']), or None (no leftover or RTC off: the loop is exactly the plain one); its tensors batch-first,
        a row per noise row (``stack_guides``). Default: policy/rtc.py, time from 1 to 0 (guided guidance, or the
        trained mode's clamped prefix)."""
        return prepare_guide(prev_chunk_left_over, noise, num_steps, inference_delay, execution_horizon, rtc,
                             self.config.rtc_training_max_delay)

    def stack_guides(self, guides: Sequence[Any]) -> Optional[Any]:
        """Several robots' guides (``rtc_guide``'s, each for noise of one row) as the guide of their stacked chunk,
        rows in order, or None when they cannot share one Euler loop (runtime/batch.py then denoises each robot
        alone). Default: policy/rtc.py's ``stack_guides``: a guide's tensors are batch-first, and guides of one
        structure and equal plain values are concatenated along that axis."""
        return stack_guides(guides)

    def start_chunk(self, context: PrefixContext, noise: torch.Tensor, num_steps: Optional[int],
                    workspace: Optional[Sequence[torch.Tensor]], *, prev_chunk_left_over: Optional[torch.Tensor],
                    inference_delay: int, execution_horizon: Optional[int], rtc: Optional[RTCSettings],
                    embodiment: Optional[torch.Tensor] = None) -> ChunkStart:
        """The part of ``chunk_setup`` every family shares: the inputs checked, the workspace (new, with the
        prefix copied in, or the caller's, checked), the RTC guide for the previous chunk's leftover."""
        steps = check_chunk_inputs(self.config, context, noise, num_steps)
        buffers = chunk_workspace(self.workspace_spec(context), workspace)
        guide = self.rtc_guide(prev_chunk_left_over, noise, steps, inference_delay=inference_delay,
                               execution_horizon=execution_horizon, rtc=rtc)
        return ChunkStart(steps, buffers, guide, noise.float(), check_embodiment(context, embodiment))

    @torch.no_grad()
    def denoise(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                num_steps: Optional[int] = None, **continuation: Any) -> torch.Tensor:
        """The chunk against a read-only context: ``chunk_setup`` then ``euler_loop``.

        state [B, max_state_dim] (normalised, zero-padded; a family that takes the state through the prompt
        ignores it); noise [B, H, max_action_dim]; ``continuation``: chunk_setup's keywords (the previous
        chunk's leftover with policy/rtc.py's settings, ``embodiment``). Returns actions in the model's space
        [B, H, max_action_dim] fp32. ``context`` is never written.
        """
        return self.euler_loop(self.chunk_setup(context, state, noise, num_steps, **continuation))

    def sample_actions(self, *inputs_and_state: Optional[torch.Tensor], noise: Optional[torch.Tensor] = None,
                       num_steps: Optional[int] = None, **continuation: Any) -> torch.Tensor:
        """Reference-shaped call: the prefix inputs (what ``fill_prefix`` takes) then the state, positionally;
        prefix then denoise (noise None: standard normal). Returns actions in the model's space [B, H, A]."""
        *inputs, state = inputs_and_state
        context = self.fill_prefix(*inputs)
        if noise is None:
            noise = torch.randn(context.batch_size, self.config.chunk_size, self.config.max_action_dim,
                                device=self.device)
        return self.denoise(context, state, noise, num_steps, **continuation)


# ---- the family ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenizerSource:
    """Where a family's tokenizer comes from when a folder has none (the doctor's fetch command)."""

    file_name: str          # the file the family reads from tokenizer/ (tokenizer.model, tokenizer.json)
    hub_name: str           # the Hub repository lerobot's tokenizer step names when the checkpoint does not
    access_note: str = ''   # what to do first (a gated repository's licence), or '' for a generic note
    # File patterns the fetch takes instead of ``file_name`` alone (huggingface-cli's --include), for a family
    # that reads a folder of files (a chat template and an image processor's settings beside the tokenizer).
    include: Tuple[str, ...] = ()


# One decoded camera frame per slot, in model order: (name, uint8 [H, W, 3] RGB, or None for a masked slot).
Frames = Sequence[Tuple[str, Optional[np.ndarray]]]


class PolicyFamily(DeclaredInterface, ABC, abstract=True):
    """One loaded policy of one family: config, model, normalisers, tokenizer, options, and its pre- and
    post-processing around the model calls.

    A subclass sets the class attributes declared below without a value and implements every abstract member;
    the rest has one default here. ``options`` are the family's own switches (``option_defaults`` names them);
    an option of another family with a non-default value is refused by name (an option no family has is
    refused as unknown by the registry, ``families.load_policy``).
    """

    # lerobot's config.json ``type`` of the checkpoints this family reads.
    type_name: ClassVar[str]
    # The PolicyModel subclass the family's config builds.
    model_class: ClassVar[type]
    # Its tokenizer class (``from_path``, ``vocab_size``, ``identity``): loading, random-weight checkpoints,
    # the doctor and the benchmarks.
    tokenizer_class: ClassVar[type]
    # Where the tokenizer comes from, for the error when a folder has none.
    tokenizer_hint: ClassVar[str]
    # The named configurations ``preset`` builds (benchmarks); names are unique across the registry. Smallest
    # first, the real shape last (bench/quant_accuracy.py measures the one or the other).
    preset_names: ClassVar[Tuple[str, ...]]
    # What the runtime and the fast path must know the family does differently.
    capabilities: ClassVar[FamilyCapabilities] = FamilyCapabilities()
    # The family's own load options and their off values (runtime keyword arguments pass through).
    option_defaults: ClassVar[Mapping[str, Any]] = {}
    # How model.safetensors keys map onto the model's (renames, tensors known to be unused, tied stand-ins).
    weight_keys: ClassVar[WeightKeys] = WeightKeys()

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(abstract=abstract, **kwargs)
        if abstract:
            return
        if not isinstance(cls.model_class, type) or not issubclass(cls.model_class, PolicyModel):
            raise TypeError(f'{cls.__qualname__}.model_class must be a PolicyModel subclass, got {cls.model_class!r}')
        if not isinstance(cls.capabilities, FamilyCapabilities):
            raise TypeError(f'{cls.__qualname__}.capabilities must be a FamilyCapabilities')
        if not (isinstance(cls.type_name, str) and cls.type_name and cls.tokenizer_hint and cls.preset_names):
            raise TypeError(f'{cls.__qualname__} needs a type_name, a tokenizer_hint and preset_names')

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
    def config_fields(cls) -> Mapping[str, Any]:
        """config.json field -> its ConfigField (how it is handled) for this family: the checkpoint doctor lists
        every refusal from it, where parse_config stops at the first."""

    @classmethod
    def folder_config(cls, folder: Path, raw: Mapping[str, Any]) -> PolicyLevelConfig:
        """The family config of a folder, from config.json ``raw`` and whatever else the family reads beside it
        (no weights); ConfigError / CheckpointError as ``load_checkpoint`` gives them."""
        return cls.parse_config(raw)

    @classmethod
    @abstractmethod
    def load_checkpoint(cls, folder: Path, raw: Mapping[str, Any], device: torch.device,
                        dtype: torch.dtype, tokenizer_path: Optional[Path] = None) -> LoadedCheckpoint:
        """Config (from config.json ``raw``), strict weights and statistics -> checkpoint.LoadedCheckpoint.
        ``tokenizer_path``: the tokenizer the user named (the node's parameter), for a family whose config reads
        settings beside its tokenizer (an image processor's); None: the one beside the folder, if any."""

    @classmethod
    def folder_normalizers(cls, folder: Path, config: PolicyLevelConfig) -> Tuple[Any, Any]:
        """The state and action normalisers of a folder's processor files (no weights; the doctor, a remote
        backend's statistics, the loaders); CheckpointError naming what is wrong. Default: lerobot's
        normalizer / unnormalizer steps, the relative-action steps checked against config.json."""
        state, action = load_normalizers(folder, config)
        check_relative_action_steps(folder, config)
        return state, action

    @classmethod
    def folder_tokenizer(cls, folder: Path, config: PolicyLevelConfig) -> Optional[Path]:
        """The tokenizer beside a folder (what ``tokenizer_class.from_path`` takes), or None. Default:
        <folder>/tokenizer/ (checkpoint.find_tokenizer)."""
        return find_tokenizer(folder)

    @classmethod
    @abstractmethod
    def tokenizer_source(cls, config: PolicyLevelConfig, hub_name: Optional[str] = None) -> TokenizerSource:
        """The tokenizer file this family reads and the Hub repository it comes from, for ``config``:
        ``hub_name`` (what the checkpoint's pre-processor names, when it does) or the family's default, with the
        note that repository needs (a gated licence)."""

    @classmethod
    def load(cls, folder: Path, device: torch.device, dtype: torch.dtype,
             tokenizer_path: Optional[Path] = None, **options: Any) -> 'PolicyFamily':
        """A lerobot ``pretrained_model/`` folder -> a loaded policy (strict: refusals name what is wrong)."""
        options = cls.checked_options(options)     # refuse another family's option before loading anything
        loaded = cls.load_checkpoint(folder, read_config_json(folder), device, dtype, tokenizer_path)
        tokenizer_file = tokenizer_path or loaded.tokenizer_path
        if tokenizer_file is None:
            where = loaded.tokenizer_problem or f'{folder} has no tokenizer/ folder'
            raise TokenizerError(f'{where}; pass tokenizer_path= pointing at {cls.tokenizer_hint}, or run '
                                 f'`vla_policy_check_checkpoint {folder}`: it prints the command that fetches it')
        tokenizer = cls.tokenizer_class.from_path(tokenizer_file)
        if tokenizer.vocab_size > loaded.config.vocab_size:
            raise TokenizerError(f'tokenizer {tokenizer_file} has {tokenizer.vocab_size} tokens, more than the '
                                 f'model embedding ({loaded.config.vocab_size})')
        cls.check_tokenizer(tokenizer, loaded.config, Path(tokenizer_file))
        return cls(loaded.config, loaded.model, loaded.state_normalizer, loaded.action_normalizer, tokenizer,
                   loaded.weights_path, **options)

    @classmethod
    def check_tokenizer(cls, tokenizer: Any, config: PolicyLevelConfig, path: Path) -> None:
        """What else a loaded tokenizer must agree on with the config (TokenizerError naming it); the vocabulary
        size is checked already. Default: nothing."""

    # ---- writing random-weight checkpoints (the embedded tiny default, tests, benchmarks) ---------------------
    @classmethod
    @abstractmethod
    def tiny_config(cls, **overrides: Any) -> PolicyLevelConfig:
        """The family's tiny configuration (a few hundred thousand parameters): tests, the demo, builtin:tiny."""

    @classmethod
    @abstractmethod
    def build_test_tokenizer(cls, folder: Path, vocab_size: int) -> Path:
        """Train a small tokenizer of the family's kind into ``folder`` (deterministic, no download) and return
        its file (what ``tokenizer_class.from_path`` reads)."""

    @classmethod
    @abstractmethod
    def preprocessor_steps(cls, config: PolicyLevelConfig) -> List[Dict[str, Any]]:
        """lerobot's pre-processor steps for ``config``, in its order (policy_preprocessor.json of a written
        folder; the normaliser's ``state_file`` is filled in by checkpoint.write_folder)."""

    @classmethod
    @abstractmethod
    def save_checkpoint(cls, folder: Path, model: PolicyModel, state_stats: Mapping[str, np.ndarray],
                        action_stats: Mapping[str, np.ndarray], tokenizer_file: Optional[Path] = None) -> Path:
        """Write ``model`` as a lerobot ``pretrained_model/`` folder of this family (config.json, weights with
        the tensors real folders carry, processor files with the statistics, the tokenizer under tokenizer/)."""

    # ---- benchmarks -----------------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def preset(cls, name: str, depth: Optional[int] = None) -> PolicyLevelConfig:
        """The configuration ``name`` of ``preset_names``; ``depth``: layers per tower for a preset cut in
        depth (the others ignore it)."""

    @classmethod
    @abstractmethod
    def stage_flops(cls, config: PolicyLevelConfig, num_steps: int) -> Dict[str, int]:
        """{'prefix': FLOPs of a miss's prefix, 'denoise': FLOPs of one chunk's denoise}, from the config alone:
        every matrix product the implementation runs, 2 FLOPs per multiply-add (bench/flops.py)."""

    # ---- device ------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The model's device (where prefix inputs, noise and state rows go)."""
        return self.model.device

    @property
    def compute_dtype(self) -> torch.dtype:
        """The model's compute dtype (part of the cache key; the bytes of a cache entry)."""
        return self.model.compute_dtype

    # ---- pre-processing: the prompt (the cache key) and the prefix inputs (a miss) -------------------------
    @abstractmethod
    def prompt_tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int64 [L], mask bool [L]) as lerobot's pre-processor makes them, L <= tokenizer_max_length,
        right-padded if padded at all (the runtime fits them to a prompt bucket by dropping masked padding):
        with the frames' bytes and ``processor_identity`` they are the cache key, so they say everything the
        prompt depends on (a prompt whose image tokens follow the frames' size: the size is in the frames'
        key already)."""

    @abstractmethod
    def prefix_inputs(self, frames: Frames, tokens: np.ndarray, token_mask: np.ndarray) -> PrefixInputs:
        """Decoded frames in camera-slot order (uint8 [H, W, 3], None for a masked slot) and the prompt ->
        what ``fill_prefix`` takes, on the device, batch of one: every step of the family's processor between
        the raw frames and the model (resize, crop, scale, patches, the prompt around the image tokens)."""

    def processor_identity(self) -> str:
        """The settings ``prefix_inputs`` depends on that the weights, the tokenizer and the tokens do not fix
        (an image processor's sizes read from beside the tokenizer), for the cache key; '' when none."""
        return ''

    def default_prompt_buckets(self) -> Tuple[int, ...]:
        """The prompt buckets (fast_path.py) the runtime uses when it is given none: () is one bucket at
        tokenizer_max_length (a prompt padded to its bound); a family whose prompts vary widely in length can offer
        smaller ones (each a shape of its own: a workspace and, with graphs, one graph per chunking mode)."""
        return ()

    def embodiment_id(self) -> Optional[int]:
        """The embodiment the action side runs as (it selects per-embodiment action weights), from the family's
        config or options; None for a family with one set of action weights."""
        return None

    # ---- the model calls -----------------------------------------------------------------------
    def fill_prefix(self, *inputs: torch.Tensor) -> PrefixContext:
        """``prefix_inputs``' tensors -> the read-only context (the model's ``fill_prefix``)."""
        return self.model.fill_prefix(*inputs)

    def workspace_spec(self, context: PrefixContext) -> WorkspaceSpec:
        """The model's ``workspace_spec`` (the fast path sizes its static workspace from it)."""
        return self.model.workspace_spec(context)

    def chunk_setup(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor,
                    num_steps: Optional[int] = None, **continuation: Any) -> Any:
        """The model's ``chunk_setup`` (RTC keywords, ``embodiment=`` and ``workspace=`` as there)."""
        return self.model.chunk_setup(context, state, noise, num_steps, **continuation)

    def euler_loop(self, chunk: Any) -> torch.Tensor:
        """The model's ``euler_loop``: what the fast path captures as one CUDA graph."""
        return self.model.euler_loop(chunk)

    def denoise(self, context: PrefixContext, state: Optional[torch.Tensor], noise: torch.Tensor, num_steps: int,
                **continuation: Any) -> torch.Tensor:
        """state [B, max_state_dim] (normalised, zero-padded); noise [B, H, max_action_dim]; ``continuation``:
        chunk_setup's keywords -> actions in the model's space [B, H, max_action_dim] fp32. ``context`` is never
        written. ``chunk_setup`` (everything fixed for the chunk) then ``euler_loop`` (the per-step loop)."""
        return self.euler_loop(self.chunk_setup(context, state, noise, num_steps, **continuation))

    def normalize_state(self, raw_state: np.ndarray) -> np.ndarray:
        """The robot's raw state [state_dim] -> the model's [state_dim] (what ``prompt_tokens`` and the denoise's
        state row get). Default: the checkpoint's state statistics (lerobot's NormalizerProcessorStep)."""
        return self.state_normalizer.normalize(raw_state)

    # ---- post-processing: the model's action space <-> the robot's units ------------------------------------
    @cached_property
    def relative_mask(self) -> Optional[np.ndarray]:
        """None: absolute actions; else [action_dim] bool, the dims that get the raw state added back."""
        return action_space.relative_mask(self.config)

    def postprocess(self, actions: np.ndarray, raw_state: np.ndarray) -> np.ndarray:
        """The denoise's actions of one robot [H, max_action_dim] (the model's space) and the raw state
        [state_dim] of the observation they come from -> robot-unit actions [H, action_dim]. Default: lerobot's
        post-processor (cut to action_dim, unnormalise, then on relative-action checkpoints the raw state added
        back: policy/action_space.py)."""
        return action_space.to_robot_units(actions[:, :self.config.action_dim], raw_state, self.action_normalizer,
                                           self.relative_mask)

    def to_model_space(self, actions: np.ndarray, raw_state: np.ndarray) -> np.ndarray:
        """``postprocess``'s inverse for a real-time-chunking leftover: absolute robot-unit actions
        [T, action_dim] -> the model's space [T, action_dim], against this observation's raw state."""
        return action_space.to_model_space(actions, raw_state, self.action_normalizer, self.relative_mask)

    def describe(self) -> Dict[str, Any]:
        """What /diagnostics and the replay summary show about the policy."""
        cfg = self.config
        element = torch.tensor([], dtype=self.compute_dtype).element_size()
        return {'policy_type': cfg.policy_type, 'cameras': list(cfg.all_camera_names),
                'prefix_len': cfg.prefix_len, 'cache_entry_bytes': cfg.cache_entry_bytes(element),
                'state_in_prompt': self.capabilities.state_in_prompt, **{k: v for k, v in self.options.items()}}
