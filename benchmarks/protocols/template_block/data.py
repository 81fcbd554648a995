"""The ``template_block`` protocol's data: training, validation and test views of the config's datasets, built by the
one :class:`~pml_extensions.runner.objects.builder.Builder` (so a cached-feature dataset can take their place later).

Two tasks (``task:``):

- ``classification`` (the paper's Table 1, Fig. 3-4): the same classes everywhere. ``split: {train, val, test,
  seed}`` splits every class of ``dataset`` into training, validation and test images: counts per class (ints) or
  fractions of each class (floats, cut at the rounded cumulative fraction), drawn with
  ``numpy.random.RandomState(seed)`` class by class in label order (the same split for every variant and seed).
  ``test`` left out: the rest of each class, or, with ``test_dataset``, that dataset (e.g. Fashion-MNIST's official
  test file). Labels are mapped to ``0 .. C-1`` in sorted order (the classifier's and the block's indices).
- ``metric_learning`` (the paper's DML experiments): class-disjoint. ``dataset``'s ``train`` split (or the dataset as
  given) holds the training classes, of which ``validation: {class_fraction, seed}`` are held out for selection
  (:func:`pml_extensions.runner.objects.data.validation_split`); ``test_dataset`` (default: ``dataset``'s ``test``
  split) holds the unseen test classes.

The training view has the ``transforms.train`` transform, the others ``transforms.eval``.

With ``feature_cache`` (:mod:`pml_extensions.runner.objects.feature_cache`) the views hold cached outputs of the
trunk's frozen prefix instead of images: part ``train`` (``num_views`` seeded views of the training images, train
transform; the unit draws its views with its seed), part ``eval`` (the plain view of every image of ``dataset``, the
training part's for ``metric_learning``: ``train_eval`` and ``val`` are its items) and, with a test dataset of its
own, part ``test``; under ``<experiment folder>/feature_cache/<boundary>/`` unless ``feature_cache.folder`` says
otherwise.

Example::

    >>> tr, va, te = per_class_split([0, 1] * 10, {"train": 6, "val": 2, "seed": 0})
    >>> len(tr), len(va), len(te), sorted(set(va) & set(tr))
    (12, 4, 4, [])
"""

from typing import Any, Dict, Tuple

import numpy as np

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.data import dataset_labels, validation_split
from pml_extensions.runner.objects.feature_cache import FeatureCaches, subset_key

SPLIT_KEYS = ("train", "val", "test", "seed")


def per_class_split(labels, split: Dict[str, Any], where: str = "config: split") -> Tuple[np.ndarray, ...]:
    """``(train, val, test)`` index arrays: each class's items permuted with ``RandomState(seed)`` (classes in sorted
    order, one permutation each), then cut into ``train``, ``val`` and ``test`` (the rest when ``test`` is absent).

    Args:
        labels: ``[N]`` labels.
        split: ``{train, val, test (optional), seed (default 0)}``; ints are images per class, floats fractions of
            each class (cuts at ``round(f_train · n)`` and ``round((f_train + f_val) · n)``).

    Raises:
        ConfigError: unknown keys, mixed or non-positive sizes, or a class with too few images (names it).
    """
    if not isinstance(split, dict):
        raise ConfigError(f"{where}: expected {{train: 300, val: 100, seed: 0}} or fractions, got {split!r}")
    unknown = sorted(set(split) - set(SPLIT_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: {', '.join(SPLIT_KEYS)}")
    sizes = [split.get(k) for k in ("train", "val", "test")]
    given = [s for s in sizes if s is not None]
    if sizes[0] is None or sizes[1] is None:
        raise ConfigError(f"{where}: needs train and val (images per class, or fractions of each class)")
    counts = all(isinstance(s, int) and not isinstance(s, bool) for s in given)
    fractions = all(isinstance(s, float) for s in given)
    if not (counts or fractions) or any(s <= 0 for s in given):
        raise ConfigError(f"{where}: train, val, test must be all positive ints (per class) or all fractions")
    if fractions and sum(given) > 1 + 1e-9:
        raise ConfigError(f"{where}: the fractions add up to {sum(given)} > 1")
    labels = np.asarray(labels)
    rng = np.random.RandomState(int(split.get("seed", 0)))
    parts = ([], [], [])
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if counts:
            a, b = sizes[0], sizes[0] + sizes[1]
            end = len(idx) if sizes[2] is None else b + sizes[2]
            if max(b, end) > len(idx):
                raise ConfigError(f"{where}: {max(b, end)} images per class asked, class {c} has {len(idx)}")
        else:
            a, b = int(round(sizes[0] * len(idx))), int(round((sizes[0] + sizes[1]) * len(idx)))
            end = len(idx) if sizes[2] is None else int(round((sizes[0] + sizes[1] + sizes[2]) * len(idx)))
        for part, sl in zip(parts, (idx[:a], idx[a:b], idx[b:end])):
            part.append(sl)
    return tuple(np.concatenate(p).astype(np.int64) for p in parts)


class _Relabel:
    """``item -> (image, index of its label in classes)`` (a view's getter)."""

    def __init__(self, classes):
        self.lookup = {int(c): i for i, c in enumerate(classes)}

    def __call__(self, item):
        return item[0], self.lookup[int(item[1])]


class _Views:
    """Views of a dataset's items: images with a transform, or (``feature_cache``) their cached prefix outputs."""

    def __init__(self, builder, config, experiment_folder):
        self.builder, self.caches = builder, None
        if config.get("feature_cache") is not None:
            self.caches = FeatureCaches(builder, experiment_folder or "", builder.log)
            if builder.frozen is None:  # the frozen prefix the caches are built with (builder.frozen)
                builder.build_models(spec={"trunk": config["models"]["trunk"]}, cached=True)

    def _cached(self, part, dataset, indices, labels, transform, getter, num_views):
        images = self.builder.subset(dataset, indices, labels, None, getter)
        try:  # the dataset's file list (or items) and the indices
            key = subset_key(dataset, indices)
        except ValueError:  # a dataset without a labels array: the subset's items are hashed
            key = None
        frozen = self.builder.frozen
        return self.caches.dataset(part, frozen, images, transform, num_views, seed=0, dataset_key=key)

    def train(self, dataset, indices, labels, transform, getter=None):
        if self.caches is None:
            return self.builder.subset(dataset, indices, labels, transform, getter=getter)
        return self._cached("train", dataset, indices, labels, transform, getter, self.caches.spec["num_views"])

    def evaluation(self, part, dataset, indices, labels, transform, getter=None):
        """Items ``indices`` of ``dataset`` (eval transform); cached: items of the part's cache of all of
        ``dataset``."""
        if self.caches is None:
            return self.builder.subset(dataset, indices, labels, transform, getter=getter)
        every = np.arange(len(dataset))
        return self.builder.subset(self._cached(part, dataset, every, labels, transform, getter, 1), indices)


def build_views(builder, config: Dict[str, Any], task: str, where=None, experiment_folder=None) -> Dict[str, Any]:
    """``{"train", "train_eval", "val", "test", "num_classes", "sizes"}``: the views (``train`` with the training
    transform, the others, ``train_eval`` the training images too, with the evaluation transform) and the number of
    training classes. With ``feature_cache`` they are cached prefix outputs (see the module docstring; the caches are
    built first when missing, under ``experiment_folder``), ``train`` a
    :class:`~pml_extensions.datasets.CachedFeatureDataset` drawing its views with seed 0.

    Raises:
        ConfigError: a bad ``split`` / ``validation``, test images of a class the training part lacks
        (classification), a cache that cannot be built; :class:`~pml_extensions.runner.errors.MissingDataError`
        for missing data.
    """
    train_tf, eval_tf = builder.build_transform("train"), builder.build_transform("eval")
    make = _Views(builder, config, experiment_folder)
    if task == "classification":
        pool = builder.build_dataset()
        labels = dataset_labels(pool)
        train_idx, val_idx, test_idx = per_class_split(labels, config.get("split") or {}, builder.where("split"))
        classes = np.unique(labels)
        relabel = None if np.array_equal(classes, np.arange(len(classes))) else _Relabel(classes)
        mapped = np.searchsorted(classes, labels)
        views = {
            "train": make.train(pool, train_idx, mapped, train_tf, getter=relabel),
            "train_eval": make.evaluation("eval", pool, train_idx, mapped, eval_tf, getter=relabel),
            "val": make.evaluation("eval", pool, val_idx, mapped, eval_tf, getter=relabel),
        }
        if config.get("test_dataset") is not None:
            if (config.get("split") or {}).get("test") is not None:
                raise ConfigError(
                    f"{builder.where('split')}: test: not with test_dataset (the test images come from it)"
                )
            test = builder.build_dataset(spec=config["test_dataset"], key="test_dataset")
            test_labels = dataset_labels(test)
            unknown = sorted(set(np.unique(test_labels).tolist()) - set(classes.tolist()))
            if unknown:
                raise ConfigError(f"{builder.where('test_dataset')}: labels {unknown[:5]} are not training classes")
            views["test"] = make.evaluation(
                "test", test, np.arange(len(test)), np.searchsorted(classes, test_labels), eval_tf, getter=relabel
            )
        else:
            views["test"] = make.evaluation("eval", pool, test_idx, mapped, eval_tf, getter=relabel)
        num_classes = len(classes)
    else:
        train_set = builder.build_dataset("train")
        labels = dataset_labels(train_set)
        val = config.get("validation") or {}
        try:
            train_idx, val_idx, _ = validation_split(labels, val.get("class_fraction", 0.25), val.get("seed", 0))
        except ConfigError as e:
            raise ConfigError(f"{builder.where('validation')}: {e}") from None
        spec, key = (
            (config["test_dataset"], "test_dataset") if config.get("test_dataset") is not None else (None, "dataset")
        )
        test = builder.build_dataset("test", spec=spec, key=key)
        views = {
            "train": make.train(train_set, train_idx, labels, train_tf),
            "train_eval": make.evaluation("eval", train_set, train_idx, labels, eval_tf),
            "val": make.evaluation("eval", train_set, val_idx, labels, eval_tf),
            "test": make.evaluation("test", test, np.arange(len(test)), dataset_labels(test), eval_tf),
        }
        num_classes = int(np.max(labels)) + 1  # the labels index the classes (the block's patch classifier)
    views["num_classes"] = int(num_classes)
    views["sizes"] = {k: len(views[k]) for k in ("train", "val", "test")}
    return views
