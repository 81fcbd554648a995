"""The probe of benchmarks/xml_generalization.py on hand-built histograms whose answer is known."""

import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from xml_generalization import probe  # noqa: E402


class TestProbe(unittest.TestCase):
    def setUp(self):
        self.labels = torch.arange(8).repeat_interleave(4)

    def test_class_specific_prototypes_do_not_transfer(self):
        # one prototype per class (what the paper says GAP prototypes do): the seen half is predicted perfectly, the
        # unseen half's prototypes get no weight from the fit, its predictions are all zero -> MAP@R of ties
        z = torch.nn.functional.one_hot(self.labels, 8).double()
        y = torch.randn(8, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)[self.labels]
        map_c, map_x, per_c, per_x = probe(y, z, self.labels, splits=5, head=lambda p: p)
        self.assertEqual(len(per_c), 5)
        self.assertAlmostEqual(map_c, 1.0, places=6)
        self.assertLess(map_x, 0.6)

    def test_shared_prototypes_transfer(self):
        # every class is a different mixture of the same 4 parts and y = z P exactly: both halves are predicted well
        g = torch.Generator().manual_seed(1)
        mix = torch.softmax(4 * torch.randn(8, 4, generator=g, dtype=torch.float64), dim=1)
        z = mix[self.labels] + 0.01 * torch.rand(len(self.labels), 4, generator=g, dtype=torch.float64)
        z = z / z.sum(1, keepdim=True)
        y = z @ torch.randn(4, 6, generator=g, dtype=torch.float64)
        map_c, map_x, _, _ = probe(y, z, self.labels, splits=5, head=lambda p: p)
        self.assertGreater(map_x, 0.9)
        self.assertGreater(map_c, 0.9)
