"""Pinned-memory batches and non-blocking host-to-device copies for PML trainers on CUDA (PML's build their DataLoader
with ``pin_memory=False`` and copy every batch with a blocking ``.to``); on CPU nothing changes.
"""

import torch
from pytorch_metric_learning.utils import common_functions as c_f


def to_data_device(data: torch.Tensor, device, dtype=None) -> torch.Tensor:
    """``data`` on ``device`` (non-blocking copy when it is a CUDA device), cast to ``dtype`` when given."""
    device = torch.device(device)
    if data.device != device:
        data = data.to(device, non_blocking=device.type == "cuda")
    return data if dtype is None else c_f.to_dtype(data, dtype=dtype)


class _PinnedMemoryMixin:
    """Put first in a PML trainer's bases: ``class T(_PinnedMemoryMixin, MetricLossOnly)``."""

    def _pins(self) -> bool:
        return self.data_device is not None and torch.device(self.data_device).type == "cuda"

    def initialize_dataloader(self):
        super().initialize_dataloader()
        if self._pins() and not self.dataloader.pin_memory:
            self.dataloader.pin_memory = True
            self.dataloader_iter = iter(self.dataloader)  # the first iterator was made before the switch

    def get_trunk_output(self, data):
        return self.models["trunk"](to_data_device(data, self.data_device, self.dtype))
