"""One entry point for every dataset the runner and benchmarks use."""

import inspect
import os
from typing import Callable, Optional

import numpy as np

from .fashion_mnist import FashionMNIST
from .glyph_dataset import GlyphDataset
from .image_csv_split import ImageCSVSplit
from .image_folder_split import ImageFolderSplit
from .open_clip_art import OpenClipArt

PML_DATASETS = {"cub": "CUB", "cars196": "Cars196", "sop": "SOP"}
#: our datasets by name -> their class (whose arguments ``kwargs`` are)
DATASET_CLASSES = {
    "glyphs": GlyphDataset,
    "glyphs_debian": GlyphDataset,
    "openclipart": OpenClipArt,
    "fashion_mnist": FashionMNIST,
    "imagefolder": ImageFolderSplit,
    "csv": ImageCSVSplit,
}
DATASET_NAMES = tuple(DATASET_CLASSES) + tuple(PML_DATASETS)
#: the datasets that need ``root``, and what it is
ROOT_HINTS = {"imagefolder": "folder with one sub-folder per class", "csv": "a CSV file with label and path columns"}


class _RGBLabels:
    """Wraps PML's dataset classes: RGB images and a numpy ``labels`` array, through the same code path."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.labels = np.asarray(dataset.labels, dtype=np.int64)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        transform, self.dataset.transform = self.dataset.transform, None
        try:
            image, label = self.dataset[index]
        finally:
            self.dataset.transform = transform
        image = image.convert("RGB")
        return (transform(image) if transform is not None else image), label


def get_dataset(
    name: str, split: str = "train", transform: Optional[Callable] = None, root: Optional[str] = None, **kwargs
):
    """Build a dataset by name.

    Args:
        name: one of ``DATASET_NAMES``: ``glyphs`` (matplotlib fonts, the embedded default), ``glyphs_debian``
            (Debian ``fonts-*``), ``openclipart``, ``fashion_mnist``, ``imagefolder`` (``root``: a folder of class
            folders, :class:`ImageFolderSplit`), ``csv`` (``root``: a table of files, :class:`ImageCSVSplit`), or PML's
            ``cub`` / ``cars196`` / ``sop`` (``root``: the extracted data; nothing is downloaded).
        split: ``"train"`` or ``"test"`` (class-disjoint, or as a table's split column says) or ``"all"``.
        kwargs: the dataset class's own, e.g. ``test_classes=[...]``, ``columns=``, ``class_overlap=``.

    Raises:
        ValueError: on an unknown name or an argument its class does not take (naming the ones it takes).
        FileNotFoundError: when the data is missing (names the package/path).
    """
    if name in DATASET_CLASSES and kwargs:  # one line naming what the class takes, not Python's TypeError
        params = inspect.signature(DATASET_CLASSES[name]).parameters
        taken = [p for p in params if p not in ("root", "split", "transform", "source")]
        for key in kwargs:
            if key not in params:
                raise ValueError(
                    f"dataset {name!r} ({DATASET_CLASSES[name].__name__}) takes no argument {key!r}; its kwargs: "
                    f"{', '.join(taken) or 'none'}"
                )
    if name in ("glyphs", "glyphs_debian"):
        if root is not None:
            raise ValueError(f"dataset {name!r} takes no root (fonts are found by source=); got root={root!r}")
        source = {"source": "debian"} if name == "glyphs_debian" else {}
        return GlyphDataset(split=split, transform=transform, **source, **kwargs)
    if name in ("openclipart", "fashion_mnist"):
        return DATASET_CLASSES[name](split=split, transform=transform, **({"root": root} if root else {}), **kwargs)
    if name in ROOT_HINTS:
        if root is None:
            raise ValueError(f"dataset {name!r} needs root=<{ROOT_HINTS[name]}>")
        return DATASET_CLASSES[name](root, split=split, transform=transform, **kwargs)
    if name in PML_DATASETS:
        import pytorch_metric_learning.datasets as pml_datasets

        if root is None or not os.path.isdir(root):
            raise FileNotFoundError(f"dataset {name!r} needs root=<folder with the extracted data>, got {root!r}")
        pml_split = "train+test" if split == "all" else split
        return _RGBLabels(
            getattr(pml_datasets, PML_DATASETS[name])(root, split=pml_split, transform=transform, download=False)
        )
    raise ValueError(f"unknown dataset {name!r}; choose one of {DATASET_NAMES}")
