import unittest

import torch

from pml_extensions.trunks import ConvNetBody


class TestConvNetBody(unittest.TestCase):
    def test_shapes(self):
        body = ConvNetBody(1, widths=(4, 6, 8), blocks_per_stage=2)
        self.assertEqual(body.out_channels, 8)
        self.assertEqual(tuple(body(torch.rand(2, 1, 16, 12)).shape), (2, 8, 4, 3))
        self.assertEqual(sum(isinstance(m, torch.nn.Conv2d) for m in body.modules()), 6)

    def test_factory_arguments_reach_every_tensor(self):
        body = ConvNetBody(3, widths=(4, 5), blocks_per_stage=1, device="cpu", dtype=torch.float64)
        floats = {t.dtype for t in body.state_dict().values() if t.is_floating_point()}
        self.assertEqual(floats, {torch.float64})
        self.assertEqual({t.device.type for t in body.state_dict().values()}, {"cpu"})
        self.assertEqual(body(torch.rand(1, 3, 4, 4, dtype=torch.float64)).dtype, torch.float64)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "must be positive"):
            ConvNetBody(3, widths=(4, 0))
