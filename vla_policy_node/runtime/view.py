"""What warmup.py and report.py read of a loaded local runtime, declared here so they need not import
policy_runtime.py (which imports them): the arrows between the runtime's modules point one way."""
from __future__ import annotations

from typing import Any, Dict, Optional, Protocol, Sequence

import torch

from ..policy.family import PolicyFamily
from .chunk import ActionChunk


class RuntimeView(Protocol):
    """The parts of a ``PolicyRuntime`` (policy_runtime.py) its warm-up and its self-description use."""

    # of the family: describe(), prompt_tokens(), normalize_state() and capabilities.rtc_modes (the warm-up's
    # prompts and chunking modes)
    policy: PolicyFamily
    model: torch.nn.Module
    config: Any                          # the family's PolicyLevelConfig
    device: torch.device
    dtype: torch.dtype
    checkpoint_path: str
    model_revision: str
    quantization: str
    quantization_kernel: str
    cuda_graphs: str
    prompt_buckets: Sequence[int]
    state_normalizer: Any                # a policy.normalize.FeatureNormalizer
    _fast: Optional[Any]                 # fast_path.StaticDenoiser
    _prefix_graphs: Optional[Any]        # fast_path.PrefixGraphs

    def infer(self, observation: Any, *args: Any, **kwargs: Any) -> ActionChunk:
        ...

    def fast_path_summary(self) -> Dict[str, object]:
        ...
