import hashlib
import os
import unittest

import numpy as np

from pml_extensions.datasets import GlyphDataset
from pml_extensions.datasets.glyph_dataset import CHARACTERS, EXCLUDED_FONTS, debian_font_files


class TestGlyphDataset(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.train = GlyphDataset("train", image_size=24)
        cls.test = GlyphDataset("test", image_size=24)

    def test_classes_and_disjoint_split(self):
        self.assertEqual(len(CHARACTERS), 62)
        self.assertEqual(self.train.classes, list(CHARACTERS))
        train_classes, test_classes = set(self.train.labels.tolist()), set(self.test.labels.tolist())
        self.assertEqual(train_classes, set(range(31)))
        self.assertEqual(test_classes, set(range(31, 62)))
        self.assertGreaterEqual(np.bincount(self.train.labels).min() if len(self.train) else 0, 0)
        # every class has many fonts
        self.assertGreaterEqual(int(np.bincount(self.test.labels)[31:].min()), 15)

    def test_items(self):
        image, label = self.train[0]
        self.assertEqual((image.mode, image.size), ("L", (24, 24)))
        self.assertEqual(label, int(self.train.labels[0]))
        self.assertLess(np.asarray(image).min(), 128)  # some ink

    def test_excluded_fonts_and_no_identical_renderings(self):
        self.assertFalse(any(os.path.basename(f).startswith(EXCLUDED_FONTS) for f in self.train.fonts))
        keys = [(int(l), hashlib.sha1(im.tobytes()).hexdigest()) for im, l in zip(self.train.images, self.train.labels)]
        self.assertEqual(len(keys), len(set(keys)))

    def test_transform(self):
        ds = GlyphDataset("test", image_size=16, transform=lambda im: np.asarray(im).shape)
        self.assertEqual(ds[0][0], (16, 16))

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "split"):
            GlyphDataset("validation")
        with self.assertRaisesRegex(ValueError, "source"):
            GlyphDataset("train", source="google")
        with self.assertRaisesRegex(ValueError, "image_size"):
            GlyphDataset("train", image_size=4)

    def test_debian_fonts(self):
        if not debian_font_files():
            with self.assertRaisesRegex(FileNotFoundError, "apt-get install fonts-"):
                GlyphDataset("train", source="debian")
            return
        ds = GlyphDataset("train", source="debian", image_size=16)
        self.assertEqual(set(ds.labels.tolist()), set(range(31)))
