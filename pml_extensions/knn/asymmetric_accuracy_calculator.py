"""PML ``AccuracyCalculator`` for asymmetric retrieval: queries and references embedded by different models.

Source: P. Suma and G. Tolias, WACV 2023, Sec. 5 (every test image a query against the whole test set; mAP, R@1).
Self-exclusion by index and the trapezoidal AP follow ``pavelsuma/raml`` (``lib/utils/evaluate.py``: the query's own
index is "junk"; ``compute_ap`` from ``filipradenovic/cnnimageretrieval-pytorch``), the AP written from its definition.
"""

from pytorch_metric_learning.utils.accuracy_calculator import (
    AccuracyCalculator,
    get_relevance_mask,
    maybe_get_avg_of_avgs,
    nan_accuracy,
    try_getting_not_lone_labels,
)

from .metrics import EngineAccuracyMixin, trapezoidal_average_precision

__all__ = ["AsymmetricAccuracyCalculator"]


class AsymmetricAccuracyCalculator(EngineAccuracyMixin, AccuracyCalculator):
    """``AccuracyCalculator`` whose query and reference sets may come from different models or resolutions.

    PML's ``ref_includes_query=True`` drops the nearest neighbour of every query and insists (``allclose``) that the
    query embeddings are the first rows of the reference. Both fail for teacher-student retrieval, where a query's
    own image is in the reference but embedded by another network (it need not be the nearest neighbour, and the
    rows differ). This subclass excludes each query's own image BY INDEX: ``self_indices[i]`` is the reference row of
    query i's image (default ``arange(Nq)`` when ``ref_includes_query=True``, i.e. PML's layout).

    The k-NN runs block by block on the exact engine :class:`~pml_extensions.knn.engine.BlockedKNN`; a user's
    ``knn_func`` (e.g. PML's ``FaissKNN``) is asked for k + 1 neighbours and the own row is removed by index.
    Labels stay integers; the k rule is ``ChunkedAccuracyCalculator``'s.

    All of PML's metrics keep their key names (``precision_at_1``, ``mean_average_precision_at_r``,
    ``mean_average_precision``, ``r_precision``, ``mean_reciprocal_rank``, ``NMI``, ``AMI``...), so
    ``HookContainer(primary_metric=...)`` works. Added metrics:

    - ``mean_average_precision_trapezoidal``: mAP of the retrieval literature (``compute_ap``), see
      :func:`trapezoidal_average_precision`. PML's ``mean_average_precision`` is the non-interpolated AP (mean of
      the precisions at the relevant ranks) - a different number.
    - ``recall_at_1``: fraction of (non-lone) queries whose top-ranked reference, self excluded, shares the query's
      label, the R@1 of the paper. It equals PML's ``precision_at_1`` and exists under the paper's name.

    Both mAPs cover the first k references (``k=None``, the default, ranks the whole reference set, as the paper).

    Args: as ``ChunkedAccuracyCalculator`` (``chunk_size``, ``memory_budget``, ``distance``, ``distributed`` and
    PML's arguments).

    ``get_accuracy(query [Nq, D], query_labels [Nq], reference [M, D] = None, reference_labels [M] = None,
    ref_includes_query=False, include=(), exclude=(), *, self_indices [Nq] long = None) -> {metric: float}``;
    ``get_accuracy_multi(query, query_labels, {name: (reference, reference_labels) or dict}) -> {name: {...}}``.
    NMI/AMI cluster the queries only, as in PML.

    Raises:
        ValueError: query and reference dimensions differ; embeddings and labels of different lengths;
            ``self_indices`` of the wrong length, out of range, repeated, or pointing at rows whose label differs
            from the query's; non-finite embeddings; an unknown metric name (as PML).

    Example:
        >>> import torch
        >>> calc = AsymmetricAccuracyCalculator(include=("recall_at_1",))
        >>> q = torch.tensor([[0.0], [5.0]]); ref = torch.tensor([[0.2], [5.1], [0.1]])
        >>> # query 1's only label-2 reference is its own image: it is lone and skipped, as in PML
        >>> own = torch.tensor([0, 1])
        >>> calc.get_accuracy(q, torch.tensor([1, 2]), ref, torch.tensor([1, 2, 1]), self_indices=own)
        {'recall_at_1': 1.0}
    """

    _require_query_rows = False

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

    calculate_recall_at_1._pml_extensions_builtin = True
    calculate_mean_average_precision_trapezoidal._pml_extensions_builtin = True
