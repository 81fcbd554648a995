"""Sharded embedding for PML testers under ``torch.distributed``: each rank embeds only its contiguous shard of an
evaluation set and the rows are all-gathered once, in dataset order (used by
``testers.ShardedGlobalEmbeddingSpaceTester`` and ``testers.AsymmetricTester``). Outside ``torch.distributed`` (or
with one rank) nothing changes.
"""

import torch
from pytorch_metric_learning.utils import common_functions as c_f


def _world():
    d = torch.distributed
    if d.is_available() and d.is_initialized() and d.get_world_size() > 1:
        return d.get_rank(), d.get_world_size()
    return 0, 1


def shard_bounds(n: int, rank: int, world_size: int):
    """Contiguous shard ``[lo, hi)`` of ``n`` items for ``rank`` of ``world_size`` (sizes differ by at most 1)."""
    return rank * n // world_size, (rank + 1) * n // world_size


def all_gather_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """The ``[hi - lo, ...]`` shards (:func:`shard_bounds`) of all ranks, concatenated in rank order: ``[n, ...]``.

    Shards are padded to ``ceil(n / world_size)`` rows for ``all_gather`` (one call). Collective: every rank calls it.
    """
    rank, world = _world()
    if world == 1:
        return x
    width = -(-n // world)
    padded = x.new_zeros((width,) + tuple(x.shape[1:]))
    padded[: len(x)] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    torch.distributed.all_gather(parts, padded)
    return torch.cat([p[: hi - lo] for p, (lo, hi) in zip(parts, (shard_bounds(n, r, world) for r in range(world)))])


class ShardedEmbeddingMixin:
    """Mixin for a PML ``BaseTester``: ``compute_all_embeddings`` embeds only this rank's contiguous shard and
    all-gathers the rows once (returned in dataset order, so PCA/normalisation and the metrics see the full set).
    Sets with fewer items than ranks are embedded whole on every rank.

    ``distributed=False`` (keyword of the tester) makes the tester rank-local: it embeds whole sets and calls no
    collective, for protocols whose ranks evaluate different models (e.g. the resolution protocol's dealt seeds).
    """

    def __init__(self, *args, distributed: bool = True, **kwargs):
        self.distributed = bool(distributed)
        super().__init__(*args, **kwargs)

    def get_all_embeddings_for_all_splits(self, dataset_dict, trunk_model, embedder_model, splits, collate_fn):
        # PML passes list(set(...)): its order differs between processes, the collectives need one order
        return super().get_all_embeddings_for_all_splits(
            dataset_dict, trunk_model, embedder_model, sorted(splits), collate_fn
        )

    def compute_all_embeddings(self, dataloader, trunk_model, embedder_model):
        rank, world = _world() if self.distributed else (0, 1)
        n = len(dataloader.dataset)
        if world == 1 or n < world:
            return super().compute_all_embeddings(dataloader, trunk_model, embedder_model)
        lo, hi = shard_bounds(n, rank, world)
        shard = c_f.get_eval_dataloader(
            torch.utils.data.Subset(dataloader.dataset, range(lo, hi)),
            self.batch_size,
            self.dataloader_num_workers,
            dataloader.collate_fn,
        )
        embeddings, labels = super().compute_all_embeddings(shard, trunk_model, embedder_model)
        return all_gather_rows(embeddings, n), all_gather_rows(labels, n)
