import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from pml_extensions.knn.chunked_accuracy_calculator import ChunkedAccuracyCalculator

CPU = torch.device("cpu")
KNN = (
    "mean_average_precision_at_r",
    "precision_at_1",
    "r_precision",
    "mean_average_precision",
    "mean_reciprocal_rank",
)


def blobs(n=300, d=8, classes=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g)
    return centers[labels] + 1.5 * torch.randn(n, d, generator=g), labels


class TestHandComputed:
    def test_one_dimensional_example(self):
        # 1-D points, labels A=0 at 0, 1, 10 and B=1 at 2, 11. Self excluded, R = class size - 1.
        # q=0 (A, R=2): neighbours 1(A) 2(B) -> P@1=1, MAP@R=(1/1)/2=0.5, R-prec=1/2
        # q=1 (A, R=2): neighbours 0(A) or 2(B) at distance 1 each; faiss keeps the lower index first -> 0(A),
        # 2(B)
        #               -> P@1=1, MAP@R=0.5, R-prec=0.5
        # q=10 (A, R=2): 11(B), 2(B) -> 0, 0, 0
        # q=2 (B, R=1): 1(A) -> 0, 0, 0
        # q=11 (B, R=1): 10(A) -> 0, 0, 0
        x = torch.tensor([[0.0], [1.0], [10.0], [2.0], [11.0]])
        y = torch.tensor([0, 0, 0, 1, 1])
        calc = ChunkedAccuracyCalculator(
            include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
            k="max_bin_count",
            device=CPU,
            chunk_size=2,
        )
        acc = calc.get_accuracy(x, y)
        assert acc["precision_at_1"] == pytest.approx(2 / 5)
        assert acc["mean_average_precision_at_r"] == pytest.approx(1 / 5)
        assert acc["r_precision"] == pytest.approx(1 / 5)


class TestEqualsStock:
    @pytest.mark.parametrize("extra", [{}, {"avg_of_avgs": True}, {"return_per_class": True}])
    @pytest.mark.parametrize("chunk_size", [1, 37, 1000])
    def test_compared_to_self(self, extra, chunk_size):
        x, y = blobs()
        y[-1] = 99  # a lone query: excluded from the k-NN metrics by both
        stock = AccuracyCalculator(include=KNN, k="max_bin_count", device=CPU, **extra).get_accuracy(x, y)
        chunked = ChunkedAccuracyCalculator(
            include=KNN, k="max_bin_count", device=CPU, chunk_size=chunk_size, **extra
        ).get_accuracy(x, y)
        assert chunked.keys() == stock.keys()
        for k in stock:
            assert chunked[k] == pytest.approx(stock[k], rel=1e-6, abs=1e-7), k

    def test_separate_reference_and_clustering(self):
        x, y = blobs(seed=1)
        stock = AccuracyCalculator(k="max_bin_count", device=CPU).get_accuracy(x[:100], y[:100], x[100:], y[100:])
        chunked = ChunkedAccuracyCalculator(k="max_bin_count", device=CPU, chunk_size=16).get_accuracy(
            x[:100], y[:100], x[100:], y[100:]
        )
        assert set(chunked) == set(stock) >= {"NMI", "AMI", "precision_at_1"}
        for k in stock:
            assert chunked[k] == pytest.approx(stock[k], rel=1e-6, abs=1e-7), k

    def test_fixed_k(self):
        x, y = blobs(seed=2)
        stock = AccuracyCalculator(include=("precision_at_1", "mean_average_precision"), k=5, device=CPU).get_accuracy(
            x, y
        )
        chunked = ChunkedAccuracyCalculator(
            include=("precision_at_1", "mean_average_precision"), k=5, device=CPU, chunk_size=50
        ).get_accuracy(x, y)
        assert chunked == pytest.approx(stock, rel=1e-6)


class TestErrors:
    @pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True])
    def test_chunk_size(self, chunk_size):
        with pytest.raises(ValueError, match="chunk_size"):
            ChunkedAccuracyCalculator(chunk_size=chunk_size)

    def test_three_dimensional_labels(self):
        with pytest.raises(ValueError, match="query_labels"):
            ChunkedAccuracyCalculator(device=CPU).get_accuracy(torch.zeros(4, 2), torch.zeros(4, 2, 1))

    def test_length_mismatch(self):
        with pytest.raises(ValueError, match="same length"):
            ChunkedAccuracyCalculator(device=CPU).get_accuracy(torch.zeros(4, 2), torch.zeros(3))
