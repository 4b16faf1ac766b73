"""Weight quantization of a loaded model: the ``quantization`` parameter (none | int8_weights | fp8).

What is quantized (every family alike, chosen by module name, so no family is named here):
- the projections of the transformer blocks: every ``nn.Linear`` named ``...layers.<i>...<proj>`` with
  ``<proj>`` one of ``PROJECTIONS`` (attention q/k/v/o, MLP gate/up/down, SigLIP fc1/fc2). They hold
  ~83% of pi0's weights and run every GEMM that matters;
- under int8_weights also the token embedding tables (``embed_tokens``), int8 rows with their scales: a
  look-up, no matmul, ~16% of pi0's weights (the 257k x 2048 PaliGemma table).
What int8_weights keeps in the compute dtype although it is a block projection (``kept_in_compute_dtype``,
measured by bench/quant_accuracy.py --ablation / --options): the action expert, the attention output
projections and grouped-query k/v projections, ~12% of pi0's weights, which carry most of int8's action error.
What stays in the compute dtype (or fp32 where the model keeps it) under every mode: norms (and pi0.5's
adaptive-norm dense layers), the patch and position embeddings, the vision->language projector, the state /
action / time projections around the action expert, the lm head (not loaded). Together under 1% of the weights
and the first / last step of every action: bench/quant_accuracy.py measures what quantizing them would add.

Modes and kernels (``check_device`` picks the kernel for a device, or refuses):
- ``int8_weights``: symmetric int8 weights, one bf16 scale per 64 inputs of each output row (scale =
  max|w_group| / 127); activations stay in the compute dtype. CUDA (Ampere and newer, no Triton needed): the
  int8 rows are dequantized into the compute dtype per matmul (memory is the gain: pi0's weights at 0.51x
  their bf16 bytes). CPU: the same dequantizing kernel (``int8_dequantize``); torch's own packed int8 kernels
  measured slower or less exact (bench/quant_speed.py --kernels prints them).
- ``fp8``: e4m3 weights with per-output-channel scales (max|w_row| / 448) and e4m3 activations with
  per-token dynamic scales (max|x_token| / 448). CUDA with compute capability >= 8.9: ``torch._scaled_mm``
  (cuBLASLt) with unit scales and fp32 output, the two scales applied after it. CPU: a reference that
  computes the same numbers (real float8_e4m3fn casts, the same scales, the matmul in fp32), offered to
  users as a slow reference for accuracy checks. Anything else is refused at configure, naming the device.

A cached prefix is never quantized: quantization changes the weights that compute it, and the mode is part of
the cache key (cache/key.py), so a hit returns exactly what its miss computed.
"""
from __future__ import annotations

from typing import Callable, Dict, FrozenSet, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

MODES = ('none', 'int8_weights', 'fp8')
PROJECTIONS = frozenset({'q_proj', 'k_proj', 'v_proj', 'o_proj', 'out_proj', 'gate_proj', 'up_proj', 'down_proj',
                         'fc1', 'fc2'})
EMBEDDINGS = frozenset({'embed_tokens'})
FP8_MIN_CAPABILITY = (8, 9)
E4M3_MAX = 448.0
INT8_MAX = 127.0
_TINY = 1e-12       # floor of a scale: an all-zero row or token quantizes to zeros, never to NaN
# int8_weights' numbers (bench/quant_accuracy.py --options measures the alternatives): one bf16 scale per 64
# inputs of a row, round-to-nearest, and three kinds of projections kept in the compute dtype (KEEP_*; the
# bench switches these to measure them, the node never does).
INT8_GROUP = 64
INT8_SCALE_DTYPE = torch.bfloat16
KEEP_ACTION_EXPERT = True     # the model's ``action_expert`` (policy/family.py PolicyModel declares it)
KEEP_SHARED_KV = True         # k/v projections narrower than their q (grouped-query attention)
KEEP_ATTENTION_OUTPUT = True  # the attention output projections (o_proj) of the Gemma / Llama blocks

KERNELS = {   # kernel -> what /diagnostics says runs
    'none': 'unquantized',
    'int8_dequantize': 'int8 weights dequantized per matmul',
    'fp8_scaled_mm': 'fp8 e4m3 torch._scaled_mm',
    'fp8_reference': 'fp8 e4m3 reference (float8 casts, fp32 matmul; slow)',
}


class QuantizationError(ValueError):
    """A mode the device lacks, or a checkpoint that cannot be quantized as asked (configure refuses it)."""


def _capability(device: torch.device) -> Tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _device_name(device: torch.device) -> str:
    try:
        return torch.cuda.get_device_name(device)
    except Exception:   # noqa: BLE001 - a name is only for the message
        return str(device)


def check_device(mode: str, device: torch.device, capability: Optional[Tuple[int, int]] = None) -> str:
    """The kernel ``mode`` runs with on ``device``; QuantizationError where the device cannot run it.

    ``capability``: the CUDA compute capability (default: asked of torch), a seam for the tests."""
    if mode not in MODES:
        raise QuantizationError(f'quantization must be one of {", ".join(MODES)}, got {mode!r}')
    if mode == 'none':
        return 'none'
    if device.type == 'meta':          # shapes only (the doctor's byte count): what the CPU would hold
        device = torch.device('cpu')
    if device.type not in ('cpu', 'cuda'):
        raise QuantizationError(f'quantization {mode} runs on cpu or cuda, not on {device}')
    if mode == 'int8_weights':
        return 'int8_dequantize'
    if device.type == 'cpu':
        return 'fp8_reference'
    capability = tuple(capability or _capability(device))
    if capability < FP8_MIN_CAPABILITY or not hasattr(torch, '_scaled_mm'):
        raise QuantizationError(
            f'quantization fp8 needs a CUDA device of compute capability >= '
            f'{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} (fp8 tensor cores: Ada, Hopper, Blackwell); '
            f'{device} is {_device_name(device)} with {capability[0]}.{capability[1]}. Use int8_weights '
            '(any CUDA device, Jetson Orin included) or none')
    return 'fp8_scaled_mm'


# ---- the numbers --------------------------------------------------------------------------------------------

def int8_rows(weight: torch.Tensor, group: Optional[int] = None,
              scale_dtype: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> int8 [N, K] and scales [N, G] in ``scale_dtype`` with weight ~= q * scale (symmetric,
    round-to-nearest), one scale per ``group`` consecutive inputs of a row (G = K / group; one per row where
    ``group`` is None or does not divide K). The int8 values are rounded against the stored (rounded) scale, so
    a bf16 scale costs no gain error, only at most a quarter step of clipping on a group's largest value.
    (An MSE-optimal clip of each scale, searched per group, lowered no action error measurably at 8 bits:
    clipping one large weight costs more than the finer steps of the others win.)"""
    rows, columns = weight.shape
    size = group if group and columns % group == 0 else columns
    w = weight.detach().float().reshape(rows, columns // size, size)
    scale = (w.abs().amax(dim=-1) / INT8_MAX).clamp_min(_TINY).to(scale_dtype).float()
    q = torch.round(w / scale[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.reshape(rows, columns), scale.to(scale_dtype)


def int8_weights(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """int8_rows with int8_weights' settings (INT8_GROUP, INT8_SCALE_DTYPE)."""
    return int8_rows(weight, INT8_GROUP, INT8_SCALE_DTYPE)


def int8_dequantize(qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 [..., K] and scales [..., G] (int8_rows) -> ``dtype`` [..., K], straight into ``dtype``: one tensor
    of that dtype, scaled in place, and no fp32 copy on the way (inside a captured prefix each such scratch
    stays in the graph's pool: pi0's fused gate/up alone is 268 MB in fp32).

    The same numbers as dequantizing in fp32 and rounding once: an int8 value is exact in bf16, and the product
    of two bf16 numbers (int8_weights' bf16 scales) is exact in fp32, so the bf16 multiply rounds it once."""
    groups = scale.shape[-1]
    shape = qweight.shape
    weight = qweight.reshape(*shape[:-1], groups, shape[-1] // groups).to(dtype)
    return weight.mul_(scale[..., None].to(dtype)).reshape(shape)


def fp8_rows(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> e4m3 [..., K] and fp32 scales [...] with x ~= q * scale (per row / per token)."""
    xf = x.detach().float()
    scale = (xf.abs().amax(dim=-1) / E4M3_MAX).clamp_min(_TINY)
    return (xf / scale[..., None]).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def _fp8_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, reference: bool) -> torch.Tensor:
    """x [M, K] in the compute dtype, qweight e4m3 [N, K] -> fp32 [M, N] = (xq @ wq^T) * sx * sw."""
    xq, x_scale = fp8_rows(x)
    if reference:
        raw = xq.float() @ qweight.float().t()
    else:
        one = torch.ones((), dtype=torch.float32, device=x.device)
        raw = torch._scaled_mm(xq, qweight.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return raw * x_scale[:, None] * scale[None, :]


class QuantizedLinear(nn.Module):
    """An ``nn.Linear`` with quantized weights (buffers, so ``set_compute_dtype`` and optimisers leave them
    alone): ``qweight`` [out, in] int8 (int8_weights) or e4m3 stored as uint8 (fp8: a ``.to(dtype)`` of the
    model cannot cast it), ``scale`` fp32 [out], ``bias`` in the original dtype or None. The output has the
    input's dtype; ``input_dtype`` is what the callers cast to (the original weight's dtype)."""

    def __init__(self, mode: str, kernel: str, qweight: torch.Tensor, scale: torch.Tensor,
                 bias: Optional[torch.Tensor], input_dtype: torch.dtype) -> None:
        super().__init__()
        self.mode, self.kernel, self.input_dtype = mode, kernel, input_dtype
        self.out_features, self.in_features = qweight.shape
        self.register_buffer('qweight', qweight if mode != 'fp8' else qweight.view(torch.uint8))
        self.register_buffer('scale', scale)
        self.register_buffer('bias', bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str, kernel: str) -> 'QuantizedLinear':
        with torch.no_grad():
            quantize = int8_weights if mode == 'int8_weights' else fp8_rows
            qweight, scale = quantize(linear.weight)
            bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(mode, kernel, qweight, scale, bias, linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_linear(x, self.qweight, self.scale, self.bias, self.mode, self.kernel)

    def extra_repr(self) -> str:
        return f'in={self.in_features}, out={self.out_features}, {self.mode} ({self.kernel})'


def quantized_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor],
                     mode: str, kernel: str) -> torch.Tensor:
    """x [..., in] -> [..., out] in x's dtype, through the kernel ``check_device`` chose."""
    if mode == 'int8_weights':
        # dequantized straight into the compute dtype, a layer at a time: the GEMM is the unquantized one's
        weight = int8_dequantize(qweight, scale, x.dtype)
        return F.linear(x, weight, None if bias is None else bias.to(x.dtype))
    flat = x.reshape(-1, x.shape[-1])
    out = _fp8_matmul(flat, qweight.view(torch.float8_e4m3fn), scale, reference=kernel == 'fp8_reference')
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], qweight.shape[0])


class QuantizedEmbedding(nn.Module):
    """A token table of int8 rows with fp32 scales (int8_weights): a look-up dequantizes only the rows read."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        qweight, scale = int8_weights(embedding.weight)
        self.dtype = embedding.weight.dtype
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.register_buffer('qweight', qweight)
        self.register_buffer('scale', scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return int8_dequantize(self.qweight[tokens], self.scale[tokens], self.dtype)


def input_dtype(linear: nn.Module) -> torch.dtype:
    """The dtype a linear's callers cast its input to (its weight's, for a quantized one the original's)."""
    return linear.input_dtype if isinstance(linear, QuantizedLinear) else linear.weight.dtype


def is_quantized(linear: nn.Module) -> bool:
    return isinstance(linear, QuantizedLinear)


def fuse_quantized(linears) -> QuantizedLinear:
    """Several QuantizedLinear of one mode that read the same input -> one, their rows stacked (per-row scales
    stack with them); each part's buffers become row views of the stacked ones, so nothing is held twice."""
    first = linears[0]
    qweight = torch.cat([linear.qweight for linear in linears])
    scale = torch.cat([linear.scale for linear in linears])
    has_bias = all(linear.bias is not None for linear in linears)
    bias = torch.cat([linear.bias for linear in linears]) if has_bias else None
    start = 0
    for linear in linears:
        rows = slice(start, start + linear.out_features)
        linear.qweight, linear.scale = qweight[rows], scale[rows]
        if has_bias:
            linear.bias = bias[rows]
        start += linear.out_features
    return QuantizedLinear(first.mode, first.kernel, qweight, scale, bias, first.input_dtype)


# ---- the model ----------------------------------------------------------------------------------------------

def quantizable(name: str, module: nn.Module, mode: str) -> bool:
    """Whether the module called ``name`` is quantized under ``mode`` (the rule of the module docstring)."""
    parts = name.split('.')
    if isinstance(module, nn.Linear):
        return parts[-1] in PROJECTIONS and 'layers' in parts
    return mode == 'int8_weights' and isinstance(module, nn.Embedding) and parts[-1] in EMBEDDINGS


def kept_in_compute_dtype(model: nn.Module, mode: str) -> FrozenSet[str]:
    """The names of the projections int8_weights leaves in the compute dtype although ``quantizable`` holds
    (bench/quant_accuracy.py --ablation --options measured why): every module of the model's ``action_expert``
    (its error enters every denoising step and the actions directly; ~9% of pi0's weights), the attention
    output projections ``o_proj`` (each block's attention enters the residual stream through it; ~2%), and
    every k/v projection narrower than its block's q projection (grouped-query attention: one k/v head serves
    several query heads, so its rounding error is shared by all of them; under 1%). fp8 keeps none."""
    if mode != 'int8_weights':
        return frozenset()
    names = set()
    if KEEP_ACTION_EXPERT:
        inside = {id(module) for module in model.action_expert.modules()}   # policy/family.py PolicyModel
        names.update(name for name, module in model.named_modules() if id(module) in inside)
    for name, module in model.named_modules():
        parent_name, _, child = name.rpartition('.')
        if KEEP_ATTENTION_OUTPUT and child == 'o_proj' and isinstance(module, nn.Linear):
            names.add(name)
        if KEEP_SHARED_KV and child in ('k_proj', 'v_proj') and isinstance(module, nn.Linear):
            query = getattr(model.get_submodule(parent_name), 'q_proj', None)      # nn.Linear or quantized
            if getattr(query, 'out_features', 0) > module.out_features:
                names.add(name)
    return frozenset(names)


def check_shapes(model: nn.Module, mode: str, kernel: str) -> None:
    """torch._scaled_mm needs both dims of every weight to be multiples of 16; QuantizationError otherwise."""
    if kernel != 'fp8_scaled_mm':
        return
    odd = [f'{name} [{module.out_features}, {module.in_features}]' for name, module in model.named_modules()
           if quantizable(name, module, mode) and isinstance(module, nn.Linear)
           and (module.in_features % 16 or module.out_features % 16)]
    if odd:
        raise QuantizationError(f'this checkpoint cannot be quantized to fp8 on CUDA: torch._scaled_mm needs '
                                f'weight dimensions that are multiples of 16, and {len(odd)} are not (first: '
                                f'{odd[0]}). Use int8_weights or none')


def quantize_model(model: nn.Module, mode: str, device: torch.device,
                   capability: Optional[Tuple[int, int]] = None,
                   only: Optional[Callable[[str], bool]] = None) -> str:
    """Replace the quantizable modules of a loaded model in place (see the module docstring) and return the
    kernel it runs with; QuantizationError (nothing changed) where the device or the checkpoint cannot.
    ``only``: a filter on the module names (bench/quant_accuracy.py's per-part ablation)."""
    kernel = check_device(mode, device, capability)
    if mode == 'none':
        return kernel
    check_shapes(model, mode, kernel)
    replaced: Dict[int, nn.Module] = {}
    kept = kept_in_compute_dtype(model, mode)
    with torch.inference_mode(False), torch.no_grad():
        for name, module in list(model.named_modules()):
            if (not name or not quantizable(name, module, mode) or name in kept
                    or (only is not None and not only(name))):
                continue
            parent_name, _, child = name.rpartition('.')
            parent = model.get_submodule(parent_name) if parent_name else model
            new = (QuantizedLinear.from_linear(module, mode, kernel) if isinstance(module, nn.Linear)
                   else QuantizedEmbedding(module))
            setattr(parent, child, new if device.type == 'meta' else new.to(device))
            replaced[id(module)] = new
        _refuse(model, replaced)
    model.quantization = mode
    return kernel


def _refuse(model: nn.Module, replaced: Dict[int, nn.Module]) -> None:
    """Point every fused projection (layers.FusedProjection: ``linears`` + ``fuse()``, found by shape so that
    this module needs no import of layers) at the modules that replaced its linears, and fuse it again."""
    for module in model.modules():
        for value in list(vars(module).values()):
            linears = getattr(value, 'linears', None)
            if (isinstance(linears, tuple) and callable(getattr(value, 'fuse', None))
                    and any(id(linear) in replaced for linear in linears)):
                value.linears = tuple(replaced.get(id(linear), linear) for linear in linears)
                value.fuse()


def model_bytes(model: nn.Module) -> int:
    """Bytes of the model as it sits in memory: every parameter and buffer once (a fused projection's stacked
    tensor is no parameter or buffer, its parts are its row views, so nothing is counted twice). Works on the
    meta device (shapes only)."""
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())
