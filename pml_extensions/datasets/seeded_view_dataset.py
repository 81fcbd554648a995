"""A fixed bank of V seeded augmented views per image and the per-epoch draw of one of them: the two seeded
functions :class:`~pml_extensions.datasets.FeatureCache` and training share, and :class:`SeededViewDataset`, the
uncached twin of :class:`~pml_extensions.datasets.CachedFeatureDataset` (docs/feature_cache.md)."""

import random
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from ..utils.checks import int_at_least

# domain tags: view contents and per-epoch draws never share a seed sequence
_VIEW_TAG = 0x76696577  # "view"
_DRAW_TAG = 0x64726177  # "draw"


@contextmanager
def _seeded_global_rngs(words) -> Iterator[None]:
    """torch (CPU), ``random`` and numpy's global RNG seeded from ``words`` inside the block, restored after it."""
    state = np.random.SeedSequence(list(words)).generate_state(2, np.uint32)
    seed64 = (int(state[0]) << 32) | int(state[1])
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed64)
        random.seed(seed64)
        np.random.seed(int(state[0]))
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def seeded_view(transform: Callable, image, view_seed: int, index: int, view: int):
    """``transform(image)`` with torch's CPU RNG, Python's ``random`` and numpy's legacy global RNG seeded from
    ``(view_seed, index, view)`` (ints >= 0; ValueError otherwise) and restored afterwards: the same triple gives the
    same output on every call and machine.

    Example::

        >>> import torchvision.transforms as T
        >>> flip = T.RandomHorizontalFlip()
        >>> x = torch.arange(6.0).view(1, 2, 3)
        >>> torch.equal(seeded_view(flip, x, 0, 5, 1), seeded_view(flip, x, 0, 5, 1))
        True
    """
    words = (
        _VIEW_TAG,
        int_at_least("view_seed", view_seed, 0),
        int_at_least("index", index, 0),
        int_at_least("view", view, 0),
    )
    with _seeded_global_rngs(words):
        return transform(image)


def draw_view(seed: int, epoch: int, index: int, num_views: int) -> int:
    """Which of the ``num_views`` views item ``index`` uses in ``epoch``: an int in ``[0, num_views)`` drawn by
    ``numpy.random.default_rng([tag, seed, epoch, index])``. ValueError: a negative argument, or ``num_views < 1``.

    Example::

        >>> [draw_view(0, epoch, 7, 4) for epoch in range(6)] == [draw_view(0, epoch, 7, 4) for epoch in range(6)]
        True
    """
    words = [_DRAW_TAG, int_at_least("seed", seed, 0), int_at_least("epoch", epoch, 0), int_at_least("index", index, 0)]
    if int_at_least("num_views", num_views, 1) == 1:
        return 0
    return int(np.random.default_rng(words).integers(num_views))


def _labels_of(dataset) -> np.ndarray:
    labels = getattr(dataset, "labels", None)
    if labels is None or len(labels) != len(dataset):
        raise ValueError(
            f"dataset ({type(dataset).__name__}) must have a labels array of its length {len(dataset)}, "
            f"got {None if labels is None else len(labels)}"
        )
    return np.asarray(labels, dtype=np.int64)


class _EpochViews(torch.utils.data.Dataset):
    """A dataset of ``labels`` whose item ``i`` is view ``draw_view(seed, epoch, i, num_views)``."""

    def __len__(self) -> int:
        return len(self.labels)

    def set_epoch(self, epoch: int) -> None:
        """Select the view draws of ``epoch`` (completed epochs, an int >= 0; ValueError otherwise)."""
        self.epoch = int_at_least("epoch", epoch, 0)

    def view_of(self, index: int) -> int:
        """The view item ``index`` uses in the current epoch."""
        return draw_view(self.seed, self.epoch, index, self.num_views)


class SeededViewDataset(_EpochViews):
    """Items ``(transformed image, label)`` where the image is view ``draw_view(seed, epoch, i, V)`` of item ``i`` from
    the bank of ``num_views`` seeded views: with the same ``transform``, ``num_views``, ``view_seed`` and ``seed``,
    exactly the images whose prefix outputs :class:`~pml_extensions.datasets.CachedFeatureDataset` returns.

    Args:
        dataset: items ``(untransformed image, label)`` and an int ``labels`` array [N].
        transform: applied to each image, seeded per (view_seed, index, view).
        num_views: V >= 1 views per image (``1`` with a deterministic transform: the plain evaluation view).
        view_seed: seeds the views' contents; seed: seeds the per-epoch draw of a view.

    ``labels``: int64 numpy array [N]. Call :meth:`set_epoch` with the completed epochs at each epoch boundary (with
    DataLoader workers, before the iterator is made).

    Raises:
        ValueError: ``num_views`` / seeds out of range, or a dataset without a ``labels`` array of its length.

    Example::

        >>> import torchvision.transforms as T
        >>> images = torch.utils.data.TensorDataset(torch.rand(2, 3, 8, 8), torch.tensor([0, 1]))
        >>> images.labels = np.array([0, 1])
        >>> views = SeededViewDataset(images, T.RandomCrop(4), num_views=3)
        >>> image, label = views[1]
        >>> image.shape, label, torch.equal(image, views.view(1, views.view_of(1)))
        (torch.Size([3, 4, 4]), 1, True)
    """

    def __init__(self, dataset, transform: Callable, num_views: int = 1, view_seed: int = 0, seed: int = 0):
        self.dataset = dataset
        self.transform = transform
        self.num_views = int_at_least("num_views", num_views, 1)
        self.view_seed = int_at_least("view_seed", view_seed, 0)
        self.seed = int_at_least("seed", seed, 0)
        self.epoch = 0
        self.labels = _labels_of(dataset)

    def view(self, index: int, view: int):
        """View ``view`` of item ``index``: the transformed image (ValueError if ``view`` is not in [0, V))."""
        if not 0 <= int_at_least("view", view, 0) < self.num_views:
            raise ValueError(f"view must be in [0, {self.num_views}), got {view}")
        image, _ = self.dataset[index]
        return seeded_view(self.transform, image, self.view_seed, index, view)

    def __getitem__(self, index: int):
        return self.view(index, self.view_of(index)), int(self.labels[index])
