"""The ``quantization`` parameter (policy/quant.py): what is quantized, its accuracy pinned on a small deep model,
exact cache hits under every mode, the cache key, and the refusals (fp8 on a device without fp8, odd shapes)."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from runtime_fixtures import make_observation, tiny_checkpoints  # noqa: F401  (fixture)
from smolvla_fixtures import write_tiny_smolvla
from vla_policy_node.cache import PrefixKeyBuilder
from vla_policy_node.params import ParameterError, resolve_values, validate
from vla_policy_node.policy import quant
from vla_policy_node.policy.families.pi0.config import preset
from vla_policy_node.policy.families.pi0.model import PiZeroModel
from vla_policy_node.policy.gemma import GemmaSize
from vla_policy_node.policy.layers import fuse_projections
from vla_policy_node.policy.quant import QuantizationError, QuantizedLinear, check_device, quantize_model
from vla_policy_node.policy.siglip import VisionSize
from vla_policy_node.runtime import PolicyRuntime

MODES = ('int8_weights', 'fp8')


@pytest.fixture(scope='module')
def smolvla_checkpoint(tmp_path_factory):
    return write_tiny_smolvla(tmp_path_factory.mktemp('smolvla_quant'))


def _folders(tiny_checkpoints, smolvla_checkpoint):
    return dict(tiny_checkpoints, smolvla=smolvla_checkpoint)


@pytest.mark.parametrize('kind', ['pi0', 'pi05', 'smolvla'])
def test_every_block_projection_is_quantized_and_the_small_parts_are_not(kind, tiny_checkpoints,
                                                                         smolvla_checkpoint):
    runtime = PolicyRuntime.from_pretrained(_folders(tiny_checkpoints, smolvla_checkpoint)[kind], device='cpu',
                                            dtype='float32', quantization='int8_weights')
    names = {name for name, module in runtime.model.named_modules() if isinstance(module, QuantizedLinear)}
    plain = {name for name, module in runtime.model.named_modules() if isinstance(module, nn.Linear)}
    assert names and all('layers' in name.split('.') for name in names)
    block = {name for name in plain if name.split('.')[-1] in quant.PROJECTIONS and 'layers' in name.split('.')}
    kept = quant.kept_in_compute_dtype(runtime.model, 'int8_weights')
    assert block and block <= kept                       # a block projection stays plain only when it is kept
    expert = {name for name, module in runtime.model.named_modules()
              if any(module is inner for inner in runtime.model.action_expert.modules())}
    assert block & expert and not names & expert         # the action expert stays in the compute dtype
    assert {name.split('.')[-1] for name in block - expert} <= {'o_proj', 'k_proj', 'v_proj'}
    assert any('action_in_proj' in name for name in plain) and any('action_out_proj' in name for name in plain)
    described = runtime.describe()
    assert described['quantization'] == 'int8_weights'
    assert described['quantization_kernel'] == quant.KERNELS['int8_dequantize']
    unquantized = PolicyRuntime.from_pretrained(_folders(tiny_checkpoints, smolvla_checkpoint)[kind],
                                                device='cpu', dtype='float32')
    # fewer bytes (the tiny models' kept action expert is a large share; full sizes: the 0.55x test below)
    assert described['weight_bytes'] < 0.8 * unquantized.describe()['weight_bytes']


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('kind', ['pi0', 'pi05', 'smolvla'])
def test_a_hit_equals_its_miss_bit_for_bit(mode, kind, tiny_checkpoints, smolvla_checkpoint):
    runtime = PolicyRuntime.from_pretrained(_folders(tiny_checkpoints, smolvla_checkpoint)[kind], device='cpu',
                                            dtype='float32', quantization=mode)
    cameras = runtime.config.all_camera_names
    observation = make_observation(images={name: np.full((24, 40, 3), 40 * i, np.uint8)
                                           for i, name in enumerate(cameras)},
                                   state=np.linspace(-0.3, 0.3, runtime.config.state_dim))
    miss, hit = runtime.infer(observation, seed=3), runtime.infer(observation, seed=3)
    assert not miss.cache_hit and hit.cache_hit
    assert np.array_equal(miss.actions, hit.actions)
    plain = PolicyRuntime.from_pretrained(_folders(tiny_checkpoints, smolvla_checkpoint)[kind], device='cpu',
                                          dtype='float32').infer(observation, seed=3)
    assert not np.array_equal(plain.actions, miss.actions)         # the mode did change the arithmetic


def test_the_mode_is_part_of_the_cache_key():
    cameras = [('cam', np.zeros((2, 2, 3), np.uint8))]
    tokens, mask = np.arange(4), np.ones(4, bool)
    keys = {mode: PrefixKeyBuilder('rev', 'tok', 'float32', quantization=mode).key(cameras, tokens, mask)
            for mode in quant.MODES}
    assert len(set(keys.values())) == 3
    assert keys['none'] == PrefixKeyBuilder('rev', 'tok', 'float32').key(cameras, tokens, mask)


# ---- accuracy on a small deep model -------------------------------------------------------------------------

def _deep_model(seed: int = 0) -> PiZeroModel:
    """pi0 with 8-layer streams at 1/4 of gemma_300m's widths, weights at 1/sqrt(fan_in) (bench/quant_accuracy.py
    runs the full widths)."""
    size = GemmaSize(width=256, depth=8, mlp_dim=1024, num_heads=4, num_kv_heads=1, head_dim=64)
    config = preset('pi0', vision=VisionSize(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=14),
                    language=size, expert=size, vocab_size=512, camera_names=('base_0_rgb', 'left_wrist_0_rgb'))
    torch.manual_seed(0)
    model = PiZeroModel(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) / (param[0].numel() ** 0.5))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * (0.1 if 'norm' in name else 0.02))
    return fuse_projections(model)


def _inputs(config, seed: int = 5):
    generator = torch.Generator().manual_seed(seed)
    height, width = config.image_resolution
    images = torch.rand(1, 2, 3, height, width, generator=generator) * 2 - 1
    tokens = torch.randint(0, config.vocab_size, (1, config.tokenizer_max_length), generator=generator)
    token_mask = torch.zeros(1, config.tokenizer_max_length, dtype=torch.bool)
    token_mask[:, :12] = True
    state = torch.randn(1, config.max_state_dim, generator=generator)
    noise = torch.randn(1, config.chunk_size, config.max_action_dim, generator=generator)
    return images, torch.ones(1, 2, dtype=torch.bool), tokens, token_mask, state, noise


def _actions(model: PiZeroModel, seed: int = 5) -> torch.Tensor:
    images, image_masks, tokens, token_mask, state, noise = _inputs(model.config, seed)
    with torch.no_grad():
        context = model.fill_prefix(images, image_masks, tokens, token_mask)
        return model.denoise(context, state, noise, 4)[0, :, :model.config.action_dim].double()


def _recipe_actions(model: PiZeroModel, seed: int = 5) -> torch.Tensor:
    """lerobot's bf16 recipe (test_model_parity.ref_sample_actions on the bf16-cast model), same inputs."""
    import test_model_parity as parity

    model.set_compute_dtype(torch.bfloat16)
    with torch.no_grad():
        actions = parity.ref_sample_actions(model, *_inputs(model.config, seed), 4)
    return actions[0, :, :model.config.action_dim].double()


@pytest.fixture(scope='module')
def deep_errors():
    """max |actions - fp32 actions| under bf16, lerobot's bf16 recipe and each mode (fp32 and bf16 compute)."""
    reference = _actions(_deep_model())
    errors = {('recipe', torch.bfloat16): float((_recipe_actions(_deep_model()) - reference).abs().max())}
    for dtype in (torch.float32, torch.bfloat16):
        for mode in ('none',) + MODES:
            if mode == 'none' and dtype == torch.float32:
                continue
            model = _deep_model().set_compute_dtype(dtype)
            quantize_model(model, mode, torch.device('cpu'))
            errors[(mode, dtype)] = float((_actions(model) - reference).abs().max())
    return errors


# Measured (torch 2.13 CPU, this model): lerobot's bf16 recipe 0.025, our bf16 0.020; int8_weights 0.027 (fp32) /
# 0.038 (bf16); fp8 0.34 / 0.27. Bounds at about 1.5x: a regression past them fails here.
BOUNDS = {('none', torch.bfloat16): 0.03, ('int8_weights', torch.float32): 0.04,
          ('int8_weights', torch.bfloat16): 0.06, ('fp8', torch.float32): 0.5, ('fp8', torch.bfloat16): 0.5}


@pytest.mark.parametrize('case', list(BOUNDS), ids=lambda case: f'{case[0]}-{str(case[1])[6:]}')
def test_each_mode_stays_within_its_pinned_action_error(case, deep_errors):
    assert 0.0 < deep_errors[case] <= BOUNDS[case], deep_errors


def test_int8_weights_in_fp32_is_within_1_5x_of_the_lerobot_bf16_recipe(deep_errors):
    # The issue's target, on the CPU's compute dtype. In bf16 compute the bf16 rounding adds to int8's
    # (1.5x here, 1.8-2.0x on bench/quant_accuracy.py's deeper models; docs/precision.md has the figures).
    assert deep_errors[('int8_weights', torch.float32)] <= 1.5 * deep_errors[('recipe', torch.bfloat16)], deep_errors


def test_int8_weights_is_more_accurate_than_fp8(deep_errors):
    assert deep_errors[('int8_weights', torch.float32)] < deep_errors[('fp8', torch.float32)], deep_errors


# ---- the arithmetic -----------------------------------------------------------------------------------------

def test_fp8_reference_uses_real_e4m3_roundings_and_per_token_scales():
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(64, 32)
    x = torch.randn(3, 5, 64, generator=generator)
    x[0, 0] *= 100.0                                   # one loud token: per-token scales keep the others' bits
    fp8 = QuantizedLinear.from_linear(linear, 'fp8', 'fp8_reference')
    w_scale = linear.weight.detach().abs().amax(1) / 448.0
    wq = (linear.weight.detach() / w_scale[:, None]).to(torch.float8_e4m3fn).float()
    x_scale = x.abs().amax(-1, keepdim=True) / 448.0
    xq = (x / x_scale).to(torch.float8_e4m3fn).float()
    expected = (xq @ wq.t()) * x_scale * w_scale + linear.bias.detach()
    assert torch.allclose(fp8(x), expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(fp8(x), linear(x), rtol=1e-4, atol=1e-4)     # it is not the fp32 product


def test_int8_rows_are_symmetric_per_output_channel():
    weight = torch.randn(16, 40) * torch.arange(1, 17)[:, None]
    q, scale = quant.int8_rows(weight)
    assert q.dtype == torch.int8 and scale.shape == (16, 1) and int(q.abs().amax(1).min()) == 127
    assert torch.allclose(quant.int8_dequantize(q, scale), weight, atol=float(scale.max()) / 2 + 1e-6)


def test_int8_groups_have_their_own_bf16_scale_and_round_against_it():
    weight = torch.randn(8, 256)
    weight[:, :64] *= 50.0                      # one loud group per row: the other groups keep their fine steps
    q, scale = quant.int8_rows(weight, group=64, scale_dtype=torch.bfloat16)
    assert scale.shape == (8, 4) and scale.dtype == torch.bfloat16
    error = (quant.int8_dequantize(q, scale) - weight).abs().view(8, 4, 64).amax(-1)
    assert torch.all(error <= scale.float() / 2 + 1e-6)             # half a step of the stored scale
    per_row = quant.int8_rows(weight)
    assert float((quant.int8_dequantize(*per_row) - weight)[:, 64:].abs().max()) > 4 * float(error[:, 1:].max())
    q_odd, scale_odd = quant.int8_rows(torch.randn(4, 100), group=64)     # 64 does not divide 100: per row
    assert scale_odd.shape == (4, 1)


class _Allocations(TorchDispatchMode):
    """Every tensor the ops under it allocate (not views, not in-place results): (dtype, numel)."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if all(ret.alias_info is None for ret in func._schema.returns):
            self.made += [(t.dtype, t.numel()) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32])
def test_int8_weights_dequantize_straight_into_the_compute_dtype(dtype):
    """No fp32 copy of the weight on the way to a bf16 GEMM (inside a captured prefix every such scratch stays
    in the graph's pool), and the same numbers as the fp32 dequantization rounded once."""
    linear = nn.Linear(128, 96)
    layer = QuantizedLinear.from_linear(linear, 'int8_weights', 'int8_dequantize')
    x = torch.randn(5, 128).to(dtype)
    with _Allocations() as allocations:
        out = layer(x)
    weight_sized = [made for made in allocations.made if made[1] == 128 * 96]
    assert weight_sized == [(dtype, 128 * 96)] * len(weight_sized) and len(weight_sized) <= 1, allocations.made
    rounded_once = (layer.qweight.view(96, 2, 64) * layer.scale[..., None].float()).view(96, 128).to(dtype)
    assert torch.equal(quant.int8_dequantize(layer.qweight, layer.scale, dtype), rounded_once)
    assert torch.equal(out, torch.nn.functional.linear(x, rounded_once, linear.bias.detach().to(dtype)))
    table = quant.QuantizedEmbedding(nn.Embedding(50, 128).to(dtype))
    tokens = torch.tensor([[1, 7, 49]])
    rows = (table.qweight[tokens].view(1, 3, 2, 64) * table.scale[tokens][..., None].float()).view(1, 3, 128)
    assert torch.equal(table(tokens), rows.to(dtype))


def test_fused_quantized_projection_is_its_parts_side_by_side(tiny_checkpoints):
    runtime = PolicyRuntime.from_pretrained(tiny_checkpoints['pi0'], device='cpu', dtype='float32',
                                            quantization='int8_weights')
    mlp = next(module for module in runtime.model.modules()
               if hasattr(module, 'gate_up') and isinstance(module.gate_proj, QuantizedLinear))
    x = torch.randn(1, 3, mlp.gate_proj.in_features)
    parts = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1)
    assert torch.allclose(mlp.gate_up(x), parts, atol=1e-5)
    assert mlp.gate_proj.qweight.untyped_storage().data_ptr() == mlp.gate_up.weight.untyped_storage().data_ptr()


# ---- refusals -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize('capability', [(8, 6), (8, 7)])
def test_fp8_is_refused_below_compute_capability_8_9_naming_the_device(capability):
    with pytest.raises(QuantizationError, match=rf'cuda.*{capability[0]}\.{capability[1]}.*int8_weights'):
        check_device('fp8', torch.device('cuda'), capability)


def test_kernel_selection_by_device():
    assert check_device('fp8', torch.device('cuda'), (8, 9)) == 'fp8_scaled_mm'
    assert check_device('fp8', torch.device('cuda'), (9, 0)) == 'fp8_scaled_mm'
    assert check_device('int8_weights', torch.device('cuda'), (8, 7)) == 'int8_dequantize'     # Orin
    assert check_device('fp8', torch.device('cpu')) == 'fp8_reference'
    assert check_device('none', torch.device('cpu')) == 'none'
    with pytest.raises(QuantizationError, match='mps'):
        check_device('int8_weights', torch.device('mps'))
    with pytest.raises(QuantizationError, match='one of'):
        check_device('int4', torch.device('cpu'))


def test_fp8_on_cuda_refuses_weights_scaled_mm_cannot_take():
    block = nn.Module()
    block.q_proj, block.o_proj = nn.Linear(64, 64), nn.Linear(64, 24)        # 24 rows: not a multiple of 16
    model = nn.Module()
    model.layers = nn.ModuleList([block])
    with pytest.raises(QuantizationError, match=r'multiples of 16.*layers\.0\.o_proj \[24, 64\]'):
        quantize_model(model, 'fp8', torch.device('cuda'), capability=(9, 0))
    assert not any(isinstance(module, QuantizedLinear) for module in model.modules())   # nothing changed


def test_the_parameter_takes_the_three_modes_only():
    values = resolve_values({'joint_names': ['j1', 'j2', 'j3', 'j4', 'j5', 'j6']})
    for mode in quant.MODES:
        validate(dict(values, quantization=mode))
    with pytest.raises(ParameterError, match='quantization'):
        validate(dict(values, quantization='int4'))


# ---- memory (the doctor) ------------------------------------------------------------------------------------

@pytest.mark.parametrize('preset_name', ['pi0', 'pi05'])
def test_full_size_int8_weights_hold_at_most_0_55x_of_the_bf16_bytes(preset_name):
    from vla_policy_node.doctor import quantized_bytes
    from vla_policy_node.policy.families import family_class, preset_config

    config = preset_config(preset_name)
    figures = quantized_bytes(family_class(config.policy_type), config)     # the real shapes, on the meta device
    assert figures['none'] > 6 * 2 ** 30
    assert figures['int8_weights'] <= 0.55 * figures['none']
    assert figures['fp8'] <= 0.6 * figures['none']


def test_the_doctor_prints_memory_per_mode_and_the_device_sizes(tiny_checkpoints):
    from vla_policy_node.doctor import diagnose

    lines = diagnose(tiny_checkpoints['pi0'], quantization='fp8').lines
    rows = {mode: next(line for line in lines if line.strip().startswith(mode + ' ')) for mode in quant.MODES}
    assert all('8 GB yes' in row and '64 GB yes' in row for row in rows.values())
    assert rows['fp8'].endswith('<- --quantization') and not rows['none'].endswith('<- --quantization')
    assert any('headroom' in line for line in lines)
