"""Issue 12 item 3 (explanation part): degenerate inputs give a clear error or a defined value, never NaN."""

import math
import unittest

import numpy as np
import torch
from torch import nn

from pml_extensions.explain import (
    ActivationDecomposition,
    HeadFolder,
    OrientationEstimator,
    SimilarityGradCAM,
)
from tests.explain.explain_testing_utils import images, linear_gap_model


class TestDegenerateInputs(unittest.TestCase):
    def test_zero_embedding_under_cosine_scaling(self):
        # a ReLU embedder with a negative bias and zero weights gives exactly E = 0 for every image
        trunk = nn.Sequential(nn.Identity(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).double()
        lin = nn.Linear(3, 2).double()
        with torch.no_grad():
            lin.weight.zero_()
            lin.bias.fill_(-1.0)
        zero = nn.Sequential(lin, nn.ReLU())
        dec = ActivationDecomposition(trunk, zero)
        x = images(2)
        with self.assertRaisesRegex(ValueError, r"query embedding of pair\(s\) \[0, 1\] is exactly zero"):
            dec.overall_maps(x, x)
        with self.assertRaisesRegex(ValueError, "exactly zero"):
            dec.point_to_point(x, x, scale="cosine")
        out = dec.overall_maps(x, x, scale="dot")  # defined: all-zero maps, similarity 0 (torch's convention)
        self.assertTrue(bool((out["query"] == 0).all()))
        torch.testing.assert_close(out["similarity"], torch.zeros(2, dtype=torch.float64))

    def test_nan_images_are_named(self):
        trunk, emb = linear_gap_model()
        x = images(3)
        x[1, 0, 2, 2] = float("nan")
        dec = ActivationDecomposition(trunk, emb)
        with self.assertRaisesRegex(ValueError, r"query_images contains NaN or inf values \(image\(s\) \[1\]"):
            dec.overall_maps(x, images(3))
        with self.assertRaisesRegex(ValueError, r"reference_images contains NaN"):
            dec.overall_maps(images(3), x)
        with self.assertRaisesRegex(ValueError, r"images contains NaN"):
            HeadFolder(trunk, emb)(x)
        with self.assertRaisesRegex(ValueError, r"query_images contains NaN"):
            SimilarityGradCAM(trunk, emb).attribute(x, images(3))

    def test_orientation_at_plus_minus_180(self):
        wrap = OrientationEstimator.wrap_degrees
        # exactly ±180 is one angle: both give -180 (half-open range [-180, 180))
        self.assertEqual(wrap(180.0), -180.0)
        self.assertEqual(wrap(-180.0), -180.0)
        self.assertEqual(OrientationEstimator.angle_error(0.0, 180.0), -180.0)
        self.assertEqual(OrientationEstimator.angle_error(180.0, 0.0), -180.0)
        # float32 rounding: (-180.00002 + 180) % 360 rounds to 360 -> would give +180 without the fold-back
        t = wrap(torch.tensor([-180.00002, 180.0, -180.0, 179.5], dtype=torch.float32))
        torch.testing.assert_close(t, torch.tensor([-180.0, -180.0, -180.0, 179.5]))
        a = wrap(np.array([-180.00002], dtype=np.float32))
        self.assertTrue(bool((a >= -180).all() and (a < 180).all()))
        self.assertEqual(OrientationEstimator.wrap_360(-1e-15), 0.0)  # (-1e-15) % 360 == 360.0 in floats
        self.assertTrue(math.isclose(OrientationEstimator.wrap_360(-90.0), 270.0))


if __name__ == "__main__":
    unittest.main()
