"""Several robots' chunks as one batch: what vla_policy_serve's batching queue (remote/batching.py) runs.

    per robot   prepare -> denoise inputs -> key -> cache lookup: PolicyRuntime's own steps, so a bad request
                fails alone with the error its own ``infer`` would raise
    misses      frames decoded and scaled per robot; one fill_prefix per prompt length over the distinct keys
                (robots sending the same frames and prompt share one fill), split into one entry per key, stored
    denoise     robots grouped by step count and RTC mode; a group's prefixes padded along the token axis to the
                longest (pad mask False there, so no query attends to the padding; positions count valid tokens
                only) and stacked on the batch axis with each robot's own state row, noise and RTC guide; one
                chunk_setup + euler_loop; a group of one is the runtime's own denoise (its fast path included)
    per robot   its row of the actions, unnormalised against its own raw state

Nothing but read-only prefixes is shared between rows, and rows never move: two robots with identical frames get
one prefix and still their own noise, state, leftover and actions. A batch of one is ``PolicyRuntime.infer``
itself, bit for bit; larger batches equal each robot's own ``infer`` within float rounding (a batched matrix
product sums in another order).

The context operations below (pad along tokens, stack on batch, take a row) assume today's PrefixContext: kv
[L, 2, B, K, P, D] and ``extra`` tensors laid out alike (batch on axis 2, tokens on axis -2). A family whose
context is laid out otherwise is run one robot at a time.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..cache import PrefixContext
from ..fast_path import EntryToken
from ..observation import Observation
from ..policy.rtc import RTCGuide, guide_mode, prepare_guide, stack_guides
from .chunk import ActionChunk
from .denoise_inputs import state_row
from .policy_runtime import PolicyRuntime, infer_request
from .stage_timer import StageTimer

BatchItem = Tuple[Observation, Mapping[str, Any]]          # an observation and its ``infer`` keyword arguments
Outcome = Union[ActionChunk, Exception]                    # a robot's chunk, or what its own ``infer`` raises

BATCH_AXIS, TOKEN_AXIS = 2, -2                             # of kv [L, 2, B, K, P, D] and of each extra tensor


def infer_batch(runtime: PolicyRuntime, items: Sequence[BatchItem]) -> List[Outcome]:
    """One outcome per item, in order: the chunk ``runtime.infer(observation, **options)`` gives, or the exception
    it raises. The runtime is held for the whole batch, as ``infer`` holds it."""
    if len(items) == 1:
        observation, options = items[0]
        try:
            return [runtime.infer(observation, **options)]
        except Exception as exc:   # the caller answers each robot with its own error
            return [exc]
    slots = []
    for observation, options in items:
        slot = _Slot(observation)
        try:
            slot.request = infer_request(runtime.cache_enabled, **options)
        except (TypeError, ValueError) as exc:
            slot.outcome = exc
        slots.append(slot)
    with runtime._lock:
        _Batch(runtime, slots).run()
    return [slot.outcome for slot in slots]


@dataclass
class _Slot:
    """One robot's request through the batch; ``outcome`` set once it is done (a chunk) or failed."""

    observation: Observation
    request: Any = None
    outcome: Optional[Outcome] = None
    prepared: Any = None
    steps: int = 0
    noise: Optional[torch.Tensor] = None
    leftover: Optional[torch.Tensor] = None
    key: Optional[str] = None
    context: Optional[PrefixContext] = None
    entry: Optional[EntryToken] = None
    hit: bool = False
    guide: Optional[RTCGuide] = None
    normalized: Optional[np.ndarray] = None

    def fail(self, exc: Exception) -> None:
        if self.outcome is None:
            self.outcome = exc


class _Batch:
    def __init__(self, runtime: PolicyRuntime, slots: List[_Slot]) -> None:
        self.rt = runtime
        self.slots = slots
        self.timer = StageTimer(runtime.device)

    def live(self) -> List[_Slot]:
        return [slot for slot in self.slots if slot.outcome is None]

    def run(self) -> None:
        rt = self.rt
        self.timer.start('hash')
        for slot in self.live():
            try:
                request = slot.request
                slot.prepared = rt._prepare(slot.observation, request.max_instruction_length, request.max_image_pixels)
                slot.steps, slot.noise, slot.leftover = rt._denoise_inputs(slot.prepared, request)
                slot.key, slot.context = rt._lookup(slot.prepared, request.use_cache)
            except Exception as exc:
                slot.fail(exc)
                continue
            slot.hit = slot.context is not None
            if slot.hit:
                slot.entry = rt._generations.token(slot.key) or rt._generations.new(slot.key)
        self.fill_misses()
        self.timer.start('denoise')
        for group in self.denoise_groups():
            try:
                self.denoise(group)
            except Exception as exc:
                for slot in group:
                    slot.fail(exc)
        self.timer.stop()
        timings = self.timer.ms
        for slot in self.live():
            try:
                slot.outcome = self.chunk(slot, timings)
            except Exception as exc:
                slot.fail(exc)

    # ---- misses ----------------------------------------------------------------------------------------------
    def fill_misses(self) -> None:
        """Every distinct missing prefix filled once, those of one prompt length in one fill_prefix call."""
        owners: Dict[Hashable, List[_Slot]] = {}
        for slot in self.live():
            if not slot.hit:
                owners.setdefault(slot.key if slot.key is not None else id(slot), []).append(slot)
        if not owners:
            return
        self.timer.start('preprocess')
        by_length: Dict[int, List[Tuple[List[_Slot], torch.Tensor, torch.Tensor]]] = {}
        for sharing in owners.values():
            try:
                images, image_masks = self.rt._preprocess(sharing[0].prepared.slots)
            except Exception as exc:      # a corrupt frame fails the robots that sent it
                for slot in sharing:
                    slot.fail(exc)
                continue
            by_length.setdefault(len(sharing[0].prepared.tokens), []).append((sharing, images, image_masks))
        self.timer.start('prefix')
        for fills in by_length.values():
            try:
                contexts = self.fill(fills)
            except Exception as exc:
                for sharing, _, _ in fills:
                    for slot in sharing:
                        slot.fail(exc)
                continue
            for (sharing, _, _), context in zip(fills, contexts):
                first = sharing[0]
                entry = self.rt._generations.new(first.key)
                if first.request.use_cache:
                    self.rt._store(first.key, context)
                for slot in sharing:
                    slot.context, slot.entry = context, entry

    def fill(self, fills: List[Tuple[List[_Slot], torch.Tensor, torch.Tensor]]) -> List[PrefixContext]:
        """One context per fill (prompts of one length): one batched fill_prefix, split into entries of their own."""
        device = self.rt.device
        prepared = [sharing[0].prepared for sharing, _, _ in fills]
        tokens = torch.from_numpy(np.stack([p.tokens for p in prepared])).to(device)
        token_masks = torch.from_numpy(np.stack([p.token_mask for p in prepared])).to(device)
        images = torch.cat([images for _, images, _ in fills])
        image_masks = torch.cat([masks for _, _, masks in fills])
        context = self.rt.policy.fill_prefix(images, image_masks, tokens, token_masks)
        if len(fills) == 1:
            return [context]
        if batchable([context]):
            return [take_row(context, row) for row in range(len(fills))]
        return [self.rt.policy.fill_prefix(images[i:i + 1], image_masks[i:i + 1], tokens[i:i + 1],
                                           token_masks[i:i + 1]) for i in range(len(fills))]

    # ---- denoise ---------------------------------------------------------------------------------------------
    def denoise_groups(self) -> List[List[_Slot]]:
        """The live robots by (step count, RTC mode), each with its own RTC guide prepared."""
        cfg = self.rt.config
        groups: Dict[Tuple[int, str], List[_Slot]] = {}
        for slot in self.live():
            request = slot.request
            try:
                slot.guide = prepare_guide(slot.leftover, slot.noise, slot.steps, request.inference_delay,
                                           request.execution_horizon, request.rtc, cfg.rtc_training_max_delay)
            except ValueError as exc:
                slot.fail(exc)
                continue
            groups.setdefault((slot.steps, guide_mode(slot.guide)), []).append(slot)
        return list(groups.values())

    def denoise(self, group: List[_Slot]) -> None:
        rt, cfg = self.rt, self.rt.config
        if len(group) == 1 or not batchable([slot.context for slot in group]):
            for slot in group:                  # the runtime's own denoise (and fast path), one robot at a time
                slot.normalized = rt._denoise(slot.context, slot.entry, slot.prepared, slot.steps, slot.noise,
                                              slot.leftover, slot.request)
            return
        context = stack_contexts([slot.context for slot in group])
        state = torch.cat([state_row(slot.prepared.normalized_state, cfg.max_state_dim, rt.device) for slot in group])
        noise = torch.cat([slot.noise for slot in group])
        steps = group[0].steps
        if group[0].guide is None:
            normalized = rt.policy.denoise(context, state, noise, steps)
        else:
            # Each row's own guide: built per robot (its leftover, delay, horizon, schedule), stacked by row.
            chunk = rt.policy.chunk_setup(context, state, noise, steps)
            normalized = rt.policy.euler_loop(dataclasses.replace(chunk, guide=stack_guides(
                [slot.guide for slot in group])))
        rows = normalized[:, :, :cfg.action_dim].float().cpu().numpy()
        for slot, row in zip(group, rows):
            slot.normalized = row

    def chunk(self, slot: _Slot, timings: Dict[str, float]) -> ActionChunk:
        """The robot's chunk, as ``PolicyRuntime._run`` makes it; the stage timings are the batch's."""
        request, prepared = slot.request, slot.prepared
        return ActionChunk(actions=self.rt._postprocess(slot.normalized, prepared.raw_state), cache_hit=slot.hit,
                           timings_ms=dict(timings), timings_clock=self.timer.clock, key=slot.key,
                           num_steps=slot.steps, camera_slots=tuple(name for name, _ in prepared.slots),
                           normalized=slot.normalized,
                           continued=request.rtc is not None and slot.leftover is not None and len(slot.leftover) > 0)


# ---- the context operations batching needs (see the module docstring) --------------------------------------

def batchable(contexts: Sequence[PrefixContext]) -> bool:
    """Whether every tensor of these contexts is laid out as kv (batch on axis 2, tokens on axis -2) and they share
    names, dtypes and every dimension but the tokens."""
    def layout(context: PrefixContext) -> Optional[Tuple]:
        tensors = {'kv': context.kv, **context.extra}
        shapes = []
        for name, tensor in sorted(tensors.items()):
            if tensor.dim() != 6 or tensor.shape[BATCH_AXIS] != context.batch_size or \
                    tensor.shape[TOKEN_AXIS] != context.prefix_len:
                return None
            shapes.append((name, tensor.dtype, tuple(tensor.shape[:TOKEN_AXIS]), tensor.shape[-1]))
        return tuple(shapes)

    layouts = [layout(context) for context in contexts]
    return layouts[0] is not None and all(other == layouts[0] for other in layouts[1:]) and \
        all(context.batch_size == contexts[0].batch_size for context in contexts)


def pad_tokens(tensor: torch.Tensor, length: int, axis: int) -> torch.Tensor:
    """``tensor`` extended with zeros (False for a mask) along ``axis`` to ``length``."""
    missing = length - tensor.shape[axis]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=axis)


def stack_contexts(contexts: Sequence[PrefixContext]) -> PrefixContext:
    """B contexts of one row each (prefix lengths may differ) -> one context of B rows, padded along the tokens to
    the longest: padded tokens are masked (pad_mask False), so they are never attended to."""
    length = max(context.prefix_len for context in contexts)
    names = list(contexts[0].extra)
    return PrefixContext(
        kv=torch.cat([pad_tokens(context.kv, length, TOKEN_AXIS) for context in contexts], dim=BATCH_AXIS),
        pad_mask=torch.cat([pad_tokens(context.pad_mask, length, -1) for context in contexts], dim=0),
        extra={name: torch.cat([pad_tokens(context.extra[name], length, TOKEN_AXIS) for context in contexts],
                               dim=BATCH_AXIS) for name in names})


def take_row(context: PrefixContext, row: int) -> PrefixContext:
    """Row ``row`` of a batched context as a context of its own (copied: a cache entry must not keep the whole
    batch's storage alive, and the budget counts what it holds)."""
    def pick(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.narrow(BATCH_AXIS, row, 1).clone()

    return PrefixContext(kv=pick(context.kv), pad_mask=context.pad_mask[row:row + 1].clone(),
                         extra={name: pick(tensor) for name, tensor in context.extra.items()})
