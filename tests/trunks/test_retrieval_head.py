import unittest

import torch

from pml_extensions.trunks.gem_pooling import GeMPooling
from pml_extensions.trunks.retrieval_head import RetrievalHead, l2n


class TestRetrievalHead(unittest.TestCase):
    def test_formula_by_hand(self):
        # 2 channels, 1x1 map [3, 4]: GeM of a single position is the value itself; L2N -> [0.6, 0.8]
        # (norm 5, +1e-6). W = [[1, 1], [1, -1]], b = [0, 0.2]: W·[0.6, 0.8] + b = [1.4, 0.0]; L2N -> [1, 0].
        head = RetrievalHead(2, out_dim=2, eps=1e-6).double()
        with torch.no_grad():
            head.whiten.weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
            head.whiten.bias.copy_(torch.tensor([0.0, 0.2]))
        x = torch.tensor([3.0, 4.0], dtype=torch.float64).view(1, 2, 1, 1)
        out = head(x)
        pooled = torch.tensor([3.0, 4.0], dtype=torch.float64) / (5.0 + 1e-6)
        lin = torch.stack([pooled.sum(), pooled[0] - pooled[1] + 0.2])
        expected = lin / (lin.norm() + 1e-6)
        torch.testing.assert_close(out[0], expected)
        self.assertAlmostEqual(out[0, 0].item(), 1.0, places=5)

    def test_unit_norm_output_and_shape(self):
        head = RetrievalHead(16, out_dim=8)
        self.assertIsInstance(head.pool, GeMPooling)
        self.assertEqual(head.num_features, 8)
        out = head(torch.rand(4, 16, 3, 5))
        self.assertEqual(out.shape, (4, 8))
        torch.testing.assert_close(out.norm(dim=1), torch.ones(4), atol=1e-5, rtol=0)

    def test_factory_arguments_reach_every_tensor(self):
        head = RetrievalHead(4, out_dim=3, dtype=torch.float64, device="cpu")
        self.assertEqual({(t.dtype, t.device.type) for t in head.state_dict().values()}, {(torch.float64, "cpu")})
        self.assertEqual(head(torch.rand(2, 4, 3, 3, dtype=torch.float64)).dtype, torch.float64)

    def test_l2n_uses_plus_eps(self):
        x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
        torch.testing.assert_close(l2n(x, eps=1.0), x / 6.0)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "in_channels"):
            RetrievalHead(0)
        with self.assertRaisesRegex(ValueError, "out_dim"):
            RetrievalHead(4, out_dim=-2)
        with self.assertRaisesRegex(ValueError, r"\[B, 4, H, W\]"):
            RetrievalHead(4)(torch.rand(2, 3, 2, 2))
