import math
import unittest

import torch

from pml_extensions.trunks.gem_pooling import GeMPooling


class TestGeMPooling(unittest.TestCase):
    def test_hand_value_p2(self):
        # one channel with values 1, 2, 3, 4: (mean(1, 4, 9, 16))^(1/2) = sqrt(7.5)
        x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).view(1, 1, 2, 2)
        out = GeMPooling(p=2.0)(x)
        self.assertEqual(out.shape, (1, 1))
        self.assertAlmostEqual(out.item(), math.sqrt(7.5), places=12)

    def test_p1_is_average_pooling(self):
        x = torch.rand(3, 5, 4, 6, dtype=torch.float64) + 0.1
        out = GeMPooling(p=1.0)(x)
        torch.testing.assert_close(out, x.mean(dim=(2, 3)))

    def test_clamp_before_power(self):
        # negatives and zeros are clamped to eps before pow: (mean(eps^3, eps^3, 8, 8))^(1/3) = (4 + eps^3/2)^(1/3)
        x = torch.tensor([-5.0, 0.0, 2.0, 2.0], dtype=torch.float64).view(1, 1, 2, 2)
        out = GeMPooling(p=3.0, eps=1e-6)(x)
        self.assertTrue(torch.isfinite(out).all())
        self.assertAlmostEqual(out.item(), 4.0 ** (1 / 3), places=10)

    def test_p_is_trainable_and_gets_gradient(self):
        pool = GeMPooling()
        self.assertIsInstance(pool.p, torch.nn.Parameter)
        self.assertEqual(float(pool.p.detach()), 3.0)
        pool(torch.rand(2, 3, 4, 4)).sum().backward()
        self.assertIsNotNone(pool.p.grad)
        self.assertTrue(torch.isfinite(pool.p.grad).all())
        fixed = GeMPooling(trainable=False)
        self.assertEqual(len(list(fixed.parameters())), 0)
        self.assertIn("p", dict(fixed.named_buffers()))

    def test_dtype_follows_input(self):
        for dtype in (torch.float32, torch.float64):
            self.assertEqual(GeMPooling()(torch.rand(1, 2, 3, 3, dtype=dtype)).dtype, dtype)

    def test_factory_arguments(self):
        # p was always a CPU float32 tensor before: RetrievalHead(..., dtype=float64) had a float32 p
        for trainable in (True, False):
            pool = GeMPooling(p=2.5, trainable=trainable, device="cpu", dtype=torch.float64)
            self.assertEqual((pool.p.dtype, pool.p.device.type, float(pool.p)), (torch.float64, "cpu", 2.5))
            with torch.device("meta"):  # the default device is honoured when none is given
                self.assertEqual(GeMPooling(trainable=trainable).p.device.type, "meta")

    def test_bad_input(self):
        for p in (0, -1.0, True, "3"):
            with self.assertRaisesRegex(ValueError, "p must be"):
                GeMPooling(p=p)
        with self.assertRaisesRegex(ValueError, "eps must be"):
            GeMPooling(eps=0)
        with self.assertRaisesRegex(ValueError, r"\[B, C, H, W\]"):
            GeMPooling()(torch.rand(2, 3))


class TestGeMPoolingLowPrecision(unittest.TestCase):
    def test_half_all_zero_input_matches_float32(self):
        # issue 12: GeMPooling(p=3).half() on all-zero [1, 2, 4, 4] gave 0 and p.grad = nan (eps^3 = 1e-18 underflows
        # in float16). Every position is clamped to eps, so y = (mean eps^3)^(1/3) = eps = 1e-6 exactly, for any p,
        # hence dy/dp = 0. Float32 gives 1e-6; float16 must give the float16 number nearest to 1e-6 (subnormal,
        # spacing 2^-24 ~ 6e-8) and a finite p.grad that is 0 up to float32 rounding.
        ref = GeMPooling(p=3.0)
        y32 = ref(torch.zeros(1, 2, 4, 4))
        y32.sum().backward()
        self.assertTrue(torch.allclose(y32, torch.full((1, 2), 1e-6), rtol=1e-5, atol=0))
        self.assertLess(abs(float(ref.p.grad)), 1e-9)
        for dtype in (torch.float16, torch.bfloat16):
            pool = GeMPooling(p=3.0).to(dtype)
            y = pool(torch.zeros(1, 2, 4, 4, dtype=dtype))
            self.assertEqual(y.dtype, dtype)
            self.assertTrue(torch.equal(y, torch.full((1, 2), 1e-6, dtype=dtype)), f"{dtype}: {y}")
            y.sum().backward()
            self.assertTrue(torch.isfinite(pool.p.grad).all(), f"{dtype}: p.grad = {pool.p.grad}")
            self.assertLess(abs(float(pool.p.grad)), 1e-9)  # 0 up to float32 rounding inside

    def test_large_p_does_not_underflow_in_float32(self):
        # p = 20: eps^p = 1e-120 is 0 in float32; the value is still eps (all positions clamped) and
        # (mean(eps^20, 1))^(1/20) = 2^(-1/20) for a half-one map, as in float64.
        x = torch.tensor([0.0, 1.0], dtype=torch.float64).view(1, 1, 1, 2)
        for dtype in (torch.float32, torch.float64):
            pool = GeMPooling(p=20.0).to(dtype)
            self.assertAlmostEqual(float(pool(torch.zeros(1, 1, 2, 2, dtype=dtype)).detach()), 1e-6, delta=1e-12)
            self.assertAlmostEqual(float(pool(x.to(dtype)).detach()), 0.5 ** (1 / 20), places=6)
