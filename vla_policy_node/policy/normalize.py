"""Normalisation of the state and un-normalisation of actions with checkpoint statistics.

Formulas follow lerobot's normalizer processor (eps 1e-8 by default):
  MEAN_STD   y = (x - mean) / (std + eps)          x = y * std + mean
  QUANTILES  y = 2 (x - q01) / d - 1, d = q99 - q01 (eps where d == 0)
             x = (y + 1) d / 2 + q01
  QUANTILE10 as QUANTILES with q10 / q90
  MIN_MAX    as QUANTILES with min / max
  IDENTITY   y = x

(huggingface/lerobot 7427f318, ``src/lerobot/processor/normalize_processor.py``;
these are every ``NormalizationMode`` of ``src/lerobot/configs/types.py``.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping

import numpy as np

DEFAULT_EPS = 1e-8
# The statistics each mode reads; for the three range modes, (low, high).
_REQUIRED_STATS = {'IDENTITY': (), 'MEAN_STD': ('mean', 'std'), 'QUANTILES': ('q01', 'q99'),
                   'QUANTILE10': ('q10', 'q90'), 'MIN_MAX': ('min', 'max')}
NORM_MODES = tuple(_REQUIRED_STATS)


class NormalizationError(ValueError):
    """Statistics missing or inconsistent with the model's dimensions."""


@dataclass(frozen=True)
class FeatureNormalizer:
    """Normalisation of one feature (``observation.state`` or ``action``)."""

    feature: str
    mode: str
    stats: Mapping[str, np.ndarray]
    eps: float = DEFAULT_EPS

    def __post_init__(self) -> None:
        if self.mode not in NORM_MODES:
            raise NormalizationError(f'{self.feature}: unknown normalisation mode {self.mode!r}')
        missing = [s for s in _REQUIRED_STATS[self.mode] if s not in self.stats]
        if missing:
            raise NormalizationError(f'{self.feature}: {self.mode} needs statistics {missing}, '
                                     f'checkpoint has {sorted(self.stats)}')

    @property
    def dim(self) -> int:
        needed = _REQUIRED_STATS[self.mode]
        return int(np.asarray(self.stats[needed[0]]).shape[-1]) if needed else -1

    def _stat(self, name: str) -> np.ndarray:
        return np.asarray(self.stats[name], dtype=np.float32)

    def _low_span(self):
        low_name, high_name = _REQUIRED_STATS[self.mode]
        low = self._stat(low_name)
        span = self._stat(high_name) - low
        return low, np.where(span == 0, np.float32(self.eps), span)

    # float32 throughout, in lerobot's order of operations: lerobot casts the statistics to the float32
    # input, so the same state gives the same normalised values bit for bit (and the same prompt bins).
    def normalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if self.mode == 'IDENTITY':
            return x.copy()
        if self.mode == 'MEAN_STD':
            return (x - self._stat('mean')) / (self._stat('std') + np.float32(self.eps))
        low, span = self._low_span()
        return np.float32(2.0) * (x - low) / span - np.float32(1.0)

    def unnormalize(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float32)
        if self.mode == 'IDENTITY':
            return y.copy()
        if self.mode == 'MEAN_STD':
            return y * self._stat('std') + self._stat('mean')
        low, span = self._low_span()
        return (y + np.float32(1.0)) * span / np.float32(2.0) + low


def split_flat_stats(flat: Mapping[str, np.ndarray], feature: str) -> Dict[str, np.ndarray]:
    """{'action.mean': ..., 'action.std': ...} -> {'mean': ..., 'std': ...} for one feature."""
    prefix = feature + '.'
    return {key[len(prefix):]: np.asarray(value, dtype=np.float64)
            for key, value in flat.items() if key.startswith(prefix)}


def flatten_stats(per_feature: Mapping[str, Mapping[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    return {f'{feature}.{stat}': np.asarray(value, dtype=np.float32)
            for feature, stats in per_feature.items() for stat, value in stats.items()}
