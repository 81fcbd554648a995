import pytest
import torch

from pml_extensions.runner.objects.mlp import MLP


def test_single_size_with_input_is_one_linear_layer():
    m = MLP([128], input_size=1024)
    assert m.layer_sizes == [1024, 128]
    assert [type(x) for x in m.net] == [torch.nn.Linear]
    assert m(torch.zeros(2, 1024)).shape == (2, 128)


def test_hidden_relu_and_exact_values():
    m = MLP([2, 2, 1])
    with torch.no_grad():
        m.net[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
        m.net[0].bias.zero_()
        m.net[2].weight.copy_(torch.tensor([[1.0, 1.0]]))
        m.net[2].bias.zero_()
    # x = (2, 3): hidden = relu((2, -3)) = (2, 0); out = 2 (no final ReLU)
    assert m(torch.tensor([[2.0, 3.0]])).item() == 2.0
    assert [type(x) for x in m.net] == [torch.nn.Linear, torch.nn.ReLU, torch.nn.Linear]
    assert isinstance(MLP([2, 1], final_relu=True).net[-1], torch.nn.ReLU)


def test_lazy_without_input_size():
    assert MLP([4])(torch.zeros(3, 7)).shape == (3, 4)


@pytest.mark.parametrize("sizes", [[], [0], [4, -1]])
def test_errors(sizes):
    with pytest.raises(ValueError, match="layer_sizes"):
        MLP(sizes)
