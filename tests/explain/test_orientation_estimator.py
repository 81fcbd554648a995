import unittest

import numpy as np
import torch
from torch import nn

from pml_extensions.explain.activation_decomposition import ActivationDecomposition
from pml_extensions.explain.orientation_estimator import OrientationEstimator

try:
    import skimage.data
    import skimage.transform
except ImportError:  # pragma: no cover
    skimage = None


def redness_model():
    """Fixed 'redness' feature R - (G + B)/2, ReLU, 9x9 Gaussian blur (sigma 2), GAP: a rotation-covariant
    map."""
    conv = nn.Conv2d(3, 1, 1, bias=False)
    blur = nn.Conv2d(1, 1, 9, padding=4, bias=False)
    g = torch.exp(-(torch.arange(-4, 5.0) ** 2) / 8.0)
    k = g[:, None] * g[None]
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -0.5, -0.5]).view(1, 3, 1, 1))
        blur.weight.copy_((k / k.sum()).view(1, 1, 9, 9))
    return nn.Sequential(conv, nn.ReLU(), blur, nn.AdaptiveAvgPool2d(1), nn.Flatten()).double()


def disc_image(name, size=96):
    img = getattr(skimage.data, name)()
    s = min(img.shape[:2])
    img = skimage.transform.resize(img[:s, :s], (size, size), anti_aliasing=True)
    yy, xx = np.mgrid[:size, :size]
    c = (size - 1) / 2
    return img * (((yy - c) ** 2 + (xx - c) ** 2) <= (size / 2 - 1) ** 2)[..., None]


class TestOrientationEstimator(unittest.TestCase):
    def test_wrap(self):
        wrap = OrientationEstimator.wrap_degrees
        self.assertEqual(wrap(359.0), -1.0)  # the paper's example
        self.assertEqual(wrap(-190.0), 170.0)
        self.assertEqual(wrap(180.0), -180.0)
        self.assertEqual(wrap(45.0), 45.0)
        t = OrientationEstimator.angle_error(torch.tensor([30.0, 10.0]), torch.tensor([211.9, 350.0]))
        torch.testing.assert_close(t, torch.tensor([178.1, 20.0]))
        self.assertTrue(bool(((t >= -180) & (t < 180)).all()))

    def test_angles(self):
        est = OrientationEstimator()
        # 0° points down (south in a north-up image); counter-clockwise as displayed
        self.assertAlmostEqual(est.polar_angle(9, 4.5, 10, 10), 0.0)  # below the centre (4.5, 4.5)
        self.assertAlmostEqual(est.polar_angle(4.5, 9, 10, 10), 90.0)  # right of it
        self.assertAlmostEqual(est.polar_angle(0, 4.5, 10, 10), 180.0)
        self.assertAlmostEqual(OrientationEstimator(clockwise=True).polar_angle(4.5, 9, 10, 10), 270.0)
        self.assertAlmostEqual(OrientationEstimator.panorama_angle(0, 360), 0.5)
        with self.assertRaisesRegex(ValueError, "outside"):
            est.polar_angle(10, 0, 10, 10)
        with self.assertRaisesRegex(ValueError, "query_geometry"):
            OrientationEstimator(query_geometry="fisheye")

    @unittest.skipIf(skimage is None, "scikit-image is not installed")
    def test_real_images_rotated_by_known_angles(self):
        est = OrientationEstimator(ActivationDecomposition(redness_model()), query_geometry="polar")
        for name in ("astronaut", "chelsea", "rocket"):
            img = disc_image(name)
            q = torch.from_numpy(img).permute(2, 0, 1)[None]
            for angle in (30.0, 140.0, 290.0):
                rot = skimage.transform.rotate(img, angle, order=1)  # counter-clockwise, about the centre
                r = torch.from_numpy(rot).permute(2, 0, 1)[None]
                out = est.estimate(q, r)
                err = float(OrientationEstimator.angle_error(torch.tensor(angle), out["estimate"][0]))
                with self.subTest(image=name, angle=angle):
                    self.assertLess(abs(err), 3.5)  # the paper's ±3.5° bin
                    self.assertTrue(-180 <= err < 180)
        overall = est.estimate(q, r, method="overall")
        self.assertEqual(tuple(overall["estimate"].shape), (1,))

    def test_needs_decomposition(self):
        with self.assertRaisesRegex(ValueError, "decomposition"):
            OrientationEstimator().estimate(torch.zeros(1, 3, 8, 8), torch.zeros(1, 3, 8, 8))


if __name__ == "__main__":
    unittest.main()
