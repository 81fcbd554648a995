"""Base class of the offline datasets: items ``(PIL.Image, int label)`` with a class-disjoint split; the split rules
(:func:`select_split_classes`, and the MLRC protocol's test classes and folds: :func:`mlrc_class_splits`)."""

import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
from torch.utils.data import Dataset

SPLITS = ("train", "test", "all")
SPLIT_RULES = ("halves", "alternate")


def select_split_classes(classes: Sequence, split: str, rule: str = "halves") -> List:
    """Classes of one side of a class-disjoint split (ValueError on an unknown split or rule).

    Args:
        classes: all class names/ids in a fixed order.
        split: ``"train"``, ``"test"`` or ``"all"``.
        rule: ``"halves"`` — train = the first ⌈c/2⌉ classes, test = the rest (the MLRC / CUB convention);
            ``"alternate"`` — train = even positions, test = odd positions (for orders that group related classes).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if rule not in SPLIT_RULES:
        raise ValueError(f"split_rule must be one of {SPLIT_RULES}, got {rule!r}")
    classes = list(classes)
    if split == "all":
        return classes
    if rule == "halves":
        half = (len(classes) + 1) // 2
        return classes[:half] if split == "train" else classes[half:]
    return classes[0::2] if split == "train" else classes[1::2]


def mlrc_class_splits(
    labels: Sequence[int],
    test_size: float = 0.5,
    test_start_idx: float = 0.5,
    num_training_partitions: int = 4,
    test_classes: Sequence[int] = None,
) -> Dict[str, Any]:
    """Class-disjoint MLRC split.

    Args:
        labels: ``[N]`` integer class labels of the whole dataset.
        test_size, test_start_idx: fractions of the sorted class list; the test classes are
            ``classes[⌊start·C⌋ : ⌊(start + size)·C⌋]`` (default the second half; an odd count gives it the extra).
        num_training_partitions: class-disjoint folds of the other classes (contiguous blocks of the sorted list,
            sizes differing by at most one).
        test_classes: the test classes (labels) instead of ``test_size`` / ``test_start_idx``.

    Returns:
        ``{"test": [classes], "trainval": [classes], "folds": [{"train": [classes], "val": [classes]}, ...]}``.

    Raises:
        ValueError: fractions outside [0, 1], fewer than 2 test classes, or fewer other classes than 2 per fold.

    Example::

        >>> s = mlrc_class_splits(list(range(12)), num_training_partitions=2)
        >>> s["test"], s["folds"][0]
        ([6, 7, 8, 9, 10, 11], {'train': [3, 4, 5], 'val': [0, 1, 2]})
    """
    classes = [int(c) for c in np.unique(np.asarray(labels))]  # sorted
    c = len(classes)
    if not (0 <= test_size <= 1 and 0 <= test_start_idx <= 1):
        raise ValueError(f"test_size and test_start_idx must be fractions in [0, 1], got {test_size}, {test_start_idx}")
    if test_classes is not None:
        test = sorted(int(t) for t in set(test_classes) & set(classes))
        pool = sorted(set(classes) - set(test))
    else:
        start = int(math.floor(test_start_idx * c + 1e-9))
        stop = min(c, int(math.floor((test_start_idx + test_size) * c + 1e-9)))
        test = classes[start:stop]
        pool = classes[:start] + classes[stop:]
    if len(test) < 2:
        raise ValueError(f"the test split needs at least 2 classes, got {len(test)} of {c}")
    if num_training_partitions < 2 or len(pool) < 2 * num_training_partitions:
        raise ValueError(
            f"num_training_partitions must be >= 2 with >= 2 classes each; got {num_training_partitions} "
            f"partitions for {len(pool)} train/val classes"
        )
    parts = [list(map(int, p)) for p in np.array_split(np.asarray(pool), num_training_partitions)]
    folds = [
        {"train": [x for j, p in enumerate(parts) if j != k for x in p], "val": parts[k]}
        for k in range(num_training_partitions)
    ]
    return {"test": test, "trainval": pool, "folds": folds}


class ClassDisjointDataset(Dataset):
    """Items ``(image, label)``; ``labels`` is an int64 numpy array [N], ``classes[label]`` the class name (the same
    label in every split). Subclasses fill ``classes`` and ``labels`` and implement ``load_image(index) -> PIL.Image``.
    """

    def __init__(self, transform: Optional[Callable] = None, target_transform: Optional[Callable] = None):
        self.transform = transform
        self.target_transform = target_transform
        self.classes: List[str] = []
        self.labels = np.zeros(0, dtype=np.int64)

    def load_image(self, index: int):
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.load_image(index)
        label = int(self.labels[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    @property
    def split_classes(self) -> List[str]:
        """Names of the classes present in this split."""
        return [self.classes[i] for i in np.unique(self.labels)]
