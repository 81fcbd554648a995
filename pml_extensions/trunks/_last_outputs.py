"""Modules that keep tensors of their last forward pass for a loss to read.

:class:`~pml_extensions.trunks.HistogramPooling` keeps ``last_histograms`` and ``last_pooled`` for ``XMLWrapper``,
:class:`~pml_extensions.trunks.TemplateMatchingBlock` keeps ``last_class_scores`` and ``last_mixing`` for the
patch-classification loss. Those tensors carry the autograd graph of the batch they came from, so they are not
part of the module's state: a copy (``copy.deepcopy``, ``pickle``, ``torch.save`` of the whole module,
``torch.optim.swa_utils.AveragedModel``, ``soft_maximizer_swap(..., inplace=False)``) gets ``None`` in their place,
as a module that has not run yet. Copying them would fail (PyTorch deep-copies only graph leaves: "Only Tensors
created explicitly by the user (graph leaves) support the deepcopy protocol"), or, when pickled, write the batch's
activations into the file and tie the copy to a forward pass it did not compute. They were never in ``state_dict``.
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
