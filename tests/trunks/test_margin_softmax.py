"""Tests for MarginAugmentedSoftmax and margin_argmax (paper Sec. 3.1, (P1) and (P3))."""

import math
import unittest

import torch

from pml_extensions.trunks.margin_softmax import MarginAugmentedSoftmax, margin_argmax


class TestMarginArgmax(unittest.TestCase):
    def test_one_hot_or_zero(self):
        a = torch.tensor([[1.0, 3.0, 2.0]], dtype=torch.float64)
        # max 3 > μ = 2.5: one-hot at index 1
        self.assertEqual(margin_argmax(a, 2.5).tolist(), [[0.0, 1.0, 0.0]])
        # max 3 <= μ = 3.5: the zero vector
        self.assertEqual(margin_argmax(a, 3.5).tolist(), [[0.0, 0.0, 0.0]])
        # max == μ: objective 0 either way; the zero vector ("no greater than μ")
        self.assertEqual(margin_argmax(a, 3.0).tolist(), [[0.0, 0.0, 0.0]])

    def test_feature_map_and_dim(self):
        a = torch.zeros(2, 3, 2, 2)
        a[0, 2, 0, 1] = 5.0  # one pixel with a clear winner; all others are 0 < μ = 1
        p = margin_argmax(a, 1.0, dim=1)
        self.assertEqual(p.shape, a.shape)
        self.assertEqual(float(p.sum()), 1.0)
        self.assertEqual(float(p[0, 2, 0, 1]), 1.0)
        # μ = -1: every pixel is matched, ties go to the first channel
        p = margin_argmax(a, -1.0, dim=1)
        self.assertTrue(torch.equal(p.sum(1), torch.ones(2, 2, 2)))
        self.assertEqual(float(p[1, 0].sum()), 4.0)

    def test_bad_input(self):
        with self.assertRaises(TypeError):
            margin_argmax(torch.tensor([1, 2]), 0.0)
        with self.assertRaises(ValueError):
            margin_argmax(torch.zeros(2, 3), 0.0, dim=2)


class TestMarginAugmentedSoftmax(unittest.TestCase):
    def test_closed_form_exact(self):
        # a = ln[1, 2, 3], μ = ln 4, ε = 1: exp values 1, 2, 3 and slack 4, sum 10 -> p = [0.1, 0.2, 0.3]; η =
        # 2 doubles it
        a = torch.log(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64))
        p = MarginAugmentedSoftmax(mu=math.log(4.0), epsilon=1.0, eta=2.0)(a)
        torch.testing.assert_close(p, torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64), rtol=0, atol=1e-15)
        # ε = 2 halves the logits: exp(a/2) = sqrt([1, 2, 3]), slack sqrt(4) = 2
        p = MarginAugmentedSoftmax(mu=math.log(4.0), epsilon=2.0)(a)
        e = torch.sqrt(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
        torch.testing.assert_close(p[0], e / (2.0 + e.sum()), rtol=0, atol=1e-15)

    def test_matches_formula_on_feature_map(self):
        g = torch.Generator().manual_seed(0)
        a = torch.randn(2, 5, 3, 4, generator=g, dtype=torch.float64)
        mu, eps, eta = 0.7, 0.5, 3.0
        p = MarginAugmentedSoftmax(mu, eps, eta, dim=1)(a)
        expected = eta * torch.exp(a / eps) / (math.exp(mu / eps) + torch.exp(a / eps).sum(1, keepdim=True))
        torch.testing.assert_close(p, expected, rtol=1e-13, atol=1e-15)
        self.assertTrue(bool((p.sum(1) < eta).all()))

    def test_jacobian_and_gradcheck(self):
        a = torch.tensor([0.3, -1.2, 0.8], dtype=torch.float64, requires_grad=True)
        eps = 0.7
        layer = MarginAugmentedSoftmax(mu=0.1, epsilon=eps, dim=0)
        p = layer(a).detach()
        jac = torch.autograd.functional.jacobian(layer, a)
        torch.testing.assert_close(jac, (torch.diag(p) - torch.outer(p, p)) / eps, rtol=1e-12, atol=1e-14)
        x = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True, generator=torch.Generator().manual_seed(1))
        self.assertTrue(torch.autograd.gradcheck(MarginAugmentedSoftmax(mu=0.5, epsilon=0.8, eta=2.0), (x,)))

    def test_small_epsilon_tends_to_lp(self):
        a = torch.tensor([[1.0, 3.0, 2.0]], dtype=torch.float64)
        for mu in (2.5, 3.5):
            hard = margin_argmax(a, mu)
            errors = [float((MarginAugmentedSoftmax(mu, eps)(a) - hard).abs().max()) for eps in (1.0, 0.1, 0.01)]
            # the closest competitor is 0.5 away from the max, so the error is at most ~ 3·exp(-0.5/ε)
            self.assertLess(errors[2], 3 * math.exp(-0.5 / 0.01) + 1e-15)
            self.assertTrue(errors[0] > errors[1] > errors[2])

    def test_float32_and_float16_keep_dtype(self):
        for dtype in (torch.float32, torch.float16):
            a = torch.randn(2, 3, 2, 2).to(dtype)
            self.assertEqual(MarginAugmentedSoftmax()(a).dtype, dtype)

    def test_bad_arguments(self):
        for eps in (0.0, -1.0, float("nan")):
            with self.assertRaises(ValueError):
                MarginAugmentedSoftmax(epsilon=eps)
        with self.assertRaises(ValueError):
            MarginAugmentedSoftmax(eta=0.0)
        with self.assertRaises(ValueError):
            MarginAugmentedSoftmax(mu=float("inf"))
        with self.assertRaises(TypeError):
            MarginAugmentedSoftmax()(torch.ones(2, 3, dtype=torch.long))
        with self.assertRaises(ValueError):
            MarginAugmentedSoftmax(dim=3)(torch.ones(2, 3))
