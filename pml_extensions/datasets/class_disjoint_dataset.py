"""Base class of the offline datasets: items ``(PIL.Image, int label)`` with a class-disjoint split."""

from typing import Callable, List, Optional, Sequence

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
