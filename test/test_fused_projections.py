"""Fused q/k/v and gate/up projections: same numbers, same checkpoint tensors, weights held once, never stale."""
import copy

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from vla_policy_node.policy.families import family_class, load_checkpoint, save_checkpoint
from vla_policy_node.policy.gemma import GemmaSize
from vla_policy_node.policy.gemma import GemmaSelfAttention
from vla_policy_node.policy.layers import FusedProjection, GemmaMLP, fuse_projections, rope_cos_sin
from vla_policy_node.policy.families.pi0.model import PiZeroModel
from vla_policy_node.policy.tiny_default import statistics
from test_model_parity import ref_rope  # lerobot's rotate-half RoPE, written out

SIZE = GemmaSize(width=64, depth=1, mlp_dim=96, num_heads=4, num_kv_heads=1, head_dim=16)


def unfused_model(policy_type: str, seed: int = 5) -> PiZeroModel:
    torch.manual_seed(seed)
    return PiZeroModel(family_class(policy_type).tiny_config()).eval()


def distinct_storage_bytes(model: torch.nn.Module) -> int:
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


def mlp_reference(mlp: GemmaMLP, x: torch.Tensor) -> torch.Tensor:
    gate = F.linear(x, mlp.gate_proj.weight.detach().clone())
    up = F.linear(x, mlp.up_proj.weight.detach().clone())
    return F.linear(F.gelu(gate, approximate='tanh') * up, mlp.down_proj.weight)


def test_saving_a_fused_model_writes_the_separate_lerobot_tensors_bit_identically(tmp_path):
    for policy_type in ('pi0', 'pi05'):
        model = unfused_model(policy_type)
        before = {key: value.clone() for key, value in model.state_dict().items()}
        fuse_projections(model)
        config = model.config
        folder = save_checkpoint(tmp_path / policy_type, model, statistics(config.state_dim, 0.5),
                                 statistics(config.action_dim, 0.2))
        written = {key[len('model.'):]: value for key, value in load_file(str(folder / 'model.safetensors')).items()}
        assert 'paligemma_with_expert.gemma_expert.model.layers.0.self_attn.k_proj.weight' in written
        assert not any('qkv' in key or 'gate_up' in key for key in written)
        for key, value in before.items():
            assert torch.equal(written[key], value), key
        # ... and they load back (strictly) into a model that holds them fused again.
        loaded = load_checkpoint(folder, torch.device('cpu'), torch.float32).model
        for key, value in loaded.state_dict().items():
            assert torch.equal(value, before[key]), key
        attention = loaded.paligemma_with_expert.paligemma.model.language_model.layers[0].self_attn
        storages = {p.untyped_storage().data_ptr() for p in (attention.q_proj.weight, attention.k_proj.weight)}
        assert len(storages) == 1


def test_fusing_holds_every_weight_once():
    model = unfused_model('pi0')
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert distinct_storage_bytes(model) == param_bytes
    fuse_projections(model)
    # One storage per fused group instead of one per matrix, and not one byte more.
    assert distinct_storage_bytes(model) == param_bytes
    mlp = model.paligemma_with_expert.gemma_expert.model.layers[0].mlp
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.up_proj.weight.untyped_storage().data_ptr()


def test_fused_attention_and_mlp_match_separate_projections():
    torch.manual_seed(0)
    attention, mlp = GemmaSelfAttention(SIZE), GemmaMLP(SIZE.width, SIZE.mlp_dim)
    x = torch.randn(2, 7, SIZE.width)
    positions = torch.arange(3, 10)[None].expand(2, -1)
    cos, sin = rope_cos_sin(positions, SIZE.head_dim, 10000.0)

    def heads(t: torch.Tensor) -> torch.Tensor:  # [B, S, n * D] -> [B, n, S, D]
        return t.view(2, 7, -1, SIZE.head_dim).transpose(1, 2)

    q_ref, k_ref, v_ref = (heads(F.linear(x, lin.weight.detach().clone()))
                           for lin in (attention.q_proj, attention.k_proj, attention.v_proj))
    expected = (ref_rope(q_ref, positions, 10000.0), ref_rope(k_ref, positions, 10000.0), v_ref)
    expected_mlp = mlp_reference(mlp, x)
    fuse_projections(attention)
    fuse_projections(mlp)
    with torch.no_grad():
        for got, want in zip(attention.project_qkv(x, cos, sin), expected):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(mlp(x), expected_mlp, atol=1e-6, rtol=1e-6)


def separate(projection: FusedProjection, x: torch.Tensor) -> torch.Tensor:
    parts = [F.linear(x, lin.weight.detach().clone(), lin.bias.detach().clone()) for lin in projection.linears]
    return torch.cat(parts, dim=-1)


def test_fused_projection_follows_the_parameters():
    """In-place edits reach the fused GEMM; new storage (assignment, .to(), deepcopy, assign-load) is re-fused."""
    torch.manual_seed(1)
    block = torch.nn.ModuleDict({'a': torch.nn.Linear(SIZE.width, 24), 'b': torch.nn.Linear(SIZE.width, 8)})
    projection = FusedProjection(block['a'], block['b'])
    block.projection = projection
    fuse_projections(block)
    x = torch.randn(3, SIZE.width)
    with torch.no_grad():
        torch.testing.assert_close(projection(x), separate(projection, x), atol=1e-6, rtol=1e-6)
        block['a'].weight.mul_(2.0)                                        # in place: the view writes through
        block['b'].bias.add_(1.0)
        torch.testing.assert_close(projection(x), separate(projection, x), atol=1e-6, rtol=1e-6)
        block['b'].weight.data = torch.randn_like(block['b'].weight)      # new storage for one part
        torch.testing.assert_close(projection(x), separate(projection, x), atol=1e-6, rtol=1e-6)
        twin = copy.deepcopy(block)
        twin['a'].weight.zero_()
        torch.testing.assert_close(twin.projection(x), separate(twin.projection, x), atol=1e-6, rtol=1e-6)
        assert not torch.allclose(twin.projection(x), projection(x))      # the copy shares nothing with the original
        state = {key: torch.randn_like(value) for key, value in block.state_dict().items()}
        block.load_state_dict(state, assign=True)
        torch.testing.assert_close(projection(x), separate(projection, x), atol=1e-6, rtol=1e-6)
        block.to(torch.float64)
        torch.testing.assert_close(projection(x.double()), separate(projection, x.double()))


def test_the_mlp_gate_up_gemm_matches_its_halves():
    """GPUs run gate and up as one GEMM, CPUs as two (faster there): both give the same numbers."""
    torch.manual_seed(2)
    mlp = fuse_projections(GemmaMLP(SIZE.width, SIZE.mlp_dim))
    x = torch.randn(2, 5, SIZE.width)
    with torch.no_grad():
        torch.testing.assert_close(mlp.gate_up(x), torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1),
                                   atol=1e-6, rtol=1e-6)
