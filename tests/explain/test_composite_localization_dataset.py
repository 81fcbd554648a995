import os
import unittest

import numpy as np

from pml_extensions.explain.composite_localization_dataset import CompositeLocalizationDataset

HAS_CLIPART = os.path.isdir("/usr/share/openclipart/png")
try:
    import skimage.data  # noqa: F401

    HAS_SKIMAGE = True
except ImportError:  # pragma: no cover
    HAS_SKIMAGE = False


@unittest.skipIf(not HAS_SKIMAGE, "scikit-image is not installed (pip install scikit-image)")
class TestCompositeLocalizationDataset(unittest.TestCase):
    def check_boxes(self, ds):
        for img, mask, box in zip(ds.images, ds.masks, ds.boxes):
            self.assertEqual(img.size, (ds.image_size, ds.image_size))
            ys, xs = np.nonzero(mask)
            self.assertEqual(tuple(box), (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))

    def test_glyph_variant_deterministic_and_exact(self):
        a = CompositeLocalizationDataset("test", n_images=6, image_size=64, source="glyph", seed=3)
        b = CompositeLocalizationDataset("test", n_images=6, image_size=64, source="glyph", seed=3)
        c = CompositeLocalizationDataset("test", n_images=6, image_size=64, source="glyph", seed=4)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))
        self.assertFalse(np.array_equal(a.boxes, c.boxes))
        self.check_boxes(a)
        image, label = a[0]
        self.assertEqual(label, int(a.labels[0]))
        train = CompositeLocalizationDataset("train", n_images=6, image_size=64, source="glyph", seed=3)
        self.assertFalse(set(train.labels) & set(a.labels))

    @unittest.skipIf(
        not HAS_CLIPART, "Debian package openclipart-png is not installed (apt-get install openclipart-png)"
    )
    def test_clipart_variant(self):
        ds = CompositeLocalizationDataset("test", n_images=5, image_size=96, seed=0, object_scale=(0.4, 0.5))
        self.check_boxes(ds)
        for box in ds.boxes:
            self.assertLessEqual(max(box[2] - box[0], box[3] - box[1]), 0.5 * 96 + 1)

    def test_bad_inputs(self):
        with self.assertRaisesRegex(ValueError, "source"):
            CompositeLocalizationDataset(source="emoji")
        with self.assertRaisesRegex(ValueError, "object_scale"):
            CompositeLocalizationDataset(source="glyph", object_scale=(0.6, 0.3))
        with self.assertRaisesRegex(ValueError, "n_images"):
            CompositeLocalizationDataset(source="glyph", n_images=0)


if __name__ == "__main__":
    unittest.main()
