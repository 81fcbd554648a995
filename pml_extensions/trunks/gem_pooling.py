"""Generalized-mean (GeM) pooling (Radenović, Tolias & Chum, TPAMI 2019) as used by RAML (Suma & Tolias, WACV 2023,
Sec. 5); formula and clamp as in ``pavelsuma/raml`` (``lib/layers/functional.py``), written from the formula."""

import math

import torch

from ..utils.checks import is_number


class GeMPooling(torch.nn.Module):
    """GeM pooling: ``y_c = (mean_{h,w} max(x_{c,h,w}, eps)^p)^(1/p)`` with one scalar p.

    Args:
        p: initial exponent (> 0). Default 3 (paper code). p = 1 is average pooling, p → ∞ tends to max pooling.
        eps: clamp floor applied BEFORE the power, so negative or zero activations never reach ``pow``.
            Default 1e-6 (paper code).
        trainable: p is an ``nn.Parameter`` (default, as in the paper) or a fixed buffer.
        device, dtype: factory arguments of p (default: the default device and dtype).

    ``forward(x [B, C, H, W]) -> [B, C]`` in the dtype/device of ``x``; computed in float32 (float64 stays) in the
    log domain, also under ``torch.autocast``. ``feat_mult()`` is 1. RAML trains p at 10× the learning rate without
    weight decay (:class:`ResolutionDistillationTrainer` builds that parameter group).

    Raises:
        ValueError: if ``p`` or ``eps`` is not > 0, or the input is not a 4-D tensor.
    """

    def __init__(self, p: float = 3.0, eps: float = 1e-6, trainable: bool = True, device=None, dtype=None):
        super().__init__()
        if not is_number(p) or not p > 0:
            raise ValueError(f"p must be a number > 0, got {p!r}")
        if not is_number(eps) or not eps > 0:
            raise ValueError(f"eps must be a number > 0, got {eps!r}")
        self.eps = float(eps)
        self.trainable = bool(trainable)
        value = torch.tensor([float(p)], device=device, dtype=dtype)
        if self.trainable:
            self.p = torch.nn.Parameter(value)
        else:
            self.register_buffer("p", value)

    def feat_mult(self) -> int:
        return 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_tensor(x) or x.ndim != 4:
            raise ValueError(f"x must be a [B, C, H, W] tensor, got {getattr(x, 'shape', type(x))}")
        # y = exp(log mean exp(p·log x) / p): the pow form underflows (eps^p is 0 in float16, and in float32 once
        # p > 12), giving y = 0 and p.grad = nan
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            p = self.p.to(dtype)
            log_x = x.to(dtype).clamp(min=self.eps).log().flatten(-2)
            log_mean = torch.logsumexp(p * log_x, dim=-1) - math.log(log_x.shape[-1])
            return torch.exp(log_mean / p).to(x.dtype)

    def extra_repr(self) -> str:
        return f"p={float(self.p.detach()):.4f}, eps={self.eps}, trainable={self.trainable}"
