"""Distributed evaluation: each rank embeds its shard of an evaluation set, the embeddings are gathered once, and the
accuracy calculator splits its query blocks over the ranks (every rank must call ``test``).
"""

from pytorch_metric_learning.testers import GlobalEmbeddingSpaceTester

from ..knn.chunked_accuracy_calculator import ChunkedAccuracyCalculator
from ..utils.sharded_embedding import ShardedEmbeddingMixin


class ShardedGlobalEmbeddingSpaceTester(ShardedEmbeddingMixin, GlobalEmbeddingSpaceTester):
    """PML's ``GlobalEmbeddingSpaceTester`` with sharded embedding under ``torch.distributed`` and, by default,
    :class:`~pml_extensions.knn.ChunkedAccuracyCalculator` (exact, PML's default ``k=None``) with its query blocks split
    over the ranks; every rank then holds the single-process accuracies. Outside ``torch.distributed`` it is PML's.

    Example:
        >>> tester = ShardedGlobalEmbeddingSpaceTester(dataloader_num_workers=0)  # doctest: +SKIP
        >>> tester.test({"val": val_dataset}, epoch, trunk, embedder)  # under torchrun, every rank  # doctest: +SKIP
    """

    def initialize_accuracy_calculator(self):
        if self.accuracy_calculator is None:
            self.accuracy_calculator = ChunkedAccuracyCalculator(device=self.data_device, distributed=self.distributed)
