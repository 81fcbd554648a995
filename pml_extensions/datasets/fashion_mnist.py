"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (no download)."""

import functools
import gzip
import os
from typing import Callable, Optional

import numpy as np
from PIL import Image

from .class_disjoint_dataset import SPLITS, ClassDisjointDataset, select_split_classes

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_HINT = "apt-get install dataset-fashion-mnist"
FASHION_MNIST_CLASSES = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot".split(",")


def read_idx(path: str) -> np.ndarray:
    """A gzipped IDX file (the MNIST format) as a numpy array (read-only: decoded once per file version and shared by
    the datasets of a process; a protocol builds its datasets several times, each a few images of the 70000)."""
    st = os.stat(path)
    return _read_idx(os.path.abspath(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _read_idx(path: str, mtime_ns: int, size: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class FashionMNIST(ClassDisjointDataset):
    """Fashion-MNIST, 28×28 grayscale, 10 classes.

    Args:
        split: ``"train"``, ``"test"`` or ``"all"``.
        class_disjoint: ``True`` (metric learning): images of both files pooled, train = classes 0-4, test = classes
            5-9. ``False`` (classification): the official train (60k) / test (10k) files, all 10 classes.
        max_per_class: keep at most this many images per class (subsample seeded by ``seed``); ``None`` keeps all.
        transform, target_transform, root: as usual.

    Raises:
        FileNotFoundError: when the Debian package is not installed (names it).
    """

    def __init__(
        self,
        split: str = "train",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        class_disjoint: bool = True,
        max_per_class: Optional[int] = None,
        seed: int = 0,
        root: str = FASHION_MNIST_ROOT,
    ):
        super().__init__(transform, target_transform)
        files = {
            "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
            "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
        }
        for name in [name for pair in files.values() for name in pair]:
            if not os.path.isfile(os.path.join(root, name)):
                raise FileNotFoundError(f"Fashion-MNIST file {name} not found in {root}: {FASHION_MNIST_HINT}")
        self.classes = list(FASHION_MNIST_CLASSES)
        if class_disjoint:
            parts = [files["train"], files["test"]]
            keep = set(select_split_classes(range(10), split, "halves"))
        else:
            if split not in SPLITS:
                raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
            parts = [files["train"], files["test"]] if split == "all" else [files[split]]
            keep = set(range(10))
        part_labels = [read_idx(os.path.join(root, p[1])) for p in parts]
        labels = np.concatenate(part_labels).astype(np.int64)
        idx = np.flatnonzero(np.isin(labels, sorted(keep)))  # indices into the files' images, in file order
        if max_per_class is not None:
            rng = np.random.default_rng(seed)
            kept = labels[idx]
            idx = np.concatenate([rng.permutation(idx[kept == c])[:max_per_class] for c in np.unique(kept)])
            idx.sort()
        # gather only the kept images, file by file (not a copy of all 70000 first)
        starts = np.cumsum([0] + [len(x) for x in part_labels])
        images = np.concatenate(
            [
                read_idx(os.path.join(root, p[0]))[idx[(idx >= lo) & (idx < hi)] - lo]
                for p, lo, hi in zip(parts, starts[:-1], starts[1:])
            ]
        )
        self.images, self.labels, self.split = images, labels[idx], split

    def load_image(self, index: int) -> Image.Image:
        return Image.fromarray(self.images[index])
