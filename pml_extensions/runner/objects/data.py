"""Dataset views the protocols share: a labelled subset with its own transform, labels, class splits and caps."""

from typing import Optional, Tuple

import numpy as np
import torch

from ...utils.checks import is_int, is_number
from ..errors import ConfigError


class Subset(torch.utils.data.Dataset):
    """Items ``indices`` of ``dataset`` (``getter(item) -> (image, label)``), the image made RGB (``rgb``) and
    transformed; ``labels``: the whole dataset's, ``self.labels`` (numpy) the subset's."""

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
    """``(train indices, validation indices, validation classes)``: a ``fraction`` of the classes of ``labels`` held
    out (drawn with ``default_rng(seed)``); ConfigError for a bad value or fewer than 2 classes on a side."""
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
    """The class names of ``ImageCSVSplit``'s validation rows when it also has test rows, else ``None``."""
    by_split = getattr(dataset, "classes_by_split", None) or {}
    return list(by_split["validation"]) if by_split.get("validation") and "test" in by_split else None
