"""layers.PackedLinears: MKL's prepacked GEMM in the SmolVLA Euler loop gives F.linear's values bit for bit."""
import pytest
import torch
import torch.nn.functional as F

from vla_policy_node.policy.layers import PackedLinears, packed_linear

pytestmark = pytest.mark.skipif(not PackedLinears.available(), reason='needs MKL')


@pytest.mark.parametrize('out_features, in_features', [(1600, 720), (960, 720), (2048, 720), (720, 2048), (24, 40)])
def test_packed_equals_plain(out_features, in_features):
    torch.manual_seed(0)
    weight, x = torch.randn(out_features, in_features), torch.randn(1, 50, in_features)
    packer = PackedLinears(50)
    packer.min_elements = 0                                # the small case too
    with torch.no_grad(), packer:
        out = packed_linear(x, weight)
    assert torch.equal(out, F.linear(x, weight))


def test_repacks_a_changed_weight_and_passes_other_rows_through():
    torch.manual_seed(1)
    weight = torch.randn(64, 32)
    packer = PackedLinears(8)
    packer.min_elements = 0
    with torch.no_grad(), packer:
        x = torch.randn(8, 32)
        first = packed_linear(x, weight)
        weight.mul_(2.0)                                   # an in-place write: the next call packs again
        assert torch.equal(packed_linear(x, weight), F.linear(x, weight))
        assert not torch.equal(packed_linear(x, weight), first)
        assert len(packer._packs) == 1 and packer._packs[id(weight)][3] is not None   # packed, not passed through
        other = torch.randn(3, 32)                         # another row count: plain F.linear
        assert torch.equal(packed_linear(other, weight), F.linear(other, weight))
    assert PackedLinears.active() is None
    assert torch.equal(packed_linear(x, weight), F.linear(x, weight))    # no packer outside the context
