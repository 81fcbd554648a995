"""Distributed evaluation: each rank embeds only its shard of an evaluation set, the embeddings are gathered once,
and the accuracy calculator splits its query blocks over the ranks (``distributed=True``).

Outside ``torch.distributed`` (or with one rank) everything is PML's ``GlobalEmbeddingSpaceTester``. Under
``torchrun`` every rank must call ``test`` (all-gather and all-reduce are collective); every rank then holds the
single-process accuracies.
"""

from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

from ..knn.chunked_accuracy_calculator import ChunkedAccuracyCalculator
from ..utils.sharded_embedding import ShardedEmbeddingMixin


class ShardedGlobalEmbeddingSpaceTester(ShardedEmbeddingMixin, GlobalEmbeddingSpaceTester):
    """PML's ``GlobalEmbeddingSpaceTester`` with sharded embedding under ``torch.distributed`` and, by default,
    :class:`~pml_extensions.knn.ChunkedAccuracyCalculator` (exact blocked engine, PML's default ``k=None``) with
    its query blocks split over the ranks. Same arguments and results as PML's tester.

    Example:
        >>> tester = ShardedGlobalEmbeddingSpaceTester(dataloader_num_workers=0)  # doctest: +SKIP
        >>> # under torchrun, on every rank:
        >>> tester.test({"val": val_dataset}, epoch, trunk, embedder)  # doctest: +SKIP
    """

    def initialize_accuracy_calculator(self):
        if self.accuracy_calculator is None:
            self.accuracy_calculator = ChunkedAccuracyCalculator(device=self.data_device, distributed=self.distributed)
