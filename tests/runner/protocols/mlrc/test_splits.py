"""runner/protocols/mlrc/runner.py: the class-disjoint MLRC split and the separate / concatenated test numbers."""

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from pml_extensions.runner.protocols.mlrc import ensemble_metrics, mlrc_class_splits


class TestSplit:
    @pytest.mark.parametrize("num_classes", [16, 62, 100, 200, 101])
    def test_folds_disjoint_union_first_half_test_second_half(self, num_classes):
        labels = np.repeat(np.arange(num_classes) * 3 + 7, 2)  # non-contiguous label values
        np.random.RandomState(0).shuffle(labels)
        s = mlrc_class_splits(labels)
        classes = sorted(set(labels.tolist()))
        half = num_classes // 2  # an odd count gives the extra class to the test half
        assert s["test"] == classes[half:]
        assert s["trainval"] == classes[:half]
        vals = [set(f["val"]) for f in s["folds"]]
        assert len(vals) == 4
        for i, f in enumerate(s["folds"]):
            assert set(f["train"]).isdisjoint(f["val"])  # class-disjoint train/val
            assert set(f["train"]) | set(f["val"]) == set(classes[:half])
            for j in range(i):
                assert vals[i].isdisjoint(vals[j])  # the 4 val partitions are disjoint
        assert set().union(*vals) == set(classes[:half])  # ... and cover the first half
        assert max(len(v) for v in vals) - min(len(v) for v in vals) <= 1

    def test_hand_example(self):
        # 8 classes 0..7: test = 4..7; partitions of 0..3 are {0},{1},{2},{3} -> needs 2 per fold, so use 2
        # folds
        s = mlrc_class_splits(np.arange(8), num_training_partitions=2)
        assert s["test"] == [4, 5, 6, 7]
        assert s["folds"] == [{"train": [2, 3], "val": [0, 1]}, {"train": [0, 1], "val": [2, 3]}]

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"test_size": 1.5}, "fractions"),
            ({"test_size": 0.0}, "at least 2"),
            ({"num_training_partitions": 9}, "partitions"),
        ],
    )
    def test_errors(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            mlrc_class_splits(np.arange(16), **kwargs)


class TestEnsembleMetrics:
    def test_concatenation_uses_l2_normalised_parts(self):
        calc = AccuracyCalculator(
            include=("precision_at_1", "mean_average_precision_at_r"),
            k="max_bin_count",
            device=torch.device("cpu"),
        )
        g = torch.Generator().manual_seed(0)
        labels = torch.arange(6).repeat_interleave(5)
        good = torch.nn.functional.one_hot(labels, 6).float() + 0.1 * torch.randn(30, 6, generator=g)
        bad = torch.randn(30, 6, generator=g)
        out = ensemble_metrics([1000.0 * bad, good], labels, calc)
        n = torch.nn.functional.normalize
        want = calc.get_accuracy(torch.cat([n(bad, dim=1), n(good, dim=1)], dim=1), labels)
        assert out["concatenated_12D"] == pytest.approx(want)
        sep = [calc.get_accuracy(e, labels) for e in (1000.0 * bad, good)]  # each model as the tester returned it
        assert out["separate_6D"]["precision_at_1"] == pytest.approx(
            (sep[0]["precision_at_1"] + sep[1]["precision_at_1"]) / 2
        )
        # without normalisation the 1000x model would dominate the concatenation
        raw = calc.get_accuracy(torch.cat([1000.0 * bad, good], dim=1), labels)
        assert out["concatenated_12D"]["precision_at_1"] > raw["precision_at_1"]

    def test_the_tester_setting_applies_to_each_model_and_to_the_concatenation(self):
        """PB tests each fold model with the tester's normalize_embeddings (false here: raw rows) and normalises the
        concatenation again when the tester does; the ensemble's setting only acts on the parts."""
        calc = AccuracyCalculator(include=("precision_at_1",), k=1, device=torch.device("cpu"))
        labels = torch.tensor([0, 0, 1, 1])
        # raw rows: the long row 3 is closest to row 0 by L2, normalised rows pair 0-1 and 2-3
        e = torch.tensor([[1.0, 0.1], [1.0, 0.3], [0.2, 1.0], [3.0, 0.4]])
        out = ensemble_metrics([e], labels, calc, normalize=False)
        assert out["separate_2D"]["precision_at_1"] == calc.get_accuracy(e, labels)["precision_at_1"]
        normed = ensemble_metrics([e], labels, calc, normalize=True)["concatenated_2D"]["precision_at_1"]
        n = torch.nn.functional.normalize
        assert normed == calc.get_accuracy(n(e, dim=1), labels)["precision_at_1"]

    def test_errors(self):
        with pytest.raises(ValueError):
            ensemble_metrics([], torch.zeros(3), None)
        with pytest.raises(ValueError):
            ensemble_metrics([torch.zeros(3, 2), torch.zeros(3, 4)], torch.zeros(3), None)
