"""Every model surgery of :mod:`pml_extensions.trunks` refuses a model it does not support with the package's own
one-line ValueError that names the model and what is supported, never an error of the model's own code (a ViT's
input-size assertion used to leak from ``use_histogram_pooling``'s 128-px probe). Cross-cutting: one table of
(surgery, expected words) over models none of them supports, as captum's hook-removal tests run from one table."""

import pytest
import torch
import torchvision

from pml_extensions import trunks

BATCH = [torch.zeros(2, 3, 224, 224)]

#: name -> (call, words the refusal must contain besides the model's class name)
SURGERIES = {
    "use_histogram_pooling": (lambda m: trunks.use_histogram_pooling(m, num_prototypes=4), ("supported: CNNs",)),
    "use_histogram_pooling at its input size": (
        lambda m: trunks.use_histogram_pooling(m, num_prototypes=4, example_input=torch.zeros(1, 3, 224, 224)),
        ("supported: CNNs",),
    ),
    "pooling_tail": (lambda m: trunks.pooling_tail(m), ("HistogramPooling",)),
    "insert_template_matching": (lambda m: trunks.insert_template_matching(m, num_classes=4), ("supported:", "ResNet")),
    "template_matching_trunk": (lambda m: trunks.template_matching_trunk(m, num_classes=4), ("supported:", "ResNet")),
    "soft_maximizer_swap": (lambda m: trunks.soft_maximizer_swap(m), ("BasicBlock/Bottleneck",)),
    "estimate_mu": (lambda m: trunks.estimate_mu(m, BATCH), ("BasicBlock/Bottleneck",)),
    "estimate_eta": (lambda m: trunks.estimate_eta(m, BATCH), ("BasicBlock/Bottleneck",)),
    "trunk_stages": (lambda m: trunks.trunk_stages(m), ("[B, C, H, W]",)),
    "split_trunk by stage index": (lambda m: trunks.split_trunk(m, 1), ("[B, C, H, W]",)),
    "trunk_body": (lambda m: trunks.trunk_body(m, torch.nn.Identity()), ("Sequential",)),
}


def _tree(model):
    return [(name, type(m).__name__) for name, m in model.named_modules()]


def _refused(model, surgery):
    call, words = SURGERIES[surgery]
    before = _tree(model)
    with pytest.raises(ValueError) as e:
        call(model)
    message = str(e.value)
    assert "\n" not in message and type(model).__name__ in message
    for word in words:
        assert word in message
    assert type(e.value) is ValueError  # the package's own, not a subclass raised by third-party code
    assert _tree(model) == before  # left unchanged


@pytest.fixture(scope="module")
def small_vit():
    """torchvision's VisionTransformer class at vit_b_16's input size and patch, one thin layer (fast)."""
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(224, 16, num_layers=1, num_heads=1, hidden_dim=8, mlp_dim=8)


@pytest.mark.parametrize("surgery", list(SURGERIES))
def test_a_vision_transformer_is_refused_in_one_line(small_vit, surgery):
    _refused(small_vit, surgery)


def test_vit_b_16_is_refused_in_one_line():
    """The reported model itself (no weights): its 224-px assertion used to leak from the 128-px probe."""
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16()
    for surgery in ("use_histogram_pooling", "insert_template_matching", "soft_maximizer_swap", "trunk_body"):
        _refused(model, surgery)


def test_the_probe_refusal_quotes_what_the_model_said():
    """The 128-px probe of a ViT: the refusal says that the probe did not run and how to pass one that fits."""
    model = torchvision.models.VisionTransformer(32, 16, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=8)
    with pytest.raises(ValueError) as e:
        trunks.use_histogram_pooling(model)
    message = str(e.value)
    assert message.startswith("use_histogram_pooling: VisionTransformer does not run on a (2, 3, 128, 128) probe")
    assert "AssertionError: Wrong image height" in message and "example_input=[B, C, H, W]" in message


def test_a_model_that_fails_after_the_swap_is_refused_and_left_unchanged():
    """A model whose forward breaks once its pooling is a HistogramPooling: refused, the swap undone."""

    class Picky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.pool = torch.nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            assert type(self.pool) is torch.nn.AdaptiveAvgPool2d, "not my pooling"
            return self.pool(self.conv(x)).flatten(1)

    model = Picky()
    with pytest.raises(
        ValueError, match=r"no longer runs \(AssertionError: not my pooling\); the model is left unchanged"
    ):
        trunks.use_histogram_pooling(model, num_prototypes=2)
    assert type(model.pool) is torch.nn.AdaptiveAvgPool2d
