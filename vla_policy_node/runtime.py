"""PolicyRuntime: observation in, ActionChunk out. Owns device, dtype, model, cache and timings.

No rclpy here: the same runtime serves the ROS node, the replay tool, the
benchmarks and tests.

    validate -> tokenize -> key (raw bytes) -> cache hit?  --yes--> denoise
                                                   | no
                          decode + resize + scale -> fill_prefix -> cache.put -> denoise
    denoise -> unnormalise -> (relative-action checkpoints) + raw state of the same observation

The model side is a policy family (policy/family.py, loaded by policy/families.load_policy from
config.json's ``type``): the runtime never asks which family it runs.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .cache import PrefixCache, PrefixContext, PrefixKeyBuilder
from .cache.key import weights_digest
from .fast_path import (DEFAULT_MAX_GRAPH_BYTES, DEFAULT_MAX_GRAPHS, FastPathError, Generations, PrefixGraphs,
                        StaticDenoiser, check_buckets, denoise_program, fit_to_bucket, resolve_cuda_graphs)
from .images import (DEFAULT_MAX_PIXELS, CompressedFrame, ImageDecodeError, RawImage, check_frame, decode_frame,
                     frame_from_msg)
from .observation import MAX_INSTRUCTION_CHARS, Observation, ObservationError, SkipReason
from .policy.families import load_policy
from .policy.family import PolicyFamily
from .policy.preprocess import image_to_unit_tensor
from .policy.relative_actions import relative_action_mask, to_absolute_actions, to_relative_actions
from .policy.rtc import RTCSettings

LOG = logging.getLogger(__name__)

CameraInput = Union[RawImage, CompressedFrame, np.ndarray, None]
STAGES = ('hash', 'preprocess', 'prefix', 'denoise')
DEFAULT_CACHE_BYTES = 1 << 30
DEFAULT_CACHE_ENTRIES = 16
# ActionChunk.timings_clock: how the stage timings were measured.
HOST_CLOCK = 'host'                  # time.perf_counter around each stage (CPU)
CUDA_EVENTS_CLOCK = 'cuda_events'    # CUDA events on the stream at the stage boundaries (GPU-true)


@dataclass
class ActionChunk:
    """Unnormalised actions [horizon, action_dim] and how they were made."""

    actions: np.ndarray
    cache_hit: bool
    timings_ms: Dict[str, float]
    key: Optional[str]
    num_steps: int
    camera_slots: Tuple[str, ...] = field(default_factory=tuple)
    normalized: Optional[np.ndarray] = None     # [horizon, action_dim] in the model's space (an RTC leftover)
    continued: bool = False                     # steered by a previous chunk's leftover (real-time chunking)
    timings_clock: str = HOST_CLOCK             # what measured timings_ms: 'cuda_events' (GPU-true) or 'host'

    @property
    def total_ms(self) -> float:
        return sum(self.timings_ms.get(stage, 0.0) for stage in STAGES)


@dataclass(frozen=True)
class _Prepared:
    """A validated observation: camera slots, state (raw and normalised, both [state_dim]) and prompt tokens."""

    slots: List[Tuple[str, CameraInput]]
    raw_state: np.ndarray
    normalized_state: np.ndarray
    tokens: np.ndarray
    token_mask: np.ndarray


def resolve_device(device: str) -> torch.device:
    if device in ('', 'auto'):
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    resolved = torch.device(device)
    if resolved.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f'device {device!r} requested but CUDA is not available')
    return resolved


def set_cpu_threads(threads: int) -> None:
    """Bound torch's CPU thread pool (0 leaves torch's default). Process-wide."""
    if threads > 0:
        torch.set_num_threads(int(threads))


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto': bf16 on CUDA, fp32 elsewhere."""
    # No float16: the finite attention-mask value overflows to -inf there (NaN on fully masked rows).
    names = {'float32': torch.float32, 'fp32': torch.float32, 'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16}
    if dtype in ('', 'auto'):
        return torch.bfloat16 if device.type == 'cuda' else torch.float32
    try:
        return names[dtype]
    except KeyError:
        raise ValueError(f'unknown dtype {dtype!r}; use auto, float32 or bfloat16') from None


# ---- content checks shared by every backend (the remote client runs them before anything is sent) ------

def check_rgb_array(name: str, frame: np.ndarray, max_pixels: int) -> None:
    """An RGB uint8 [H, W, 3] array of at most ``max_pixels`` pixels, or ObservationError (bad_image)."""
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8 or 0 in frame.shape:
        raise ObservationError(f'images.{name}', f'arrays must be RGB uint8 [H, W, 3], got '
                               f'{frame.dtype} {list(frame.shape)}', SkipReason.BAD_IMAGE)
    if frame.shape[0] * frame.shape[1] > max_pixels:
        raise ObservationError(f'images.{name}', f'array is {frame.shape[1]}x{frame.shape[0]} pixels, '
                               f'more than max_image_pixels {max_pixels}', SkipReason.BAD_IMAGE)


def checked_state(state: np.ndarray, state_dim: int) -> np.ndarray:
    """The raw state as float64 [state_dim], or ObservationError."""
    state = np.asarray(state, dtype=np.float64)
    if state.shape != (state_dim,):
        raise ObservationError('state', f'expected shape [{state_dim}], got {list(state.shape)}',
                               SkipReason.JOINT_STATE_MALFORMED)
    if not np.all(np.isfinite(state)):
        bad = [int(i) for i in np.flatnonzero(~np.isfinite(state))]
        raise ObservationError('state', f'non-finite value(s) at index {bad}', SkipReason.JOINT_STATE_NONFINITE)
    return state


def checked_instruction(instruction: Optional[str], max_length: int) -> str:
    if not instruction or not instruction.strip():
        raise ObservationError('instruction', 'empty', SkipReason.INSTRUCTION_EMPTY)
    if len(instruction) > max_length:
        raise ObservationError('instruction', f'{len(instruction)} characters, more than {max_length} '
                               '(max_instruction_length)', SkipReason.INSTRUCTION_TOO_LONG)
    return instruction


class _StageTimer:
    """Per-stage milliseconds: CUDA events on a CUDA device (GPU-true: each stage is the time between events
    recorded on the stream at its boundaries, no synchronize inside the chunk, one wait in ``ms``),
    ``time.perf_counter`` on the CPU. ``clock`` labels which one made the figures."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == 'cuda'
        self.clock = CUDA_EVENTS_CLOCK if self._cuda else HOST_CLOCK
        self._host_ms: Dict[str, float] = {stage: 0.0 for stage in STAGES}
        self._events: List[Tuple[str, object, object]] = []     # (stage, start event, end event) on CUDA
        self._stage: Optional[str] = None
        self._start: object = 0.0

    def _mark(self) -> object:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self, stage: str) -> None:
        self.stop()
        self._stage, self._start = stage, self._mark()

    def stop(self) -> None:
        if self._stage is None:
            return
        end = self._mark()
        if self._cuda:
            self._events.append((self._stage, self._start, end))
        else:
            self._host_ms[self._stage] += (end - self._start) * 1e3
        self._stage = None

    @property
    def ms(self) -> Dict[str, float]:
        """Milliseconds per stage (on CUDA this waits for the last event, once per chunk)."""
        self.stop()
        if not self._cuda:
            return dict(self._host_ms)
        totals = {stage: 0.0 for stage in STAGES}
        if self._events:
            self._events[-1][2].synchronize()
        for stage, start, end in self._events:
            totals[stage] += start.elapsed_time(end)
        return totals


class PolicyRuntime:
    """A loaded policy with its prefix cache. ``infer`` is safe to call from one thread at a time."""

    def __init__(self, policy: PolicyFamily, model_revision: str, *,
                 cache_max_bytes: int = DEFAULT_CACHE_BYTES, cache_max_entries: int = DEFAULT_CACHE_ENTRIES,
                 cache_enabled: bool = True, num_steps: Optional[int] = None, cuda_graphs: str = 'off',
                 static_workspace: bool = False, prompt_buckets: Optional[Sequence[int]] = None,
                 compile_denoise: bool = False, max_graphs: int = DEFAULT_MAX_GRAPHS,
                 max_graph_bytes: int = DEFAULT_MAX_GRAPH_BYTES) -> None:
        """``policy``: a loaded family (policy/family.py); its options (e.g. pi0.5's
        ``pi05_padded_state_prompt``) are readable here as attributes of the same name.

        The fast path (fast_path.py): ``cuda_graphs`` auto | on | off (``on`` without CUDA raises
        FastPathError); ``static_workspace`` runs the denoise through the static K/V workspace eagerly (what
        the graphs replay; implied by graphs); ``prompt_buckets`` pads the prompt to the smallest bucket that
        holds it (default: one bucket at tokenizer_max_length); ``compile_denoise`` wraps the loop in
        torch.compile (off by default: Jetson wheels have no Triton); ``max_graphs`` / ``max_graph_bytes``
        bound the graph cache."""
        self.policy = policy
        self.model = policy.model
        self.config = policy.config
        for name, value in policy.options.items():
            setattr(self, name, value)
        # None: absolute actions. Else [action_dim] bool: the dims that get the raw state added back.
        self.relative_mask = (relative_action_mask(self.config.action_dim, self.config.relative_exclude_joints,
                                                   self.config.action_feature_names)
                              if self.config.use_relative_actions else None)
        self.device = policy.device
        self.dtype = policy.compute_dtype
        self.tokenizer = policy.tokenizer
        self.state_normalizer = policy.state_normalizer
        self.action_normalizer = policy.action_normalizer
        self.model_revision = model_revision
        self.cache = PrefixCache(cache_max_bytes, cache_max_entries)
        self.cache_enabled = cache_enabled
        self.num_steps = int(num_steps or self.config.num_inference_steps)
        self._keys = PrefixKeyBuilder(model_revision, self.tokenizer.identity, str(self.dtype).replace('torch.', ''))
        self._lock = threading.Lock()
        self._warned_oversize = False
        graphs = resolve_cuda_graphs(cuda_graphs, self.device)
        self.cuda_graphs = cuda_graphs
        self.prompt_buckets = check_buckets(prompt_buckets, self.config.tokenizer_max_length)
        self._generations = Generations()
        self._fast: Optional[StaticDenoiser] = None
        self._prefix_graphs: Optional[PrefixGraphs] = None
        program = denoise_program(policy)
        if program is None and cuda_graphs == 'on':
            raise FastPathError(f'cuda_graphs is "on", but the {self.config.policy_type} family offers no '
                                'capturable denoise (chunk_setup with a workspace + euler_loop)')
        if program is not None and (graphs or static_workspace or compile_denoise):
            # strict (a capture failure raises) only during warmup(), under cuda_graphs: on
            self._fast = StaticDenoiser(program, family_name=self.config.policy_type, graphs=graphs,
                                        max_graphs=max_graphs, max_graph_bytes=max_graph_bytes,
                                        compile_loop=compile_denoise)
            self._prefix_graphs = PrefixGraphs(policy, graphs=graphs, max_graph_bytes=max_graph_bytes)

    # ---- construction --------------------------------------------------------------------
    _RUNTIME_OPTIONS = ('cache_max_bytes', 'cache_max_entries', 'cache_enabled', 'num_steps', 'cuda_graphs',
                        'static_workspace', 'prompt_buckets', 'compile_denoise', 'max_graphs', 'max_graph_bytes')

    @classmethod
    def from_pretrained(cls, path: Union[str, Path], device: str = 'auto', dtype: str = 'auto',
                        tokenizer_path: Optional[Union[str, Path]] = None, **options) -> 'PolicyRuntime':
        """Load a lerobot ``pretrained_model/`` folder. Cache and step ``options`` go to the constructor,
        the others to the policy family (refused by name where the family has no such option)."""
        torch_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, torch_device)
        resolve_cuda_graphs(options.get('cuda_graphs', 'off'), torch_device)     # refused before loading anything
        runtime_options = {name: options.pop(name) for name in cls._RUNTIME_OPTIONS if name in options}
        policy = load_policy(Path(path), torch_device, torch_dtype, tokenizer_path, **options)
        return cls(policy, weights_digest(str(policy.weights_path)), **runtime_options)

    # ---- content checks (the observation contract's second half; timing is InputBuffer's) ----------
    def _camera_slots(self, images: Mapping[str, object],
                      max_pixels: int = DEFAULT_MAX_PIXELS) -> List[Tuple[str, CameraInput]]:
        """Model slots as lerobot orders them: present cameras (config order), then the masked ones.

        Messages become frames here (no copy); every frame is checked without decoding (encoding,
        size against ``max_pixels``, geometry): a huge frame never allocates its pixels.
        """
        known = self.config.all_camera_names
        unknown = sorted(set(images) - set(known))
        if unknown:
            raise ObservationError('images', f'unknown camera(s) {unknown}; the model knows {list(known)}',
                                   SkipReason.BAD_IMAGE)
        present, absent = [], []
        for name in known:
            frame = images.get(name)
            if frame is None:
                absent.append((name, None))
                continue
            if isinstance(frame, np.ndarray):
                check_rgb_array(name, frame, max_pixels)
            else:
                try:
                    frame = frame_from_msg(frame)
                    check_frame(frame, max_pixels)
                except ImageDecodeError as exc:
                    raise ObservationError(f'images.{name}', str(exc), SkipReason.BAD_IMAGE) from exc
            present.append((name, frame))
        if not present:
            raise ObservationError('images', 'no camera image at all; at least one is needed', SkipReason.BAD_IMAGE)
        return present + absent

    def _checked_state(self, state: np.ndarray) -> np.ndarray:
        """The raw state as float64 [state_dim], or ObservationError."""
        return checked_state(state, self.config.state_dim)

    _instruction = staticmethod(checked_instruction)

    def _tokens(self, instruction: str, normalized_state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self.policy.prompt_tokens(instruction, normalized_state)

    def _noise(self, noise: Optional[np.ndarray], seed: Optional[int]) -> torch.Tensor:
        shape = (1, self.config.chunk_size, self.config.max_action_dim)
        if noise is not None:
            array = np.asarray(noise, dtype=np.float32)
            if array.shape not in (shape, shape[1:]):
                raise ObservationError('noise', f'expected shape {list(shape[1:])}, got {list(array.shape)}')
            return torch.from_numpy(array.reshape(shape).copy()).to(self.device)
        # Drawn on the CPU so a seed gives the same noise on every device.
        generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        return torch.randn(shape, generator=generator).to(self.device)

    # ---- inference -------------------------------------------------------------------------
    def _prepare(self, observation: Observation, max_instruction_length: int = MAX_INSTRUCTION_CHARS,
                 max_image_pixels: int = DEFAULT_MAX_PIXELS) -> _Prepared:
        """Validate, normalise the state and tokenise."""
        slots = self._camera_slots(observation.images, max_image_pixels)
        raw_state = self._checked_state(observation.state)
        normalized = self.state_normalizer.normalize(raw_state)
        tokens, token_mask = self._tokens(self._instruction(observation.instruction, max_instruction_length),
                                          normalized)
        tokens, token_mask = fit_to_bucket(tokens, token_mask, self.prompt_buckets)
        return _Prepared(slots, raw_state, normalized, tokens, token_mask)

    def prefix_key(self, observation: Observation) -> str:
        """The cache key this observation would use (validates it like ``infer``)."""
        prepared = self._prepare(observation)
        return self._keys.key(prepared.slots, prepared.tokens, prepared.token_mask)

    def _leftover(self, prev_chunk_left_over: Optional[np.ndarray], prev_actions: Optional[np.ndarray],
                  raw_state: np.ndarray) -> Optional[torch.Tensor]:
        """The previous chunk's unexecuted actions in the model's space [T, A], or None.

        prev_chunk_left_over is already normalised ([T, <= max_action_dim]); prev_actions are robot
        units ([T, action_dim]), absolute: on a relative-action checkpoint they are first made relative
        to *this* observation's raw state, the state the new chunk is anchored to (lerobot
        policies/rtc/relative.py reanchor_relative_rtc_prefix), then normalised with the action statistics.
        """
        if prev_chunk_left_over is not None and prev_actions is not None:
            raise ObservationError('prev_actions', 'give prev_chunk_left_over or prev_actions, not both')
        name, array = (('prev_actions', prev_actions) if prev_actions is not None
                       else ('prev_chunk_left_over', prev_chunk_left_over))
        if array is None:
            return None
        array = np.asarray(array, dtype=np.float64)
        width = self.config.action_dim if name == 'prev_actions' else self.config.max_action_dim
        if array.ndim != 2 or not 0 < array.shape[1] <= width or (name == 'prev_actions' and array.shape[1] != width):
            raise ObservationError(name, f'expected [T, {width}], got {list(array.shape)}')
        if not np.all(np.isfinite(array)):
            raise ObservationError(name, 'non-finite value(s)')
        if name == 'prev_actions':
            if self.relative_mask is not None:
                array = to_relative_actions(array, raw_state, self.relative_mask)
            array = self.action_normalizer.normalize(array)
        return torch.from_numpy(np.asarray(array, dtype=np.float32)).to(self.device)

    def _check_rtc(self, rtc: Optional[RTCSettings], inference_delay: int) -> None:
        if inference_delay < 0:
            raise ObservationError('inference_delay', f'must be >= 0, got {inference_delay}')
        if rtc is None or rtc.mode != 'trained':
            return
        limit = self.config.rtc_training_max_delay
        if limit <= 0:
            raise ObservationError('rtc', 'mode "trained" needs a checkpoint with rtc_training_max_delay > 0')
        if inference_delay > limit:
            raise ObservationError('inference_delay', f'{inference_delay} exceeds the checkpoint '
                                   f'rtc_training_max_delay {limit}')

    def infer(self, observation: Observation, noise: Optional[np.ndarray] = None,
              seed: Optional[int] = None, num_steps: Optional[int] = None,
              use_cache: Optional[bool] = None,
              max_instruction_length: int = MAX_INSTRUCTION_CHARS, *, max_image_pixels: int = DEFAULT_MAX_PIXELS,
              prev_chunk_left_over: Optional[np.ndarray] = None, prev_actions: Optional[np.ndarray] = None,
              inference_delay: int = 0, execution_horizon: Optional[int] = None,
              rtc: Optional[RTCSettings] = None) -> ActionChunk:
        """One action chunk; ``num_steps`` / ``use_cache`` None use the runtime's settings.

        Real-time chunking (``rtc``, see policy/rtc.py): the previous chunk's unexecuted actions as
        ``prev_chunk_left_over`` (normalised, as lerobot takes them) or ``prev_actions`` (robot units),
        ``inference_delay`` and ``execution_horizon`` in actions. It acts on the suffix only: the
        cached prefix is the same, and a hit returns what a miss does for the same leftover.

        Bad input raises ObservationError. Everything checkable without decoding
        (cameras, frame encoding, size against ``max_image_pixels`` and geometry, state,
        instruction, noise, leftover) is checked before
        the cache lookup; a corrupt compressed image is only found while
        decoding on a miss, and then nothing is stored.
        """
        with self._lock:
            return self._infer_locked(observation, noise, seed, num_steps,
                                      self.cache_enabled if use_cache is None else use_cache,
                                      (min(int(max_instruction_length), MAX_INSTRUCTION_CHARS), int(max_image_pixels)),
                                      dict(prev_chunk_left_over=prev_chunk_left_over, prev_actions=prev_actions,
                                           inference_delay=int(inference_delay),
                                           execution_horizon=execution_horizon, rtc=rtc))

    def _infer_locked(self, observation: Observation, noise: Optional[np.ndarray], seed: Optional[int],
                      num_steps: Optional[int], use_cache: bool, limits: Tuple[int, int],
                      continuation: Dict[str, object]) -> ActionChunk:
        cfg = self.config
        timer = _StageTimer(self.device)
        timer.start('hash')
        prepared = self._prepare(observation, *limits)
        slots, tokens, token_mask = prepared.slots, prepared.tokens, prepared.token_mask
        steps = int(num_steps or self.num_steps)
        if steps < 1:
            raise ObservationError('num_steps', f'must be >= 1, got {steps}')
        noise_tensor = self._noise(noise, seed)
        leftover = self._leftover(continuation.pop('prev_chunk_left_over'), continuation.pop('prev_actions'),
                                  prepared.raw_state)
        rtc = continuation['rtc']
        self._check_rtc(rtc, continuation['inference_delay'])
        key = self._keys.key(slots, tokens, token_mask) if use_cache else None
        context = self.cache.get(key) if use_cache else None
        timer.stop()
        hit = context is not None
        if context is None:
            timer.start('preprocess')
            images, image_masks = self._preprocess(slots)
            tokens_t = torch.from_numpy(tokens)[None].to(self.device)
            mask_t = torch.from_numpy(token_mask)[None].to(self.device)
            timer.start('prefix')
            fill = self._prefix_graphs.fill_prefix if self._prefix_graphs is not None else self.policy.fill_prefix
            context = fill(images, image_masks, tokens_t, mask_t)
            timer.stop()
            entry = self._generations.new(key)
            if use_cache:
                self._store(key, context)
        else:
            entry = self._generations.token(key) or self._generations.new(key)
        timer.start('denoise')
        state = np.zeros(cfg.max_state_dim, dtype=np.float32)       # zero-padded as lerobot's pad_vector
        state[:cfg.state_dim] = prepared.normalized_state
        state_t = torch.from_numpy(state)[None].to(self.device)
        if self._fast is not None:
            normalized = self._fast.denoise(context, entry, state_t, noise_tensor, steps,
                                            prev_chunk_left_over=leftover, **continuation)
        else:
            normalized = self.policy.denoise(context, state_t, noise_tensor, steps, prev_chunk_left_over=leftover,
                                             **continuation)                            # [1, H, max_action_dim]
        actions = normalized[0, :, :cfg.action_dim].float().cpu().numpy()
        timer.stop()
        return ActionChunk(actions=self._postprocess(actions, prepared.raw_state), cache_hit=hit,
                           timings_ms=timer.ms, timings_clock=timer.clock, key=key, num_steps=steps,
                           camera_slots=tuple(name for name, _ in slots), normalized=actions,
                           continued=rtc is not None and leftover is not None and len(leftover) > 0)

    def _postprocess(self, normalized_actions: np.ndarray, raw_state: np.ndarray) -> np.ndarray:
        """lerobot's post-processor: unnormalise, then (relative-action checkpoints) add the raw state back.

        The state added back is the raw state of the observation this chunk was predicted from. lerobot adds
        the state of its latest pre-processor call, which its synchronous loop re-runs every tick, so queued
        actions there drift with the robot (its sync rollout refuses relative actions for that reason, and
        RTC post-processes each chunk right after prediction, anchored like here). Each chunk the node
        publishes is a plan from one observation, so it is anchored to that observation's joint state.

        The prefix cache is unaffected: a family either keeps the state out of the prefix or puts the
        normalised absolute state in the prompt whether or not actions are relative, and the add-back
        only touches the action output, after the model.
        """
        actions = self.action_normalizer.unnormalize(normalized_actions)
        if self.relative_mask is None:
            return actions
        return to_absolute_actions(actions, raw_state, self.relative_mask)

    def _preprocess(self, slots: Sequence[Tuple[str, CameraInput]]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Decode, resize-with-pad and scale every slot -> images [1, N, 3, H, W], masks [1, N]."""
        images, masks = [], []
        for name, frame in slots:
            if frame is None:
                images.append(self.policy.empty_image())
                masks.append(False)
                continue
            try:
                pixels = frame if isinstance(frame, np.ndarray) else decode_frame(frame)
            except ImageDecodeError as exc:
                raise ObservationError(f'images.{name}', str(exc), SkipReason.BAD_IMAGE) from exc
            unit = image_to_unit_tensor(pixels, self.device)
            images.append(self.policy.image_to_model(unit))
            masks.append(True)
        return torch.stack(images)[None], torch.tensor([masks], device=self.device)

    def _store(self, key: str, context: PrefixContext) -> None:
        if len(self._generations) > 2 * self.cache.stats().max_entries + 8:
            self._generations.forget_unless(lambda stored: stored in self.cache)
        if not self.cache.put(key, context) and not self._warned_oversize:
            self._warned_oversize = True
            stats = self.cache.stats()
            LOG.warning('prefix cache stores nothing: one entry needs %d bytes, the budget is %d bytes and %d '
                        'entries; raise cache_max_bytes to cache prefixes', context.nbytes, stats.max_bytes,
                        stats.max_entries)

    def warmup(self) -> ActionChunk:
        """One inference on a blank observation, outside the cache, so the first real tick is not the slow one.

        With CUDA graphs this captures the prefix graph and the plain and guided-RTC denoise graphs; under
        ``cuda_graphs: on`` a capture failure here raises FastPathError (a configure error). Shapes first seen
        later (trained RTC, another prompt bucket) are captured then and fall back to eager, logged, on failure:
        a tick never fails on a capture."""
        cfg = self.config
        height, width = cfg.image_resolution
        blank = {name: np.zeros((height, width, 3), dtype=np.uint8) for name in cfg.camera_names}
        observation = Observation(blank, self._neutral_state(), 'warm up')
        runners = [runner for runner in (self._fast, self._prefix_graphs) if runner is not None]
        strict = self.cuda_graphs == 'on'
        try:
            for runner in runners:
                runner.strict = strict
            chunk = self.infer(observation, seed=0, use_cache=False)
            if self._fast is not None and self._fast.graphs:
                self.infer(observation, seed=0, use_cache=False, prev_chunk_left_over=np.zeros((1, 1)),
                           inference_delay=0, rtc=RTCSettings())
        finally:
            for runner in runners:
                runner.strict = False
        return chunk

    def _neutral_state(self) -> np.ndarray:
        """A state that normalises to zero."""
        return self.state_normalizer.unnormalize(np.zeros(self.config.state_dim, dtype=np.float32))

    def prefix_bytes(self) -> int:
        """Analytic device bytes of one cached prefix (K/V only, the family's extra K/V included)."""
        element = torch.tensor([], dtype=self.dtype).element_size()
        return self.config.kv_entry_bytes(element)

    checkpoint_path = ''    # what it was loaded from, as checkpoint_path names it (settings.load_local sets it)

    def describe(self) -> Dict[str, object]:
        """What /diagnostics and the replay summary show of this backend: the family's own description (policy
        type, cameras, prefix length, cache entry bytes ...) plus where and how it runs."""
        return dict(self.policy.describe(), backend='local', checkpoint_path=self.checkpoint_path,
                    device=str(self.device), dtype=str(self.dtype).replace('torch.', ''),
                    model_revision=self.model_revision, prefix_entry_bytes=self.prefix_bytes(),
                    **self.fast_path_summary())

    def summary(self) -> str:
        """The configure log line's backend part (the backend seam, docs/architecture.md)."""
        return (f'loaded {self.config.policy_type} from {self.checkpoint_path or "a checkpoint"} on {self.device} '
                f'({self.dtype}); one cached prefix = {self.prefix_bytes() / 2**20:.2f} MiB')

    def fast_path_summary(self) -> Dict[str, object]:
        """The fast path's figures for /diagnostics and the replay summary (cuda_graphs mode, graphs, copies)."""
        summary: Dict[str, object] = {'cuda_graphs_mode': self.cuda_graphs,
                                      'prompt_buckets': list(self.prompt_buckets)}
        if self._fast is not None:
            summary.update(self._fast.describe())
        if self._prefix_graphs is not None:
            summary.update(self._prefix_graphs.describe())
        return summary

    def close(self) -> None:
        """Drop the cache and the model; return device memory to the allocator's owner."""
        self.cache.clear()
        self._fast = self._prefix_graphs = None
        self.model = None  # type: ignore[assignment]
        self.policy = None  # type: ignore[assignment]
        if self.device.type == 'cuda':
            torch.cuda.empty_cache()
