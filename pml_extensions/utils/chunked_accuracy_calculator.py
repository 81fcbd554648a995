"""PML's ``AccuracyCalculator`` with the k-nearest-neighbour step done in query chunks.

With ``k="max_bin_count"`` the stock calculator searches ``k`` neighbours for every query at once and keeps
``[N, k]`` distances, indices, labels and relevance masks: for 100k embeddings in 6 classes k ≈ 16.7k, i.e.
tens of GiB (reported on PML's tracker, ``KevinMusgrave/pytorch-metric-learning``, "AccuracyCalculator out of
memory with max_bin_count"). This subclass runs the same ``knn_func`` (faiss by default) on ``chunk_size``
queries at a time against the whole reference set, evaluates every k-NN metric on the chunk, and combines the
chunks exactly: each metric is a mean over queries (or a mean of per-class means with ``avg_of_avgs``), so
per-class sums and counts are accumulated and divided at the end. Peak memory is ``O(chunk_size · k)`` instead
of ``O(N · k)``.
"""

from typing import Dict

import torch
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import (
    AccuracyCalculator,
    get_label_match_counts,
    get_lone_query_labels,
)


class ChunkedAccuracyCalculator(AccuracyCalculator):
    """``AccuracyCalculator`` whose k-NN metrics are computed ``chunk_size`` queries at a time.

    Args:
        chunk_size: queries per k-NN search. Memory per chunk ≈ ``chunk_size · k · 24`` bytes plus the metric
        masks. Default 1024. *args, **kwargs: as for ``AccuracyCalculator`` (``include``, ``exclude``,
        ``avg_of_avgs``, ``return_per_class``, ``k``, ``label_comparison_fn``, ``device``, ``knn_func``,
            ``kmeans_func``).

    ``get_accuracy(query [N, D], query_labels [N], reference [M, D] = None, reference_labels [M] = None,
    ref_includes_query=False, include=(), exclude=()) -> {metric: float or per-class list}``, the same numbers
    as the stock calculator (up to float summation order). Labels must be 1-D. Clustering metrics (NMI, AMI)
    are not k-NN based and go through the stock code on all queries. A custom ``calculate_*`` k-NN metric must
    be a mean over queries (as all of PML's are) to be combined correctly.

    Raises:
        ValueError: if ``chunk_size`` < 1, labels are not 1-D, or lengths mismatch (as the stock calculator).
    """

    def __init__(self, *args, chunk_size: int = 1024, **kwargs):
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        super().__init__(*args, **kwargs)
        self.chunk_size = chunk_size

    def get_accuracy(
        self,
        query,
        query_labels,
        reference=None,
        reference_labels=None,
        ref_includes_query=False,
        include=(),
        exclude=(),
    ):
        if reference is None:
            reference, reference_labels, ref_includes_query = query, query_labels, True
        query, reference, query_labels, reference_labels = [
            c_f.numpy_to_torch(x).to(self.device).type(torch.float)
            for x in (query, reference, query_labels, reference_labels)
        ]
        if query_labels.ndim != 1 or reference_labels.ndim != 1:
            raise ValueError("ChunkedAccuracyCalculator needs 1-D query_labels and reference_labels")
        if len(query) != len(query_labels) or len(reference) != len(reference_labels):
            raise ValueError("embeddings and labels must have the same length")
        if ref_includes_query and not (
            torch.allclose(query, reference[: len(query)])
            and torch.equal(query_labels, reference_labels[: len(query)])
        ):
            raise ValueError(
                "When ref_includes_query is True, the first len(query) rows of reference must equal query"
            )

        metrics = list(self.get_function_dict(include, exclude))
        clustering = [m for m in metrics if m in self.requires_clustering()]
        knn_metrics = [m for m in metrics if m not in clustering]
        out: Dict[str, object] = {}
        if clustering:
            out.update(
                super().get_accuracy(
                    query, query_labels, reference, reference_labels, ref_includes_query, include=clustering
                )
            )
        if knn_metrics:
            out.update(
                self._chunked_knn_metrics(
                    query, query_labels, reference, reference_labels, ref_includes_query, knn_metrics
                )
            )
        self.curr_function_dict = self.get_function_dict(include, exclude)
        return {m: out[m] for m in metrics}

    def _chunked_knn_metrics(
        self, query, query_labels, reference, reference_labels, ref_includes_query, metrics
    ):
        function_dict = self.get_function_dict(include=metrics)
        self.curr_function_dict = function_dict
        label_counts = get_label_match_counts(query_labels, reference_labels, self.label_comparison_fn)
        _, not_lone = get_lone_query_labels(
            query_labels, label_counts, ref_includes_query, self.label_comparison_fn
        )
        num_k = self.determine_k(label_counts[1], len(reference), ref_includes_query)
        classes = torch.unique(query_labels[not_lone]) if bool(not_lone.any()) else query_labels.new_zeros(0)
        sums = {m: torch.zeros(len(classes), dtype=torch.float64) for m in metrics}
        counts = torch.zeros(len(classes), dtype=torch.float64)
        saved = (self.avg_of_avgs, self.return_per_class)
        self.avg_of_avgs, self.return_per_class = False, True
        try:
            for start in range(0, len(query), self.chunk_size):
                stop = min(start + self.chunk_size, len(query))
                mask = not_lone[start:stop]
                if not bool(mask.any()):
                    continue
                q = query[start:stop]
                if ref_includes_query:
                    # The stock k-NN removes each query's own row by position; keep positions global by
                    # searching
                    # the chunk against a reference whose first rows are this chunk.
                    ref = torch.cat([q, reference[:start], reference[stop:]])
                    ref_lab = torch.cat(
                        [reference_labels[start:stop], reference_labels[:start], reference_labels[stop:]]
                    )
                else:
                    ref, ref_lab = reference, reference_labels
                dist, idx = self.knn_func(q, num_k, ref, ref_includes_query)
                knn_labels = ref_lab[idx]
                q_lab = query_labels[start:stop]
                kwargs = {
                    "query": q,
                    "reference": ref,
                    "query_labels": q_lab,
                    "reference_labels": ref_lab,
                    "ref_includes_query": ref_includes_query,
                    "label_comparison_fn": self.label_comparison_fn,
                    "label_counts": label_counts,
                    "knn_labels": knn_labels,
                    "knn_distances": dist,
                    "lone_query_labels": None,
                    "not_lone_query_mask": mask,
                }
                chunk_classes, chunk_counts = torch.unique(q_lab[mask], return_counts=True)
                pos = torch.searchsorted(classes, chunk_classes)
                counts[pos] += chunk_counts.double().cpu()
                for m, fn in function_dict.items():
                    per_class = torch.tensor(fn(**kwargs), dtype=torch.float64)
                    sums[m][pos] += per_class * chunk_counts.double().cpu()
        finally:
            self.avg_of_avgs, self.return_per_class = saved
        result = {}
        for m in metrics:
            if len(classes) == 0:
                result[m] = [float("nan")] * len(label_counts[0]) if self.return_per_class else float("nan")
                continue
            per_class = sums[m] / counts
            if self.return_per_class:
                result[m] = per_class.tolist()
            elif self.avg_of_avgs:
                result[m] = float(per_class.mean())
            else:
                result[m] = float(sums[m].sum() / counts.sum())
        return result
