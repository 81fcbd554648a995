"""The MLRC embedder ``MLP: {layer_sizes: [128]}`` (powerful-benchmarker's ``MLP``, rewritten): the runner fills
``input_size`` with the trunk's output width, so ``[128]`` is one linear layer ``D_trunk -> 128``."""

from typing import Optional, Sequence

import torch


class MLP(torch.nn.Module):
    """Linear layers with ReLU between them.

    Args:
        layer_sizes: widths ``[in, h1, ..., out]``; a single ``[out]`` infers the input width at the first forward
            (``torch.nn.LazyLinear``).
        final_relu: also apply ReLU after the last layer (default ``False``, MLRC's).
        input_size: width of the input; prepended to ``layer_sizes`` when given.

    ``forward(x [N, in]) -> [N, out]``, float, same device/dtype as the weights.

    Raises:
        ValueError: if ``layer_sizes`` is empty or holds non-positive sizes.
    """

    def __init__(self, layer_sizes: Sequence[int], final_relu: bool = False, input_size: Optional[int] = None):
        super().__init__()
        sizes = ([] if input_size is None else [int(input_size)]) + [int(s) for s in layer_sizes or []]
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError(f"layer_sizes must be a non-empty list of positive ints, got {list(layer_sizes or [])}")
        linears = [torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])] or [torch.nn.LazyLinear(sizes[0])]
        layers = [m for linear in linears for m in (linear, torch.nn.ReLU(inplace=False))]
        self.layer_sizes = sizes
        self.net = torch.nn.Sequential(*(layers if final_relu else layers[:-1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
