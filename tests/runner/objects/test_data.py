"""runner/objects/data.py: dataset views (subset, transform, RGB, labels), the class-disjoint validation part."""

import unittest

import numpy as np
from PIL import Image

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.data import (
    Subset,
    ToRGB,
    dataset_labels,
    validation_rows,
    validation_split,
)


class _Items:
    """Three grey 2 x 2 images with labels 5, 6, 7 (``targets``, as torchvision names them)."""

    targets = [5, 6, 7]

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return Image.new("L", (2, 2), color=10 * i), self.targets[i]


class TestViews(unittest.TestCase):
    def test_subset_keeps_its_items_labels_and_transform(self):
        base = [(i, i % 3) for i in range(9)]
        view = Subset(base, [7, 2], [i % 3 for i in range(9)], transform=lambda x: -x)
        self.assertEqual([view[0], view[1]], [(-7, 1), (-2, 2)])
        self.assertEqual(view.labels.tolist(), [1, 2])
        self.assertEqual(len(view), 2)

    def test_getter_and_rgb(self):
        dicts = [{"img": Image.new("L", (2, 2), color=c), "y": c} for c in (3, 9)]
        view = Subset(dicts, [1], [3, 9], None, getter=lambda d: (d["img"], d["y"]), rgb=True)
        image, label = view[0]
        self.assertEqual((image.mode, image.getpixel((0, 0)), label), ("RGB", (9, 9, 9), 9))
        self.assertEqual(repr(ToRGB()), "ToRGB()")
        self.assertEqual(ToRGB()(5), 5)  # not an image: unchanged

    def test_dataset_labels_from_labels_targets_or_items(self):
        self.assertEqual(dataset_labels(_Items()).tolist(), [5, 6, 7])
        self.assertEqual(dataset_labels([(None, 1), (None, 0)]).tolist(), [1, 0])
        hierarchical = type("H", (), {"labels": [[0, 10], [1, 11]]})()
        self.assertEqual(dataset_labels(hierarchical).shape, (2, 2))


class TestValidationSplit(unittest.TestCase):
    def test_the_drawn_classes_are_held_out(self):
        labels = np.repeat(np.arange(8), 3)
        train, val, val_classes = validation_split(labels, 0.25, seed=4)
        # round(0.25 * 8) = 2 classes, the first two of numpy's permutation with seed 4
        self.assertEqual(val_classes, sorted(np.random.default_rng(4).permutation(np.arange(8))[:2].tolist()))
        self.assertEqual(sorted(set(labels[val])), val_classes)
        self.assertFalse(set(labels[train]) & set(val_classes))
        self.assertEqual(len(train) + len(val), 24)

    def test_bad_fractions_name_the_key(self):
        with self.assertRaisesRegex(ConfigError, r"validation.class_fraction must be a number in \(0, 1\)"):
            validation_split([0, 1, 2, 3], True, seed=0)
        with self.assertRaisesRegex(ConfigError, "leaves 1 validation and 3 training classes"):
            validation_split([0, 1, 2, 3], 0.25, seed=0)

    def test_a_seed_that_is_not_an_integer_is_one_line(self):
        """`job --validation "{seed: abc}"` (or a mistyped `~APPLY~2` that puts a dict there) ended in int()'s
        traceback."""
        labels = np.repeat(np.arange(8), 2)
        for seed in ("abc", -1, 1.5, True, {"class_fraction": 0.5}):
            with self.assertRaises(ConfigError) as e:
                validation_split(labels, 0.25, seed=seed)
            self.assertEqual(str(e.exception), f"validation.seed must be a non-negative integer, got {seed!r}")
        self.assertEqual(validation_split(labels, 0.25, seed=np.int64(3))[2], validation_split(labels, 0.25, 3)[2])


def test_validation_rows_need_validation_and_test_rows():
    from types import SimpleNamespace as S

    assert validation_rows(S(classes_by_split={"train": ["a"], "validation": ["b"], "test": ["c"]})) == ["b"]
    assert validation_rows(S(classes_by_split={"train": ["a"], "validation": ["b"]})) is None
