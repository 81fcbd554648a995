"""RAML's retrieval head ``f(x) = L2N(W · L2N(GeM_p(backbone(x))) + b)`` (Suma & Tolias, WACV 2023, Sec. 5; the L2N
placement and ``+1e-6`` as in ``pavelsuma/raml``, ``lib/networks/imageretrievalnet.py``), written from the formula."""

import torch

from ..utils.checks import is_int
from .gem_pooling import GeMPooling


def l2n(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / (||x||_2 + eps)`` along the last dimension (RAML's L2N; not ``F.normalize``, which uses max(norm, eps))."""
    return x / (x.norm(p=2, dim=-1, keepdim=True) + eps)


class RetrievalHead(torch.nn.Module):
    """PML ``embedder`` that turns a backbone feature map into an L2-normalised retrieval embedding.

    Args:
        in_channels: C of the backbone's feature map (1280 for MobileNetV2, 2048 for ResNet50).
        out_dim: D of the embedding. Default 512 (paper).
        p: initial GeM exponent. Default 3 (paper code).
        eps: GeM clamp and L2N epsilon. Default 1e-6 (paper code).
        trainable_p: learn the GeM exponent (default, paper).
        device, dtype: factory arguments of the GeM exponent and the linear layer ("whitening", with bias).

    ``forward(x [B, C, H, W]) -> [B, D]``, rows of norm 1 − O(eps) (dot product = cosine similarity).
    The GeM module is ``self.pool`` (its ``p`` gets its own parameter group in RAML's recipe).

    Raises:
        ValueError: if ``in_channels``/``out_dim`` are not positive ints, or the feature map has the wrong width.
    """

    def __init__(
        self,
        in_channels: int,
        out_dim: int = 512,
        p: float = 3.0,
        eps: float = 1e-6,
        trainable_p: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_dim", out_dim)):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.in_channels = in_channels
        self.out_dim = out_dim
        self.eps = float(eps)
        self.pool = GeMPooling(p=p, eps=eps, trainable=trainable_p, device=device, dtype=dtype)
        self.whiten = torch.nn.Linear(in_channels, out_dim, bias=True, device=device, dtype=dtype)

    @property
    def num_features(self) -> int:
        return self.out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_tensor(x) or x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"x must be a [B, {self.in_channels}, H, W] feature map, got {getattr(x, 'shape', type(x))}"
            )
        pooled = l2n(self.pool(x), self.eps)
        return l2n(self.whiten(pooled), self.eps)
