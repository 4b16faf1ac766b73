"""Several robots' chunks as one batch: what vla_policy_serve's batching queue (remote/batching.py) runs.

    per robot   prepare -> denoise inputs -> key -> cache lookup: PolicyRuntime's own steps, so a bad request
                fails alone with the error its own ``infer`` would raise
    misses      per distinct key (robots sending the same frames and prompt share one fill) the family's prefix
                inputs from the decoded frames (``prefix_inputs``); misses whose inputs have the same shapes
                concatenated on their batch axis into one fill_prefix, its rows taken as contexts of their own
                (cache/context.py ``context_row``) and stored; a miss alone is the runtime's own fill
    denoise     robots grouped by step count and RTC guide (the family's ``rtc_guide`` per robot; its
                ``stack_guides`` stacks a group's guides, one row each); a group's contexts stacked
                (``stack_contexts``: each token sequence padded to its longest with masked zeros) with each
                robot's own state row, noise and embodiment; one chunk_setup + euler_loop. A group of one, contexts
                that do not stack (``can_stack``), a chunk without a ``guide`` field or guides the family cannot
                stack: each robot alone through the runtime's own denoise (its fast path included)
    per robot   its row of the actions, post-processed by the family against its own raw state

Nothing but read-only prefixes is shared between rows, and rows never move: two robots with identical frames get
one prefix and still their own noise, state, leftover and actions. A batch of one is ``PolicyRuntime.infer``
itself, bit for bit; larger batches equal each robot's own ``infer`` within float rounding (a batched matrix
product sums in another order). Nothing here knows a family: what differs is the family's hooks and the axes
its context declares.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..cache import PrefixContext, can_stack, context_row, stack_contexts
from ..fast_path import EntryToken, tree_signature
from ..observation import Observation
from ..policy.family import PrefixInputs
from .chunk import ActionChunk
from .denoise_inputs import state_row
from .policy_runtime import PolicyRuntime, decoded_frames, finished_chunk, infer_request
from .stage_timer import StageTimer

BatchItem = Tuple[Observation, Mapping[str, Any]]          # an observation and its ``infer`` keyword arguments
Outcome = Union[ActionChunk, Exception]                    # a robot's chunk, or what its own ``infer`` raises


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
            slot.request = infer_request(runtime.cache_enabled, **options,
                                         rtc_modes=runtime.policy.capabilities.rtc_modes)
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
    guide: Any = None
    actions: Optional[np.ndarray] = None          # model-space [H, max_action_dim]

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
                slot.outcome = finished_chunk(rt.policy, slot.prepared, slot.request, slot.actions, slot.leftover,
                                              hit=slot.hit, key=slot.key, steps=slot.steps, timings=timings,
                                              clock=self.timer.clock)
            except Exception as exc:
                slot.fail(exc)

    # ---- misses ----------------------------------------------------------------------------------------------
    def fill_misses(self) -> None:
        """Every distinct missing prefix filled once; those whose prefix inputs have one shape in one call."""
        owners: Dict[Hashable, List[_Slot]] = {}
        for slot in self.live():
            if not slot.hit:
                owners.setdefault(slot.key if slot.key is not None else id(slot), []).append(slot)
        if not owners:
            return
        self.timer.start('preprocess')
        by_shape: Dict[Hashable, List[Tuple[List[_Slot], PrefixInputs]]] = {}
        for sharing in owners.values():
            prepared = sharing[0].prepared
            try:
                inputs = self.rt.policy.prefix_inputs(decoded_frames(prepared.slots), prepared.tokens,
                                                      prepared.token_mask)
            except Exception as exc:      # a corrupt frame fails the robots that sent it
                for slot in sharing:
                    slot.fail(exc)
                continue
            by_shape.setdefault(tree_signature(tuple(inputs)), []).append((sharing, inputs))
        self.timer.start('prefix')
        for fills in by_shape.values():
            try:
                contexts = self.fill([inputs for _, inputs in fills])
            except Exception as exc:
                for sharing, _ in fills:
                    for slot in sharing:
                        slot.fail(exc)
                continue
            for (sharing, _), context in zip(fills, contexts):
                first = sharing[0]
                entry = self.rt._generations.new(first.key)
                if first.request.use_cache:
                    self.rt._store(first.key, context)
                for slot in sharing:
                    slot.context, slot.entry = context, entry

    def fill(self, inputs: List[PrefixInputs]) -> List[PrefixContext]:
        """One context per prefix inputs of one shape (each batch-first, one row): one fill_prefix over them
        concatenated, each row then a context of its own. One alone: the runtime's own fill (its prefix graph)."""
        if len(inputs) == 1:
            return [self.rt._fill(inputs[0])]
        stacked = tuple(torch.cat(parts) for parts in zip(*inputs))
        context = self.rt.policy.fill_prefix(*stacked)
        return [context_row(context, row) for row in range(len(inputs))]

    # ---- denoise ---------------------------------------------------------------------------------------------
    def denoise_groups(self) -> List[List[_Slot]]:
        """The live robots by step count and RTC guide (its structure, shapes and plain values: what one Euler
        loop bakes in), each with its guide from the family's ``rtc_guide``; a guide of a kind tree_signature does
        not know puts its robot in a group of its own."""
        rtc_guide = self.rt.model.rtc_guide
        groups: Dict[Hashable, List[_Slot]] = {}
        for slot in self.live():
            request = slot.request
            try:            # what chunk_setup would raise for this robot alone, it raises for this robot here
                slot.guide = rtc_guide(slot.leftover, slot.noise, slot.steps, inference_delay=request.inference_delay,
                                       execution_horizon=request.execution_horizon, rtc=request.rtc)
            except Exception as exc:
                slot.fail(exc)
                continue
            try:
                shape: Hashable = (slot.steps, tree_signature(slot.guide))
            except TypeError:
                shape = id(slot)
            groups.setdefault(shape, []).append(slot)
        return list(groups.values())

    def denoise(self, group: List[_Slot]) -> None:
        """One chunk_setup + euler_loop over the group's stacked contexts, or each robot alone (see above)."""
        rows = self.denoise_together(group) if len(group) > 1 else None
        if rows is None:
            for slot in group:                  # the runtime's own denoise (and fast path), one robot at a time
                slot.actions = self.rt._denoise(slot.context, slot.entry, slot.prepared, slot.steps, slot.noise,
                                                slot.leftover, slot.request)
            return
        for slot, row in zip(group, rows):
            slot.actions = row

    def denoise_together(self, group: List[_Slot]) -> Optional[np.ndarray]:
        """The group's model-space actions [B, H, max_action_dim] from one loop, or None where the contexts do not
        stack, the family cannot stack the group's guides or its chunk has no ``guide`` field to take them."""
        rt = self.rt
        contexts = [slot.context for slot in group]
        guide = None if group[0].guide is None else rt.model.stack_guides([slot.guide for slot in group])
        if not can_stack(contexts) or (group[0].guide is not None and guide is None):
            return None
        state = torch.cat([state_row(slot.prepared.normalized_state, rt.config.max_state_dim, rt.device)
                           for slot in group])
        noise = torch.cat([slot.noise for slot in group])
        embodiment = None if rt._embodiment is None else rt._embodiment.expand(len(group)).contiguous()
        chunk = rt.policy.chunk_setup(stack_contexts(contexts), state, noise, group[0].steps, embodiment=embodiment)
        if guide is not None:
            # Each row's own guide, stacked by row, where chunk_setup keeps the guide (policy/family.py).
            if not dataclasses.is_dataclass(chunk) or 'guide' not in {f.name for f in dataclasses.fields(chunk)}:
                return None
            chunk = dataclasses.replace(chunk, guide=guide)
        return rt.policy.euler_loop(chunk).float().cpu().numpy()
