"""Tests for soft_maximizer_swap, bn_relu_thresholds, estimate_mu, estimate_eta (paper Sec. 3.2, 4.1)."""

import math
import unittest

import torch
import torchvision
from torchvision.models.resnet import BasicBlock

from pml_extensions.trunks.margin_softmax import MarginAugmentedSoftmax
from pml_extensions.trunks.perturbed_maximizer import PerturbedMaximizer
from pml_extensions.trunks.soft_maximizer_swap import (
    bn_relu_sites,
    bn_relu_thresholds,
    estimate_eta,
    estimate_mu,
    soft_maximizer_swap,
)
from pml_extensions.trunks.template_matching_inserter import template_matching_blocks, template_matching_trunk


def tiny_block_model():
    """One BasicBlock with 2 channels and hand-set bn1: γ = [2, 1], β = [1, -0.5], running mean [0.5, -1],
    running var [3, 0.25] (eps = 1 for round numbers)."""
    model = torch.nn.Sequential(BasicBlock(2, 2))
    bn = model[0].bn1
    bn.eps = 1.0
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([2.0, 1.0]))
        bn.bias.copy_(torch.tensor([1.0, -0.5]))
        bn.running_mean.copy_(torch.tensor([0.5, -1.0]))
        bn.running_var.copy_(torch.tensor([3.0, 0.25]))
    return model.double()


class TestThresholds(unittest.TestCase):
    def test_hand_values(self):
        # μ_k = E a_k − β_k sqrt(Var + eps)/γ_k: channel 0: 0.5 − 1·sqrt(4)/2 = −0.5; channel 1: −1 +
        # 0.5·sqrt(1.25)/1
        mu = bn_relu_thresholds(tiny_block_model()[0].bn1)
        torch.testing.assert_close(mu, torch.tensor([-0.5, -1 + 0.5 * math.sqrt(1.25)], dtype=torch.float64))

    def test_positive_exactly_above_threshold(self):
        g = torch.Generator().manual_seed(0)
        bn = torch.nn.BatchNorm2d(6).double().eval()
        with torch.no_grad():
            bn.weight.copy_(torch.rand(6, generator=g, dtype=torch.float64) + 0.1)  # γ > 0
            bn.bias.copy_(torch.randn(6, generator=g, dtype=torch.float64))
            bn.running_mean.copy_(torch.randn(6, generator=g, dtype=torch.float64))
            bn.running_var.copy_(torch.rand(6, generator=g, dtype=torch.float64) + 0.5)
        a = torch.randn(4, 6, 5, 5, generator=g, dtype=torch.float64) * 2
        mu = bn_relu_thresholds(bn)
        positive = torch.relu(bn(a)) > 0
        self.assertTrue(torch.equal(positive, a > mu[None, :, None, None]))

    def test_bad_input(self):
        with self.assertRaises(TypeError):
            bn_relu_thresholds(torch.nn.ReLU())
        with self.assertRaises(ValueError):
            bn_relu_thresholds(torch.nn.BatchNorm2d(3, affine=False))


class TestEstimates(unittest.TestCase):
    def test_mu_from_running_stats(self):
        # both γ > 0 and both μ_k ≠ 0: mean of the two hand values above
        mu, per_site = estimate_mu(tiny_block_model(), return_per_channel=True)
        self.assertAlmostEqual(mu, (-0.5 + -1 + 0.5 * math.sqrt(1.25)) / 2, places=12)
        self.assertEqual(len(per_site), 1)

    def test_mu_from_data_and_eta(self):
        model = tiny_block_model().train()
        x = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        block = model[0]
        with torch.no_grad():
            a = block.conv1(x)
            mean, var = a.mean(dim=(0, 2, 3)), a.var(dim=(0, 2, 3), unbiased=False)
            gamma, beta = block.bn1.weight, block.bn1.bias
            mu_k = mean - beta * torch.sqrt(var + 1.0) / gamma
            eta = torch.relu(block.bn1.eval()(a)).sum(1).mean()
        block.bn1.train()
        # two batches of the same data: the pooled statistics equal the single-batch ones
        self.assertAlmostEqual(estimate_mu(model, [x, (x, torch.zeros(3))]), float(mu_k.mean()), places=10)
        self.assertAlmostEqual(estimate_eta(model, [(x, None)]), float(eta), places=10)
        self.assertTrue(model.training)  # mode restored
        self.assertEqual(len(block.bn1._forward_hooks), 0)  # hooks removed

    def test_hooks_removed_and_mode_restored_on_error(self):
        model = tiny_block_model().train()
        with self.assertRaises(RuntimeError):  # 3 input channels for a 2-channel conv
            estimate_mu(model, [torch.zeros(1, 3, 4, 4, dtype=torch.float64)])
        self.assertEqual(len(model[0].bn1._forward_hooks), 0)
        self.assertTrue(model.training)

    def test_errors(self):
        with self.assertRaises(ValueError):
            estimate_eta(tiny_block_model(), [])
        with self.assertRaises(ValueError):
            estimate_eta(torch.nn.Sequential(torch.nn.Conv2d(1, 1, 3)), [torch.zeros(1, 1, 4, 4)])
        fresh = torch.nn.Sequential(BasicBlock(2, 2))  # running mean 0, β = 0: every μ_k is 0
        with self.assertRaisesRegex(ValueError, "non-zero"):
            estimate_mu(fresh)


class TestSwap(unittest.TestCase):
    def test_resnet18_softmax(self):
        model = torchvision.models.resnet18(weights=None, num_classes=5)
        self.assertEqual(len(bn_relu_sites(model)), 8)
        swapped = soft_maximizer_swap(model, "softmax", mu=2.5, eta=17.0)
        self.assertIsNot(swapped, model)
        self.assertIsInstance(model.layer1[0].bn1, torch.nn.BatchNorm2d)  # the original is untouched
        mods = [getattr(b, n) for b, n in bn_relu_sites(swapped)]
        self.assertTrue(all(isinstance(m, MarginAugmentedSoftmax) and m.eta == 17.0 for m in mods))
        self.assertIsInstance(swapped.layer1[0].bn2, torch.nn.BatchNorm2d)  # BN before the residual add stays
        x = torch.randn(2, 3, 32, 32)
        out = swapped(x)
        self.assertEqual(out.shape, (2, 5))
        out.sum().backward()

    def test_copy_of_a_model_that_has_run(self):
        # issue 22: inplace=False deep-copies the model; with a template-matching block that has run (its class
        # scores hold the graph) the copy raised "Only Tensors created explicitly by the user (graph leaves) ..."
        torch.manual_seed(0)
        model = template_matching_trunk(torchvision.models.resnet18(weights=None), num_classes=4)
        model(torch.rand(2, 3, 32, 32)).sum().backward()
        swapped = soft_maximizer_swap(model, "softmax", inplace=False)
        self.assertIsInstance(model[4][0].bn1, torch.nn.BatchNorm2d)  # the original is untouched
        self.assertIsInstance(swapped[4][0].bn1, MarginAugmentedSoftmax)
        (block,), (copied,) = template_matching_blocks(model), template_matching_blocks(swapped)
        self.assertIsNotNone(block.last_class_scores)
        self.assertIsNone(copied.last_class_scores)
        self.assertEqual(swapped(torch.rand(2, 3, 32, 32)).shape, (2, 512, 1, 1))

    def test_resnet50_perturbed(self):
        model = torchvision.models.resnet50(weights=None, num_classes=3)
        swapped = soft_maximizer_swap(model, "perturbed", num_samples=4, seed=10)
        sites = bn_relu_sites(swapped)
        self.assertEqual(len(sites), 16)
        self.assertTrue(all(n == "bn2" for _, n in sites))
        seeds = [getattr(b, n).seed for b, n in sites]
        self.assertEqual(seeds, list(range(10, 26)))
        self.assertTrue(all(isinstance(getattr(b, n), PerturbedMaximizer) for b, n in sites))
        self.assertEqual(swapped(torch.randn(2, 3, 32, 32)).shape, (2, 3))

    def test_replacement_is_exact_on_a_block(self):
        # BN replaced by η·softmax([a, μ]/ε); the block's ReLU that follows is the identity on it
        model = tiny_block_model().eval()
        swapped = soft_maximizer_swap(model, "softmax", mu=0.3, eta=2.0, epsilon=0.5)
        x = torch.randn(1, 2, 3, 3, dtype=torch.float64)
        blk = swapped[0]
        h = MarginAugmentedSoftmax(0.3, 0.5, 2.0)(blk.conv1(x))
        expected = torch.relu(blk.bn2(blk.conv2(h)) + x)
        torch.testing.assert_close(swapped(x), expected)

    def test_only_the_sites_change_and_the_function_does(self):
        # not the identity by design (the docstring says so): every module but the replaced BNs is kept bit for bit,
        # and the swapped network equals the original with each site's BN output replaced by η·softmax([a, μ]/ε)
        torch.manual_seed(0)
        model = torchvision.models.resnet18(weights=None, num_classes=5).double().eval()
        swapped = soft_maximizer_swap(model, "softmax", mu=0.1, eta=3.0).eval()
        sites = {
            f"{name}.{attr}" for name, block in model.named_modules() for b, attr in bn_relu_sites(model) if b is block
        }
        self.assertEqual(len(sites), 8)
        kept = {k: v for k, v in model.state_dict().items() if k.rpartition(".")[0] not in sites}
        self.assertEqual(set(kept), set(swapped.state_dict()))
        self.assertTrue(all(torch.equal(v, swapped.state_dict()[k]) for k, v in kept.items()))
        maximizer = MarginAugmentedSoftmax(0.1, 1.0, 3.0, dim=1)
        handles = [
            getattr(b, attr).register_forward_hook(lambda m, args, out: maximizer(args[0]))
            for b, attr in bn_relu_sites(model)
        ]
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        with torch.no_grad():
            try:
                reference = model(x)
            finally:
                for h in handles:
                    h.remove()
            self.assertTrue(torch.equal(swapped(x), reference))
            self.assertFalse(torch.allclose(swapped(x), model(x)))

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "softmax"):
            soft_maximizer_swap(torchvision.models.resnet18(weights=None), "sparsemax")
        with self.assertRaisesRegex(ValueError, "BasicBlock"):
            soft_maximizer_swap(torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3)))
        with self.assertRaises(ValueError):
            soft_maximizer_swap(tiny_block_model(), "softmax", epsilon=0.0)
        with self.assertRaises(ValueError):
            soft_maximizer_swap(tiny_block_model(), "perturbed", num_samples=0)
