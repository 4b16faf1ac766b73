"""Normalisation of the state and un-normalisation of actions with checkpoint statistics.

Formulas follow lerobot's normalizer processor (eps 1e-8 by default):
  MEAN_STD   y = (x - mean) / (std + eps)          x = y * std + mean
  QUANTILES  y = 2 (x - q01) / d - 1, d = q99 - q01 (eps where d == 0)
             x = (y + 1) d / 2 + q01
  MIN_MAX    as QUANTILES with min / max
  IDENTITY   y = x
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping

import numpy as np

DEFAULT_EPS = 1e-8
NORM_MODES = ('IDENTITY', 'MEAN_STD', 'QUANTILES', 'MIN_MAX')
_REQUIRED_STATS = {'IDENTITY': (), 'MEAN_STD': ('mean', 'std'), 'QUANTILES': ('q01', 'q99'), 'MIN_MAX': ('min', 'max')}


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

    def _low_span(self):
        low_name, high_name = ('q01', 'q99') if self.mode == 'QUANTILES' else ('min', 'max')
        low = np.asarray(self.stats[low_name], dtype=np.float64)
        span = np.asarray(self.stats[high_name], dtype=np.float64) - low
        return low, np.where(span == 0, self.eps, span)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.mode == 'IDENTITY':
            return x.astype(np.float32)
        if self.mode == 'MEAN_STD':
            y = (x - self.stats['mean']) / (np.asarray(self.stats['std'], dtype=np.float64) + self.eps)
        else:
            low, span = self._low_span()
            y = 2.0 * (x - low) / span - 1.0
        return y.astype(np.float32)

    def unnormalize(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        if self.mode == 'IDENTITY':
            return y.astype(np.float32)
        if self.mode == 'MEAN_STD':
            x = y * self.stats['std'] + self.stats['mean']
        else:
            low, span = self._low_span()
            x = (y + 1.0) * span / 2.0 + low
        return x.astype(np.float32)


def split_flat_stats(flat: Mapping[str, np.ndarray], feature: str) -> Dict[str, np.ndarray]:
    """{'action.mean': ..., 'action.std': ...} -> {'mean': ..., 'std': ...} for one feature."""
    prefix = feature + '.'
    return {key[len(prefix):]: np.asarray(value, dtype=np.float64)
            for key, value in flat.items() if key.startswith(prefix)}


def flatten_stats(per_feature: Mapping[str, Mapping[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    return {f'{feature}.{stat}': np.asarray(value, dtype=np.float32)
            for feature, stats in per_feature.items() for stat, value in stats.items()}
