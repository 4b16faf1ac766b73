"""meta/stats.json and the per-episode statistics, computed as lerobot computes them.

lerobot 7427f318 ``src/lerobot/datasets/compute_stats.py`` (and ``dataset_writer.save_episode``,
``dataset_metadata.save_episode``), whose arithmetic this follows step by step so QUANTILES and QUANTILE10
normalisation (pi0.5, SmolVLA) train on the numbers lerobot would have written:

- per episode, per feature: min, max, mean, std, count and the quantiles q01 q10 q50 q90 q99
  (``DEFAULT_QUANTILES``) from ``RunningQuantileStats``: one update with the whole episode (as float32, or
  float64 for integer features), mean of squares for the std, quantiles from a 5000-bin histogram between the
  episode's min and max, linearly interpolated inside the bin; fewer than 2 rows: the plain numpy figures,
  quantiles = mean;
- videos: ``sample_images`` takes ``estimate_num_samples`` evenly spaced frames of the episode (channel first,
  every k-th pixel above 300 px: ``auto_downsample_height_width``), statistics per channel over the pixels,
  divided by 255, shape (3, 1, 1); ``count`` is the number of frames sampled;
- the dataset: the episodes folded in one at a time (``aggregate_stats([so_far, episode])``): counts add,
  means by count, variances by the parallel formula, min of mins, max of maxes, and for the quantiles a bound,
  not an estimate (min of the q <= 50 ones, max of the others);
- with relative actions: ``compute_relative_action_stats`` (what ``lerobot-edit-dataset --operation.type
  recompute_stats --operation.relative_action true`` writes for ``action``): every window of ``chunk_size``
  frames inside one episode, minus the state at its start on the dims the mask selects (policy/
  relative_actions.py, lerobot's mask rule), in batches of 50 000 windows.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..policy.relative_actions import relative_action_mask

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f'q{int(q * 100):02d}' for q in QUANTILES)
HISTOGRAM_BINS = 5000
RELATIVE_BATCH = 50_000

Stats = Dict[str, np.ndarray]


class RunningStats:
    """Per-dimension running min, max, mean, mean of squares and a histogram per dimension (lerobot's
    RunningQuantileStats: same operations in the same order, so the same bits on the same numpy)."""

    def __init__(self, bins: int = HISTOGRAM_BINS) -> None:
        self.bins = bins
        self.count = 0
        self.mean: Optional[np.ndarray] = None
        self.mean_of_squares: Optional[np.ndarray] = None
        self.min: Optional[np.ndarray] = None
        self.max: Optional[np.ndarray] = None
        self.histograms: List[np.ndarray] = []
        self.edges: List[np.ndarray] = []

    def update(self, batch: np.ndarray) -> None:
        batch = batch.reshape(-1, batch.shape[-1])
        batch = batch.astype(np.result_type(batch.dtype, np.float32), copy=False)
        rows, width = batch.shape
        if self.count == 0:
            self.mean = np.mean(batch, axis=0)
            self.mean_of_squares = np.mean(batch ** 2, axis=0)
            self.min = np.min(batch, axis=0)
            self.max = np.max(batch, axis=0)
            self.histograms = [np.zeros(self.bins) for _ in range(width)]
            self.edges = [np.linspace(self.min[i] - 1e-10, self.max[i] + 1e-10, self.bins + 1) for i in range(width)]
        else:
            if width != self.mean.size:
                raise ValueError(f'a batch of width {width} for statistics of width {self.mean.size}')
            new_max, new_min = np.max(batch, axis=0), np.min(batch, axis=0)
            grown = np.any(new_max > self.max) or np.any(new_min < self.min)
            self.max = np.maximum(self.max, new_max)
            self.min = np.minimum(self.min, new_min)
            if grown:
                self._rebin()
        self.count += rows
        self.mean += (np.mean(batch, axis=0) - self.mean) * (rows / self.count)
        self.mean_of_squares += (np.mean(batch ** 2, axis=0) - self.mean_of_squares) * (rows / self.count)
        for i in range(width):
            self.histograms[i] += np.histogram(batch[:, i], bins=self.edges[i])[0]

    def _rebin(self) -> None:
        """The range grew: each old bin's count moves to the new bin holding its centre."""
        for i, (edges, histogram) in enumerate(zip(self.edges, self.histograms)):
            padding = (self.max[i] - self.min[i]) * 1e-10
            new_edges = np.linspace(self.min[i] - padding, self.max[i] + padding, self.bins + 1)
            centres = (edges[:-1] + edges[1:]) / 2
            moved = np.zeros(self.bins)
            for centre, count in zip(centres, histogram):
                if count > 0:
                    moved[max(0, min(int(np.searchsorted(new_edges, centre)) - 1, self.bins - 1))] += count
            self.histograms[i], self.edges[i] = moved, new_edges

    def result(self) -> Stats:
        if self.count < 2:
            raise ValueError('statistics need at least 2 rows')
        stats = {'min': self.min.copy(), 'max': self.max.copy(), 'mean': self.mean.copy(),
                 'std': np.sqrt(np.maximum(0, self.mean_of_squares - self.mean ** 2)),
                 'count': np.array([self.count])}
        for key, q in zip(QUANTILE_KEYS, QUANTILES):
            stats[key] = np.array([_quantile(h, e, q * self.count) for h, e in zip(self.histograms, self.edges)])
        return stats


def _quantile(histogram: np.ndarray, edges: np.ndarray, target: float) -> float:
    cumulative = np.cumsum(histogram)
    index = np.searchsorted(cumulative, target)
    if index == 0:
        return edges[0]
    if index >= len(cumulative):
        return edges[-1]
    before = cumulative[index - 1]
    inside = cumulative[index] - before
    if inside == 0:
        return edges[index]
    return edges[index] + (target - before) / inside * (edges[index + 1] - edges[index])


def _rows_stats(rows: np.ndarray, count: int) -> Stats:
    """Statistics over the rows of a 2-D array (one column per dimension); ``count`` as reported."""
    if rows.shape[0] < 2:
        stats = {'min': np.min(rows, axis=0), 'max': np.max(rows, axis=0), 'mean': np.mean(rows, axis=0),
                 'std': np.std(rows, axis=0), 'count': np.array([count])}
        stats.update({key: stats['mean'].copy() for key in QUANTILE_KEYS})
        return stats
    running = RunningStats()
    running.update(rows)
    stats = running.result()
    stats['count'] = np.array([count])
    return stats


def vector_stats(values: np.ndarray) -> Stats:
    """A numeric feature of one episode: [N] (each statistic of shape (1,)) or [N, D] (shape (D,))."""
    if values.ndim == 1:
        stats = _rows_stats(values.reshape(-1, 1), values.shape[0])
        return {key: value if key == 'count' else value.reshape(1) for key, value in stats.items()}
    return _rows_stats(values, values.shape[0])


def sample_count(frames: int, least: int = 100, most: int = 10_000, power: float = 0.75) -> int:
    """How many frames of an episode its image statistics read (compute_stats.estimate_num_samples)."""
    if frames < least:
        least = frames
    return max(least, min(int(frames ** power), most))


def sampled_frames(frames: int) -> List[int]:
    """Which frames (compute_stats.sample_indices): evenly spaced, rounded."""
    return np.round(np.linspace(0, frames - 1, sample_count(frames))).astype(int).tolist()


def downsampled(frame_chw: np.ndarray, target: int = 150, threshold: int = 300) -> np.ndarray:
    """Every k-th pixel of a large frame (compute_stats.auto_downsample_height_width)."""
    _, height, width = frame_chw.shape
    if max(width, height) < threshold:
        return frame_chw
    step = int(width / target) if width > height else int(height / target)
    return frame_chw[:, ::step, ::step]


def image_stats(frames_chw: np.ndarray) -> Stats:
    """Per-channel statistics of sampled uint8 frames [n, C, h, w], scaled to [0, 1], each of shape (C, 1, 1)."""
    count, channels = frames_chw.shape[:2]
    stats = _rows_stats(frames_chw.transpose(0, 2, 3, 1).reshape(-1, channels), count)
    return {key: value if key == 'count' else np.squeeze(value.reshape(1, -1, 1, 1) / 255.0, axis=0)
            for key, value in stats.items()}


def aggregate(parts: Sequence[Mapping[str, Stats]]) -> Dict[str, Stats]:
    """Statistics of several parts (compute_stats.aggregate_stats): every feature any part has."""
    keys: List[str] = []
    for part in parts:
        keys += [key for key in part if key not in keys]
    return {key: _aggregate_feature([part[key] for part in parts if key in part]) for key in keys}


def _aggregate_feature(parts: Sequence[Stats]) -> Stats:
    means = np.stack([p['mean'] for p in parts])
    variances = np.stack([p['std'] ** 2 for p in parts])
    counts = np.stack([p['count'] for p in parts])
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    mean = (means * counts).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    result = {'min': np.min(np.stack([p['min'] for p in parts]), axis=0),
              'max': np.max(np.stack([p['max'] for p in parts]), axis=0),
              'mean': mean, 'std': np.sqrt(variance), 'count': total}
    for key in (k for k in parts[0] if k.startswith('q') and k[1:].isdigit()):
        if all(key in p for p in parts):
            stacked = np.stack([p[key] for p in parts])
            result[key] = np.min(stacked, axis=0) if int(key[1:]) <= 50 else np.max(stacked, axis=0)
    return result


def relative_action_stats(actions: np.ndarray, states: np.ndarray, episode_index: np.ndarray, chunk_size: int,
                          exclude_joints: Sequence[str], action_names: Optional[Sequence[str]]) -> Stats:
    """``action`` statistics in relative space over every in-episode window of ``chunk_size`` frames
    (compute_stats.compute_relative_action_stats); ValueError when no episode is that long."""
    mask = relative_action_mask(actions.shape[1], exclude_joints, action_names).astype(np.float32)
    actions = np.asarray(actions, dtype=np.float32)
    states = np.asarray(states, dtype=np.float32)
    total = len(episode_index)
    starts = np.arange(max(0, total - chunk_size + 1))
    starts = starts[episode_index[starts] == episode_index[starts + chunk_size - 1]] if starts.size else starts
    if starts.size == 0:
        raise ValueError(f'no window of chunk_size {chunk_size} frames lies inside one episode '
                         f'({total} frames in all)')
    running = RunningStats()
    offsets = np.arange(chunk_size)
    for first in range(0, starts.size, RELATIVE_BATCH):
        batch = starts[first:first + RELATIVE_BATCH]
        windows = actions[batch[:, None] + offsets[None, :]].copy()
        windows[:, :, :mask.size] -= states[batch][:, None, :mask.size] * mask[None, None, :]
        running.update(windows.reshape(-1, actions.shape[1]))
    return running.result()


def serialisable(stats: Mapping[str, Mapping[str, np.ndarray]]) -> Dict[str, Dict[str, object]]:
    """stats.json's shape: nested lists of numbers (io_utils.write_stats / utils.serialize_dict)."""
    return {key: {name: np.asarray(value).tolist() for name, value in feature.items()}
            for key, feature in stats.items()}
