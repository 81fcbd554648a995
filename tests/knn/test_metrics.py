"""Tests of :mod:`pml_extensions.knn.metrics`: the trapezoidal AP (moved here from the asymmetric calculator,
which imports it) and every metric of both calculators against a float64 brute force on the engine's float32 scores
(ties by reference index), on every engine path."""

import functools
import unittest

import numpy as np
import pytest
import torch

import pml_extensions.knn as knn
from pml_extensions.knn import AsymmetricAccuracyCalculator, ChunkedAccuracyCalculator
from pml_extensions.knn.engine import BlockedKNN
from pml_extensions.knn.metrics import trapezoidal_average_precision
from tests.knn import knn_brute_force as bf
from tests.knn.test_engine import near_tie_set


def test_trapezoidal_ap_is_exported_by_the_knn_room():
    assert knn.trapezoidal_average_precision is trapezoidal_average_precision


def test_no_import_cycle_between_the_calculators_and_knn_metrics():
    import ast
    import os

    path = os.path.join(os.path.dirname(knn.__file__), "metrics.py")
    imported = {
        node.module
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read()))
        if isinstance(node, ast.ImportFrom) and node.level == 1
    }
    assert imported == {"engine"}


class TestTrapezoidalAP(unittest.TestCase):
    def test_hand_made_rankings(self):
        rel = torch.tensor(
            [
                [1, 0, 1, 0],  # 2 relevant: (1+1)/2 and (1/2 + 2/3)/2 -> (1 + 7/12)/2 = 19/24
                [0, 1, 0, 0],  # 1 relevant at rank 2: (0/1 + 1/2)/2 = 1/4
                [1, 1, 0, 0],  # perfect: 1
                [0, 0, 0, 1],  # rank 4: (0 + 1/4)/2 = 1/8
                [1, 0, 1, 0],  # 3 relevant, one never retrieved: (1 + 7/12)/3 = 19/36
            ],
            dtype=torch.bool,
        )
        ap = trapezoidal_average_precision(rel, torch.tensor([2, 1, 2, 1, 3]))
        expected = torch.tensor([19 / 24, 1 / 4, 1.0, 1 / 8, 19 / 36], dtype=torch.float64)
        torch.testing.assert_close(ap, expected, rtol=0, atol=1e-15)

    def test_matches_cirtorch_style_loop(self):
        # the loop form of compute_ap (0-based ranks of the positives), written here from its definition
        def loop_ap(ranks, npos):
            ap = 0.0
            for j, r in enumerate(ranks):
                p0 = 1.0 if r == 0 else j / r
                p1 = (j + 1) / (r + 1)
                ap += (p0 + p1) / (2 * npos)
            return ap

        rng = np.random.default_rng(0)
        rel = torch.tensor(rng.random((20, 15)) < 0.3)
        rel[:, 0] |= ~rel.any(dim=1)
        npos = rel.sum(dim=1) + torch.tensor(rng.integers(0, 2, 20))
        ap = trapezoidal_average_precision(rel, npos)
        for i in range(20):
            ranks = torch.where(rel[i])[0].tolist()
            self.assertAlmostEqual(ap[i].item(), loop_ap(ranks, int(npos[i])), places=12)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "num_relevant"):
            trapezoidal_average_precision(torch.ones(2, 3, dtype=torch.bool), torch.tensor([1, 0]))
        with self.assertRaisesRegex(ValueError, r"\[Nq, K\]"):
            trapezoidal_average_precision(torch.ones(3, dtype=torch.bool), torch.tensor([1]))


ALL = (
    "precision_at_1",
    "r_precision",
    "mean_average_precision_at_r",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "recall_at_1",
    "mean_average_precision_trapezoidal",
)
ENGINES = {
    "rows": dict(method="rows"),
    "threshold-fp32": dict(method="threshold", low_precision=False, block_size=48),
    "threshold-bf16": dict(method="threshold", low_precision=True, block_size=48),
}


def labelled_near_ties(seed=0):
    """The engine tests' near-tie set (scores within ~1e-7, exact duplicates, equal float32 scores) with labels
    mixed inside the cluster, so every metric depends on the order of near-ties and on the tie rule."""
    q, r = near_tie_set(seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.cat([q, r])
    return x, torch.randint(0, 4, (len(x),), generator=g)


def random_set(seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 6, (260,), generator=g)
    return torch.randn(6, 16, generator=g)[y] + 1.2 * torch.randn(260, 16, generator=g), y


class TestEveryMetricEqualsTheBruteForce:
    @pytest.mark.parametrize("engine", list(ENGINES))
    @pytest.mark.parametrize("data", [labelled_near_ties, random_set])
    @pytest.mark.parametrize("k", [None, 9, 20])
    def test_self_retrieval(self, engine, data, k):
        if k is None and engine != "rows":
            pytest.skip("k = every reference: only the rows method applies (tiles must hold 2k + 2 rows)")
        x, y = data()
        knn = BlockedKNN(**ENGINES[engine])
        want = bf.metrics(x, y, x, y, k=k, self_indices=torch.arange(len(x)), given=knn.float32_scores(x, x))
        got = AsymmetricAccuracyCalculator(include=ALL, k=k, knn_func=knn).get_accuracy(x, y)
        assert got == pytest.approx({m: want[m] for m in ALL}, rel=1e-12, abs=1e-12)
        if k is not None and engine != "rows":
            assert knn.last_plan["symmetric"]
        chunked = ChunkedAccuracyCalculator(include=ALL[:5], k=k, knn_func=BlockedKNN(**ENGINES[engine]))
        assert chunked.get_accuracy(x, y) == pytest.approx({m: want[m] for m in ALL[:5]}, rel=1e-12, abs=1e-12)

    @pytest.mark.parametrize("engine", list(ENGINES))
    @pytest.mark.parametrize("inner_product", [False, True])
    def test_query_set_and_own_rows_elsewhere(self, engine, inner_product):
        x, y = labelled_near_ties()
        q, ql, r, rl = x[:150], y[:150], x[100:], y[100:]
        dist = "inner_product" if inner_product else "euclidean"
        calc = AsymmetricAccuracyCalculator(include=ALL, k=12, knn_func=BlockedKNN(dist, **ENGINES[engine]))
        scores = calc.knn_func.float32_scores
        want = bf.metrics(q, ql, r, rl, k=12, given=scores(q, r))
        assert calc.get_accuracy(q, ql, r, rl) == pytest.approx({m: want[m] for m in ALL}, rel=1e-12, abs=1e-12)
        own = torch.arange(100, 150) - 100  # queries 100..149 are reference rows 0..49
        want = bf.metrics(x[100:150], y[100:150], r, rl, k=12, self_indices=own, given=scores(x[100:150], r))
        got = calc.get_accuracy(x[100:150], y[100:150], r, rl, self_indices=own)
        assert got == pytest.approx({m: want[m] for m in ALL}, rel=1e-12, abs=1e-12)

    def test_stage_seconds_cover_the_engine_and_the_metrics(self):
        x, y = random_set()
        calc = ChunkedAccuracyCalculator(
            include=("precision_at_1",), k=9, knn_func=BlockedKNN(**ENGINES["threshold-bf16"])
        )
        calc.get_accuracy(x, y)
        assert {"gemm", "selection", "rescore", "rank", "metrics"} <= set(calc.stage_seconds)


# ------------------------------------------------------------------ k below what a metric needs: PML's warning
TRUNCATING = ("mean_average_precision_at_r", "r_precision")


def _two_thousand_in_ten_classes():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2000, 32, generator=g), torch.randint(0, 10, (2000,), generator=g)


@functools.lru_cache(maxsize=1)
def _map_at_r_brute_force() -> float:
    """MAP@R of :func:`_two_thousand_in_ten_classes` by the float64 brute force on the engine's float32 scores."""
    x, y = _two_thousand_in_ten_classes()
    k = int(torch.bincount(y).max()) - 1  # every relevant neighbour of every query
    given = BlockedKNN().float32_scores(x, x)
    return bf.metrics(x, y, x, y, k=k, self_indices=torch.arange(2000), given=given)["mean_average_precision_at_r"]


def _k_warnings(records):
    return [r.getMessage() for r in records if r.levelname == "WARNING" and "max bin count" in r.getMessage()]


@pytest.mark.parametrize("calculator", [ChunkedAccuracyCalculator, AsymmetricAccuracyCalculator])
class TestKBelowTheMaxBinCount:
    """``k=10`` on 2,000 points in 10 classes truncates MAP@R and R-precision at 10 neighbours; PML warns (``k (10)
    is less than the max bin count (222) ...``) and so must the calculators, on the call that computes them. They
    used to stay silent: the warning read the PREVIOUS call's metric list."""

    def test_a_truncated_map_at_r_warns_in_pml_words(self, calculator, caplog):
        x, y = _two_thousand_in_ten_classes()
        max_bin = int(torch.bincount(y).max())
        with caplog.at_level("INFO", logger="PML"):
            truncated = calculator(k=10).get_accuracy(x, y)  # every metric, NMI and AMI included
        (warning,) = _k_warnings(caplog.records)
        assert f"but the value for k (10) is less than the max bin count ({max_bin}) so the values for these" in warning
        assert "metrics will be incorrect" in warning and "mean_average_precision_at_r" in warning
        # the right value: every neighbour a MAP@R needs (k = max bin count), equal to the float64 brute force on
        # the engine's float32 scores; the truncated one is far below it
        caplog.clear()
        with caplog.at_level("INFO", logger="PML"):
            right = calculator(k="max_bin_count", include=("mean_average_precision_at_r",)).get_accuracy(x, y)
        assert _k_warnings(caplog.records) == []
        assert right["mean_average_precision_at_r"] == pytest.approx(_map_at_r_brute_force(), rel=1e-12, abs=1e-15)
        assert right["mean_average_precision_at_r"] == pytest.approx(0.012834426965452870, rel=1e-12)
        assert truncated["mean_average_precision_at_r"] == pytest.approx(0.0017762369958011566, rel=1e-12)

    @pytest.mark.parametrize("first, second", [(("precision_at_1",), TRUNCATING), (TRUNCATING, ("precision_at_1",))])
    def test_a_reused_calculator_warns_on_the_call_that_computes_the_metric(self, calculator, caplog, first, second):
        x, y = _two_thousand_in_ten_classes()
        calc = calculator(k=10)
        for include in (first, second):
            caplog.clear()
            with caplog.at_level("WARNING", logger="PML"):
                calc.get_accuracy(x[:400], y[:400], include=include)
            assert len(_k_warnings(caplog.records)) == (include == TRUNCATING), include

    def test_clustering_metrics_in_the_same_call_keep_the_warning(self, calculator, caplog):
        x, y = _two_thousand_in_ten_classes()
        with caplog.at_level("WARNING", logger="PML"):
            calculator(k=10, include=("NMI", "r_precision")).get_accuracy(x[:400], y[:400])
        assert len(_k_warnings(caplog.records)) == 1
