import os
import unittest

import numpy as np

from pml_extensions.datasets import OpenClipArt
from pml_extensions.datasets.open_clip_art import OPENCLIPART_ROOT


@unittest.skipUnless(os.path.isdir(OPENCLIPART_ROOT), "Debian package openclipart-png is not installed")
class TestOpenClipArt(unittest.TestCase):
    def test_class_disjoint_split_with_min_images(self):
        train = OpenClipArt("train", max_classes=40)
        test = OpenClipArt("test", max_classes=40)
        self.assertEqual(len(train.classes), 40)
        self.assertEqual(train.classes, test.classes)
        a, b = set(train.labels.tolist()), set(test.labels.tolist())
        self.assertFalse(a & b)
        self.assertEqual(len(a | b), 40)
        self.assertGreaterEqual(int(np.bincount(train.labels)[sorted(a)].min()), 20)
        for name in train.classes:
            self.assertLessEqual(len(name.split("/")), 2)

    def test_items_are_alpha_cropped_on_white(self):
        ds = OpenClipArt("test", max_classes=10, max_side=64)
        image, label = ds[0]
        self.assertEqual(image.mode, "RGB")
        self.assertLessEqual(max(image.size), 64)
        self.assertIn(label, set(ds.labels.tolist()))
        rgba = OpenClipArt("test", max_classes=10, max_side=64, rgba=True)[0][0]
        self.assertEqual(rgba.mode, "RGBA")
        alpha = np.asarray(rgba.getchannel("A"))
        # cropped to the alpha box: every border row/column has some opaque pixel
        self.assertTrue(alpha[0].max() > 0 and alpha[-1].max() > 0 and alpha[:, 0].max() > 0 and alpha[:, -1].max() > 0)


class TestOpenClipArtMissing(unittest.TestCase):
    def test_missing_data_names_the_package(self):
        with self.assertRaisesRegex(FileNotFoundError, "apt-get install openclipart-png"):
            OpenClipArt(root="/nonexistent/openclipart")
