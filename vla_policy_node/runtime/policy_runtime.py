"""PolicyRuntime: observation in, ActionChunk out, with the prefix cache and the stage timings.

No rclpy here: the same runtime serves the ROS node, the replay tool, the benchmarks and tests.
``infer`` is one pipeline, a method per step:

    prepare      content checks (observation_checks.py) -> normalise the state -> the family's prompt tokens
                 (bucketed) + the denoise inputs: steps, noise, RTC leftover, embodiment (denoise_inputs.py)
    key          xxh3-128 over the raw camera bytes, the tokens and the processor settings (cache/key.py)
    hit / miss   cache.get(key) --hit--> the stored context
                                --miss-> decode -> the family's prefix_inputs -> fill_prefix -> cache.put
    denoise      the family's denoise, or the fast path's static workspace / CUDA graph (fast_path.py)
    postprocess  the family's postprocess: by default unnormalise -> (relative-action checkpoints) + the raw
                 state of the same observation (policy/action_space.py)

The model side is a policy family (policy/family.py, loaded by policy/families.load_policy from
config.json's ``type``): the runtime never asks which family it runs, and the family keeps its own
options (``runtime.policy.options``). The warm-up is warmup.py, the self-description report.py.
"""
from __future__ import annotations

import inspect
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..cache import PrefixCache, PrefixContext, PrefixKeyBuilder
from ..cache.key import weights_digest
from ..fast_path import (DEFAULT_MAX_GRAPH_BYTES, DEFAULT_MAX_GRAPHS, EntryToken, FastPathError, Generations,
                         PrefixGraphs, StaticDenoiser, build_fast_path, check_buckets, denoise_program,
                         fit_to_bucket, resolve_cuda_graphs)
from ..images import DEFAULT_MAX_PIXELS, ImageDecodeError, decode_frame
from ..observation import MAX_INSTRUCTION_CHARS, Observation, ObservationError, SkipReason
from ..observation_checks import CameraInput, camera_slots, checked_instruction, checked_state
from ..policy.families import load_policy
from ..policy.family import Frames, PolicyFamily, PrefixInputs
from ..policy.quant import check_device, quantize_model
from ..policy.rtc import RTCSettings
from . import report
from .chunk import ActionChunk
from .denoise_inputs import (checked_steps, check_rtc, embodiment_tensor, leftover_tensor, noise_tensor,
                             resolved_rtc, state_row)
from .devices import resolve_device, resolve_dtype
from .stage_timer import StageTimer
from .warmup import warm_up

LOG = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 1 << 30
DEFAULT_CACHE_ENTRIES = 16


@dataclass(frozen=True)
class _Prepared:
    """A validated observation: camera slots, state (raw and normalised, both [state_dim]) and prompt tokens."""

    slots: List[Tuple[str, CameraInput]]
    raw_state: np.ndarray
    normalized_state: np.ndarray
    tokens: np.ndarray
    token_mask: np.ndarray


@dataclass(frozen=True)
class _Request:
    """One ``infer`` call's arguments besides the observation (see ``infer``)."""

    noise: Optional[np.ndarray]
    seed: Optional[int]
    num_steps: Optional[int]
    use_cache: bool
    max_instruction_length: int
    max_image_pixels: int
    prev_chunk_left_over: Optional[np.ndarray]
    prev_actions: Optional[np.ndarray]
    inference_delay: int
    execution_horizon: Optional[int]
    rtc: Optional[RTCSettings]


def infer_request(cache_enabled: bool, noise: Optional[np.ndarray] = None, seed: Optional[int] = None,
                  num_steps: Optional[int] = None, use_cache: Optional[bool] = None,
                  max_instruction_length: int = MAX_INSTRUCTION_CHARS, *, max_image_pixels: int = DEFAULT_MAX_PIXELS,
                  prev_chunk_left_over: Optional[np.ndarray] = None, prev_actions: Optional[np.ndarray] = None,
                  inference_delay: int = 0, execution_horizon: Optional[int] = None,
                  rtc: Optional[RTCSettings] = None, rtc_modes: Sequence[str] = ()) -> _Request:
    """``PolicyRuntime.infer``'s keyword arguments as one request, the runtime's defaults applied (``use_cache``
    None: ``cache_enabled``; rtc mode "auto": the first of the family's ``rtc_modes``); runtime/batch.py builds
    each robot's request of a batch with it too."""
    return _Request(noise=noise, seed=seed, num_steps=num_steps,
                    use_cache=cache_enabled if use_cache is None else use_cache,
                    max_instruction_length=min(int(max_instruction_length), MAX_INSTRUCTION_CHARS),
                    max_image_pixels=int(max_image_pixels), prev_chunk_left_over=prev_chunk_left_over,
                    prev_actions=prev_actions, inference_delay=int(inference_delay),
                    execution_horizon=execution_horizon, rtc=resolved_rtc(rtc, rtc_modes))


class PolicyRuntime:
    """A loaded policy with its prefix cache. ``infer`` is safe to call from one thread at a time."""

    checkpoint_path = ''    # what it was loaded from, as checkpoint_path names it (settings.load_local sets it)

    def __init__(self, policy: PolicyFamily, model_revision: str, *,
                 cache_max_bytes: int = DEFAULT_CACHE_BYTES, cache_max_entries: int = DEFAULT_CACHE_ENTRIES,
                 cache_enabled: bool = True, num_steps: Optional[int] = None, cuda_graphs: str = 'off',
                 static_workspace: bool = False, prompt_buckets: Optional[Sequence[int]] = None,
                 compile_denoise: bool = False, max_graphs: int = DEFAULT_MAX_GRAPHS,
                 max_graph_bytes: int = DEFAULT_MAX_GRAPH_BYTES, quantization: str = 'none') -> None:
        """``policy``: a loaded family (policy/family.py), its options in ``policy.options``.

        The fast path (fast_path.py): ``cuda_graphs`` auto | on | off (``on`` without CUDA raises
        FastPathError); ``static_workspace`` runs the denoise through the static K/V workspace eagerly (what
        the graphs replay; implied by graphs); ``prompt_buckets`` pads the prompt to the smallest bucket that
        holds it (default: the family's ``default_prompt_buckets``, else one at tokenizer_max_length);
        ``compile_denoise`` wraps the loop in torch.compile (off by default: Jetson wheels have no Triton);
        ``max_graphs`` / ``max_graph_bytes``
        bound the graphs (count; bytes of their pools, static inputs and the workspaces). ``warmup()``
        captures them; a shape it did not capture runs eagerly. ``quantization`` none | int8_weights | fp8
        quantizes the model's weights in place (policy/quant.py; QuantizationError where the device cannot run
        the mode)."""
        self.policy, self.model, self.config = policy, policy.model, policy.config
        self.device, self.dtype = policy.device, policy.compute_dtype
        self.quantization = quantization
        self.quantization_kernel = quantize_model(self.model, quantization, self.device)
        self.tokenizer = policy.tokenizer
        self.state_normalizer, self.action_normalizer = policy.state_normalizer, policy.action_normalizer
        self.model_revision = model_revision
        self.cache = PrefixCache(cache_max_bytes, cache_max_entries)
        self.cache_enabled = cache_enabled
        self.num_steps = int(num_steps or self.config.num_inference_steps)
        self._keys = PrefixKeyBuilder(model_revision, self.tokenizer.identity, report.dtype_name(self.dtype),
                                      quantization=quantization, processor=policy.processor_identity())
        self._embodiment = embodiment_tensor(policy.embodiment_id(), self.device)
        self._lock = threading.Lock()
        self._warned_oversize = False
        graphs = resolve_cuda_graphs(cuda_graphs, self.device)
        self.cuda_graphs = cuda_graphs
        self.prompt_buckets = check_buckets(prompt_buckets or policy.default_prompt_buckets(),
                                            self.config.tokenizer_max_length)
        self._generations = Generations()
        self._fast: Optional[StaticDenoiser] = None
        self._prefix_graphs: Optional[PrefixGraphs] = None
        program = denoise_program(policy)
        if program is None and cuda_graphs == 'on':
            raise FastPathError(f'cuda_graphs is "on", but the {self.config.policy_type} family offers no '
                                'capturable denoise (chunk_setup with a workspace + euler_loop)')
        if program is not None and (graphs or static_workspace or compile_denoise):
            self._fast, self._prefix_graphs = build_fast_path(
                program, policy, family_name=self.config.policy_type, graphs=graphs, device=self.device,
                max_graphs=max_graphs, max_graph_bytes=max_graph_bytes, compile_loop=compile_denoise,
                prefix_graphs=policy.capabilities.capturable_prefix)

    @classmethod
    def from_pretrained(cls, path: Union[str, Path], device: str = 'auto', dtype: str = 'auto',
                        tokenizer_path: Optional[Union[str, Path]] = None, **options) -> 'PolicyRuntime':
        """Load a lerobot ``pretrained_model/`` folder. The constructor's keyword options (cache, steps, fast
        path) go to the runtime, the others to the policy family (which refuses an option it lacks)."""
        torch_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, torch_device)
        resolve_cuda_graphs(options.get('cuda_graphs', 'off'), torch_device)     # refused before loading anything
        check_device(options.get('quantization', 'none'), torch_device)
        own = [name for name, parameter in inspect.signature(cls.__init__).parameters.items()
               if parameter.kind is parameter.KEYWORD_ONLY]
        runtime_options = {name: options.pop(name) for name in own if name in options}
        policy = load_policy(Path(path), torch_device, torch_dtype, tokenizer_path, **options)
        return cls(policy, weights_digest(str(policy.weights_path)), **runtime_options)

    # ---- inference ---------------------------------------------------------------------------
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
        request = infer_request(self.cache_enabled, noise, seed, num_steps, use_cache, max_instruction_length,
                                max_image_pixels=max_image_pixels, prev_chunk_left_over=prev_chunk_left_over,
                                prev_actions=prev_actions, inference_delay=inference_delay,
                                execution_horizon=execution_horizon, rtc=rtc,
                                rtc_modes=self.policy.capabilities.rtc_modes)
        with self._lock:
            return self._run(observation, request)

    def _run(self, observation: Observation, request: _Request) -> ActionChunk:
        """prepare -> key -> hit / miss -> denoise -> postprocess, timed per stage."""
        timer = StageTimer(self.device)
        timer.start('hash')
        prepared = self._prepare(observation, request.max_instruction_length, request.max_image_pixels)
        steps, noise, leftover = self._denoise_inputs(prepared, request)
        key, context = self._lookup(prepared, request.use_cache)
        timer.stop()
        hit = context is not None
        if hit:
            entry = self._generations.token(key) or self._generations.new(key)
        else:
            context, entry = self._miss(prepared, key, request.use_cache, timer)
        timer.start('denoise')
        actions = self._denoise(context, entry, prepared, steps, noise, leftover, request)
        timer.stop()
        return finished_chunk(self.policy, prepared, request, actions, leftover, hit=hit, key=key, steps=steps,
                              timings=timer.ms, clock=timer.clock)

    def _prepare(self, observation: Observation, max_instruction_length: int = MAX_INSTRUCTION_CHARS,
                 max_image_pixels: int = DEFAULT_MAX_PIXELS) -> _Prepared:
        """Check the content, normalise the state and tokenise (the prompt fitted to its bucket)."""
        slots = camera_slots(observation.images, self.config.all_camera_names, max_image_pixels)
        raw_state = checked_state(observation.state, self.config.state_dim)
        normalized = self.policy.normalize_state(raw_state)
        instruction = checked_instruction(observation.instruction, max_instruction_length)
        tokens, token_mask = self.policy.prompt_tokens(instruction, normalized)
        tokens, token_mask = fit_to_bucket(tokens, token_mask, self.prompt_buckets)
        return _Prepared(slots, raw_state, normalized, tokens, token_mask)

    def _denoise_inputs(self, prepared: _Prepared,
                        request: _Request) -> Tuple[int, torch.Tensor, Optional[torch.Tensor]]:
        """Steps, noise [1, H, max_action_dim] and the RTC leftover in the model's space, checked."""
        cfg = self.config
        steps = checked_steps(int(request.num_steps or self.num_steps))
        noise = noise_tensor(request.noise, request.seed, (1, cfg.chunk_size, cfg.max_action_dim), self.device)
        leftover = leftover_tensor(request.prev_chunk_left_over, request.prev_actions, prepared.raw_state, cfg,
                                   self.policy.to_model_space, self.device)
        check_rtc(request.rtc, request.inference_delay, cfg.rtc_training_max_delay, self.policy.capabilities)
        return steps, noise, leftover

    def _lookup(self, prepared: _Prepared, use_cache: bool) -> Tuple[Optional[str], Optional[PrefixContext]]:
        """The cache key and the prefix stored under it (None, None without the cache)."""
        if not use_cache:
            return None, None
        key = self._keys.key(prepared.slots, prepared.tokens, prepared.token_mask)
        return key, self.cache.get(key)

    def prefix_key(self, observation: Observation) -> str:
        """The cache key this observation would use (validates it like ``infer``)."""
        prepared = self._prepare(observation)
        return self._keys.key(prepared.slots, prepared.tokens, prepared.token_mask)

    def _miss(self, prepared: _Prepared, key: Optional[str], use_cache: bool,
              timer: StageTimer) -> Tuple[PrefixContext, EntryToken]:
        """Decode the frames, the family's prefix inputs from them and the prompt, fill the prefix, store it
        (``use_cache``)."""
        timer.start('preprocess')
        inputs = self.policy.prefix_inputs(decoded_frames(prepared.slots), prepared.tokens, prepared.token_mask)
        timer.start('prefix')
        context = self._fill(inputs)
        timer.stop()
        entry = self._generations.new(key)
        if use_cache:
            self._store(key, context)
        return context, entry

    def _fill(self, inputs: PrefixInputs) -> PrefixContext:
        """The family's fill_prefix over its prefix inputs, through the captured prefix graph when there is one."""
        fill = self._prefix_graphs.fill_prefix if self._prefix_graphs is not None else self.policy.fill_prefix
        return fill(*inputs)

    def _store(self, key: str, context: PrefixContext) -> None:
        if len(self._generations) > 2 * self.cache.stats().max_entries + 8:
            self._generations.forget_unless(lambda stored: stored in self.cache)
        if not self.cache.put(key, context) and not self._warned_oversize:
            self._warned_oversize = True
            stats = self.cache.stats()
            LOG.warning('prefix cache stores nothing: one entry needs %d bytes, the budget is %d bytes and %d '
                        'entries; raise cache_max_bytes to cache prefixes', context.nbytes, stats.max_bytes,
                        stats.max_entries)

    def _denoise(self, context: PrefixContext, entry: EntryToken, prepared: _Prepared, steps: int,
                 noise: torch.Tensor, leftover: Optional[torch.Tensor], request: _Request) -> np.ndarray:
        """The model-space actions [H, max_action_dim] from the context, the state row and the noise."""
        state = state_row(prepared.normalized_state, self.config.max_state_dim, self.device)
        guidance = dict(prev_chunk_left_over=leftover, inference_delay=request.inference_delay,
                        execution_horizon=request.execution_horizon, rtc=request.rtc, embodiment=self._embodiment)
        if self._fast is not None:
            normalized = self._fast.denoise(context, entry, state, noise, steps, **guidance)
        else:
            normalized = self.policy.denoise(context, state, noise, steps, **guidance)   # [1, H, max_action_dim]
        return normalized[0].float().cpu().numpy()

    # ---- warm-up and self-description, in warmup.py / report.py (warmup, describe, summary: backends.py) ----
    def warmup(self) -> ActionChunk:
        """Blank inferences outside the cache; with graphs, one per prompt bucket and chunking mode, capturing
        every graph (warmup.py)."""
        return warm_up(self)

    def describe(self) -> Dict[str, object]:
        """What /diagnostics and the replay summary show of this backend (report.py)."""
        return report.describe(self)

    def summary(self) -> str:
        """The configure log line's backend part (report.py)."""
        return report.summary(self)

    def fast_path_summary(self) -> Dict[str, object]:
        """The fast path's figures for /diagnostics and the replay summary (report.py)."""
        return report.fast_path_summary(self)

    def prefix_bytes(self) -> int:
        """Analytic device bytes of one cached prefix (report.py)."""
        return report.prefix_bytes(self.config, self.dtype)

    def close(self) -> None:
        """Drop the cache and the model; return device memory to the allocator's owner."""
        self.cache.clear()
        self._fast = self._prefix_graphs = None
        self.model = None  # type: ignore[assignment]
        self.policy = None  # type: ignore[assignment]
        if self.device.type == 'cuda':
            torch.cuda.empty_cache()


def finished_chunk(policy: PolicyFamily, prepared: _Prepared, request: _Request, actions: np.ndarray,
                   leftover: Optional[torch.Tensor], *, hit: bool, key: Optional[str], steps: int,
                   timings: Dict[str, float], clock: str) -> ActionChunk:
    """One robot's chunk from its model-space actions [H, max_action_dim]: the family's postprocess against the
    raw state of the observation they come from (runtime/batch.py makes each row's chunk with it too)."""
    return ActionChunk(actions=policy.postprocess(actions, prepared.raw_state), cache_hit=hit,
                       timings_ms=dict(timings), timings_clock=clock, key=key, num_steps=steps,
                       camera_slots=tuple(name for name, _ in prepared.slots),
                       normalized=np.ascontiguousarray(actions[:, :policy.config.action_dim]),
                       continued=request.rtc is not None and leftover is not None and len(leftover) > 0)


def decoded_frames(slots: Sequence[Tuple[str, CameraInput]]) -> Frames:
    """Every camera slot decoded (uint8 [H, W, 3]; None stays None: a masked slot); a corrupt frame is an
    ObservationError naming its camera (nothing is stored then)."""
    frames = []
    for name, frame in slots:
        try:
            pixels = frame if frame is None or isinstance(frame, np.ndarray) else decode_frame(frame)
        except ImageDecodeError as exc:
            raise ObservationError(f'images.{name}', str(exc), SkipReason.BAD_IMAGE) from exc
        frames.append((name, pixels))
    return frames
