import os
import unittest

from pml_extensions.datasets import FashionMNIST
from pml_extensions.datasets.fashion_mnist import FASHION_MNIST_ROOT


@unittest.skipUnless(os.path.isdir(FASHION_MNIST_ROOT), "Debian package dataset-fashion-mnist is not installed")
class TestFashionMNIST(unittest.TestCase):
    def test_class_disjoint(self):
        train, test = FashionMNIST("train"), FashionMNIST("test")
        self.assertEqual((len(train), len(test)), (35000, 35000))  # 7000 images per class, 5 classes each
        self.assertEqual(set(train.labels.tolist()), {0, 1, 2, 3, 4})
        self.assertEqual(set(test.labels.tolist()), {5, 6, 7, 8, 9})
        image, _ = train[0]
        self.assertEqual((image.mode, image.size), ("L", (28, 28)))

    def test_classification_files_and_subsample(self):
        self.assertEqual(len(FashionMNIST("test", class_disjoint=False)), 10000)
        small = FashionMNIST("train", class_disjoint=False, max_per_class=7, seed=1)
        self.assertEqual(len(small), 70)
        again = FashionMNIST("train", class_disjoint=False, max_per_class=7, seed=1)
        self.assertTrue((small.images == again.images).all())


class TestFashionMNISTMissing(unittest.TestCase):
    def test_missing_data_names_the_package(self):
        with self.assertRaisesRegex(FileNotFoundError, "apt-get install dataset-fashion-mnist"):
            FashionMNIST(root="/nonexistent")
