"""PML's ``AccuracyCalculator`` on the blocked k-NN engine: exact metrics with memory bounded in N (why the stock
calculator runs out of memory, and how this one works: ``docs/evaluation.md``).
"""

from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from .metrics import EngineAccuracyMixin


class ChunkedAccuracyCalculator(EngineAccuracyMixin, AccuracyCalculator):
    """``AccuracyCalculator`` whose k-NN metrics run block by block on the exact torch engine.

    Args:
        chunk_size: query rows per block; None (default) derives it from ``memory_budget``. With a user
            ``knn_func`` (e.g. PML's ``FaissKNN``) the default is 1024.
        memory_budget: bytes per block of the default engine (default 512 MiB).
        distance: the default engine's distance: ``"euclidean"`` (default, as PML's ``FaissKNN``),
            ``"inner_product"`` or a PML distance object (see ``BlockedKNN``). Not with ``knn_func``.
        distributed: when True and ``torch.distributed`` is initialised with several ranks, the blocks are split
            over the ranks and the sums all-reduced; every rank must then call ``get_accuracy`` with the same
            inputs (e.g. gathered embeddings), and all get the single-process result.
        *args, **kwargs: as for ``AccuracyCalculator`` (``include``, ``exclude``, ``avg_of_avgs``,
            ``return_per_class``, ``k``, ``label_comparison_fn``, ``device``, ``knn_func``, ``kmeans_func``).
            ``device=None`` keeps the inputs' device.

    ``get_accuracy(query [N, D], query_labels [N] or [N, L], reference [M, D] = None, reference_labels = None,
    ref_includes_query=False, include=(), exclude=(), *, self_indices [N] long = None) -> {metric: float or
    per-class list}``: the numbers of the stock calculator (float32 round-off; stock PML drops the NEAREST
    neighbour when ``ref_includes_query``, this one drops the query's own row, the same unless duplicates).
    ``get_accuracy_multi`` evaluates several reference sets in one call. Every metric that is not NMI/AMI is a
    k-NN metric (MRR alone works). Ties: by distance, then by increasing reference index.

    k rule (all calculators of this package): ``k`` (an int, None = all references, or ``"max_bin_count"``, as
    PML) is clamped to the references available to a query: M, or M − 1 when its own row is excluded. An int ``k``
    below the largest class's reference count truncates ``mean_average_precision_at_r`` and ``r_precision``: the
    call that computes either logs PML's warning (logger ``"PML"``, level WARNING: "the value for k (10) is less
    than the max bin count (222) so the values for these metrics will be incorrect ..."), whatever an earlier call
    computed. Each call logs its k at INFO, as PML's ``FaissKNN`` does.

    Raises:
        ValueError: ``chunk_size`` not a positive int, embeddings not ``[n, D]`` with one D, labels not ``[n]`` /
            ``[n, L]`` of their embeddings' length, non-finite embeddings, ``ref_includes_query`` with a
            reference whose first rows are not the queries (without ``self_indices``), unknown metric names.

    Example:
        >>> import torch
        >>> calc = ChunkedAccuracyCalculator(include=("precision_at_1",), k="max_bin_count")
        >>> x = torch.tensor([[0.0], [0.1], [5.0], [5.2]]); y = torch.tensor([7, 7, 9, 9])
        >>> calc.get_accuracy(x, y)
        {'precision_at_1': 1.0}
    """
