import unittest

import torch
import torchvision

from pml_extensions.trunks import MobileNetV2Features, split_trunk, trunk_stages


def _seeded(build, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


def _mobilenet():
    return _seeded(lambda: torchvision.models.mobilenet_v2(num_classes=10))


def _resnet():
    return _seeded(lambda: torchvision.models.resnet18(num_classes=10))


class TestSplit(unittest.TestCase):
    def _check(self, model, boundary, prefix_shape, x):
        prefix, rest = split_trunk(model, boundary)
        with torch.no_grad():
            features = prefix(x)
            self.assertEqual(tuple(features.shape), prefix_shape)
            self.assertTrue(torch.equal(rest(features), model(x)))
        # the halves share the model's parameter objects, split between them
        ids = lambda m: {id(p) for p in m.parameters()}  # noqa: E731
        self.assertEqual(ids(prefix) | ids(rest), ids(model))
        self.assertFalse(ids(prefix) & ids(rest))
        return prefix, rest

    def test_torchvision_mobilenet_v2_at_a_module_path(self):
        model, x = _mobilenet(), torch.randn(2, 3, 64, 64)
        prefix, rest = self._check(model, "features.17", (2, 320, 2, 2), x)
        self.assertEqual(next(iter(rest.state_dict())), "features.18.0.weight")  # keys keep their paths
        self.assertIn("classifier.1.weight", rest.state_dict())
        self.assertIn("features.0.0.weight", prefix.state_dict())
        self.assertNotIn("features.18.0.weight", prefix.state_dict())
        # training the rest trains the model's own parameters
        with torch.no_grad():
            rest.get_submodule("features.18.0").weight.mul_(0)
        self.assertEqual(model.features[18][0].weight.abs().sum().item(), 0.0)

    def test_mobilenet_features_and_sequential_trunks(self):
        x = torch.randn(2, 3, 64, 64)
        body = _seeded(lambda: MobileNetV2Features(pretrained=False))
        self._check(body, "17", (2, 320, 2, 2), x)
        trunk = torch.nn.Sequential(body, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        _, rest = self._check(trunk, "0.16", (2, 160, 2, 2), x)
        self.assertEqual(len([m for m in rest.modules() if isinstance(m, torch.nn.Conv2d)]), 4)
        self._check(trunk, "0", (2, 1280, 2, 2), x)  # everything frozen: the rest pools only

    def test_torchvision_resnet_by_path_and_stage_index(self):
        model, x = _resnet(), torch.randn(2, 3, 64, 64)
        self._check(model, "layer3", (2, 256, 4, 4), x)
        self._check(model, -2, (2, 256, 4, 4), x)
        self._check(model, "layer3.0", (2, 256, 4, 4), x)  # between two blocks of a stage
        self._check(model, 0, (2, 64, 32, 32), x)

    def test_stages(self):
        self.assertEqual(
            trunk_stages(_mobilenet(), (3, 96, 96)),
            ["features.1", "features.3", "features.6", "features.13", "features.18"],
        )
        self.assertEqual(trunk_stages(_resnet(), (3, 64, 64)), ["relu", "layer1", "layer2", "layer3", "layer4"])
        trunk = torch.nn.Sequential(MobileNetV2Features(pretrained=False), torch.nn.AdaptiveAvgPool2d(1))
        self.assertEqual(trunk_stages(trunk, (3, 64, 64)), ["0.1", "0.3", "0.6", "0.13", "0.18"])

    def test_probe_restores_modes_and_statistics(self):
        model = _resnet().train()
        before = model.bn1.running_mean.clone()
        trunk_stages(model, (3, 32, 32))
        self.assertTrue(all(m.training for m in model.modules()))
        self.assertTrue(torch.equal(before, model.bn1.running_mean))


class _SkipsItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.unused = torch.nn.Conv2d(3, 3, 1), torch.nn.Conv2d(3, 3, 1), torch.nn.ReLU()

    def forward(self, x):
        return self.b(self.a(x)) + x


class _Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: not traceable
            return self.conv(x)
        return x


class TestErrors(unittest.TestCase):
    def _raises(self, error, message, model, boundary):
        with self.assertRaisesRegex(error, message) as ctx:
            split_trunk(model, boundary)
        self.assertNotIn("\n", str(ctx.exception))

    def test_unknown_path_lists_the_nearest_names(self):
        self._raises(
            ValueError,
            r"'features.71' is not a module of MobileNetV2; nearest: \['features.7'",
            _mobilenet(),
            "features.71",
        )
        self._raises(ValueError, r"'layer5' is not a module of ResNet; nearest: \[.*'layer\d'", _resnet(), "layer5")

    def test_boundary_inside_a_residual_block(self):
        self._raises(
            ValueError,
            r"'layer1.0.conv1' does not split ResNet.forward cleanly: the output of 'maxpool', computed before it, is "
            r"also used after it .*clean boundaries here: \[",
            _resnet(),
            "layer1.0.conv1",
        )
        self._raises(ValueError, r"the input 'x', computed before it, is also used after it", _SkipsItsInput(), "a")

    def test_module_called_twice_or_never(self):
        conv = torch.nn.Conv2d(3, 3, 1)
        self._raises(ValueError, r"'0' is called 2 times in Sequential.forward", torch.nn.Sequential(conv, conv), "0")
        self._raises(ValueError, r"'unused' is never called in _SkipsItsInput.forward", _SkipsItsInput(), "unused")

    def test_stage_index_and_types(self):
        self._raises(ValueError, r"stage index 5 is out of range: ResNet has 5 stages ending at \['relu'", _resnet(), 5)
        self._raises(TypeError, "boundary must be a module path", _resnet(), True)
        self._raises(TypeError, "boundary must be a module path", _resnet(), 1.0)

    def test_untraceable_forward(self):
        model = torch.nn.Sequential(_Branchy(), torch.nn.ReLU())
        self.assertEqual(len(split_trunk(model, "0")), 2)  # the untraceable module as a whole is fine
        self._raises(ValueError, r"torch.fx cannot trace Sequential.forward through \['0'\]", model, "0.conv")
