"""Dataset views the protocols share: a labelled subset with its own transform, RGB conversion, labels of any
dataset.

Example::

    >>> base = [(i, i % 3) for i in range(9)]          # (image, label) pairs
    >>> view = Subset(base, [0, 4, 5], [i % 3 for i in range(9)], transform=lambda x: x * 10)
    >>> [view[i] for i in range(len(view))], view.labels.tolist()
    ([(0, 0), (40, 1), (50, 2)], [0, 1, 2])
"""

import numpy as np
import torch


class Subset(torch.utils.data.Dataset):
    """Items ``indices`` of ``dataset`` with ``transform`` applied to the image.

    Args:
        dataset: yields ``(image, label, ...)``.
        indices: ``[n]`` integer positions in ``dataset``.
        labels: ``[len(dataset)]`` labels of the whole dataset; ``self.labels`` (``[n]`` numpy) keeps the subset's
            for samplers.
        transform: applied to the image (``None``: unchanged).
        getter: ``item -> (image, label)`` (default ``item[0], item[1]``; e.g.
            :func:`pml_extensions.runner.pb_keys.data_and_label_getter` for datasets that return dicts).
    """

    def __init__(self, dataset, indices, labels, transform, getter=None):
        self.dataset = dataset
        self.getter = getter
        self.indices = np.asarray(indices, dtype=np.int64)
        self.labels = np.asarray(labels)[self.indices]
        self.transform = transform

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        item = self.dataset[int(self.indices[i])]
        image, label = self.getter(item) if self.getter is not None else (item[0], item[1])
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
