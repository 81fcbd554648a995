"""torch.distributed wrapper for any PML-style loss, including losses that need extra per-sample tensors.

PML's ``utils.distributed.DistributedLossWrapper`` accepts only its own base classes and gathers only embeddings and
labels. This subclass accepts any loss module taking ``(embeddings, labels, ...)`` and also gathers the extra
per-sample tensors a loss declares (``XMLWrapper``'s histograms), with the same row order as the embeddings, so the
loss on every process equals the single-process loss on the gathered batch.
"""

import inspect

import torch
from pytorch_metric_learning.utils import distributed as pml_dist


def _gather_rows(tensor):
    """Local rows first (with their graph), then the other processes' rows in rank order (no graph) — PML's order."""
    others = pml_dist.all_gather(tensor)
    return tensor if others is None else torch.cat([tensor, others], dim=0)


class DistributedLossWrapper(pml_dist.DistributedLossWrapper):
    """Gather embeddings, labels and the loss's extra per-sample tensors across processes, then call the loss.

    Args:
        loss: any loss module whose forward takes ``(embeddings, labels, ...)``. If it has a method
            ``extra_tensors_for_gather(embeddings, **kwargs) -> dict`` (``XMLWrapper`` does), the tensors it returns
            ([N, ...] each) are gathered too and passed by keyword.
        efficient: PML's memory-saving mode (local embeddings against gathered references). Not available with
            extra tensors, because those losses need the whole gathered batch.

    ``forward(embeddings [N, d], labels [N], indices_tuple=None, ref_emb=None, ref_labels=None, **tensors)``
    returns ``world_size × loss(gathered batch)``, PML's convention that compensates DDP's gradient averaging.
    Outside an initialised process group it calls the loss unchanged.

    Raises:
        TypeError: if ``loss`` does not take ``(embeddings, labels)``.
        ValueError: ``efficient=True`` with a loss that has extra tensors; extra tensors with the wrong batch size.
    """

    def __init__(self, loss: torch.nn.Module, efficient: bool = False):
        torch.nn.Module.__init__(self)
        params = inspect.signature(loss.forward).parameters if isinstance(loss, torch.nn.Module) else {}
        if len(params) < 2:
            raise TypeError(f"loss must be a loss module taking (embeddings, labels, ...), got {type(loss).__name__}")
        if efficient and hasattr(loss, "extra_tensors_for_gather"):
            raise ValueError(f"efficient=True is not supported for {type(loss).__name__}: it needs the gathered batch")
        self.loss = loss
        self.efficient = efficient

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None, **tensors):
        if hasattr(self.loss, "extra_tensors_for_gather"):
            tensors = self.loss.extra_tensors_for_gather(embeddings, **tensors)
        for name, value in tensors.items():
            if torch.is_tensor(value) and value.shape[:1] != embeddings.shape[:1]:
                raise ValueError(f"{name} has {value.shape[0]} rows but embeddings has {embeddings.shape[0]}")
        world_size = torch.distributed.get_world_size() if pml_dist.is_distributed() else 1
        if world_size <= 1:
            return self._call(embeddings, labels, indices_tuple, ref_emb, ref_labels, tensors)
        if self.efficient:
            return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        all_emb, all_labels, all_ref_emb, all_ref_labels, _ = pml_dist.gather_emb_and_ref(
            embeddings, labels, ref_emb, ref_labels
        )
        gathered = {k: _gather_rows(v) if torch.is_tensor(v) else v for k, v in tensors.items()}
        return self._call(all_emb, all_labels, indices_tuple, all_ref_emb, all_ref_labels, gathered) * world_size

    def _call(self, embeddings, labels, indices_tuple, ref_emb, ref_labels, tensors):
        kwargs = {"indices_tuple": indices_tuple, "ref_emb": ref_emb, "ref_labels": ref_labels}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return self.loss(embeddings, labels, **kwargs, **tensors)
