"""``trunks.use_histogram_pooling`` + ``XMLWrapper(...).attach(...)``: XML in two lines on torchvision models
(random init, no downloads) and timm-style models, inside PML's MetricLossOnly (issue 21, item 7)."""

import copy
import csv
import os
import tempfile
import unittest

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from pytorch_metric_learning import samplers

from pml_extensions import losses, trainers, trunks
from pml_extensions.trunks import (
    HistogramPooling,
    MobileNetV2Features,
    find_histogram_layers,
    mobilenet_v2_imagenet,
    pooling_tail,
    use_histogram_pooling,
)
from tests.losses.test_xml_wrapper_in_trainers import _record_keeper

# (constructor, attribute PML users set to Identity, where the layer must land, tail module names, GAP width)
TORCHVISION = {
    "resnet18": (torchvision.models.resnet18, "fc", "avgpool", ["fc"], 512),
    # MobileNetV2 pools functionally in forward(): the layer is appended to `features` (19 blocks: index 19)
    "mobilenet_v2": (torchvision.models.mobilenet_v2, "classifier", "features.19", ["classifier"], 1280),
    # EfficientNet-B0 has a squeeze-excitation AdaptiveAvgPool2d(1) in every block: only `avgpool` is global
    "efficientnet_b0": (torchvision.models.efficientnet_b0, "classifier", "avgpool", ["classifier"], 1280),
}


def _images(n=4, size=64, seed=1):
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _path(model, module):
    return next(name for name, m in model.named_modules() if m is module)


class TestSwapOnTorchvision(unittest.TestCase):
    def test_finds_the_global_pooling_and_keeps_the_output(self):
        for name, (ctor, _, where, tail, width) in TORCHVISION.items():
            with self.subTest(name):
                torch.manual_seed(0)
                model = ctor(num_classes=10).eval()
                x = _images()
                with torch.no_grad():
                    before = model(x)
                model = use_histogram_pooling(model, num_prototypes=8)
                layers = find_histogram_layers(model)
                self.assertEqual(len(layers), 1)
                pool = layers[0]
                self.assertEqual(_path(model, pool), where)
                self.assertEqual((pool.in_channels, pool.num_prototypes), (width, 8))
                self.assertTrue(pool.lazy_init_pending)  # k-means at the first training batches
                with torch.no_grad():
                    after = model(x)  # 64 px, not the 128 px probe: the swap holds for any size
                torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
                self.assertEqual(tuple(pool.last_histograms.shape), (4, 8))
                torch.testing.assert_close(pool.last_histograms.sum(1), torch.ones(4))
                torch.testing.assert_close(pool.last_pooled.shape, torch.Size([4, width]))
                self.assertEqual([_path(model, m) for m in pooling_tail(model)], tail)

    def test_pml_trunk_output_fits_the_embedder(self):
        for name, (ctor, head_attr, _, _, width) in TORCHVISION.items():
            with self.subTest(name):
                trunk = ctor()
                setattr(trunk, head_attr, torch.nn.Identity())  # PML's usual trunk
                trunk = use_histogram_pooling(trunk, num_prototypes=8, init=None).eval()
                embedder = torch.nn.Linear(width, 16)
                x = _images(2)
                with torch.no_grad():
                    out = trunk(x)
                    pooled = find_histogram_layers(trunk)[0].last_pooled
                torch.testing.assert_close(out, pooled, rtol=0, atol=0)  # the trunk's output is the GAP vector
                self.assertEqual(tuple(embedder(out).shape), (2, 16))
                # target="pooled": the head maps the GAP vector exactly as trunk tail + embedder do
                loss = losses.XMLWrapper(losses.ContrastiveLoss(), target="pooled").attach(
                    {"trunk": trunk, "embedder": embedder}
                )
                with torch.no_grad():
                    torch.testing.assert_close(loss.head(pooled), embedder(out), rtol=0, atol=0)


class _Dataset(torch.utils.data.Dataset):
    def __init__(self, n=32, classes=8, size=64):
        g = torch.Generator().manual_seed(0)
        self.labels = np.arange(n) % classes
        self.images = torch.rand(n, 3, size, size, generator=g) + torch.as_tensor(self.labels)[:, None, None, None] / 8

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


class TestTwoLinesInMetricLossOnly(unittest.TestCase):
    def _step(self, ctor, head_attr, width, target, folder):
        torch.manual_seed(0)
        trunk = ctor()
        setattr(trunk, head_attr, torch.nn.Identity())
        embedder = torch.nn.Linear(width, 16)
        # the two lines
        trunk = trunks.use_histogram_pooling(trunk, num_prototypes=16, init_batches=1, seed=0)
        loss = losses.XMLWrapper(losses.ContrastiveLoss(), xml_weight=1.0, target=target).attach(
            {"trunk": trunk, "embedder": embedder}
        )
        pool = find_histogram_layers(trunk)[0]
        random_prototypes = pool.prototypes.detach().clone()
        models = {"trunk": trunk, "embedder": embedder}
        optimizers = {
            "trunk_optimizer": torch.optim.SGD(trunk.parameters(), lr=0.01),
            "embedder_optimizer": torch.optim.SGD(embedder.parameters(), lr=0.01),
        }
        dataset = _Dataset()
        rk = _record_keeper(folder)
        from pytorch_metric_learning.utils import logging_presets

        hooks = logging_presets.HookContainer(rk, log_freq=1)
        trainer = trainers.MetricLossOnly(
            models,
            optimizers,
            batch_size=8,
            loss_funcs={"metric_loss": loss},
            dataset=dataset,
            # 4 classes x 2: two class-disjoint halves with a positive pair each
            sampler=samplers.MPerClassSampler(dataset.labels, m=2, batch_size=8, length_before_new_iter=8),
            iterations_per_epoch=1,
            dataloader_num_workers=0,
            end_of_iteration_hook=hooks.end_of_iteration_hook,
        )
        trainer.train(num_epochs=1)
        rk.save_records()
        return loss, pool, random_prototypes

    def test_one_step_records_xml_loss(self):
        cases = [(n, target) for n in TORCHVISION for target in ("pooled", "embeddings")]
        for name, target in cases:
            ctor, head_attr, _, _, width = TORCHVISION[name]
            with self.subTest(name=name, target=target), tempfile.TemporaryDirectory() as tmp:
                loss, pool, random_prototypes = self._step(ctor, head_attr, width, target, tmp)
                # k-means prototypes from the first batch, then one SGD step: no longer the random ones
                self.assertFalse(pool.lazy_init_pending)
                self.assertGreater(float((pool.prototypes - random_prototypes).abs().max()), 0.01)
                self.assertEqual(loss.num_skipped_xml, 0)
                with open(os.path.join(tmp, "metric_loss_XMLWrapper.csv")) as f:
                    rows = list(csv.DictReader(f))
                self.assertEqual(len(rows), 1)
                xml = float(rows[0]["xml_loss"])
                self.assertTrue(np.isfinite(xml) and xml > 0, rows)
                self.assertAlmostEqual(xml, float(loss.xml_loss), places=5)


class _FastMean(torch.nn.Module):
    """timm's FastAdaptiveAvgPool: a spatial mean written as ``x.mean``, not an AdaptiveAvgPool2d."""

    def forward(self, x):
        return x.mean((2, 3))


class _SelectAdaptivePool(torch.nn.Module):
    """timm's SelectAdaptivePool2d(pool_type="avg", flatten=True): an inner pool and a Flatten."""

    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.flatten = torch.nn.Flatten(1)

    def forward(self, x):
        return self.flatten(self.pool(x))


class _SqueezeExcite(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc(self.pool(x)))


class _TimmStyle(torch.nn.Module):
    """forward_features -> global_pool -> head, as timm's models; squeeze-excitation inside the body."""

    def __init__(self, pool, num_classes=5):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 12, 3, stride=2, padding=1)
        self.blocks = torch.nn.Sequential(_SqueezeExcite(12), torch.nn.Conv2d(12, 24, 3, stride=2), _SqueezeExcite(24))
        self.global_pool = pool
        self.head = torch.nn.Linear(24, num_classes)

    def forward_features(self, x):
        return self.blocks(F.relu(self.stem(x)))

    def forward(self, x):
        return self.head(self.global_pool(self.forward_features(x)))


class _ReluThenFunctionalPool(torch.nn.Module):
    """torchvision DenseNet's shape: features, then a ReLU and the pooling written in forward()."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.BatchNorm2d(8))
        self.classifier = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(F.relu(self.features(x)), 1), 1))


class TestSwapOnOtherModels(unittest.TestCase):
    def test_timm_style_models(self):
        cases = (
            (_SelectAdaptivePool(), "global_pool.pool", ["global_pool.flatten", "head"]),
            (_FastMean(), "global_pool", ["head"]),
        )
        for pool, where, tail in cases:
            with self.subTest(where):
                torch.manual_seed(0)
                model = _TimmStyle(pool).eval()
                x = _images(2, 40)
                with torch.no_grad():
                    before = model(x)
                    model = use_histogram_pooling(model, num_prototypes=4)
                    after = model(x)
                layer = find_histogram_layers(model)[0]
                self.assertEqual(_path(model, layer), where)  # not a squeeze-excitation pool of the blocks
                self.assertEqual(layer.in_channels, 24)
                torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
                self.assertEqual([_path(model, m) for m in pooling_tail(model)], tail)

    def test_tail_that_needs_the_pooling_map_shape(self):
        # ConvNeXt's shape: AdaptiveAvgPool2d(1) -> a classifier that works on [N, C, 1, 1] (there LayerNorm2d)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 6, 3),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Sequential(torch.nn.Conv2d(6, 2, 1), torch.nn.Flatten(1)),
        )
        model = use_histogram_pooling(model, num_prototypes=2)
        tail = pooling_tail(model)
        self.assertIsInstance(tail[0], torch.nn.Unflatten)
        self.assertIs(tail[1], model[2])
        x = _images(3, 12)
        with torch.no_grad():
            out = model(x)
            head = torch.nn.Sequential(*tail)
            torch.testing.assert_close(head(model[1].last_pooled), out, rtol=0, atol=0)

    def test_a_body_gets_the_layer_after_it(self):
        body = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.ReLU())
        trunk = use_histogram_pooling(body, num_prototypes=4, init=None)
        self.assertIsInstance(trunk, torch.nn.Sequential)
        self.assertIs(trunk[0], body)
        self.assertIsInstance(trunk[1], HistogramPooling)
        x = _images(2, 10)
        torch.testing.assert_close(trunk(x), body(x).mean(dim=(2, 3)))

    def test_given_prototypes_are_used_as_they_are(self):
        protos = torch.randn(4, 24, generator=torch.Generator().manual_seed(0))
        model = use_histogram_pooling(_TimmStyle(_SelectAdaptivePool()), prototypes=protos)
        layer = find_histogram_layers(model)[0]
        self.assertFalse(layer.lazy_init_pending)
        torch.testing.assert_close(layer.prototypes, protos, rtol=0, atol=0)

    def test_refusals_leave_the_model_unchanged(self):
        model = _ReluThenFunctionalPool()
        state = {k: v.clone() for k, v in model.state_dict().items()}
        with self.assertRaisesRegex(ValueError, "appended to `features` changes the model's output"):
            use_histogram_pooling(model)
        self.assertEqual(find_histogram_layers(model), [])
        self.assertEqual(list(model.state_dict()), list(state))
        with self.assertRaisesRegex(ValueError, "already holds a HistogramPooling"):
            use_histogram_pooling(use_histogram_pooling(torchvision.models.resnet18(num_classes=2)))
        with self.assertRaisesRegex(ValueError, "no Conv2d .* pass example_input"):
            use_histogram_pooling(torch.nn.Linear(3, 3))
        with self.assertRaisesRegex(TypeError, "model must be a torch.nn.Module"):
            use_histogram_pooling("resnet18")
        with self.assertRaisesRegex(ValueError, r"prototypes must be \[m, 24\]"):
            use_histogram_pooling(_TimmStyle(_SelectAdaptivePool()), prototypes=torch.zeros(4, 5))

    def test_tail_refused_when_functional_code_follows_the_pooling(self):
        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 4, 3)
                self.avgpool = torch.nn.AdaptiveAvgPool2d(1)

            def forward(self, x):
                return 2 * torch.flatten(self.avgpool(self.conv(x)), 1)

        trunk = use_histogram_pooling(Scaled(), num_prototypes=2)
        loss = losses.XMLWrapper(losses.ContrastiveLoss()).attach(trunk)  # histograms only: fine
        self.assertIs(loss.histogram_layer, trunk.avgpool)
        with self.assertRaisesRegex(ValueError, "not its modules after the HistogramPooling.*head="):
            losses.XMLWrapper(losses.ContrastiveLoss(), target="pooled").attach(trunk, torch.nn.Identity())


class TestPlainWrapperSaysWhatToCall(unittest.TestCase):
    def test_one_line_naming_attach_and_the_swap(self):
        loss = losses.XMLWrapper(losses.ContrastiveLoss())
        with self.assertRaises(ValueError) as caught:
            loss(torch.randn(8, 4), torch.arange(4).repeat(2))
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertIn("loss.attach(trunk)", message)
        self.assertIn("trunks.use_histogram_pooling(trunk)", message)
        with self.assertRaisesRegex(ValueError, "found 0 .*use_histogram_pooling"):
            loss.attach(torchvision.models.resnet18(num_classes=2))
        with self.assertRaisesRegex(ValueError, "needs a 'trunk' key"):
            loss.attach({"embedder": torch.nn.Identity()})

    def test_pooled_without_embedder_says_what_to_call(self):
        trunk = use_histogram_pooling(torchvision.models.resnet18(num_classes=4), num_prototypes=4)
        loss = losses.XMLWrapper(losses.ContrastiveLoss(), target="pooled").attach(trunk)
        self.assertIsNone(loss.head)  # attach(trunk) alone keeps its meaning: the head waits for the embedder
        trunk.train()
        embeddings = trunk(_images(8, 32))
        with self.assertRaisesRegex(ValueError, r"needs a head .*attach\(trunk, embedder\)"):
            loss(embeddings, torch.arange(4).repeat(2))


if __name__ == "__main__":
    unittest.main()


def _same_output_bit_for_bit(test, model, swapped, x):
    """Eval and train mode (batch statistics; the same dropout / stochastic-depth draws in both)."""
    with torch.no_grad():
        for training in (False, True):
            model.train(training)
            swapped.train(training)
            torch.manual_seed(0)
            before = model(x)
            torch.manual_seed(0)
            after = swapped(x)
            test.assertTrue(torch.equal(after, before), f"training={training}: {(after - before).abs().max()}")


class TestOutputUnchangedBitForBit(unittest.TestCase):
    """The layer returns the GAP vector computed by the same ``mean`` as the pooling it replaces."""

    def test_torchvision_models(self):
        # (the whole MobileNetV2 and its PML trunk: test_pretrained_mobilenet_v2_is_unchanged_by_the_swap)
        for name, pml_trunk in (("resnet18", False), ("resnet18", True), ("efficientnet_b0", False)):
            with self.subTest(name, pml_trunk=pml_trunk):
                ctor, head_attr, *_ = TORCHVISION[name]
                torch.manual_seed(0)
                model = ctor(num_classes=10)
                if pml_trunk:
                    setattr(model, head_attr, torch.nn.Identity())
                x = _images(2, 64)
                swapped = use_histogram_pooling(copy.deepcopy(model), num_prototypes=8, example_input=x)
                _same_output_bit_for_bit(self, model, swapped, x)
                self.assertEqual(len(find_histogram_layers(swapped)), 1)

    def test_timm_style_and_sequential_trunks(self):
        cases = {
            "SelectAdaptivePool2d": lambda: _TimmStyle(_SelectAdaptivePool()),
            "FastAdaptiveAvgPool": lambda: _TimmStyle(_FastMean()),
            "Sequential body + AdaptiveAvgPool2d(1) + Flatten": lambda: torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, stride=2),
                torch.nn.BatchNorm2d(8),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
            ),  # fmt: skip
        }
        for name, make in cases.items():
            for dtype in (torch.float32, torch.float64):
                with self.subTest(name, dtype=dtype):
                    torch.manual_seed(0)
                    model = make().to(dtype)
                    swapped = use_histogram_pooling(copy.deepcopy(model), num_prototypes=4)
                    _same_output_bit_for_bit(self, model, swapped, _images(2, 40).to(dtype))

    def test_a_fixed_kernel_avg_pool_is_kept_up_to_rounding(self):
        # AvgPool2d(8) over an 8 x 8 map sums in another order than the layer's mean: a few float32 ulps (documented)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.AvgPool2d(8), torch.nn.Flatten())
        x = _images(3, 8)
        swapped = use_histogram_pooling(copy.deepcopy(model), num_prototypes=4, example_input=x)
        self.assertIsInstance(swapped[1], HistogramPooling)
        with torch.no_grad():
            torch.testing.assert_close(swapped.eval()(x), model.eval()(x), rtol=1e-6, atol=1e-7)

    def test_a_model_that_no_longer_runs_is_refused_and_left_unchanged(self):
        class FixedKernelInForward(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU())
                self.fc = torch.nn.Linear(8, 3)

            def forward(self, x):
                return self.fc(torch.flatten(F.avg_pool2d(self.features(x), 4), 1))

        model = FixedKernelInForward()
        with self.assertRaisesRegex(ValueError, "appended to `features` the model no longer runs .*left unchanged"):
            use_histogram_pooling(model, num_prototypes=2, example_input=_images(2, 8))
        self.assertEqual(find_histogram_layers(model), [])
        self.assertEqual(len(model.features), 2)


@pytest.mark.parametrize("trunk", [False, True])
def test_pretrained_mobilenet_v2_is_unchanged_by_the_swap(mobilenet_weights, trunk):
    """ImageNet MobileNetV2: the whole model (functional pooling: the layer is appended to ``features``) and the PML
    trunk ``Sequential(MobileNetV2Features, AdaptiveAvgPool2d(1), Flatten)``."""
    if trunk:
        model = torch.nn.Sequential(
            MobileNetV2Features(pretrained=True), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()
        )
    else:
        model = mobilenet_v2_imagenet(pretrained=True)
    swapped = use_histogram_pooling(copy.deepcopy(model), num_prototypes=8)
    _same_output_bit_for_bit(unittest.TestCase(), model, swapped, _images(2, 96))
