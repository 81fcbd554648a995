"""Modules that keep tensors of their last forward pass for a loss to read (:class:`HistogramPooling`'s
``last_histograms`` / ``last_pooled``, :class:`TemplateMatchingBlock`'s ``last_class_scores`` / ``last_mixing``).

Those tensors carry the batch's autograd graph, so a copy (``copy.deepcopy``, ``pickle``, ``torch.save``,
``AveragedModel``) gets ``None`` in their place, as a module that has not run yet: deep-copying them would fail
(non-leaf tensors) and pickling would write the batch's activations. They were never in ``state_dict``.
"""

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
