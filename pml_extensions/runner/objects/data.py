"""Dataset views the protocols share: a labelled subset with its own transform, labels, class splits and caps.

Example::

    >>> base = [(i, i % 3) for i in range(9)]          # (image, label) pairs
    >>> view = Subset(base, [0, 4, 5], [i % 3 for i in range(9)], transform=lambda x: x * 10)
    >>> [view[i] for i in range(len(view))], view.labels.tolist()
    ([(0, 0), (40, 1), (50, 2)], [0, 1, 2])
    >>> train, val, val_classes = validation_split([0, 0, 1, 1, 2, 2, 3, 3], 0.5, seed=0)
    >>> sorted(val_classes) == sorted({0, 1, 2, 3} - {[0, 0, 1, 1, 2, 2, 3, 3][i] for i in train})
    True
"""

from typing import Optional, Tuple

import numpy as np
import torch

from ...utils.checks import is_int, is_number
from ..errors import ConfigError


class Subset(torch.utils.data.Dataset):
    """Items ``indices`` of ``dataset`` with ``transform`` applied to the image.

    Args:
        dataset: yields ``(image, label, ...)``.
        indices: ``[n]`` integer positions in ``dataset``.
        labels: ``[len(dataset)]`` labels of the whole dataset; ``self.labels`` (``[n]`` numpy) keeps the subset's.
        transform: applied to the image (``None``: unchanged).
        getter: ``item -> (image, label)`` (default ``item[0], item[1]``).
        rgb: convert PIL images to RGB before ``transform`` (:class:`ToRGB`).
    """

    def __init__(self, dataset, indices, labels, transform, getter=None, rgb: bool = False):
        self.dataset = dataset
        self.getter = getter
        self.indices = np.asarray(indices, dtype=np.int64)
        self.labels = np.asarray(labels)[self.indices]
        self.transform = transform
        self.rgb = ToRGB() if rgb else None

    def __len__(self):
        return len(self.indices)

    @property
    def classes(self):
        """The base dataset's class names (label -> name), or None."""
        return getattr(self.dataset, "classes", None)

    def __getitem__(self, i):
        item = self.dataset[int(self.indices[i])]
        image, label = self.getter(item) if self.getter is not None else (item[0], item[1])
        if self.rgb is not None:
            image = self.rgb(image)
        if self.transform is not None:
            image = self.transform(image)
        return image, (int(label) if np.ndim(label) == 0 else torch.as_tensor(label))


class ToRGB:
    """PIL images to mode RGB (other inputs unchanged)."""

    def __call__(self, image):
        convert = getattr(image, "convert", None)
        return convert("RGB") if convert is not None and getattr(image, "mode", "RGB") != "RGB" else image

    def __repr__(self):
        return "ToRGB()"


def dataset_labels(dataset) -> np.ndarray:
    """``[N]`` (or ``[N, L]`` for hierarchical labels) int64 labels from ``dataset.labels``, ``dataset.targets``
    or, failing both, item ``[1]`` of every item."""
    labels = getattr(dataset, "labels", None)
    if labels is None:
        labels = getattr(dataset, "targets", None)
    if labels is None:
        labels = [dataset[i][1] for i in range(len(dataset))]
    labels = np.asarray(labels).astype(np.int64)
    return labels if labels.ndim == 2 else labels.reshape(-1)


def validation_split(labels, fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray, list]:
    """Class-disjoint split of the training classes into (train indices, validation indices, validation classes):
    the ``validation: {class_fraction, seed}`` key of the paired protocols.

    Args:
        labels: ``[N]`` integer labels of the training split.
        fraction: share of the classes held out for validation, in (0, 1).
        seed: the classes are drawn with ``numpy.random.default_rng(seed)``.

    Raises:
        ConfigError: when ``fraction`` is outside (0, 1) or leaves fewer than 2 classes on a side, or ``seed`` is not
            a non-negative integer.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if not is_number(fraction) or not 0 < fraction < 1:
        raise ConfigError(f"validation.class_fraction must be a number in (0, 1), got {fraction!r}")
    if not is_int(seed) or seed < 0:
        raise ConfigError(f"validation.seed must be a non-negative integer, got {seed!r}")
    num_val = int(round(fraction * len(classes)))
    if num_val < 2 or len(classes) - num_val < 2:
        raise ConfigError(
            f"validation.class_fraction {fraction} of {len(classes)} training classes leaves {num_val} validation and "
            f"{len(classes) - num_val} training classes; each side needs at least 2"
        )
    val_classes = np.sort(np.random.default_rng(seed).permutation(classes)[:num_val])
    is_val = np.isin(labels, val_classes)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val), val_classes.tolist()


def validation_rows(dataset) -> Optional[list]:
    """The class names of a table's validation rows when it has both validation and test rows
    (:class:`pml_extensions.datasets.ImageCSVSplit`'s ``classes_by_split``), else ``None``.

    Example::

        >>> from types import SimpleNamespace as S
        >>> validation_rows(S(classes_by_split={"train": ["a"], "validation": ["b"], "test": ["c"]}))
        ['b']
        >>> validation_rows(S(classes_by_split={"train": ["a"], "validation": ["b"]})) is None
        True
    """
    by_split = getattr(dataset, "classes_by_split", None) or {}
    return list(by_split["validation"]) if by_split.get("validation") and "test" in by_split else None


def cap_per_class(labels, max_per_class: Optional[int], seed: int = 0) -> np.ndarray:
    """Indices keeping at most ``max_per_class`` items of each label (a seeded draw, sorted); all when None.

    Example::

        >>> cap_per_class([0, 0, 0, 1], 2).tolist()  # two of label 0's three items, drawn with seed 0
        [1, 2, 3]
    """
    labels = np.asarray(labels)
    if max_per_class is None:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    keep = []
    for label in np.unique(labels):
        idx = np.where(labels == label)[0]
        keep.append(idx if len(idx) <= max_per_class else rng.choice(idx, max_per_class, replace=False))
    return np.sort(np.concatenate(keep))
