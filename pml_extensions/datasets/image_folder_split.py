"""Any ImageFolder tree (``root/<class>/<image>``) as a class-disjoint metric-learning dataset."""

import os
from typing import Callable, Optional

import numpy as np
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from .class_disjoint_dataset import ClassDisjointDataset, select_split_classes


class ImageFolderSplit(ClassDisjointDataset):
    """Class-disjoint split of an ImageFolder tree: classes sorted by folder name, train = first half, test = rest.

    Uses torchvision's ``make_dataset`` to list images. Items are ``(PIL RGB image, int label)``.

    Raises:
        FileNotFoundError: if ``root`` is not a folder.
        ValueError: on a bad split or a tree with no class folders.
    """

    def __init__(
        self,
        root: str,
        split: str = "train",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        split_rule: str = "halves",
    ):
        super().__init__(transform, target_transform)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"root {root!r} is not a folder of class sub-folders")
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not classes:
            raise ValueError(f"root {root!r} has no class sub-folders")
        self.classes = classes
        keep = select_split_classes(classes, split, split_rule)
        samples = make_dataset(root, {c: i for i, c in enumerate(classes)}, IMG_EXTENSIONS)
        samples = [(p, t) for p, t in samples if classes[t] in set(keep)]
        self.paths = [p for p, _ in samples]
        self.labels = np.asarray([t for _, t in samples], dtype=np.int64)
        self.split = split

    def load_image(self, index: int) -> Image.Image:
        with Image.open(self.paths[index]) as image:
            return image.convert("RGB")
