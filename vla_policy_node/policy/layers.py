"""Building blocks shared by the vision tower and the two Gemma streams.

Shapes use B batch, S query length, T key length, H query heads, K kv heads,
G = H // K queries per kv head, D head dim, W width.
"""
from __future__ import annotations

import contextlib
import math
import threading
import weakref
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .quant import fuse_quantized, is_quantized

# Finite "minus infinity" for additive attention masks. A fully masked row (a
# padded query) then gets a uniform softmax instead of NaN, and a NaN never
# reaches the K/V of the next layer. Same value as the reference implementations.
ATTENTION_MASK_VALUE = -2.3819763e38


# F.rms_norm (torch >= 2.4): one fused kernel on GPUs, same order of operations as the formula below.
_HAS_RMS_NORM = hasattr(F, 'rms_norm')


def _rms_normalize(x: torch.Tensor, eps: float, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) [* weight] over the last dim, in x's dtype (fp32 here)."""
    if _HAS_RMS_NORM:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight


class RMSNorm(nn.Module):
    """Gemma RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), computed in fp32, rounded once to x's dtype.

    As lerobot's PiGemmaRMSNorm (policies/pi_gemma.py, lerobot 7427f318): (1 + w) is
    applied in fp32 before the cast. For fp32 activations no cast happens at all.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_normalize(x.float(), self.eps, 1.0 + self.weight.float()).type_as(x)


class LlamaRMSNorm(nn.Module):
    """Llama RMSNorm: x * rsqrt(mean(x^2) + eps) * w (plain w, not Gemma's 1 + w), in fp32, rounded once to
    x's dtype (transformers LlamaRMSNorm; SmolVLM's text model and SmolVLA's expert)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_normalize(x.float(), self.eps, self.weight.float()).type_as(x)


class AdaptiveRMSNorm(nn.Module):
    """pi0.5 expert norm: RMSNorm whose scale and shift come from the time condition.

    One dense layer maps the condition [B, W_cond] (or per token [B, S, W_cond]) to
    (scale, shift, gate), each [B, 1 or S, W]. Returns the modulated activations
    and the gate for the residual that follows.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        normed = _rms_normalize(x.float(), self.eps)
        modulation = self.dense(cond.to(self.dense.weight.dtype)).float()  # [B, 3W] or [B, S, 3W]
        if modulation.dim() == 2:
            modulation = modulation[:, None, :]
        scale, shift, gate = modulation.chunk(3, dim=-1)                     # each [B, 1 or S, W]
        out = normed * (1.0 + scale) + shift
        return out.type_as(x), gate.type_as(x)


class FusedProjection:
    """Several ``nn.Linear`` that read the same input, run as one GEMM.

    Fusing concatenates the weights (and biases) into one [sum(out), in] tensor and
    turns each module's parameter into a row view of it: the weights are held once,
    ``state_dict`` keeps lerobot's keys and tensors, and an in-place write to a
    parameter reaches the fused GEMM. Anything that gives a parameter new storage
    (``.to()``, ``param.data = ...``, ``deepcopy``, ``load_state_dict(assign=True)``)
    leaves the views behind; the next call notices (storage addresses) and fuses again
    from the current parameters, so the GEMM never runs on stale weights. The loader
    fuses right after loading (``fuse_projections``) so that this happens at load time,
    not in the first control tick. Quantized parts (policy/quant.py, the ``quantization`` parameter) fuse the
    same way: their stacked int8 / e4m3 rows and per-row scales, one quantized GEMM; partly quantized parts run
    one GEMM each. Deliberately not an ``nn.Module``: it owns no parameters and adds no state_dict entries.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        self.linears = linears
        self.weight: Optional[torch.Tensor] = None
        self.bias: Optional[torch.Tensor] = None
        self.quantized: Optional[nn.Module] = None          # the stacked QuantizedLinear, when the parts are
        self.mixed = False
        self._views: List[Tuple[dict, str, int]] = []        # (module's tensor dict, name, expected address)

    def fuse(self) -> None:
        quantized = [is_quantized(linear) for linear in self.linears]
        self.mixed = any(quantized) and not all(quantized)     # some parts quantized: each runs its own GEMM
        if self.mixed:
            self.weight, self._views = self.linears[0], []
            return
        if all(quantized):
            self._fuse_quantized()
            return
        self.quantized = None
        # inference_mode(False): the fused tensors become parameter storage, which must stay usable outside it.
        with torch.inference_mode(False), torch.no_grad():
            self.weight = _concatenate_into_views([linear.weight for linear in self.linears])
            has_bias = all(linear.bias is not None for linear in self.linears)
            self.bias = _concatenate_into_views([linear.bias for linear in self.linears]) if has_bias else None
        names = ('weight', 'bias') if has_bias else ('weight',)
        self._views = [(linear._parameters, name, linear._parameters[name].data_ptr())
                       for linear in self.linears for name in names]

    def _fuse_quantized(self) -> None:
        """Quantized parts (policy/quant.py): their int8 / e4m3 rows and per-row scales stacked, one GEMM."""
        with torch.inference_mode(False), torch.no_grad():
            self.quantized = fuse_quantized(self.linears)
        self.weight = self.quantized.qweight
        self._views = [(linear._buffers, name, linear._buffers[name].data_ptr())
                       for linear in self.linears for name in ('qweight', 'scale')]

    def _views_current(self) -> bool:
        """True while every parameter is still its block of the fused tensors (a dict lookup and an address each)."""
        for tensors, name, address in self._views:
            if tensors[name].data_ptr() != address:
                return False
        return True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., sum(out)]: the linears' outputs side by side, from one GEMM."""
        # Under torch.compile the storage check would break the graph; a compiled caller fuses first.
        if self.weight is None or not (_compiling() or self._views_current()):
            self.fuse()
        if self.mixed:
            return torch.cat([apply_linear(linear, x) for linear in self.linears], dim=-1)
        if self.quantized is not None:
            return self.quantized(x)
        return packed_linear(x, self.weight, self.bias)


def _compiling() -> bool:
    compiler = getattr(torch, 'compiler', None)
    return bool(compiler is not None and hasattr(compiler, 'is_compiling') and compiler.is_compiling())


def _concatenate_into_views(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """cat(params) along dim 0; each parameter then holds its row block of the result (no second copy)."""
    fused = torch.cat([p.detach() for p in params])
    start = 0
    for param in params:
        param.data = fused[start:start + param.shape[0]]
        start += param.shape[0]
    return fused


def fuse_projections(model: nn.Module) -> nn.Module:
    """Fuse q/k/v and gate/up of every block that supports it (call once after loading the weights)."""
    for module in model.modules():
        for attribute in list(vars(module).values()):
            if isinstance(attribute, FusedProjection):
                attribute.fuse()
    return model


class PackedLinears:
    """CPU, fp32, MKL: every weight that ``linear`` sees with ``rows`` input rows, prepacked once for MKL's packed
    GEMM (``torch.ops.mkl._mkl_linear``), which runs a fixed small-row GEMM faster than plain sgemm (SmolVLA's
    50-row expert GEMMs on this project's CPU). Same values: a weight whose packed GEMM does not match F.linear
    bit for bit on a probe is not packed (``_pack``). The cost is one more fp32 copy of each packed weight
    (at the real SmolVLA shape the expert's qkv, q and gate/up: about 250 MB), held while the packer lives.
    A weight that changes (new storage or an in-place write) is packed again; anything else (other row counts,
    dtypes, devices, no MKL, autograd) runs F.linear.
    Active only inside ``with packer:`` (``packed_linear`` then uses it), so other callers are untouched."""

    _local = threading.local()          # the active packer, per thread
    # Smaller weights run F.linear: the look-up costs more than packing saves (the tiny checkpoints).
    min_elements = 256 * 256

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._packs: dict = {}          # id(weight) -> (weakref to it, data_ptr, version, packed)

    @staticmethod
    def available() -> bool:
        return (torch.backends.mkl.is_available() and hasattr(torch.ops, 'mkl')
                and hasattr(torch.ops.mkl, '_mkl_linear'))

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if (rows != self.rows or weight.numel() < self.min_elements or x.device.type != 'cpu'
                or x.dtype != torch.float32 or weight.dtype != torch.float32 or torch.is_grad_enabled()):
            return F.linear(x, weight, bias)
        entry = self._packs.get(id(weight))
        if (entry is None or entry[0]() is not weight or entry[1] != weight.data_ptr()
                or entry[2] != weight._version):
            entry = (weakref.ref(weight), weight.data_ptr(), weight._version, self._pack(weight, bias, rows))
            self._packs = {key: value for key, value in self._packs.items() if value[0]() is not None}
            self._packs[id(weight)] = entry
        if entry[3] is None:
            return F.linear(x, weight, bias)
        flat = x.reshape(rows, x.shape[-1])
        out = torch.ops.mkl._mkl_linear(flat, entry[3], weight, bias, rows)
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def _pack(weight: torch.Tensor, bias: Optional[torch.Tensor], rows: int) -> Optional[torch.Tensor]:
        """The packed weight, or None where MKL's packed GEMM does not give F.linear's values bit for bit on a
        probe (it runs other kernels for some shapes, e.g. 720 output features here: ~1e-6 relative)."""
        with torch.inference_mode(False), torch.no_grad():
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
            probe = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(0))
            same = torch.equal(torch.ops.mkl._mkl_linear(probe, packed, weight, bias, rows),
                               F.linear(probe, weight, bias))
        return packed if same else None

    @staticmethod
    def active() -> Optional['PackedLinears']:
        return getattr(PackedLinears._local, 'packer', None)

    def __enter__(self) -> 'PackedLinears':
        self._previous, PackedLinears._local.packer = PackedLinears.active(), self
        return self

    def __exit__(self, *exc) -> None:
        PackedLinears._local.packer = self._previous


def loop_packer(owner: object, rows: int, device: torch.device, dtype: torch.dtype):
    """The context a model's denoise loop runs in: on CPU, fp32, with MKL, a ``PackedLinears`` for the loop's
    ``rows``-row GEMMs, kept on ``owner`` across calls (packed once, packed again when the row count changes);
    otherwise a no-op context."""
    if device.type != 'cpu' or dtype != torch.float32 or not PackedLinears.available():
        return contextlib.nullcontext()
    packer = getattr(owner, '_packed_linears', None)
    if packer is None or packer.rows != rows:
        packer = owner._packed_linears = PackedLinears(rows)
    return packer


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear, through the active ``PackedLinears`` when there is one."""
    packer = PackedLinears.active()
    return F.linear(x, weight, bias) if packer is None else packer.linear(x, weight, bias)


def apply_linear(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A block's projection: an ``nn.Linear`` through ``packed_linear``, a quantized one (policy/quant.py) itself."""
    return linear(x) if is_quantized(linear) else packed_linear(x, linear.weight, linear.bias)


class GemmaMLP(nn.Module):
    """down(act(gate(x)) * up(x)); act gelu_tanh (Gemma) or silu (Llama, ``activation='silu'``)."""

    def __init__(self, width: int, mlp_dim: int, activation: str = 'gelu_tanh') -> None:
        super().__init__()
        self.activation = activation
        self.gate_proj = nn.Linear(width, mlp_dim, bias=False)
        self.up_proj = nn.Linear(width, mlp_dim, bias=False)
        self.down_proj = nn.Linear(mlp_dim, width, bias=False)
        self.gate_up = FusedProjection(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == 'cpu':
            # CPU BLAS runs the two [mlp_dim, W] blocks faster than one [2 * mlp_dim, W] GEMM (3-5% of
            # the pi0 denoise on this project's CPU, bench/bench_runtime.py); on a GPU one launch wins.
            gate, up = apply_linear(self.gate_proj, x), apply_linear(self.up_proj, x)
        else:
            gate, up = self.gate_up(x).chunk(2, dim=-1)                  # each [..., mlp_dim]
        act = F.silu(gate) if self.activation == 'silu' else F.gelu(gate, approximate='tanh')
        return apply_linear(self.down_proj, act * up)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for integer positions [B, S] -> cos, sin [B, S, 1, D] in fp32 (once per pass).

    Laid out for activations [B, S, heads, D] (heads before the transpose), so one
    call rotates the query and key heads of a fused projection together.
    """
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, device=positions.device, dtype=torch.float32) * 2.0 / head_dim))
    angles = positions.float()[..., None] * inv_freq                 # [B, S, D/2]
    angles = torch.cat([angles, angles], dim=-1)[:, :, None]         # [B, S, 1, D]
    return angles.cos(), angles.sin()


def split_half_rope_tables(positions: torch.Tensor, head_dim: int,
                           max_wavelength: float = 10_000.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """lerobot SmolVLA's own RoPE tables (smolvlm_with_expert.apply_rope): radians = pos / wavelength^(2i/D),
    in fp32 -> cos, sin [B, S, 1, D] for ``apply_rope`` (whose split-half rotation is the same arithmetic)."""
    half = head_dim // 2
    exponents = (2.0 / head_dim) * torch.arange(half, dtype=torch.float32, device=positions.device)
    timescale = max_wavelength ** exponents
    radians = positions.to(torch.float32)[..., None] / timescale               # [B, S, D/2]
    radians = torch.cat([radians, radians], dim=-1)[:, :, None]                # [B, S, 1, D]
    return radians.cos(), radians.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on [B, S, heads, D] with tables [B, S, 1, D], in fp32, result in x's dtype.

    fp32 where lerobot rotates in bf16 (modeling_gemma.apply_rotary_pos_emb on bf16
    tables): openpi's order, and the smaller bf16 error; a no-op cast in fp32.
    """
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).type_as(x)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean "may attend" [B, 1, S, T] -> additive float mask."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    # a fill, not torch.tensor(python float): that is a host-to-device copy, illegal inside a CUDA graph capture
    return torch.where(allowed, zero, torch.full((), ATTENTION_MASK_VALUE, dtype=dtype, device=allowed.device))


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """Additive mask [B, 1, S, T] -> [B, 1, G*S, T] for grouped_query_attention (once per pass, not per layer)."""
    batch, _, seq, keys = mask.shape
    return mask.unsqueeze(2).expand(batch, 1, groups, seq, keys).reshape(batch, 1, groups * seq, keys)


def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            folded_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Multi-query / grouped-query attention without repeating K/V.

    q [B, H, S, D]; k, v [B, K, T, D]; folded_mask from ``fold_mask`` [B, 1, G*S, T] or None.
    The G query heads that share one kv head are folded into the query length,
    so K/V are read in place (never expanded to H heads): [B, K, G*S, D].
    Returns [B, H, S, D]. Query head h uses kv head h // G, as in Gemma.
    """
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    q_folded = q.reshape(batch, kv_heads, (heads // kv_heads) * seq, dim)
    out = F.scaled_dot_product_attention(q_folded, k, v, attn_mask=folded_mask, scale=1.0 / math.sqrt(dim))
    return out.reshape(batch, heads, seq, dim)


def sincos_time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """Sinusoidal embedding of flow-matching time t [N] -> [N, dim], computed in float64.

    Periods are geometric from min_period to max_period; output is [sin, cos].
    """
    if dim % 2:
        raise ValueError(f'time embedding width must be even, got {dim}')
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    angular_rate = 2.0 * math.pi / period                              # [dim/2]
    angles = t.to(torch.float64)[:, None] * angular_rate[None, :]      # [N, dim/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class TimeEmbeddingTable:
    """Sin-cos embeddings of the Euler times t_k = 1 + k*dt (k < num_steps), then of t = 0 (a clean token),
    -> [num_steps + 1, width] fp32 on a device, computed once per (num_steps, device)."""

    def __init__(self, width: int, min_period: float, max_period: float) -> None:
        self.width, self.min_period, self.max_period = width, min_period, max_period
        self._tables: dict = {}

    def __call__(self, num_steps: int, device: torch.device) -> torch.Tensor:
        from .rtc import step_times
        key = (num_steps, str(device))
        if key not in self._tables:
            t = torch.tensor(step_times(num_steps) + [0.0], dtype=torch.float32)
            emb = sincos_time_embedding(t, self.width, self.min_period, self.max_period)
            self._tables[key] = emb.to(torch.float32).to(device)
        return self._tables[key]


def keep_fp32(name: str, compute_dtype: torch.dtype, markers: Sequence[str]) -> torch.dtype:
    """Storage dtype of parameter ``name``: fp32 when a marker is in its name, else the compute dtype."""
    return torch.float32 if any(marker in name for marker in markers) else compute_dtype


class MixedPrecisionPolicy(nn.Module):
    """A policy model that computes in ``compute_dtype`` but keeps the parameters its ``param_dtype`` names
    in fp32 (subclasses set ``fp32_markers``)."""

    fp32_markers: Tuple[str, ...] = ()

    def param_dtype(self, name: str, compute_dtype: torch.dtype) -> torch.dtype:
        return keep_fp32(name, compute_dtype, self.fp32_markers)

    def set_compute_dtype(self, dtype: torch.dtype) -> 'MixedPrecisionPolicy':
        self.compute_dtype = dtype
        for name, param in self.named_parameters():
            param.data = param.data.to(self.param_dtype(name, dtype))
        return self
