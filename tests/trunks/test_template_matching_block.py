"""Tests for TemplateMatchingBlock and same_patch_mean (paper Sec. 3.3, Fig. 2)."""

import copy
import unittest

import torch

from pml_extensions.trunks.margin_softmax import MarginAugmentedSoftmax
from pml_extensions.trunks.perturbed_maximizer import PerturbedMaximizer
from pml_extensions.trunks.template_matching_block import TemplateMatchingBlock, same_patch_mean


def brute_force_patch_mean(x, kh, kw):
    """Loop over pixels: rows [i − (kh−1)//2, i + kh//2] and columns likewise, clipped to the map (TF
    'same')."""
    b, c, h, w = x.shape
    out = torch.empty_like(x)
    for i in range(h):
        for j in range(w):
            r0, r1 = max(0, i - (kh - 1) // 2), min(h, i + kh // 2 + 1)
            c0, c1 = max(0, j - (kw - 1) // 2), min(w, j + kw // 2 + 1)
            out[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(dim=(2, 3))
    return out


def conv1x1_count(module):
    return sum(1 for m in module.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1))


class TestSamePatchMean(unittest.TestCase):
    def test_matches_brute_force(self):
        g = torch.Generator().manual_seed(0)
        for h, w in ((6, 6), (7, 5)):
            x = torch.randn(2, 3, h, w, generator=g, dtype=torch.float64)
            for kh, kw in ((1, 1), (2, 2), (3, 3), (4, 4), (2, 3), (3, 2), (h // 2, w // 2), (h, w), (4, 5)):
                if kh > h or kw > w:
                    continue
                torch.testing.assert_close(
                    same_patch_mean(x, (kh, kw)),
                    brute_force_patch_mean(x, kh, kw),
                    rtol=1e-13,
                    atol=1e-14,
                    msg=f"{h}x{w} window {kh}x{kw}",
                )

    def test_hand_value_even_window(self):
        # 1×4 row [0, 1, 2, 3], window 1×2: pixel j averages columns j and j+1 (TF puts the extra column
        # after),
        # the last one only itself: [0.5, 1.5, 2.5, 3]
        x = torch.arange(4.0, dtype=torch.float64).view(1, 1, 1, 4)
        self.assertEqual(same_patch_mean(x, (1, 2)).flatten().tolist(), [0.5, 1.5, 2.5, 3.0])
        # window 1×3 (odd, centred): [0.5, 1, 2, 2.5] — padding excluded from the mean
        self.assertEqual(same_patch_mean(x, (1, 3)).flatten().tolist(), [0.5, 1.0, 2.0, 2.5])

    def test_window_larger_than_map(self):
        with self.assertRaisesRegex(ValueError, "larger"):
            same_patch_mean(torch.zeros(1, 1, 4, 4), (5, 2))
        with self.assertRaises(ValueError):
            same_patch_mean(torch.zeros(1, 1, 4, 4), 0)


class TestTemplateMatchingBlock(unittest.TestCase):
    def setUp(self):
        self.x = torch.randn(3, 8, 6, 6, generator=torch.Generator().manual_seed(0))

    def test_add_variant_matches_definition(self):
        block = TemplateMatchingBlock(8, 5)
        self.assertEqual(conv1x1_count(block), 3)
        self.assertIsNotNone(block.classifier.bias)
        self.assertIsNone(block.values.bias)
        self.assertIsNone(block.shortcut.bias)
        block.train()
        out = block(self.x)
        self.assertEqual(out.shape, (3, 8, 6, 6))
        self.assertEqual(block.window_for(6, 6), (3, 3))
        scores = block.classifier(same_patch_mean(self.x, (3, 3)))
        torch.testing.assert_close(block.last_class_scores, scores)
        p_hat = torch.relu(
            torch.nn.functional.batch_norm(
                scores, None, None, block.mixer[0].weight, block.mixer[0].bias, training=True
            )
        )
        torch.testing.assert_close(block.last_mixing, p_hat)
        # f' = Σ_k p̂_k ν_k with ν_k the columns of the values conv; f_out = conv1×1(f) + f'
        nu = block.values.weight[:, :, 0, 0]  # [d', c]
        f_prime = torch.einsum("bkhw,dk->bdhw", p_hat, nu)
        torch.testing.assert_close(out, block.shortcut(self.x) + f_prime)
        # the scaled-convex-combination identity: η Σ p̂*_k ν_k = Σ p̂_k ν_k with η = Σ_k p̂_k
        eta = p_hat.sum(1, keepdim=True).clamp_min(1e-12)
        torch.testing.assert_close(torch.einsum("bkhw,dk->bdhw", p_hat / eta, nu) * eta, f_prime)

    def test_concat_variant(self):
        block = TemplateMatchingBlock(8, 5, value_channels=4, combine="concat")
        self.assertEqual(conv1x1_count(block), 2)
        out = block(self.x)
        self.assertEqual(out.shape, (3, 12, 6, 6))
        self.assertEqual(block.out_channels, 12)
        torch.testing.assert_close(out[:, :8], self.x, rtol=0, atol=0)

    def test_soft_maximizer_mixings_and_backward(self):
        for mixing, cls in (("softmax", MarginAugmentedSoftmax), ("perturbed", PerturbedMaximizer)):
            block = TemplateMatchingBlock(8, 5, mixing=mixing, num_samples=16, mu=0.5, eta=2.0)
            self.assertIsInstance(block.mixer, cls)
            x = self.x.clone().requires_grad_(True)
            out = block(x)
            self.assertEqual(out.shape, x.shape)
            (out.square().mean() + block.last_class_scores.mean()).backward()
            self.assertTrue(all(p.grad is not None for p in block.parameters()))
            self.assertIsNotNone(x.grad)

    def test_aux_only_variant_returns_input(self):
        block = TemplateMatchingBlock(8, 5, mixing="none")
        self.assertEqual(conv1x1_count(block), 1)
        out = block(self.x)
        self.assertIs(out, self.x)
        self.assertEqual(block.last_class_scores.shape, (3, 5, 6, 6))

    def test_explicit_window_and_odd_map(self):
        block = TemplateMatchingBlock(8, 3, window=(2, 3))
        x = torch.randn(2, 8, 7, 5)
        block(x)
        torch.testing.assert_close(block.last_class_scores, block.classifier(brute_force_patch_mean(x, 2, 3)))
        self.assertEqual(TemplateMatchingBlock(8, 3).window_for(7, 5), (3, 2))
        self.assertEqual(TemplateMatchingBlock(8, 3).window_for(1, 1), (1, 1))

    def test_deepcopy_after_a_forward_pass_with_gradients(self):
        # last_class_scores / last_mixing hold the forward pass's graph: a copy starts without them
        for mixing in ("bn_relu", "softmax", "none"):
            with self.subTest(mixing=mixing):
                torch.manual_seed(0)
                block = TemplateMatchingBlock(4, 3, mixing=mixing)
                block(torch.rand(2, 4, 6, 6))
                twin = copy.deepcopy(block)
                self.assertIsNone(twin.last_class_scores)
                self.assertIsNone(twin.last_mixing)
                self.assertIsNotNone(block.last_class_scores.grad_fn)
                x = torch.rand(2, 4, 6, 6)
                torch.testing.assert_close(twin(x), block(x), rtol=0, atol=0)

    def test_zero_init_last(self):
        block = TemplateMatchingBlock(8, 5)
        block.zero_init_last()
        torch.testing.assert_close(block(self.x), block.shortcut(self.x))
        self.assertEqual(TemplateMatchingBlock.expansion, 1)

    def test_init_identity_returns_the_input_bit_for_bit(self):
        for mixing in ("bn_relu", "softmax", "perturbed", "none"):
            for dtype in (torch.float32, torch.float64):
                with self.subTest(mixing=mixing, dtype=dtype):
                    torch.manual_seed(0)
                    block = TemplateMatchingBlock(8, 5, mixing=mixing, num_samples=4, init="identity", dtype=dtype)
                    x = self.x.to(dtype)
                    for mode in (True, False):
                        self.assertTrue(torch.equal(block.train(mode)(x), x))
                    self.assertEqual(block.last_class_scores.shape, (3, 5, 6, 6))

    def test_init_identity_keeps_the_random_draws_of_the_classifier(self):
        torch.manual_seed(0)
        paper = TemplateMatchingBlock(8, 5)
        torch.manual_seed(0)
        ours = TemplateMatchingBlock(8, 5, init="identity")
        self.assertTrue(torch.equal(paper.classifier.weight, ours.classifier.weight))
        self.assertTrue(torch.equal(ours.shortcut.weight[:, :, 0, 0], torch.eye(8)))
        self.assertEqual(float(ours.values.weight.detach().abs().sum()), 0.0)
        self.assertIs(paper.init_identity(), paper)  # the method, on a built block
        self.assertTrue(torch.equal(paper.eval()(self.x), self.x))

    def test_init_identity_shortcut_is_torchs_dirac(self):
        # init_identity writes the ones in one indexed write; torch.nn.init.dirac_ is the reference
        for channels, dtype in ((1, torch.float32), (8, torch.float32), (13, torch.float64)):
            with self.subTest(channels=channels, dtype=dtype):
                block = TemplateMatchingBlock(channels, 3, dtype=dtype)
                block.shortcut.weight.data.normal_()
                block.init_identity()
                expected = torch.nn.init.dirac_(torch.empty_like(block.shortcut.weight))
                self.assertTrue(torch.equal(block.shortcut.weight, expected))

    def test_init_identity_refused_where_no_identity_exists(self):
        with self.assertRaisesRegex(ValueError, "init='identity' needs combine='add'"):
            TemplateMatchingBlock(8, 3, combine="concat", init="identity")
        with self.assertRaisesRegex(ValueError, r"init='identity' needs value_channels == in_channels .* 8 to 4"):
            TemplateMatchingBlock(8, 3, value_channels=4).init_identity()
        with self.assertRaisesRegex(ValueError, r"init must be one of \('paper', 'identity'\), got 'zeros'"):
            TemplateMatchingBlock(8, 3, init="zeros")

    def test_float64(self):
        block = TemplateMatchingBlock(8, 3, dtype=torch.float64)
        self.assertEqual(block(self.x.double()).dtype, torch.float64)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "num_classes"):
            TemplateMatchingBlock(8, 1)
        with self.assertRaisesRegex(ValueError, "bn_relu"):
            TemplateMatchingBlock(8, 3, mixing="sigmoid")
        with self.assertRaisesRegex(ValueError, "concat"):
            TemplateMatchingBlock(8, 3, combine="mul")
        with self.assertRaises(ValueError):
            TemplateMatchingBlock(8, 3, mixing="softmax", epsilon=0.0)
        with self.assertRaises(ValueError):
            TemplateMatchingBlock(8, 3, mixing="perturbed", num_samples=0)
        with self.assertRaisesRegex(ValueError, "larger"):
            TemplateMatchingBlock(8, 3, window=7)(self.x)
        with self.assertRaisesRegex(ValueError, "channels"):
            TemplateMatchingBlock(4, 3)(self.x)
        with self.assertRaises(ValueError):
            TemplateMatchingBlock(8, 3)(self.x[0])
