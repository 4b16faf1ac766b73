"""Train the embedded demo policy: the tiny pi0 fitted to the demo's sample bag by flow matching.

    vla_policy_train_demo OUT [--bag BAG] [--seed 0] [--steps 3000]
    python -m vla_policy_node.train_demo OUT ...

This is a tool for the embedded default (``checkpoint_path: builtin:demo``), NOT a general trainer: it
knows one model (the ``tiny`` pi0 preset), one kind of data (a bag laid out like ``vla_policy_make_bag``'s:
cameras, instruction, ``/joint_states`` and the recorded ``/joint_command``) and one machine (a small
CPU, one torch thread). It has no data augmentation, no validation split, no resuming, no mixed
precision; a real policy is fine-tuned with lerobot or openpi and loaded as a ``pretrained_model/``
folder.

What it fits. One sample per recorded joint state at time tau (the ticks the node could run):

- inputs: the newest frame of each camera at or before tau, the instruction, the joint state at tau;
- targets: the recorded command at ``origin + (i + 1) * DEMO_ACTION_PERIOD_SEC`` for i < chunk_size, where
  ``origin`` is the newest camera stamp: the time the node's chunks count from in either stamp mode
  (handover.py), so a published point i is due exactly when its target was recorded. Past the end of the
  recording the last command is repeated (np.interp).

The loss is pi0's flow matching exactly as lerobot and openpi train it (``flow_matching_loss`` in
policy/families/pi0/training.py, with pi0's training forward), the
weights start from the seeded random default (``write_tiny_default``) and the optimiser is lerobot's pi0
preset (AdamW, betas (0.9, 0.95), weight decay 0.01, gradient norm clipped at 1, linear warm-up then cosine
decay) with a larger peak rate, since this model is trained from scratch. Everything random comes from
one seeded torch generator state, on one thread, so a seed gives the same weights bit for bit on the same
torch build and CPU kind.

The checkpoint is a lerobot ``pretrained_model/`` folder (``save_checkpoint``) whose normalisation
statistics are computed from the bag (state: /joint_states, action: /joint_command), plus
``training.json`` (the command, seed, steps, versions, final loss, time, weights digest).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from .images import decode_frame, frame_from_msg
from .observation import joint_positions
from .policy.checkpoint import TRAINING_FILE, WEIGHTS_FILE
from .policy.config_fields import ACTION_FEATURE, STATE_FEATURE
from .policy.families import save_checkpoint
from .policy.families.pi0.config import PolicyConfig, preset
from .policy.families.pi0.tiny_tokenizer import build_test_tokenizer
from .policy.families.pi0.tokenizer import PromptTokenizer
from .policy.families.pi0.training import flow_matching_loss, sample_time, trainable
from .policy.normalize import FeatureNormalizer
from .policy.preprocess import image_to_unit_tensor, resize_with_pad, to_model_range
from .policy.tiny_default import DEFAULT_SEED, random_model
from .bags.bag_io import bag_topics, read_messages
from .replay.make_bag import COMMAND_TOPIC, INSTRUCTION_TOPIC, JOINT_STATE_TOPIC, SampleBagSpec, write_sample_bag

# The demo's action period (config/demo.yaml action_period_sec; a test keeps them equal).
DEMO_ACTION_PERIOD_SEC = 0.1
# The demo's sample bag (demo.py writes the same one).
DEMO_BAG_SPEC = SampleBagSpec(duration_sec=6.0)
DEFAULT_STEPS = 3000
BATCH_SIZE = 32
PEAK_LR = 1e-3
DECAY_LR = 1e-4
WARMUP_STEPS = 100


# ---- data ------------------------------------------------------------------------------------------------

@dataclass
class DemoData:
    """Samples cut from a bag. Frames are stored once ([F, 3, h, w] per camera, model range) and indexed."""

    camera_frames: Tuple[torch.Tensor, ...]   # per camera [F_c, 3, h, w] in [-1, 1]
    frame_index: torch.Tensor                 # [S, N] int64: each sample's frame of each camera
    states: np.ndarray                        # [S, state_dim] raw joint state at tau
    targets: np.ndarray                       # [S, H, action_dim] raw recorded command
    instructions: List[str]                   # per sample
    state_positions: np.ndarray               # every recorded joint state [T, state_dim] (statistics)
    command_positions: np.ndarray             # every recorded command [T', action_dim] (statistics)
    joint_names: Tuple[str, ...]

    @property
    def size(self) -> int:
        return int(self.frame_index.shape[0])


def _camera_topic(topics: Mapping[str, str], camera: str) -> str:
    for topic in (f'/cameras/{camera}/image_raw', f'/cameras/{camera}/image_raw/compressed'):
        if topic in topics:
            return topic
    raise ValueError(f'the bag has no topic for camera {camera!r}; topics: {sorted(topics)}')


def _model_image(msg: object, size: Tuple[int, int]) -> torch.Tensor:
    """A camera message -> [3, h, w] in [-1, 1], through the runtime's own preprocessing functions."""
    unit = image_to_unit_tensor(decode_frame(frame_from_msg(msg)), torch.device('cpu'))
    return to_model_range(resize_with_pad(unit, size))


def load_demo_data(bag: Path, config: PolicyConfig, action_period_sec: float = DEMO_ACTION_PERIOD_SEC) -> DemoData:
    """Cut (observation, next chunk of recorded commands) samples from a sample-bag-shaped bag."""
    topics = bag_topics(bag)
    camera_topics = [_camera_topic(topics, name) for name in config.camera_names]
    wanted = camera_topics + [JOINT_STATE_TOPIC, COMMAND_TOPIC, INSTRUCTION_TOPIC]
    frames: Dict[str, List[Tuple[int, torch.Tensor]]] = {topic: [] for topic in camera_topics}
    joint_names: Optional[Tuple[str, ...]] = None
    states: List[Tuple[int, np.ndarray]] = []
    commands: List[Tuple[int, np.ndarray]] = []
    instructions: List[Tuple[int, str]] = []
    for message in read_messages(bag, wanted):
        msg = message.msg
        if message.topic in frames:
            frames[message.topic].append((message.timestamp_ns, _model_image(msg, config.image_resolution)))
        elif message.topic == INSTRUCTION_TOPIC:
            instructions.append((message.timestamp_ns, str(msg.data)))
        else:
            if joint_names is None:
                joint_names = tuple(msg.name)
            positions = joint_positions(msg, joint_names, message.topic)
            (states if message.topic == JOINT_STATE_TOPIC else commands).append((message.timestamp_ns, positions))
    if joint_names is None or len(joint_names) != config.action_dim or not commands or not instructions:
        raise ValueError(f'{bag}: need joint states and commands of {config.action_dim} joints and an instruction')
    command_t = np.array([t for t, _ in commands], dtype=np.float64)
    command_p = np.stack([p for _, p in commands])
    period_ns = action_period_sec * 1e9
    offsets = (np.arange(config.chunk_size) + 1) * period_ns
    index, sample_states, targets, texts = [], [], [], []
    for tau, state in states:
        latest = [_latest(frames[topic], tau) for topic in camera_topics]
        text = _latest(instructions, tau)
        if any(i is None for i in latest) or text is None:
            continue
        origin = max(frames[topic][i][0] for topic, i in zip(camera_topics, latest))   # the newest camera stamp
        due = origin + offsets
        targets.append(np.stack([np.interp(due, command_t, command_p[:, j]) for j in range(len(joint_names))], 1))
        index.append(latest)
        sample_states.append(state)
        texts.append(instructions[text][1])
    if not index:
        raise ValueError(f'{bag}: no joint state comes after a frame of every camera and an instruction')
    return DemoData(camera_frames=tuple(torch.stack([f for _, f in frames[topic]]) for topic in camera_topics),
                    frame_index=torch.tensor(index, dtype=torch.int64),
                    states=np.stack(sample_states), targets=np.stack(targets), instructions=texts,
                    state_positions=np.stack([p for _, p in states]), command_positions=command_p,
                    joint_names=joint_names)


def _latest(stream: Sequence[Tuple[int, object]], time_ns: int) -> Optional[int]:
    """Index of the last entry stamped at or before ``time_ns`` (streams are in time order), or None."""
    found = None
    for i, (stamp, _) in enumerate(stream):
        if stamp > time_ns:
            break
        found = i
    return found


def statistics_of(values: np.ndarray) -> Dict[str, np.ndarray]:
    """Every statistic lerobot's dataset stats keep (per dimension, float32), so any normalisation mode loads."""
    values = np.asarray(values, dtype=np.float64)
    stats = {'mean': values.mean(0), 'std': values.std(0), 'min': values.min(0), 'max': values.max(0)}
    for name, q in (('q01', 0.01), ('q10', 0.10), ('q90', 0.90), ('q99', 0.99)):
        stats[name] = np.quantile(values, q, axis=0)
    return {name: value.astype(np.float32) for name, value in stats.items()}


# ---- training ----------------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    folder: Path
    steps: int
    final_loss: float          # mean over the last 50 steps
    seconds: float
    weights_sha256: str


def _learning_rate(step: int, steps: int) -> float:
    """lerobot's cosine decay with warm-up (CosineDecayWithWarmupSchedulerConfig), as a factor of PEAK_LR."""
    if step < WARMUP_STEPS:
        return (step + 1) / (WARMUP_STEPS + 1)
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return (DECAY_LR + (PEAK_LR - DECAY_LR) * cosine) / PEAK_LR


class _Batches:
    """Model inputs of the samples, prepared once; ``take(idx)`` gathers a batch."""

    def __init__(self, data: DemoData, config: PolicyConfig, tokenizer: PromptTokenizer,
                 state_norm: FeatureNormalizer, action_norm: FeatureNormalizer) -> None:
        size = data.size
        self.frames = data.camera_frames
        self.frame_index = data.frame_index
        encoded = [tokenizer.encode_pi0(text, config.tokenizer_max_length) for text in data.instructions]
        self.tokens = torch.from_numpy(np.stack([ids for ids, _ in encoded]))
        self.token_masks = torch.from_numpy(np.stack([mask for _, mask in encoded]))
        self.image_masks = torch.ones(size, len(self.frames), dtype=torch.bool)
        state = np.zeros((size, config.max_state_dim), dtype=np.float32)
        state[:, :config.state_dim] = state_norm.normalize(data.states)
        self.states = torch.from_numpy(state)
        actions = np.zeros((size, config.chunk_size, config.max_action_dim), dtype=np.float32)
        actions[:, :, :config.action_dim] = action_norm.normalize(data.targets)
        self.actions = torch.from_numpy(actions)

    def take(self, idx: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        images = torch.stack([frames[self.frame_index[idx, c]] for c, frames in enumerate(self.frames)], dim=1)
        return (images, self.image_masks[idx], self.tokens[idx], self.token_masks[idx], self.states[idx],
                self.actions[idx])


def _progress(steps: int, enabled: bool) -> Iterator[int]:
    if not enabled:
        return iter(range(steps))
    from tqdm import tqdm
    return tqdm(range(steps), desc='training the demo policy', unit='step', file=sys.stderr)


def train(output: Path, bag: Optional[Path] = None, seed: int = DEFAULT_SEED, steps: int = DEFAULT_STEPS,
          progress: bool = True, command: Optional[str] = None) -> TrainResult:
    """Fit the tiny pi0 to ``bag`` (default: the demo's sample bag, written to a scratch folder) and write
    the checkpoint to ``output``. Deterministic for a seed; one torch thread."""
    config = preset('tiny')
    output = Path(output)
    threads = torch.get_num_threads()
    rng_state = torch.random.get_rng_state()
    with tempfile.TemporaryDirectory(prefix='vla_train_demo.') as scratch:
        source = Path(bag) if bag is not None else write_sample_bag(Path(scratch) / 'sample_bag', DEMO_BAG_SPEC)
        tokenizer_file = build_test_tokenizer(Path(scratch) / 'tokenizer', vocab_size=min(config.vocab_size, 512))
        tokenizer = PromptTokenizer.from_path(tokenizer_file)
        data = load_demo_data(source, config)
        state_stats, action_stats = statistics_of(data.state_positions), statistics_of(data.command_positions)
        mapping = config.normalization_mapping
        batches = _Batches(data, config, tokenizer, FeatureNormalizer(STATE_FEATURE, mapping['STATE'], state_stats),
                           FeatureNormalizer(ACTION_FEATURE, mapping['ACTION'], action_stats))
        model = random_model(config, seed)          # the random default's weights are the starting point
        try:
            torch.set_num_threads(1)
            torch.manual_seed(seed)
            started = time.monotonic()
            losses = _fit(model, batches, config, steps, progress)
            seconds = time.monotonic() - started
        finally:
            torch.set_num_threads(threads)
            torch.random.set_rng_state(rng_state)
        save_checkpoint(output, model, state_stats, action_stats, tokenizer_file=tokenizer_file)
    digest = hashlib.sha256((output / WEIGHTS_FILE).read_bytes()).hexdigest()
    final = float(np.mean(losses[-50:]))
    record = {'command': command or f'vla_policy_train_demo {output} --seed {seed} --steps {steps}',
              'seed': seed, 'steps': steps, 'batch_size': BATCH_SIZE, 'samples': data.size,
              'final_loss': final, 'seconds': round(seconds, 1), 'weights_sha256': digest,
              'torch': torch.__version__, 'numpy': np.__version__, 'python': platform.python_version(),
              'machine': platform.machine(), 'joint_names': list(data.joint_names),
              'action_period_sec': DEMO_ACTION_PERIOD_SEC, 'chunk_origin': 'the newest camera stamp',
              'bag': 'the demo sample bag (vla_policy_make_bag --duration 6)' if bag is None else str(bag)}
    (output / TRAINING_FILE).write_text(json.dumps(record, indent=2) + '\n')
    return TrainResult(output, steps, final, seconds, digest)


def _fit(model: nn.Module, batches: _Batches, config: PolicyConfig, steps: int, progress: bool) -> List[float]:
    losses: List[float] = []
    with trainable(model):
        optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _learning_rate(step, steps))
        size = batches.actions.shape[0]
        bar = _progress(steps, progress)
        for step in bar:
            idx = torch.randint(size, (BATCH_SIZE,))
            images, image_masks, tokens, token_masks, state, actions = batches.take(idx)
            noise = torch.randn(actions.shape)
            loss = flow_matching_loss(model, images, image_masks, tokens, token_masks, state, actions, noise,
                                      sample_time(BATCH_SIZE), config.action_dim)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
            if progress and step % 10 == 0:
                bar.set_postfix(loss=f'{np.mean(losses[-10:]):.4f}')
    return losses


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='vla_policy_train_demo', description=__doc__.split('\n\n')[0])
    parser.add_argument('output', type=Path, help='checkpoint folder to write (pretrained_model layout)')
    parser.add_argument('--bag', type=Path, help="a bag laid out like vla_policy_make_bag's (default: the "
                                                 "demo's 6 s sample bag, generated)")
    parser.add_argument('--seed', type=int, default=DEFAULT_SEED,
                        help='initial weights and training noise (default %(default)s; with the default --steps: '
                             'builtin:demo)')
    parser.add_argument('--steps', type=int, default=DEFAULT_STEPS, help='optimizer steps (default %(default)s)')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    args = parser.parse_args(argv)
    command = ' '.join(['vla_policy_train_demo', str(args.output)] + (['--bag', str(args.bag)] if args.bag else [])
                       + ['--seed', str(args.seed), '--steps', str(args.steps)])
    result = train(args.output, args.bag, args.seed, args.steps, progress=not args.no_progress, command=command)
    print(f'trained {result.steps} steps in {result.seconds:.1f} s, final loss {result.final_loss:.4f} '
          f'(mean of the last 50 steps); wrote {result.folder} (weights sha256 {result.weights_sha256[:16]})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
