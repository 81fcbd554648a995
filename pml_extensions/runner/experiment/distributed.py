"""Running the runner under ``torchrun`` (docs/runner.md); outside it every function here is a no-op. Each rank takes
its slice of every global batch; the loss wrapper gathers them back (the one-process loss × ``world_size``)."""

import gc
import os
from typing import Any, Dict, Iterator, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def is_active() -> bool:
    """True inside an initialised process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_active() else 0


def world_size() -> int:
    return dist.get_world_size() if is_active() else 1


_current_rank, _current_world_size = rank, world_size


def is_main() -> bool:
    return rank() == 0


def init_from_env(backend: Optional[str] = None) -> bool:
    """Join torchrun's process group (``backend`` ``None``: nccl with CUDA, else gloo); True with several ranks."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    return is_active()


def barrier() -> None:
    if is_active():
        dist.barrier()


def broadcast_object(obj: Any = None, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank (collective: every rank calls it)."""
    if not is_active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any) -> list:
    """Every rank's ``obj`` in rank order (collective)."""
    if not is_active():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def shutdown() -> None:
    """Leave the process group: every rank waits (gloo aborts a rank whose peer left first), the unreferenced DDP
    wrappers are freed (their reducers hold the group)."""
    if not is_active():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


class DistributedBatchSliceSampler(torch.utils.data.Sampler):
    """Positions ``[r·b, (r+1)·b)`` (b = B/W) of every complete global batch of B that ``sampler`` (the same
    sequence on every rank) draws; ``rank`` and ``world_size`` default to the process group's."""

    def __init__(self, sampler, global_batch_size: int, rank: Optional[int] = None, world_size: Optional[int] = None):
        self.sampler = sampler
        self.world_size = _current_world_size() if world_size is None else int(world_size)
        self.rank = _current_rank() if rank is None else int(rank)
        if not (0 <= self.rank < self.world_size):
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if global_batch_size < 1 or global_batch_size % self.world_size:
            raise ValueError(
                "global_batch_size must be a positive multiple of "
                f"world_size={self.world_size}, got {global_batch_size}"
            )
        self.global_batch_size = int(global_batch_size)
        self.local_batch_size = self.global_batch_size // self.world_size

    def __iter__(self) -> Iterator[int]:
        batch = []
        lo, hi = self.rank * self.local_batch_size, (self.rank + 1) * self.local_batch_size
        for idx in self.sampler:
            batch.append(int(idx))
            if len(batch) == self.global_batch_size:
                yield from batch[lo:hi]
                batch = []

    def __len__(self) -> int:
        return (len(self.sampler) // self.global_batch_size) * self.local_batch_size


def wrap_losses(loss_funcs: Dict[str, torch.nn.Module]) -> Dict[str, torch.nn.Module]:
    """Each loss in ``DistributedLossWrapper`` when a process group is active."""
    if not is_active():
        return loss_funcs
    from ...utils.distributed_loss_wrapper import DistributedLossWrapper

    return {k: DistributedLossWrapper(v) for k, v in loss_funcs.items()}


def wrap_models(models: Dict[str, torch.nn.Module], device: torch.device) -> Dict[str, torch.nn.Module]:
    """``DistributedDataParallel`` around every model that has trainable parameters."""
    if not is_active():
        return models
    ids = [device.index] if device.type == "cuda" else None
    # static_graph: parameters reached only through a side output of the forward (HistogramPooling's prototypes,
    # whose gradient comes from XMLWrapper's histograms, not from the returned vector) are reduced once;
    # find_unused_parameters would mark them ready at forward time and again in backward.
    return {
        k: DDP(m, device_ids=ids, static_graph=True) if any(p.requires_grad for p in m.parameters()) else m
        for k, m in models.items()
    }


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DDP) else model
