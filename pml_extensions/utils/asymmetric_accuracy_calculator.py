"""PML ``AccuracyCalculator`` for asymmetric retrieval: queries and references embedded by different models.

Source: P. Suma and G. Tolias, WACV 2023, Sec. 5 (evaluation: every test image is a query against the whole test set,
mAP and R@1). Self-exclusion by index and the trapezoidal AP follow the protocol of ``pavelsuma/raml``
(``lib/utils/evaluate.py``, where the query's own index is "junk", and ``compute_ap`` inherited from
``filipradenovic/cnnimageretrieval-pytorch``). The trapezoidal AP here is written from its definition (area under
the precision-recall curve by the trapezoid rule), not ported.
"""

from typing import Optional

import torch
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils.accuracy_calculator import (
    AccuracyCalculator,
    get_label_match_counts,
    get_lone_query_labels,
    get_relevance_mask,
    maybe_get_avg_of_avgs,
    nan_accuracy,
    try_getting_not_lone_labels,
)


def trapezoidal_average_precision(is_relevant: torch.Tensor, num_relevant: torch.Tensor) -> torch.Tensor:
    """Average precision as the trapezoid-rule area under the precision-recall curve (retrieval literature).

    Walking down the ranking, every relevant item raises recall by ``1 / num_relevant``; the area of that step is
    its width times the mean of the precision just before the item and the precision at the item. For the c-th
    relevant item at 1-based rank k: ``p_before = (c − 1)/(k − 1)`` (1 when k = 1), ``p_at = c/k``, and
    ``AP = Σ (p_before + p_at) / (2 · num_relevant)``. Relevant items missing from the ranking add nothing.
    Example: relevance [1, 0, 1] with 2 relevant -> (1 + (1/2 + 2/3)/2)/2 = 19/24 (the non-interpolated AP is 5/6).

    Args:
        is_relevant: [Nq, K] bool, relevance of the K ranked references of each query (junk already removed).
        num_relevant: [Nq] int, number of relevant references of each query (> 0).

    Returns:
        [Nq] float64 AP in [0, 1].

    Raises:
        ValueError: if the shapes disagree or a query has ``num_relevant`` <= 0.
    """
    if is_relevant.ndim != 2 or num_relevant.ndim != 1 or num_relevant.shape[0] != is_relevant.shape[0]:
        raise ValueError(
            f"is_relevant must be [Nq, K] and num_relevant [Nq], got {tuple(is_relevant.shape)} and "
            f"{tuple(num_relevant.shape)}"
        )
    if bool((num_relevant <= 0).any()):
        raise ValueError("num_relevant must be > 0 for every query")
    rel = is_relevant.to(torch.float64)
    count = torch.cumsum(rel, dim=1)
    rank = torch.arange(1, rel.shape[1] + 1, dtype=torch.float64, device=rel.device).expand_as(rel)
    p_at = count / rank
    p_before = torch.where(rank > 1, (count - 1) / (rank - 1).clamp(min=1), torch.ones_like(rank))
    return ((p_before + p_at) * rel).sum(dim=1) / (2 * num_relevant.to(torch.float64))


class AsymmetricAccuracyCalculator(AccuracyCalculator):
    """``AccuracyCalculator`` whose query and reference sets may come from different models or resolutions.

    PML's ``ref_includes_query=True`` drops the nearest neighbour of every query and insists (``allclose``) that the
    query embeddings are the first rows of the reference. Both fail for teacher-student retrieval, where a query's
    own image is in the reference but embedded by another network (it need not be the nearest neighbour, and the
    rows differ). This subclass excludes each query's own image BY INDEX: ``self_indices[i]`` is the reference row of
    query i's image (default ``arange(Nq)`` when ``ref_includes_query=True``, i.e. PML's layout). It asks the
    ``knn_func`` for k + 1 neighbours and removes the query's own row when present, else the last one.

    All of PML's metrics keep their key names (``precision_at_1``, ``mean_average_precision_at_r``,
    ``mean_average_precision``, ``r_precision``, ``NMI``, ``AMI``...), so ``HookContainer(primary_metric=...)`` works.
    Added metrics:

    - ``mean_average_precision_trapezoidal``: mAP of the retrieval literature (``compute_ap``), see
      :func:`trapezoidal_average_precision`. PML's ``mean_average_precision`` is the non-interpolated AP (mean of
      the precisions at the relevant ranks) - a different number.
    - ``recall_at_1``: fraction of (non-lone) queries whose top-ranked reference, self excluded, shares the query's
      label, the R@1 of the paper. It equals PML's ``precision_at_1`` and exists under the paper's name.

    Both mAPs cover the first k references (``k=None``, the default, ranks the whole reference set, as the paper).
    With the same embeddings on both sides the numbers equal PML's stock ``AccuracyCalculator`` exactly.

    ``get_accuracy(query [Nq, D], query_labels [Nq], reference [M, D] = None, reference_labels [M] = None,
    ref_includes_query=False, include=(), exclude=(), *, self_indices [Nq] long = None) -> {metric: float}``.
    NMI/AMI cluster the queries only, as in PML.

    Raises:
        ValueError: query and reference dimensions differ; embeddings and labels of different lengths;
            ``self_indices`` of the wrong length, out of range, repeated, or pointing at rows whose label differs
            from the query's; an unknown metric name (as PML).
    """

    def requires_knn(self):
        return super().requires_knn() + ["mean_average_precision_trapezoidal", "recall_at_1"]

    def calculate_recall_at_1(self, **kwargs):
        return self.calculate_precision_at_1(**kwargs)

    def calculate_mean_average_precision_trapezoidal(
        self, knn_labels, query_labels, not_lone_query_mask, ref_includes_query, label_counts, **kwargs
    ):
        knn_labels, query_labels = try_getting_not_lone_labels(knn_labels, query_labels, not_lone_query_mask)
        if knn_labels is None:
            return nan_accuracy(label_counts[0], self.return_per_class)
        gt = query_labels[:, None]
        _, num_relevant = get_relevance_mask(knn_labels.shape[:2], gt, ref_includes_query, label_counts)
        ap = trapezoidal_average_precision(self.label_comparison_fn(gt, knn_labels), num_relevant)
        return maybe_get_avg_of_avgs(ap, gt, self.avg_of_avgs, self.return_per_class)

    def knn_excluding_self(
        self, query: torch.Tensor, k: int, reference: torch.Tensor, self_indices: torch.Tensor
    ) -> tuple:
        """k nearest references of each query with its own row ``self_indices[i]`` removed.

        Returns ``(distances [Nq, k], indices [Nq, k])`` in the ``knn_func``'s order and units.
        """
        k_plus = min(k + 1, reference.shape[0])
        distances, indices = self.knn_func(query, k_plus, reference, False)
        is_self = indices == self_indices.to(indices.device)[:, None]
        drop = is_self.clone()
        drop[:, -1] |= ~is_self.any(dim=1)
        keep = ~drop
        n = query.shape[0]
        return distances[keep].view(n, k_plus - 1), indices[keep].view(n, k_plus - 1)

    def get_accuracy(
        self,
        query,
        query_labels,
        reference=None,
        reference_labels=None,
        ref_includes_query=False,
        include=(),
        exclude=(),
        *,
        self_indices: Optional[torch.Tensor] = None,
    ):
        if reference is None:
            reference, reference_labels, ref_includes_query = query, query_labels, True
        query, reference, query_labels, reference_labels = [
            c_f.numpy_to_torch(x).to(self.device).type(torch.float)
            for x in [query, reference, query_labels, reference_labels]
        ]
        if len(query) != len(query_labels) or len(reference) != len(reference_labels):
            raise ValueError("embeddings and labels must have the same length")
        if query.ndim != 2 or reference.ndim != 2 or query.shape[1] != reference.shape[1]:
            raise ValueError(
                f"query [Nq, D] and reference [M, D] must have the same dimension D, got {tuple(query.shape)} and "
                f"{tuple(reference.shape)}"
            )
        exclude_self = bool(ref_includes_query) or self_indices is not None
        if exclude_self:
            self_indices = self._check_self_indices(self_indices, query_labels, reference_labels)

        self.curr_function_dict = self.get_function_dict(include, exclude)
        kwargs = {
            "query": query,
            "reference": reference,
            "query_labels": query_labels,
            "reference_labels": reference_labels,
            "ref_includes_query": exclude_self,
            "label_comparison_fn": self.label_comparison_fn,
        }
        if any(x in self.requires_knn() for x in self.get_curr_metrics()):
            label_counts = get_label_match_counts(query_labels, reference_labels, self.label_comparison_fn)
            lone_query_labels, not_lone_query_mask = get_lone_query_labels(
                query_labels, label_counts, exclude_self, self.label_comparison_fn
            )
            num_k = self.determine_k(label_counts[1], len(reference), exclude_self)
            if exclude_self:
                knn_distances, knn_indices = self.knn_excluding_self(query, num_k, reference, self_indices)
            else:
                knn_distances, knn_indices = self.knn_func(query, num_k, reference, False)
            if not any(not_lone_query_mask):
                c_f.LOGGER.warning("None of the query labels are in the reference set.")
            kwargs.update(
                label_counts=label_counts,
                knn_labels=reference_labels[knn_indices],
                knn_distances=knn_distances,
                knn_indices=knn_indices,
                lone_query_labels=lone_query_labels,
                not_lone_query_mask=not_lone_query_mask,
            )
        if any(x in self.requires_clustering() for x in self.get_curr_metrics()):
            kwargs["cluster_labels"] = self.get_cluster_labels(**kwargs)
        return self._get_accuracy(self.curr_function_dict, **kwargs)

    @staticmethod
    def _check_self_indices(self_indices, query_labels, reference_labels):
        n, m = len(query_labels), len(reference_labels)
        if self_indices is None:
            if n > m:
                raise ValueError(
                    f"ref_includes_query=True needs the {n} query images as the first reference rows, but the "
                    f"reference has only {m} rows; pass self_indices"
                )
            self_indices = torch.arange(n, device=query_labels.device)
        self_indices = torch.as_tensor(self_indices, device=query_labels.device)
        if self_indices.ndim != 1 or len(self_indices) != n or self_indices.is_floating_point():
            raise ValueError(f"self_indices must be a 1-D integer tensor of length {n} (one per query)")
        self_indices = self_indices.long()
        if n and (int(self_indices.min()) < 0 or int(self_indices.max()) >= m):
            raise ValueError(f"self_indices must lie in [0, {m}) (reference rows)")
        if len(torch.unique(self_indices)) != n:
            raise ValueError("self_indices must not repeat: each query has its own reference row")
        if not torch.equal(reference_labels[self_indices], query_labels):
            raise ValueError(
                "the reference rows named by self_indices have labels different from their queries; query i and "
                "reference row self_indices[i] must be the same image"
            )
        return self_indices
