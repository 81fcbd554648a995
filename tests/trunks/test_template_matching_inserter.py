"""Tests for insert_template_matching (paper Sec. 3.3: the block between the last two stages)."""

import unittest

import torch
import torchvision

from pml_extensions.trunks.template_matching_block import TemplateMatchingBlock
from pml_extensions.trunks.template_matching_inserter import (
    insert_template_matching,
    template_matching_blocks,
)

ARCHS = {
    # name: (constructor, width d of the map the block sees)
    "resnet18": (torchvision.models.resnet18, 256),
    "resnet34": (torchvision.models.resnet34, 256),
    "resnet50": (torchvision.models.resnet50, 1024),
    "mobilenet_v2": (torchvision.models.mobilenet_v2, 96),
    "densenet121": (torchvision.models.densenet121, 1024),
}


def conv1x1_count(module):
    return sum(1 for m in module.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1))


class TestInsertTemplateMatching(unittest.TestCase):
    def setUp(self):
        self.x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))

    def test_shape_backward_and_three_convs(self):
        for name, (ctor, width) in ARCHS.items():
            with self.subTest(name):
                model = ctor(weights=None, num_classes=7)
                trunk = insert_template_matching(model, num_classes=10)
                self.assertIsNot(trunk, model)
                self.assertEqual(template_matching_blocks(model), [])  # the original is untouched
                blocks = template_matching_blocks(trunk)
                self.assertEqual(len(blocks), 1)
                self.assertEqual(blocks[0].in_channels, width)
                self.assertEqual(conv1x1_count(trunk) - conv1x1_count(model), 3)
                out = trunk(self.x)
                self.assertEqual(out.shape, model(self.x).shape)
                # 64×64 input -> stride-16 map 4×4; window 2×2
                self.assertEqual(blocks[0].last_class_scores.shape, (2, 10, 4, 4))
                (out.sum() + blocks[0].last_class_scores.sum()).backward()
                self.assertIsNotNone(blocks[0].classifier.weight.grad)
                self.assertIsNotNone(blocks[0].values.weight.grad)

    def test_concat_keeps_output_and_function(self):
        # concat widens the next layer's input with zero weights: at insertion the function is unchanged (eval
        # mode)
        for name in ("resnet18", "mobilenet_v2", "densenet121"):
            with self.subTest(name):
                model = ARCHS[name][0](weights=None).eval()
                trunk = insert_template_matching(model, 5, combine="concat", value_channels=8).eval()
                self.assertEqual(conv1x1_count(trunk) - conv1x1_count(model), 2)
                with torch.no_grad():
                    torch.testing.assert_close(trunk(self.x), model(self.x), rtol=1e-5, atol=1e-5)
                self.assertEqual(template_matching_blocks(trunk)[0].out_channels, ARCHS[name][1] + 8)

    def test_pml_trunk_and_keys(self):
        model = torchvision.models.resnet18(weights=None)
        model.fc = torch.nn.Identity()
        trunk = insert_template_matching(model, 4, mixing="softmax")
        self.assertEqual(trunk(self.x).shape, (2, 512))
        # the original weights keep their names, so a pretrained state dict still loads
        missing, unexpected = trunk.load_state_dict(model.state_dict(), strict=False)
        self.assertEqual(unexpected, [])
        self.assertTrue(all(k.startswith("layer3.2.") for k in missing))

    def test_inplace(self):
        model = torchvision.models.resnet18(weights=None)
        self.assertIs(insert_template_matching(model, 3, inplace=True), model)
        self.assertEqual(len(template_matching_blocks(model)), 1)
        self.assertIsInstance(model.layer3[-1], TemplateMatchingBlock)

    def test_unknown_architecture(self):
        with self.assertRaises(ValueError) as ctx:
            insert_template_matching(torchvision.models.squeezenet1_0(weights=None), 3)
        msg = str(ctx.exception)
        for word in ("SqueezeNet", "ResNet", "MobileNetV2", "DenseNet", "resnet18", "densenet121"):
            self.assertIn(word, msg)
        with self.assertRaises(TypeError):
            insert_template_matching("resnet18", 3)

    def test_bad_block_arguments(self):
        model = torchvision.models.resnet18(weights=None)
        with self.assertRaisesRegex(ValueError, "num_classes"):
            insert_template_matching(model, 1)
        with self.assertRaisesRegex(ValueError, "value_channels"):
            insert_template_matching(model, 3, value_channels=100)


class TestInsertAfter(unittest.TestCase):
    """``after=``: the block at another stage (the position as an experiment's variable)."""

    def test_after_appends_to_the_named_stage_of_any_model(self):
        from pml_extensions.trunks import SmallResNet

        torch.manual_seed(0)
        net = SmallResNet(1, (4, 8, 16, 16))
        x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(1))
        for stage, width in (("layer1", 4), ("layer2", 8), ("layer3", 16)):
            with self.subTest(stage):
                out = insert_template_matching(net, num_classes=5, after=stage)
                (block,) = template_matching_blocks(out)
                self.assertIs(getattr(out, stage)[-1], block)
                self.assertEqual(block.in_channels, width)
                self.assertEqual(out(x).shape, (2, 16))
                self.assertEqual(block.last_class_scores.shape[:2], (2, 5))
        # the default for a ResNet-style model is the paper's: after layer3, as after="layer3"
        self.assertIsInstance(insert_template_matching(net, 5).layer3[-1], TemplateMatchingBlock)
        keys = set(net.state_dict())
        self.assertTrue(keys <= set(insert_template_matching(net, 5, after="layer2").state_dict()))

    def test_after_errors_name_the_stages(self):
        from pml_extensions.trunks import SmallResNet

        net = SmallResNet(1, (4, 8))
        with self.assertRaisesRegex(ValueError, r"after='layer9' must name an nn.Sequential stage.*layer1"):
            insert_template_matching(net, 5, after="layer9")
        with self.assertRaisesRegex(ValueError, "combine='add'"):
            insert_template_matching(net, 5, after="layer1", combine="concat")


class TestInsertAfterAModule(unittest.TestCase):
    """``after=`` naming a module inside an ``nn.Sequential``: the block goes right after it (the cached-prefix
    experiments put it after ``features.13`` of a ``Sequential`` MobileNetV2 trunk)."""

    def test_after_features_13_is_the_papers_mobilenet_place(self):
        torch.manual_seed(0)
        model = torchvision.models.mobilenet_v2(weights=None).eval()
        trunk = torch.nn.Sequential(torch.nn.Sequential(*model.features.children())).eval()
        torch.manual_seed(7)
        paper = insert_template_matching(model, num_classes=4).eval()
        torch.manual_seed(7)
        ours = insert_template_matching(trunk, num_classes=4, after="0.13").eval()
        self.assertEqual([type(m).__name__ for m in ours[0]][13:16], ["InvertedResidual", "TemplateMatchingBlock",
                                                                      "InvertedResidual"])  # fmt: skip
        self.assertEqual(len(ours[0]), 20)  # the later children shifted by one index
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            self.assertTrue(torch.equal(ours(x), paper.features(x)))

    def test_named_children_keep_their_names(self):
        from collections import OrderedDict

        net = torch.nn.Sequential(OrderedDict(conv=torch.nn.Conv2d(1, 3, 1), relu=torch.nn.ReLU()))
        out = insert_template_matching(net, 2, after="conv")
        self.assertEqual([n for n, _ in out.named_children()], ["conv", "template_block", "relu"])
        self.assertEqual([n for n, _ in net.named_children()], ["conv", "relu"])  # not in place: a copy

    def test_a_module_outside_a_sequential_is_refused(self):
        from pml_extensions.trunks import SmallResNet

        net = SmallResNet(1, (4, 8))
        with self.assertRaisesRegex(ValueError, r"after='layer1.0.conv1' must name an nn.Sequential stage"):
            insert_template_matching(net, 5, after="layer1.0.conv1")
