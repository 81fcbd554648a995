"""benchmarks/protocols/template_block/data.py: the per-class split (counts or cumulative fractions, a fixed draw) and
the views the Builder makes of it."""

import numpy as np
import pytest

from benchmarks.protocols.template_block.data import per_class_split
from pml_extensions.runner.errors import ConfigError


def test_counts_per_class_follow_one_randomstate_class_by_class():
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 2, 2, 2, 2])
    tr, va, te = per_class_split(labels, {"train": 2, "val": 1, "seed": 7})
    rng = np.random.RandomState(7)
    want = [rng.permutation(np.flatnonzero(labels == c)) for c in (0, 1, 2)]
    assert tr.tolist() == [i for p in want for i in p[:2]]
    assert va.tolist() == [i for p in want for i in p[2:3]]
    assert te.tolist() == [i for p in want for i in p[3:]]
    assert len(set(tr) | set(va) | set(te)) == len(labels)  # disjoint and complete
    _, _, te = per_class_split(labels, {"train": 2, "val": 1, "test": 1, "seed": 7})
    assert te.tolist() == [i for p in want for i in p[3:4]]


def test_fractions_cut_at_the_rounded_cumulative_fraction():
    labels = np.repeat([0, 1], 7)
    tr, va, te = per_class_split(labels, {"train": 0.6, "val": 0.2, "seed": 0})
    # 7 images per class: round(0.6 * 7) = 4 training, round(0.8 * 7) = 6 -> 2 validation, 1 test
    assert (len(tr), len(va), len(te)) == (8, 4, 2)


@pytest.mark.parametrize(
    "split, message",
    [
        ({"train": 5, "val": 1}, r"^config: split: 6 images per class asked, class 0 has 5"),
        ({"train": 2, "val": 0.5}, "all positive ints"),
        ({"train": 0.9, "val": 0.2}, "add up to"),
        ({"train": 2}, "needs train and val"),
        ({"train": 1, "val": 1, "sead": 1}, r"unknown keys \['sead'\]"),
    ],
)
def test_bad_splits_are_named(split, message):
    with pytest.raises(ConfigError, match=message):
        per_class_split(np.repeat([0, 1], 5), split)
