import os
import tempfile
import unittest

from PIL import Image

from pml_extensions.datasets import ImageFolderSplit, get_dataset, select_split_classes


class TestGetDataset(unittest.TestCase):
    def test_select_split_classes(self):
        self.assertEqual(select_split_classes(range(5), "train"), [0, 1, 2])
        self.assertEqual(select_split_classes(range(5), "test"), [3, 4])
        self.assertEqual(select_split_classes(range(5), "train", "alternate"), [0, 2, 4])
        self.assertEqual(select_split_classes(range(5), "test", "alternate"), [1, 3])
        with self.assertRaisesRegex(ValueError, "split_rule"):
            select_split_classes(range(5), "train", "random")

    def test_image_folder_through_the_same_path(self):
        with tempfile.TemporaryDirectory() as root:
            for c in ("cat", "dog", "emu", "fox"):
                os.makedirs(os.path.join(root, c))
                for i in range(3):
                    Image.new("RGB", (8, 6), (i * 40, 0, 0)).save(os.path.join(root, c, f"{i}.png"))
            train = get_dataset("imagefolder", "train", root=root)
            test = get_dataset("imagefolder", "test", root=root)
            self.assertIsInstance(train, ImageFolderSplit)
            self.assertEqual(set(train.labels.tolist()), {0, 1})
            self.assertEqual(set(test.labels.tolist()), {2, 3})
            image, label = test[0]
            self.assertEqual((image.mode, image.size, label), ("RGB", (8, 6), 2))

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "unknown dataset 'mnist'"):
            get_dataset("mnist")
        with self.assertRaisesRegex(ValueError, "root"):
            get_dataset("imagefolder")
        with self.assertRaisesRegex(FileNotFoundError, "cub"):
            get_dataset("cub", root="/nonexistent")


def test_an_argument_the_dataset_class_does_not_take_is_one_line_naming_the_ones_it_takes(tmp_path):
    import pytest

    from pml_extensions.datasets.get_dataset import get_dataset

    with pytest.raises(ValueError) as e:
        get_dataset("imagefolder", root=str(tmp_path), image_size=32)
    assert str(e.value) == (
        "dataset 'imagefolder' (ImageFolderSplit) takes no argument 'image_size'; its kwargs: target_transform, "
        "split_rule, test_classes"
    )
