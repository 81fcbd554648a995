import math
import unittest

import torch
from torch import nn

from pml_extensions.explain import ActivationDecomposition, RandomExplainer, SimilarityFidelity


def region_model():
    """E = (mean of channel 0, 1): GAP then Linear(2 -> 2) with weight [[1, 0], [0, 0]] and bias (0, 1)."""
    trunk = nn.Sequential(nn.Identity(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).double()
    lin = nn.Linear(2, 2).double()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
        lin.bias.copy_(torch.tensor([0.0, 1.0]))
    return trunk, lin


def region_image():
    x = torch.zeros(1, 2, 8, 8, dtype=torch.float64)
    x[0, 0, 2:6, 3:7] = 1.0  # the 16 pixels R that carry the similarity
    return x


def cos(a, b):
    return (a[0] * b[0] + a[1] * b[1]) / math.hypot(*a) / math.hypot(*b)


class TestSimilarityFidelity(unittest.TestCase):
    def test_hand_made_model_exact_curves(self):
        trunk, lin = region_model()
        x = region_image()
        exact = torch.zeros(1, 8, 8, dtype=torch.float64)
        exact[0, 2:6, 3:7] = 1.0
        fid = SimilarityFidelity(trunk, lin, steps=8)
        out = fid.curves(x, x, exact)
        er = (16 / 64, 1.0)
        # step s changes 8 s pixels, the R pixels first: min(8 s, 16) of R are removed / revealed
        deletion = [cos(((16 - min(8 * s, 16)) / 64, 1.0), er) for s in range(9)]
        insertion = [cos((min(8 * s, 16) / 64, 1.0), er) for s in range(9)]
        torch.testing.assert_close(out["deletion"][0], torch.tensor(deletion, dtype=torch.float64))
        torch.testing.assert_close(out["insertion"][0], torch.tensor(insertion, dtype=torch.float64))
        fr = [s / 8 for s in range(9)]
        area_del = sum((fr[i + 1] - fr[i]) * (deletion[i] + deletion[i + 1]) / 2 for i in range(8))
        self.assertAlmostEqual(float(out["deletion_area"][0]), area_del, places=12)

    def test_exact_and_decomposition_beat_random(self):
        trunk, lin = region_model()
        x = region_image()
        fid = SimilarityFidelity(trunk, lin, steps=16)
        res = fid.compare(
            {"decomposition": ActivationDecomposition(trunk, lin), "random": RandomExplainer(seed=0)}, x, x
        )
        self.assertLess(float(res["decomposition"]["deletion_area"][0]), float(res["random"]["deletion_area"][0]))
        self.assertGreater(float(res["decomposition"]["insertion_area"][0]), float(res["random"]["insertion_area"][0]))

    def test_bad_inputs(self):
        trunk, lin = region_model()
        x = region_image()
        fid = SimilarityFidelity(trunk, lin)
        with self.assertRaisesRegex(ValueError, "maps must be"):
            fid.curves(x, x, torch.zeros(2, 8, 8))
        with self.assertRaisesRegex(ValueError, "NaN"):
            fid.curves(x, x, torch.full((1, 8, 8), float("nan")))
        with self.assertRaisesRegex(ValueError, "baseline"):
            SimilarityFidelity(trunk, lin, baseline="noise")
        with self.assertRaisesRegex(ValueError, "steps"):
            SimilarityFidelity(trunk, lin, steps=0)

    def test_baselines_and_anisotropic_map(self):
        trunk, lin = region_model()
        x = region_image()
        m = torch.zeros(1, 2, 8, dtype=torch.float64)  # stride 4 along y, 1 along x
        for baseline in ("zero", "mean", "blur", 0.5):
            out = SimilarityFidelity(trunk, lin, steps=4, baseline=baseline).curves(x, x, m)
            self.assertEqual(tuple(out["deletion"].shape), (1, 5))
            self.assertAlmostEqual(float(out["deletion"][0, 0]), 1.0, places=12)  # nothing removed yet


if __name__ == "__main__":
    unittest.main()
