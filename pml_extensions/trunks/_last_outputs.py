"""Modules that keep tensors of their last forward pass (with the batch's graph) for a loss to read; a copy gets
``None`` in their place (deep-copying non-leaf tensors fails, pickling would write the batch's activations)."""

from typing import Tuple


class _KeepsLastOutputs:
    """Mixin, placed before ``torch.nn.Module`` in the bases: the attributes named in ``_last_outputs`` are left
    out of every copy (``__getstate__``, which ``copy``, ``pickle`` and ``torch.save`` use) and come back as
    ``None``; the original keeps them."""

    _last_outputs: Tuple[str, ...] = ()

    def __getstate__(self):
        state = super().__getstate__()
        for name in self._last_outputs:
            if name in state:
                state[name] = None
        return state
