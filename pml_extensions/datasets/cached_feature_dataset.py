"""A Dataset over a finished :class:`~pml_extensions.datasets.FeatureCache`: ``(features, label)`` items."""

import json
import os
from typing import Optional

import numpy as np
import torch

from ..utils.checks import int_at_least
from .seeded_view_dataset import _EpochViews

#: the ``format`` of a cache's ``meta.json`` that this reader understands (written by ``FeatureCache``)
FORMAT = "pml_extensions.feature_cache/1"


class CachedFeatureDataset(_EpochViews):
    """Items ``(features, label)``: the cached prefix output of view ``draw_view(seed, epoch, i, V)`` of item ``i``.

    Drop-in for the image dataset of a PML trainer or tester whose trunk is the trainable rest of a split model
    (:func:`pml_extensions.trunks.split_trunk`). Call :meth:`set_epoch` with the completed epochs before a DataLoader
    iterator is made (PML: ``end_of_epoch_hook=lambda trainer: dataset.set_epoch(trainer.epoch)``; a run resumed at
    PML epoch e calls ``set_epoch(e - 1)`` first).

    Args:
        folder: a :class:`FeatureCache` folder whose build is complete.
        seed: seeds the per-epoch view draws (the training seed).
        dtype: dtype of the returned features (the stored values converted).
        key: when given, the cache's key must equal it (as :meth:`FeatureCache.open` passes).

    ``__getitem__(i) -> (features [*feature_shape] dtype, int label)``, read from the memory-mapped file; ``labels`` is
    an int64 numpy array [N]; ``feature_shape``, ``num_views``, ``meta`` describe the cache.

    Raises:
        FileNotFoundError: no ``meta.json`` in ``folder``.
        ValueError: the cache is incomplete, of another format, or has another key than ``key``; a negative seed.

    Example::

        >>> import tempfile
        >>> from pml_extensions.datasets import FeatureCache
        >>> images = torch.utils.data.TensorDataset(torch.rand(4, 3, 6, 6), torch.tensor([0, 0, 1, 1]))
        >>> images.labels, folder = np.array([0, 0, 1, 1]), tempfile.mkdtemp()
        >>> FeatureCache(folder, torch.nn.Conv2d(3, 2, 3), images, torch.nn.Identity(), num_views=3,
        ...              dataset_key="four").build()
        True
        >>> train = CachedFeatureDataset(folder, seed=1)
        >>> train.num_views, train.feature_shape, train.labels.tolist(), train[2][0].shape
        (3, (2, 4, 4), [0, 0, 1, 1], torch.Size([2, 4, 4]))
    """

    def __init__(self, folder: str, seed: int = 0, dtype: torch.dtype = torch.float32, key: Optional[str] = None):
        self.folder = os.fspath(folder)
        path = os.path.join(self.folder, "meta.json")
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no feature cache in {self.folder} (no meta.json): run FeatureCache.build"
            ) from None
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
        if key is not None and meta.get("key") != key:
            raise ValueError(f"{path}: the cache's key differs from the expected one (its inputs changed): rebuild it")
        if not meta.get("complete"):
            done = len(os.listdir(os.path.join(self.folder, "chunks")))
            raise ValueError(
                f"the feature cache in {self.folder} is incomplete ({done} of {meta['num_chunks']} chunks): "
                "run FeatureCache.build to finish it"
            )
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
        self.meta = meta
        self.seed = int_at_least("seed", seed, 0)
        self.dtype = dtype
        self.epoch = 0
        self.num_views = int(meta["num_views"])
        self.feature_shape = tuple(meta["feature_shape"])
        self.labels = np.load(os.path.join(self.folder, "labels.npy"))
        self._features = None

    @property
    def features(self) -> np.ndarray:
        """The memory-mapped ``[N, V, *feature_shape]`` array (opened lazily, so a pickled dataset re-opens it)."""
        if self._features is None:
            self._features = np.load(os.path.join(self.folder, "features.npy"), mmap_mode="r")
        return self._features

    @property
    def view_seed(self) -> int:
        return int(self.meta.get("view_seed", 0))

    def view(self, index: int, view: int) -> torch.Tensor:
        """Stored view ``view`` of item ``index``, in the stored dtype (the input of a derived cache)."""
        return torch.from_numpy(np.array(self.features[index, view]))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_features"] = None  # a pickled memmap would copy the whole file
        return state

    def __getitem__(self, index: int):
        row = np.array(self.features[index, self.view_of(index)])
        return torch.from_numpy(row).to(self.dtype), int(self.labels[index])
