"""SmallResNet: the template block experiments' random-init ResNet of BasicBlocks (stem stride 1, stages 2-3 halve)."""

import pytest
import torch
from torchvision.models.resnet import BasicBlock

from pml_extensions.trunks import SmallResNet


def test_shapes_strides_and_parameter_count():
    net = SmallResNet(1, widths=(4, 8, 16, 16), blocks=1)
    x = torch.zeros(3, 1, 28, 28)
    assert net(x).shape == (3, 16)
    assert net.features(x).shape == (3, 16, 7, 7)  # 28 -> 28 -> 14 -> 7 -> 7
    assert SmallResNet(1, (4, 8, 16, 16), pool=False)(x).shape == (3, 16, 7, 7)
    assert [type(b) for b in net.layer2] == [BasicBlock]
    # stem 1*4*9 + BN 8; layer1 (4->4): 2 convs 4*4*9 + 2 BN 8 each; layer2 (4->8, stride 2): 4*8*9 + 8*8*9 + 2*16 BN
    # + shortcut 4*8 + 16; layer3 (8->16): 8*16*9 + 16*16*9 + 64 + 8*16 + 32; layer4 (16->16): 2*16*16*9 + 64
    expected = (36 + 8) + (2 * 144 + 16) + (288 + 576 + 32 + 32 + 16) + (1152 + 2304 + 64 + 128 + 32) + (4608 + 64)
    assert sum(p.numel() for p in net.parameters()) == expected


def test_same_seed_same_weights_and_errors():
    torch.manual_seed(3)
    a = SmallResNet(1, (4, 8)).state_dict()
    torch.manual_seed(3)
    b = SmallResNet(1, (4, 8)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="widths"):
        SmallResNet(1, ())
    with pytest.raises(ValueError, match="blocks"):
        SmallResNet(1, (4,), blocks=0)
