import unittest
import warnings

import torch
import torchvision
from torch import nn

from pml_extensions.explain.head_folder import HeadFolder
from tests.explain.explain_testing_utils import hook_count, images, make_model, training_flags


def arange_model():
    """Identity 'layer' on a [1, 2, 2, 2] arange input, GAP, Linear(2 -> 1) with weight [1, 2] and bias 3."""
    trunk = nn.Sequential(nn.Identity(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).double()
    lin = nn.Linear(2, 1).double()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
        lin.bias.fill_(3.0)
    x = torch.arange(8, dtype=torch.float64).view(
        1, 2, 2, 2
    )  # channel 0 = [[0, 1], [2, 3]], channel 1 = [[4, 5], [6, 7]]
    return trunk, lin, x


class L2Norm(nn.Module):
    def forward(self, x):
        return nn.functional.normalize(x, dim=1)


class TestHeadFolder(unittest.TestCase):
    def test_hand_computed_gap_linear(self):
        trunk, lin, x = arange_model()
        f = HeadFolder(trunk, lin)(x)
        # F_ij = W A_ij / (h w): (0 + 2*4)/4 = 2, (1 + 2*5)/4 = 2.75, (2 + 2*6)/4 = 3.5, (3 + 2*7)/4 = 4.25
        expected = torch.tensor([[2.0, 2.75], [3.5, 4.25]], dtype=torch.float64)
        torch.testing.assert_close(f.features[0, :, :, 0], expected, rtol=0, atol=0)
        torch.testing.assert_close(f.bias, torch.tensor([[3.0]], dtype=torch.float64))
        # E = GAP = [1.5, 5.5] -> 1.5 + 11 + 3 = 15.5
        torch.testing.assert_close(f.embedding, torch.tensor([[15.5]], dtype=torch.float64))
        self.assertTrue(f.exact)
        self.assertFalse(f.normalised)

    def test_folded_head_reproduces_embedding(self):
        for pool in ("gap", "gmp", "flatten"):
            with self.subTest(pool=pool):
                trunk, emb = make_model(pool)
                x = images(3)
                f = HeadFolder(trunk, emb)(x)
                with torch.no_grad():
                    expected = emb.eval()(trunk.eval()(x))
                torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, expected, rtol=1e-12, atol=1e-12)
                self.assertEqual(tuple(f.features.shape), (3, 5, 6, 6))

    def test_batchnorm_uses_eps(self):
        trunk, _, x = arange_model()
        bn = nn.BatchNorm1d(2, eps=0.5).double()
        with torch.no_grad():
            bn.running_mean.copy_(torch.tensor([1.0, 2.0]))
            bn.running_var.copy_(torch.tensor([0.5, 1.5]))
            bn.weight.copy_(torch.tensor([2.0, 3.0]))
            bn.bias.copy_(torch.tensor([0.1, 0.2]))
        f = HeadFolder(trunk, bn)(x)
        # GAP = [1.5, 5.5]; scale = w / sqrt(var + eps) = [2/1, 3/sqrt(2)]; bias = b - mean * scale
        scale = torch.tensor([2.0, 3.0 / 2**0.5], dtype=torch.float64)
        torch.testing.assert_close(
            f.bias[0],
            torch.tensor([0.1, 0.2], dtype=torch.float64) - torch.tensor([1.0, 2.0], dtype=torch.float64) * scale,
        )
        torch.testing.assert_close(f.embedding[0], torch.tensor([1.5, 5.5], dtype=torch.float64) * scale + f.bias[0])

    def test_gmp_ties_share_the_mass_equally(self):
        trunk = nn.Sequential(nn.Identity(), nn.AdaptiveMaxPool2d(1), nn.Flatten()).double()
        x = torch.ones(1, 2, 3, 3, dtype=torch.float64)  # every position ties
        f = HeadFolder(trunk, None)(x)
        torch.testing.assert_close(f.features, torch.full((1, 3, 3, 2), 1 / 9, dtype=torch.float64))
        torch.testing.assert_close(f.embedding, torch.ones(1, 2, dtype=torch.float64))

    def test_saturated_relu6_ties(self):
        # issue 12: ReLU6 saturates two positions of channel 0 at exactly 6; each gets half the max
        trunk = nn.Sequential(nn.ReLU6(), nn.AdaptiveMaxPool2d(1), nn.Flatten()).double()
        x = torch.tensor([[[[7.0, 9.0], [1.0, -2.0]], [[0.5, 2.0], [3.0, 1.0]]]], dtype=torch.float64)
        f = HeadFolder(trunk, None, layer="0")(x)
        # ReLU6: channel 0 = [[6, 6], [1, 0]] (tie at (0, 0), (0, 1)); channel 1 max 3 at (1, 0)
        expected = torch.zeros(2, 2, 2, dtype=torch.float64)  # [h, w, C]
        expected[0, 0, 0] = expected[0, 1, 0] = 3.0
        expected[1, 0, 1] = 3.0
        torch.testing.assert_close(f.features[0], expected, rtol=0, atol=0)
        torch.testing.assert_close(f.embedding, torch.tensor([[6.0, 3.0]], dtype=torch.float64))

    def test_torchvision_resnet(self):
        trunk = torchvision.models.resnet18(weights=None)
        trunk.fc = nn.Identity()
        trunk = trunk.double()
        emb = nn.Linear(512, 8).double()
        x = images(2, size=(64, 64))
        f = HeadFolder(trunk, emb)(x)
        with torch.no_grad():
            expected = emb(trunk.eval()(x))
        torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, expected, rtol=1e-10, atol=1e-10)
        self.assertEqual(tuple(f.features.shape), (2, 2, 2, 8))

    def test_l2_normalising_heads(self):
        trunk, emb = make_model("gap")
        x = images(2)
        plain = HeadFolder(trunk, emb)(x)
        for head in (nn.Sequential(emb, L2Norm()),):
            f = HeadFolder(trunk, head)(x)
            self.assertTrue(f.normalised)
            torch.testing.assert_close(f.embedding, plain.embedding)

        class Functional(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return nn.functional.normalize(self.inner(x), dim=1)

        f = HeadFolder(trunk, Functional(emb))(x)
        self.assertTrue(f.normalised)
        torch.testing.assert_close(f.embedding, plain.embedding)

    def test_unsupported_module_named(self):
        trunk, _ = make_model("gap")
        head = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
        with self.assertRaisesRegex(ValueError, r"embedder\.1 \(Tanh\)"):
            HeadFolder(trunk.double(), head.double())(images(1))
        self.assertEqual(hook_count(trunk, head), 0)

    def test_jacobian_fallback(self):
        trunk, _ = make_model("gap")
        head = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).double()
        x = images(2)
        with self.assertWarnsRegex(UserWarning, "first-order"):
            f = HeadFolder(trunk, head, fallback="jacobian")(x)
        self.assertFalse(f.exact)
        with torch.no_grad():
            expected = head(trunk(x))
        torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, expected, rtol=1e-12, atol=1e-12)
        self.assertEqual(hook_count(trunk, head), 0)

    def test_jacobian_equals_exact_fold_for_piecewise_linear_head(self):
        trunk, emb = make_model("gmp")

        class Hidden(nn.Module):  # the same head with a functional ReLU: no exact fold, Jacobian is exact locally
            def __init__(self, e):
                super().__init__()
                self.e = e

            def forward(self, x):
                return self.e[4](torch.relu(self.e[1](self.e[0](x))))

        x = images(2)
        exact = HeadFolder(trunk, emb)(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            approx = HeadFolder(trunk, Hidden(emb), fallback="jacobian")(x)
        torch.testing.assert_close(approx.features, exact.features, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(approx.bias, exact.bias, rtol=1e-10, atol=1e-12)

    def test_modes_and_hooks_restored(self):
        trunk, emb = make_model("gap")
        trunk.train()
        emb.train()
        before = training_flags(trunk, emb)
        HeadFolder(trunk, emb)(images(2))
        self.assertEqual(training_flags(trunk, emb), before)
        self.assertEqual(hook_count(trunk, emb), 0)

    def test_hooks_removed_after_exception(self):
        trunk, _ = make_model("gap")

        class Boom(nn.Module):
            def forward(self, x):
                raise RuntimeError("boom")

        with self.assertRaisesRegex(RuntimeError, "boom"):
            HeadFolder(trunk, Boom())(images(1))
        self.assertEqual(hook_count(trunk), 0)

    def test_bad_inputs(self):
        trunk, emb = make_model("gap")
        with self.assertRaisesRegex(TypeError, "trunk"):
            HeadFolder("not a module")
        with self.assertRaisesRegex(ValueError, "fallback"):
            HeadFolder(trunk, emb, fallback="guess")
        with self.assertRaisesRegex(ValueError, "images"):
            HeadFolder(trunk, emb)(torch.zeros(3, 5, 6, dtype=torch.float64))
        with self.assertRaisesRegex(TypeError, "images"):
            HeadFolder(trunk, emb)([1, 2])
        with self.assertRaisesRegex(ValueError, "layer"):
            HeadFolder(trunk, emb, layer="nope")

    def test_explicit_layer(self):
        trunk, emb = make_model("gap")
        f = HeadFolder(trunk, emb, layer="0.1")(images(2))
        self.assertEqual(tuple(f.feature_map.shape), (2, 4, 5, 6))


if __name__ == "__main__":
    unittest.main()


class TestIntPoolSizes(unittest.TestCase):
    def test_non_global_int_pool_size_is_a_clear_error(self):
        # AdaptiveAvgPool2d(2) stores output_size as an int: must give the "cannot be folded" error, not a
        # TypeError
        from pml_extensions.explain import ActivationDecomposition

        trunk = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten()
        )
        dec = ActivationDecomposition(trunk.eval(), torch.nn.Linear(16, 5).eval())
        with self.assertRaisesRegex(ValueError, "AdaptiveAvgPool2d.*cannot be folded"):
            dec.overall_maps(torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8))
