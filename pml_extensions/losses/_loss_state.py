"""Helpers of :class:`pml_extensions.losses.XMLWrapper`: call a wrapped loss without changing its state."""

from contextlib import contextmanager

import torch


@contextmanager
def _state_left_untouched(module: torch.nn.Module):
    """Run a block that calls ``module`` without letting it change the module's state: every buffer (memory banks,
    running statistics, counters) is swapped for a clone during the block and the originals put back afterwards
    (the originals are never written, so a graph that saved them stays valid), and plain number/bool attributes
    (queue positions, call counters, recorded statistics) get their values back."""
    saved_buffers, saved_numbers = [], []
    for sub in module.modules():
        for name, buf in sub._buffers.items():
            if buf is not None:
                saved_buffers.append((sub, name, buf))
                sub._buffers[name] = buf.clone()
        numbers = {k: v for k, v in vars(sub).items() if isinstance(v, (bool, int, float)) and not k.startswith("__")}
        saved_numbers.append((sub, numbers))
    try:
        yield
    finally:
        for sub, name, buf in saved_buffers:
            sub._buffers[name] = buf
        for sub, numbers in saved_numbers:
            for key, value in numbers.items():
                setattr(sub, key, value)


def _is_memory_wrapper(loss: torch.nn.Module) -> bool:
    """A cross-batch memory loss (PML's ``CrossBatchMemory`` or alike): a memory-bank buffer around a wrapped loss."""
    return isinstance(getattr(loss, "loss", None), torch.nn.Module) and torch.is_tensor(
        getattr(loss, "embedding_memory", None)
    )
