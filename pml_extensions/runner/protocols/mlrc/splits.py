"""The MLRC split and test numbers (Musgrave, Belongie & Lim, "A Metric Learning Reality Check", ECCV 2020, Sec. 4).

Example::

    >>> s = mlrc_class_splits(list(range(12)), num_training_partitions=2)
    >>> s["test"], s["folds"][0]
    ([6, 7, 8, 9, 10, 11], {'train': [3, 4, 5], 'val': [0, 1, 2]})
"""

import math
from typing import Any, Dict, List, Sequence

import numpy as np
import torch


def mlrc_class_splits(
    labels: Sequence[int],
    test_size: float = 0.5,
    test_start_idx: float = 0.5,
    num_training_partitions: int = 4,
    test_classes: Sequence[int] = None,
) -> Dict[str, Any]:
    """Class-disjoint MLRC split.

    Args:
        labels: ``[N]`` integer class labels of the whole dataset.
        test_size, test_start_idx: fractions of the (sorted) class list; the test classes are
            ``classes[⌊start·C⌋ : ⌊(start + size)·C⌋]``. Default: the second half (with an odd count the test
            half gets the extra class).
        num_training_partitions: number of class-disjoint folds of the remaining classes (contiguous blocks of
        the sorted list, sizes differing by at most one).
        test_classes: the test classes (labels) instead of ``test_size`` / ``test_start_idx``.

    Returns:
        ``{"test": [classes], "trainval": [classes], "folds": [{"train": [classes], "val": [classes]},
        ...]}``.

    Raises:
        ValueError: on fractions outside [0, 1], fewer than 2 test classes, or fewer pool classes than 2 per
        fold.
    """
    classes = sorted(int(c) for c in np.unique(np.asarray(labels)))
    c = len(classes)
    if not (0 <= test_size <= 1 and 0 <= test_start_idx <= 1):
        raise ValueError(f"test_size and test_start_idx must be fractions in [0, 1], got {test_size}, {test_start_idx}")
    if test_classes is not None:
        test = sorted(int(t) for t in set(test_classes) & set(classes))
        pool = [k for k in classes if k not in set(test)]
    else:
        start = int(math.floor(test_start_idx * c + 1e-9))
        stop = min(c, int(math.floor((test_start_idx + test_size) * c + 1e-9)))
        test = classes[start:stop]
        pool = classes[:start] + classes[stop:]
    if len(test) < 2:
        raise ValueError(f"the test split needs at least 2 classes, got {len(test)} of {c}")
    if num_training_partitions < 2 or len(pool) < 2 * num_training_partitions:
        raise ValueError(
            f"num_training_partitions must be >= 2 with >= 2 classes each; got {num_training_partitions} "
            f"partitions for {len(pool)} train/val classes"
        )
    parts = [list(map(int, p)) for p in np.array_split(np.asarray(pool), num_training_partitions)]
    folds = [
        {"train": [x for j, p in enumerate(parts) if j != k for x in p], "val": parts[k]}
        for k in range(num_training_partitions)
    ]
    return {"test": test, "trainval": pool, "folds": folds}


def ensemble_metrics(
    embeddings: List[torch.Tensor],
    labels: torch.Tensor,
    calculator,
    normalize: bool = True,
    tester_normalize: bool = False,
) -> Dict[str, Any]:
    """MLRC test numbers from the k models' embeddings of the same test items, as powerful-benchmarker computes them:
    each model is tested with the tester's settings, the concatenation with the ensemble's.

    Args:
        embeddings: k tensors ``[N, d]`` (float), one per fold model, rows aligned, as the tester returns them (its
            ``normalize_embeddings`` already applied).
        labels: ``[N]`` integer labels.
        calculator: a PML ``AccuracyCalculator`` (queries compared to themselves).
        normalize: L2-normalise each model's embeddings before concatenating them (PB's
            ``ConcatenateEmbeddings.normalize_embeddings``).
        tester_normalize: the tester's ``normalize_embeddings``, applied to the concatenation too (PB's tester
            normalises whatever the ensemble model outputs).

    Returns:
        ``{"separate_<d>D": mean over the k models of each metric (the embeddings as given),
        "concatenated_<k·d>D": metrics of ``cat([normalize(e) for e in embeddings], dim=1)`` (normalised again
        with ``tester_normalize``), "per_model": [k dicts]}`` — MLRC's "128D" and "512D".

    Raises:
        ValueError: on an empty list or embeddings with different shapes.
    """
    if not embeddings:
        raise ValueError("embeddings must hold at least one [N, d] tensor")
    if any(e.shape != embeddings[0].shape or e.ndim != 2 for e in embeddings):
        raise ValueError(
            f"embeddings must all be [N, d] with the same shape, got {[tuple(e.shape) for e in embeddings]}"
        )
    per_model = [{m: float(v) for m, v in calculator.get_accuracy(e.float(), labels).items()} for e in embeddings]
    d = embeddings[0].shape[1]
    separate = {m: float(np.mean([p[m] for p in per_model])) for m in per_model[0]}
    normalized = [torch.nn.functional.normalize(e.float(), dim=1) if normalize else e.float() for e in embeddings]
    concat = torch.cat(normalized, dim=1)
    if tester_normalize:
        concat = torch.nn.functional.normalize(concat, dim=1)
    concatenated = {m: float(v) for m, v in calculator.get_accuracy(concat, labels).items()}
    return {
        f"separate_{d}D": separate,
        f"concatenated_{concat.shape[1]}D": concatenated,
        "per_model": per_model,
    }
