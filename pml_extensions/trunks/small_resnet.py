"""A small randomly initialised ResNet of torchvision ``BasicBlock`` stages for 28-64 px images (Gorgun, Gurbuz &
Alatan, BMVC 2022, Table 1 "RN", Fig. 3)."""

from typing import Sequence

import torch
from torchvision.models.resnet import BasicBlock


class SmallResNet(torch.nn.Module):
    """3×3 stem (stride 1) -> stages ``layer1 .. layerS`` of torchvision ``BasicBlock`` -> global average pooling.

    Stages 2 and 3 halve the resolution (the paper's RN), the others keep it; a block whose stride or width changes
    gets a 1×1 conv + BN shortcut. The stages are ``layer1``, ``layer2``, ... as in torchvision's ResNet, so
    :func:`pml_extensions.trunks.insert_template_matching` and :func:`pml_extensions.trunks.soft_maximizer_swap`
    find them.

    Args:
        in_channels: image channels (1 for Fashion-MNIST and glyphs).
        widths: output channels of each stage (``len(widths)`` stages).
        blocks: BasicBlocks per stage.
        pool: end with global average pooling (``[B, widths[-1]]`` vectors, a PML trunk); ``False`` returns the map.

    ``forward(images [B, in_channels, H, W]) -> [B, widths[-1]]`` (float, the input's dtype and device);
    ``out_channels`` is ``widths[-1]``. Weights are drawn from the global torch RNG in module order.

    Raises:
        ValueError: a non-positive ``in_channels``, width or ``blocks``, or no stage.

    Example::

        >>> net = SmallResNet(1, widths=(8, 16, 32, 32))
        >>> net(torch.zeros(2, 1, 28, 28)).shape, net.out_channels
        (torch.Size([2, 32]), 32)
    """

    def __init__(
        self, in_channels: int = 1, widths: Sequence[int] = (8, 16, 32, 32), blocks: int = 1, pool: bool = True
    ):
        super().__init__()
        widths = [int(w) for w in widths]
        if in_channels < 1 or not widths or any(w < 1 for w in widths) or blocks < 1:
            raise ValueError(
                f"in_channels, widths and blocks must be positive (and widths non-empty), got {in_channels}, "
                f"{widths}, {blocks}"
            )
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(widths[0]),
            torch.nn.ReLU(inplace=True),
        )
        c = widths[0]
        for s, w in enumerate(widths):
            stride = 2 if s in (1, 2) else 1
            layers = []
            for b in range(blocks):
                st = stride if b == 0 else 1
                down = None
                if st != 1 or c != w:
                    down = torch.nn.Sequential(torch.nn.Conv2d(c, w, 1, stride=st, bias=False), torch.nn.BatchNorm2d(w))
                layers.append(BasicBlock(c, w, stride=st, downsample=down))
                c = w
            setattr(self, f"layer{s + 1}", torch.nn.Sequential(*layers))
        self.num_stages = len(widths)
        self.out_channels = c
        self.pool = bool(pool)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The last stage's map ``[B, widths[-1], H', W']``."""
        x = self.stem(images)
        for s in range(self.num_stages):
            x = getattr(self, f"layer{s + 1}")(x)
        return x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.features(images)
        return x.mean(dim=(2, 3)) if self.pool else x
