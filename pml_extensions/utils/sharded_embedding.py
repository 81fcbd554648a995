"""Sharded embedding for PML testers under ``torch.distributed``: each rank embeds its contiguous shard of an
evaluation set and the rows are all-gathered once, in dataset order (one rank: nothing changes).
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
    """The ``[hi - lo, ...]`` shards of all ranks in rank order, ``[n, ...]`` (collective)."""
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
    """Mixin for a PML ``BaseTester``: ``compute_all_embeddings`` embeds this rank's shard and all-gathers the rows
    (sets with fewer items than ranks are embedded whole); ``distributed=False``: rank-local, no collective."""

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
