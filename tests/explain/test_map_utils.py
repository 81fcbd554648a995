import unittest

import torch

from pml_extensions.explain.map_utils import (
    check_map_matches_image,
    map_strides,
    normalize_maps,
    point_weights,
    resize_maps,
)


class TestMapUtils(unittest.TestCase):
    def test_normalize(self):
        m = torch.tensor([[[-2.0, 0.0], [1.0, 2.0]]])
        torch.testing.assert_close(normalize_maps(m, "minmax"), torch.tensor([[[0.0, 0.5], [0.75, 1.0]]]))
        torch.testing.assert_close(normalize_maps(m, "max_abs"), torch.tensor([[[-1.0, 0.0], [0.5, 1.0]]]))
        self.assertIs(normalize_maps(m, None), m)
        torch.testing.assert_close(normalize_maps(torch.ones(2, 2), "minmax"), torch.zeros(2, 2))
        with self.assertRaisesRegex(ValueError, "normalize"):
            normalize_maps(m, "softmax")

    def test_resize_constant(self):
        out = resize_maps(torch.full((2, 3, 4), 5.0), (6, 8))
        torch.testing.assert_close(out, torch.full((2, 6, 8), 5.0))

    def test_point_weights_hand_values(self):
        # image 8 x 8, features 4 x 4 (stride 2): pixel (2.5, 4.5) -> u = 3 * 0.5 - 0.5 = 1, v = 5 * .5 -
        # .5 = 2
        w = point_weights([(2.5, 4.5)], (8, 8), (4, 4), dtype=torch.float64)
        self.assertEqual(int(torch.argmax(w[0])), 1 * 4 + 2)
        self.assertAlmostEqual(float(w[0].max()), 1.0)
        # pixel (2.0, 4.5) -> u = 0.75: 0.25 on row 0, 0.75 on row 1
        w = point_weights([(2.0, 4.5)], (8, 8), (4, 4), dtype=torch.float64)
        self.assertAlmostEqual(float(w[0, 0 * 4 + 2]), 0.25)
        self.assertAlmostEqual(float(w[0, 1 * 4 + 2]), 0.75)
        # edge pixel (0, 0) -> u = -0.25 clamped to 0
        w = point_weights([(0, 0)], (8, 8), (4, 4), dtype=torch.float64)
        self.assertAlmostEqual(float(w[0, 0]), 1.0)
        with self.assertRaisesRegex(ValueError, "outside the image"):
            point_weights([(8, 0)], (8, 8), (4, 4))
        with self.assertRaisesRegex(ValueError, r"\[P, 2\]"):
            point_weights([(1, 2, 3)], (8, 8), (4, 4))

    def test_map_image_match(self):
        check_map_matches_image((10, 10), (320, 320))
        check_map_matches_image((8, 4), (256, 128))
        check_map_matches_image((1, 2), (20, 40))
        check_map_matches_image((7, 7), (224, 224))
        check_map_matches_image((16, 431), (128, 431))  # per-axis strides 8 and 1 (spectrogram)
        self.assertEqual(map_strides((16, 431), (128, 431)), (8.0, 1.0))
        with self.assertRaisesRegex(ValueError, "larger than the image"):
            check_map_matches_image((10, 10), (320, 8))


if __name__ == "__main__":
    unittest.main()
