"""A small randomly initialised CNN body for fast experiments and tests (no weights to download)."""

from typing import Sequence

import torch


class ConvNetBody(torch.nn.Module):
    """Conv-BN-ReLU stages, each halving the resolution; returns the last feature map.

    Args:
        in_channels: image channels (1 for glyphs, 3 for RGB).
        widths: output channels of each stage; ``len(widths)`` stages, total stride ``2 ** (len(widths) - 1)``
            (the first stage keeps the resolution).
        blocks_per_stage: 3×3 conv-BN-ReLU layers per stage.
        device, dtype: factory arguments of the convolutions and BatchNorm layers.

    ``forward(images [B, in_channels, H, W]) -> [B, widths[-1], H / 2^(S-1), W / 2^(S-1)]``; ``out_channels`` is
    ``widths[-1]``.
    """

    def __init__(
        self,
        in_channels: int = 3,
        widths: Sequence[int] = (32, 64, 128),
        blocks_per_stage: int = 2,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if in_channels < 1 or not widths or any(w < 1 for w in widths) or blocks_per_stage < 1:
            raise ValueError(
                f"in_channels, widths and blocks_per_stage must be positive, got {in_channels}, {widths}, "
                f"{blocks_per_stage}"
            )
        fk = {"device": device, "dtype": dtype}
        layers, c = [], in_channels
        for stage, width in enumerate(widths):
            for block in range(blocks_per_stage):
                stride = 2 if (stage > 0 and block == 0) else 1
                layers += [
                    torch.nn.Conv2d(c, width, 3, stride=stride, padding=1, bias=False, **fk),
                    torch.nn.BatchNorm2d(width, **fk),
                    torch.nn.ReLU(inplace=True),
                ]
                c = width
        self.features = torch.nn.Sequential(*layers)
        self.out_channels = c

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images)
