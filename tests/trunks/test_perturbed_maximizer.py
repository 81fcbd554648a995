"""Tests for PerturbedMaximizer / PerturbedArgmaxFunction (paper Sec. 3.1 (P2); Berthet et al. 2020)."""

import math
import unittest
from unittest import mock

import numpy as np
import torch
from scipy.special import ndtr

from pml_extensions.trunks import perturbed_maximizer as pm
from pml_extensions.trunks.margin_softmax import MarginAugmentedSoftmax
from pml_extensions.trunks.perturbed_maximizer import PerturbedMaximizer


def exact_gaussian_probs(aug: np.ndarray, eps: float) -> np.ndarray:
    """P(argmax(ã + εZ) = j) for Z ~ N(0, I): ∫ φ(t) Π_{i≠j} Φ((ã_j − ã_i)/ε + t) dt, by the trapezoid rule on
    [-12, 12] (error far below 1e-10 for these smooth integrands)."""
    t = np.linspace(-12.0, 12.0, 48001)
    phi = np.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
    out = []
    for j in range(len(aug)):
        f = phi.copy()
        for i in range(len(aug)):
            if i != j:
                f *= ndtr((aug[j] - aug[i]) / eps + t)
        out.append(np.trapezoid(f, t) if hasattr(np, "trapezoid") else np.trapz(f, t))
    return np.array(out)


class TestPerturbedMaximizer(unittest.TestCase):
    def test_gumbel_converges_to_margin_softmax(self):
        # With Gumbel noise E[argmax(ã + εG)] is exactly softmax(ã/ε); the MC error is ≤ 0.5/sqrt(S) per
        # standard
        # deviation, so 4 standard deviations give 2/sqrt(S).
        a = torch.tensor([[0.5, -0.2, 1.0]], dtype=torch.float64)
        target = MarginAugmentedSoftmax(mu=0.3, epsilon=1.0, dim=1)(a)
        errors = []
        for s in (100, 1600, 25600):
            p = PerturbedMaximizer(mu=0.3, epsilon=1.0, num_samples=s, noise="gumbel", seed=0)(a)
            err = float((p - target).abs().max())
            self.assertLess(err, 2.0 / math.sqrt(s), f"S={s}")
            errors.append(err)
        self.assertLess(errors[-1], errors[0])

    def test_matches_manual_estimator_with_same_noise(self):
        # One chunk: the module's noise is randn((S, N, K+1)) from Generator().manual_seed(seed); forward and
        # backward
        # must equal the estimator written out by hand with that noise (so backward replays the forward's
        # noise).
        s, eps, mu, eta = 50, 0.8, 0.2, 3.0
        x = torch.tensor([[0.1, 0.5, -0.3], [1.0, 0.0, 0.2]], dtype=torch.float64, requires_grad=True)
        g_out = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.7, -1.1]], dtype=torch.float64)
        layer = PerturbedMaximizer(mu=mu, epsilon=eps, eta=eta, num_samples=s, chunk_size=s, seed=7)
        p = layer(x)
        p.backward(g_out)
        z = torch.randn((s, 2, 4), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        aug = torch.cat([x.detach(), torch.full((2, 1), mu, dtype=torch.float64)], 1)
        y = torch.nn.functional.one_hot((aug + eps * z).argmax(2), 4).double()  # [S, N, K+1]
        torch.testing.assert_close(p.detach(), eta * y.mean(0)[:, :3], rtol=0, atol=1e-15)
        g_aug = torch.cat([g_out, torch.zeros(2, 1, dtype=torch.float64)], 1)
        expected = eta * ((y * g_aug).sum(2, keepdim=True) * z).mean(0)[:, :3] / eps
        torch.testing.assert_close(x.grad, expected, rtol=1e-12, atol=1e-14)

    def test_gaussian_gradient_matches_finite_differences(self):
        # 3 classes + slack. Exact p_ε by quadrature; its Jacobian by central differences (h = 1e-4, error
        # ~1e-8).
        # The estimator is averaged over R independent seeds; it must agree within 4 standard errors.
        a = np.array([0.4, -0.3, 0.9])
        mu, eps, h = 0.2, 1.0, 1e-4
        fd = np.zeros((3, 3))
        for i in range(3):
            d = np.zeros(3)
            d[i] = h
            fd[:, i] = (
                exact_gaussian_probs(np.append(a + d, mu), eps)[:3]
                - exact_gaussian_probs(np.append(a - d, mu), eps)[:3]
            ) / (2 * h)
        jacs, probs = [], []
        for seed in range(20):
            layer = PerturbedMaximizer(mu=mu, epsilon=eps, num_samples=4000, seed=seed, dim=0)
            x = torch.tensor(a, dtype=torch.float64)
            probs.append(layer(x).numpy())
            layer.reset_generator()  # the Jacobian uses the same noise as this forward pass
            jacs.append(torch.autograd.functional.jacobian(layer, x).numpy())
        jacs, probs = np.stack(jacs), np.stack(probs)
        se = jacs.std(0, ddof=1) / math.sqrt(len(jacs))
        self.assertTrue(np.all(np.abs(jacs.mean(0) - fd) <= 4 * se + 1e-3), (jacs.mean(0), fd, se))
        exact = exact_gaussian_probs(np.append(a, mu), eps)[:3]
        se_p = probs.std(0, ddof=1) / math.sqrt(len(probs))
        self.assertTrue(np.all(np.abs(probs.mean(0) - exact) <= 4 * se_p + 1e-4), (probs.mean(0), exact))

    def test_feature_map_shape_values_and_seeding(self):
        a = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0))
        layer = PerturbedMaximizer(mu=0.0, eta=2.0, num_samples=10, chunk_size=3, seed=5)
        p = layer(a)
        self.assertEqual(p.shape, a.shape)
        self.assertEqual(p.dtype, a.dtype)
        # entries are multiples of η/S and sum to at most η over the classes
        torch.testing.assert_close(p * 10 / 2.0, torch.round(p * 10 / 2.0), rtol=0, atol=1e-5)
        self.assertTrue(bool((p.sum(1) <= 2.0 + 1e-6).all()))
        # same seed -> same output; the stream advances between calls; reset_generator restarts it
        p2 = PerturbedMaximizer(mu=0.0, eta=2.0, num_samples=10, chunk_size=3, seed=5)(a)
        torch.testing.assert_close(p, p2, rtol=0, atol=0)
        layer.reset_generator()
        torch.testing.assert_close(layer(a), p, rtol=0, atol=0)

    def test_backward_on_feature_map(self):
        a = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
        PerturbedMaximizer(num_samples=20, chunk_size=6)(a).square().sum().backward()
        self.assertEqual(a.grad.shape, a.shape)
        self.assertTrue(bool(torch.isfinite(a.grad).all()))

    def test_samples_are_drawn_in_bounded_chunks(self):
        # S = 10 with chunk_size 3: forward draws 3, 3, 3, 1 samples and backward replays the same chunks
        shapes = []
        real = pm._sample_noise

        def spy(shape, *args):
            shapes.append(shape[0])
            return real(shape, *args)

        a = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
        with mock.patch.object(pm, "_sample_noise", spy):
            PerturbedMaximizer(num_samples=10, chunk_size=3)(a).sum().backward()
        self.assertEqual(shapes, [3, 3, 3, 1, 3, 3, 3, 1])
        # the automatic chunk keeps at most 2**24 noise entries
        shapes.clear()
        with mock.patch.object(pm, "DEFAULT_MAX_CHUNK_ELEMENTS", 100), mock.patch.object(pm, "_sample_noise", spy):
            PerturbedMaximizer(num_samples=10)(torch.zeros(1, 4))  # 5 entries per sample -> chunks of 100 // 5 = 20
        self.assertEqual(shapes, [10])
        shapes.clear()
        with mock.patch.object(pm, "DEFAULT_MAX_CHUNK_ELEMENTS", 12), mock.patch.object(pm, "_sample_noise", spy):
            PerturbedMaximizer(num_samples=10)(torch.zeros(1, 4))  # 12 // 5 = 2 samples per chunk
        self.assertEqual(shapes, [2] * 5)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            PerturbedMaximizer(num_samples=0)
        with self.assertRaises(ValueError):
            PerturbedMaximizer(epsilon=0.0)
        with self.assertRaises(ValueError):
            PerturbedMaximizer(epsilon=-2.0)
        with self.assertRaises(ValueError):
            PerturbedMaximizer(chunk_size=0)
        with self.assertRaisesRegex(ValueError, "normal"):
            PerturbedMaximizer(noise="uniform")
        with self.assertRaises(TypeError):
            PerturbedMaximizer()(torch.ones(2, 3, dtype=torch.long))
