"""Tests for insert_template_matching (paper Sec. 3.3: the block between the last two stages)."""

import unittest

import pytest
import torch
import torchvision

from pml_extensions.losses.patch_classification_loss import PatchClassificationLoss
from pml_extensions.trunks.pretrained import MobileNetV2Features, mobilenet_v2_imagenet
from pml_extensions.trunks.template_matching_block import TemplateMatchingBlock
from pml_extensions.trunks.template_matching_inserter import (
    insert_template_matching,
    template_matching_blocks,
    template_matching_trunk,
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
        # concat widens the next layer's input with zero weights: at insertion the function is unchanged (eval mode),
        # up to the order of the sums (the next conv's reduction is longer), so float64 and a float64 tolerance; the
        # value vectors stay random (zero values behind zero weights would get no gradient, see TestTheBlockStillLearns)
        for name in ("resnet18", "mobilenet_v2", "densenet121"):
            with self.subTest(name):
                model = ARCHS[name][0](weights=None).double().eval()
                trunk = insert_template_matching(model, 5, combine="concat", value_channels=8).eval()
                self.assertEqual(conv1x1_count(trunk) - conv1x1_count(model), 2)
                with torch.no_grad():
                    x = self.x.double()
                    torch.testing.assert_close(trunk(x), model(x), rtol=1e-12, atol=1e-12)
                (block,) = template_matching_blocks(trunk)
                self.assertEqual(block.out_channels, ARCHS[name][1] + 8)
                self.assertGreater(float(block.values.weight.detach().abs().sum()), 0)

    def test_a_widened_batchnorm_keeps_the_models_mode(self):
        # DenseNet's transition3.norm is rebuilt wider for concat: it was a fresh module in train mode inside an eval
        # model, so the model was no longer "unchanged at insertion" until .eval() was called again
        model = torchvision.models.densenet121(weights=None).eval()
        trunk = insert_template_matching(model, 5, combine="concat", value_channels=8)
        norm = trunk.features.transition3.norm
        self.assertEqual((norm.num_features, norm.training), (1024 + 8, False))

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


# ----------------------------------------------------------------------------------------------------------------------
# init="identity" (the default): the host network computes exactly what it computed before the insertion


def _images(n=2, size=64, seed=1, dtype=torch.float32):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _assert_same_function(test, model, inserted, x):
    with torch.no_grad():
        for mode in ("eval", "train"):  # train: the host's BNs use batch statistics of the same tensors
            model.train(mode == "train")
            inserted.train(mode == "train")
            torch.manual_seed(0)  # the same dropout masks (MobileNetV2's classifier) in both
            before = model(x)
            torch.manual_seed(0)
            after = inserted(x)
            test.assertTrue(torch.equal(after, before), f"{mode}: max |diff| {(after - before).abs().max()}")


class TestIdentityAtInsertion(unittest.TestCase):
    def test_resnet18_at_several_places_and_mixings(self):
        torch.manual_seed(0)
        model = torchvision.models.resnet18(weights=None, num_classes=7)
        x = _images(size=32)
        cases = [(after, "bn_relu") for after in ("layer1", "layer2", "layer4")]
        cases += [(None, mixing) for mixing in ("bn_relu", "softmax", "perturbed", "none")]
        for after, mixing in cases:
            with self.subTest(after=after, mixing=mixing):
                inserted = insert_template_matching(model, 10, after=after, mixing=mixing, num_samples=8)
                _assert_same_function(self, model, inserted, x)
                (block,) = template_matching_blocks(inserted)
                self.assertEqual(block.last_class_scores.shape[:2], (2, 10))  # the block did run

    @pytest.mark.slow  # over 3 s on 2 cores: tox runs it, -m 'not slow' leaves it out
    def test_float64_densenet_and_mobilenet_at_the_papers_place(self):
        for name in ("densenet121", "mobilenet_v2"):
            with self.subTest(name):
                torch.manual_seed(0)
                model = ARCHS[name][0](weights=None, num_classes=5).double()
                _assert_same_function(
                    self, model, insert_template_matching(model, 4), _images(dtype=torch.float64, size=32)
                )

    def test_paper_init_changes_the_function_with_the_same_classifier(self):
        torch.manual_seed(0)
        model = torchvision.models.resnet18(weights=None).eval()
        torch.manual_seed(3)
        paper = insert_template_matching(model, 4, init="paper").eval()
        torch.manual_seed(3)
        ours = insert_template_matching(model, 4).eval()
        x = _images()
        with torch.no_grad():
            self.assertFalse(torch.equal(paper(x), model(x)))
        (bp,), (bo,) = template_matching_blocks(paper), template_matching_blocks(ours)
        self.assertTrue(torch.equal(bp.classifier.weight, bo.classifier.weight))  # the same random draws
        self.assertTrue(torch.equal(bo.shortcut.weight[:, :, 0, 0], torch.eye(256)))
        self.assertEqual(float(bo.values.weight.detach().abs().sum()), 0.0)

    def test_template_matching_trunk_passes_init(self):
        torch.manual_seed(0)
        model = torchvision.models.resnet18(weights=None).eval()
        body = template_matching_trunk(model, 4).eval()
        plain = torch.nn.Sequential(*list(model.children())[:-2]).eval()
        x = _images()
        with torch.no_grad():
            self.assertTrue(torch.equal(body(x), plain(x)))
            self.assertFalse(torch.equal(template_matching_trunk(model, 4, init="paper").eval()(x), plain(x)))

    def test_unknown_init(self):
        with self.assertRaisesRegex(ValueError, r"init must be one of \('paper', 'identity'\), got 'dirac'"):
            insert_template_matching(torchvision.models.resnet18(weights=None), 4, init="dirac")


@pytest.mark.parametrize("after", [None, "13", "6", "16", "17"])
def test_pretrained_mobilenet_v2_is_unchanged_by_the_insertion(mobilenet_weights, after):
    """ImageNet MobileNetV2: with a randomly initialised block (init="paper") the pooled features of real images have a
    cosine of about 0.3 to the original's; with the default they are the original's, bit for bit."""
    torch.manual_seed(0)
    if after is None:  # the paper's place in the whole torchvision model (before the last stride-2 block): logits
        model = mobilenet_v2_imagenet(pretrained=True).eval()
    else:  # the trunk of the cached-prefix experiments
        model = torch.nn.Sequential(
            MobileNetV2Features(pretrained=True), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()
        ).eval()
        after = f"0.{after}"
    inserted = insert_template_matching(model, num_classes=60, after=after).eval()
    x = _images(3, 96)
    with torch.no_grad():
        before, out = model(x), inserted(x)
        assert torch.equal(out, before)
        paper = insert_template_matching(model, num_classes=60, after=after, init="paper").eval()(x)
    assert float(torch.nn.functional.cosine_similarity(paper, before, dim=1).min()) < 0.99


class TestTheBlockStillLearns(unittest.TestCase):
    """With init="identity" every parameter of the block gets a gradient at once or after one step."""

    def _step(self, model, block, x, labels, aux_weight=0.5):
        model.zero_grad()
        logits = model(x)
        loss = (1 - aux_weight) * torch.nn.functional.cross_entropy(logits, labels)
        loss = loss + aux_weight * PatchClassificationLoss()(block.last_class_scores, labels)
        loss.backward()
        return {name: float(p.grad.abs().sum()) if p.grad is not None else 0.0 for name, p in block.named_parameters()}

    def test_gradients_reach_the_templates_and_the_values(self):
        torch.manual_seed(0)
        model = insert_template_matching(torchvision.models.resnet18(weights=None, num_classes=4), 4).train()
        (block,) = template_matching_blocks(model)
        x, labels = _images(4, 32), torch.tensor([0, 1, 2, 3])
        grads = self._step(model, block, x, labels)
        # the templates (classifier) learn from the auxiliary loss, the shortcut and the value vectors from the main
        # loss; BN-ReLU's γ, β only reach the loss through the value vectors, which are 0 at the start
        for name in ("classifier.weight", "classifier.bias", "values.weight", "shortcut.weight"):
            self.assertGreater(grads[name], 0, name)
        self.assertEqual((grads["mixer.0.weight"], grads["mixer.0.bias"]), (0.0, 0.0))
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        grads = self._step(model, block, x, labels)
        self.assertTrue(all(g > 0 for g in grads.values()), grads)

    def test_concat_learns_through_the_widened_weights(self):
        torch.manual_seed(0)
        model = insert_template_matching(
            torchvision.models.resnet18(weights=None, num_classes=4), 4, combine="concat", value_channels=8
        ).train()
        (block,) = template_matching_blocks(model)
        widened = model.layer4[0].conv1.weight
        x, labels = _images(4, 32), torch.tensor([0, 1, 2, 3])
        grads = self._step(model, block, x, labels)
        self.assertGreater(float(widened.grad[:, 256:].abs().sum()), 0)  # the zero weights of f' move first
        self.assertGreater(grads["classifier.weight"], 0)
        self.assertEqual(grads["values.weight"], 0.0)  # behind zero weights
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        grads = self._step(model, block, x, labels)
        self.assertTrue(all(g > 0 for g in grads.values()), grads)
