"""A frozen trunk prefix that stays frozen when a trainer calls ``trunk.train()``."""

import torch


class FrozenPrefix(torch.nn.Module):
    """Runs ``prefix`` in eval mode and without gradients, whatever mode the enclosing model is put in.

    PML's trainers call ``models["trunk"].train()`` every epoch, which would put a frozen prefix's BatchNorm layers
    back on batch statistics. Wrapped, the prefix keeps its statistics and parameters, so
    ``Sequential(FrozenPrefix(prefix), rest)`` computes what ``rest`` trained on cached prefix outputs
    (:class:`pml_extensions.datasets.CachedFeatureDataset`) computes: the feature cache's uncached baseline.

    Args:
        prefix: the frozen part (e.g. the first half of :func:`pml_extensions.trunks.split_trunk`); its parameters
            get ``requires_grad=False`` and it is put in eval mode.

    ``forward(x) -> prefix(x)`` under ``torch.no_grad()`` (the output does not require grad).

    Example::

        >>> prefix = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
        >>> model = torch.nn.Sequential(FrozenPrefix(prefix), torch.nn.Flatten()).train()
        >>> prefix.training, model(torch.randn(2, 3, 1, 1)).requires_grad
        (False, False)
    """

    def __init__(self, prefix: torch.nn.Module):
        super().__init__()
        if not isinstance(prefix, torch.nn.Module):
            raise TypeError(f"prefix must be a torch.nn.Module, got {type(prefix).__name__}")
        self.prefix = prefix
        self.prefix.requires_grad_(False)
        self.prefix.eval()

    def train(self, mode: bool = True) -> "FrozenPrefix":
        """Sets this wrapper's flag only; the prefix stays in eval mode."""
        self.training = bool(mode)
        self.prefix.eval()
        return self

    def forward(self, x):
        with torch.no_grad():
            return self.prefix(x)
