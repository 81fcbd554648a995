"""torch.distributed wrapper for any PML-style loss, including losses that need extra per-sample tensors (PML's
accepts only its own base classes, gathers only embeddings and labels, and puts each process's own rows first).
"""

import inspect

import torch
from pytorch_metric_learning.utils import distributed as pml_dist


def _has_memory_bank(loss: torch.nn.Module) -> bool:
    """A cross-batch memory (PML's ``CrossBatchMemory`` or alike) anywhere inside ``loss``."""
    return any(torch.is_tensor(getattr(m, "embedding_memory", None)) for m in loss.modules())


def _gather_in_rank_order(tensor):
    """``(every process's rows in rank order, sizes)``; this process's rows are ``tensor`` itself, with its graph."""
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    size = torch.tensor([tensor.shape[0]], dtype=torch.long, device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    torch.distributed.all_gather(sizes, size)
    sizes = [int(s) for s in sizes]
    padding = (0, 0) * (tensor.ndim - 1) + (0, max(sizes) - tensor.shape[0])  # zero rows up to the longest
    padded = torch.nn.functional.pad(tensor.detach(), padding)
    parts = [torch.empty_like(padded) for _ in range(world)]
    torch.distributed.all_gather(parts, padded.contiguous())
    parts = [part[:n] for part, n in zip(parts, sizes)]
    parts[rank] = tensor
    return torch.cat(parts, dim=0), sizes


def _own_first_to_rank_order(sizes, rank, device):
    """Position in the rank-order batch of each row of PML's own-rows-first batch."""
    order, start, end = torch.arange(sum(sizes), device=device), sum(sizes[:rank]), sum(sizes[: rank + 1])
    return torch.cat([order[start:end], order[:start], order[end:]])


def _remap_indices_tuple(indices_tuple, emb_map, ref_map):
    """A mined tuple of PML's own-rows-first batch renumbered to the rank-order batch."""
    if indices_tuple is None:
        return None
    maps = {3: (emb_map, ref_map, ref_map), 4: (emb_map, ref_map, emb_map, ref_map)}.get(len(indices_tuple))
    if maps is None:
        raise ValueError(f"indices_tuple must have 3 or 4 elements, got {len(indices_tuple)}")
    return tuple(m[t.to(m.device)] for m, t in zip(maps, indices_tuple))


class DistributedLossWrapper(pml_dist.DistributedLossWrapper):
    """Gather embeddings, labels and the loss's extra per-sample tensors across processes in rank order, then call the
    loss: every process calls it on the single-process batch, so stateful losses (``CrossBatchMemory``) stay equal on
    every process.

    Args:
        loss: any loss module whose forward takes ``(embeddings, labels, ...)``. If it has a method
            ``extra_tensors_for_gather(embeddings, **kwargs) -> dict`` (``XMLWrapper`` does), the tensors it returns
            ([N, ...] each) are gathered too and passed by keyword.
        efficient: PML's memory-saving mode (local embeddings against gathered references); not with extra tensors
            or a memory bank, which need the whole gathered batch.

    ``forward(embeddings [N, d], labels [N], indices_tuple=None, ref_emb=None, ref_labels=None, **tensors)`` returns
    ``world_size × loss(gathered batch)`` (PML's convention against DDP's gradient averaging); local batch sizes may
    differ; ``indices_tuple`` follows PML's own-rows-first convention and is renumbered. Outside an initialised process
    group it calls the loss unchanged.

    Raises:
        TypeError: if ``loss`` does not take ``(embeddings, labels)``.
        ValueError: ``efficient=True`` with a loss that has extra tensors or a memory bank; extra tensors with the
            wrong batch size.
    """

    def __init__(self, loss: torch.nn.Module, efficient: bool = False):
        torch.nn.Module.__init__(self)
        params = inspect.signature(loss.forward).parameters if isinstance(loss, torch.nn.Module) else {}
        if len(params) < 2:
            raise TypeError(f"loss must be a loss module taking (embeddings, labels, ...), got {type(loss).__name__}")
        if efficient and hasattr(loss, "extra_tensors_for_gather"):
            raise ValueError(f"efficient=True is not supported for {type(loss).__name__}: it needs the gathered batch")
        if efficient and _has_memory_bank(loss):
            raise ValueError(
                f"efficient=True is not supported for {type(loss).__name__}: its memory bank must see the gathered "
                "batch, the same on every process"
            )
        self.loss = loss
        self.efficient = efficient

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None, **tensors):
        if hasattr(self.loss, "extra_tensors_for_gather"):
            # the loss's own per-sample tensors (histograms...) replace what it takes of the keywords; the others
            # (e.g. CrossBatchMemory's enqueue_mask) are gathered as they are
            takes = inspect.signature(self.loss.extra_tensors_for_gather).parameters
            given = {k: tensors.pop(k) for k in list(tensors) if k in takes and k != "embeddings"}
            tensors.update(self.loss.extra_tensors_for_gather(embeddings, **given))
        for name, value in tensors.items():
            if torch.is_tensor(value) and value.shape[:1] != embeddings.shape[:1]:
                raise ValueError(f"{name} has {value.shape[0]} rows but embeddings has {embeddings.shape[0]}")
        world_size = torch.distributed.get_world_size() if pml_dist.is_distributed() else 1
        if world_size <= 1:
            return self._call(embeddings, labels, indices_tuple, ref_emb, ref_labels, tensors)
        if self.efficient:
            return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        rank, device = torch.distributed.get_rank(), embeddings.device
        all_emb, sizes = _gather_in_rank_order(embeddings)
        all_labels = None if labels is None else _gather_in_rank_order(labels.to(device))[0]
        emb_map = _own_first_to_rank_order(sizes, rank, device)
        all_ref_emb = all_ref_labels = None
        ref_map = emb_map
        if ref_emb is not None:
            all_ref_emb, ref_sizes = _gather_in_rank_order(ref_emb)
            all_ref_labels = None if ref_labels is None else _gather_in_rank_order(ref_labels.to(device))[0]
            ref_map = _own_first_to_rank_order(ref_sizes, rank, device)
        indices_tuple = _remap_indices_tuple(indices_tuple, emb_map, ref_map)
        gathered = {k: _gather_in_rank_order(v)[0] if torch.is_tensor(v) else v for k, v in tensors.items()}
        return self._call(all_emb, all_labels, indices_tuple, all_ref_emb, all_ref_labels, gathered) * world_size

    def _call(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, tensors):
        kwargs = {"indices_tuple": indices_tuple, "ref_emb": ref_emb, "ref_labels": ref_labels}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return self.loss(embeddings, labels, **kwargs, **tensors)
