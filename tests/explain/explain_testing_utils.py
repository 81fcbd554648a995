"""Tiny fixed-seed models and helpers shared by the tests of pml_extensions.explain."""

import torch
from torch import nn


def make_model(pool: str = "gap", dtype=torch.float64, seed: int = 0, channels: int = 4, size=(5, 6), out_dim: int = 6):
    """Conv-ReLU body + {GAP, GMP, Flatten} trunk and a Linear-BN1d-ReLU-Dropout-Linear embedder (eval
    statistics
    randomised so BN is not the identity)."""
    g = torch.Generator().manual_seed(seed)
    body = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU())
    if pool == "gap":
        trunk = nn.Sequential(body, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        d = channels
    elif pool == "gmp":
        trunk = nn.Sequential(body, nn.AdaptiveMaxPool2d(1), nn.Flatten())
        d = channels
    elif pool == "flatten":
        trunk = nn.Sequential(body, nn.Flatten())
        d = channels * size[0] * size[1]
    else:
        raise ValueError(pool)
    embedder = nn.Sequential(
        nn.Linear(d, 8), nn.BatchNorm1d(8, eps=0.1), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, out_dim)
    )
    for m in list(trunk.modules()) + list(embedder.modules()):
        for p in m.parameters(recurse=False):
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    bn = embedder[1]
    bn.running_mean.copy_(torch.randn(8, generator=g) * 0.1)
    bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)
    return trunk.to(dtype), embedder.to(dtype)


def linear_gap_model(pool: str = "gap", dtype=torch.float64, seed: int = 0, channels: int = 4, out_dim: int = 5):
    """Conv-ReLU body, GAP or GMP, one Linear layer: the setting of the paper's Section V."""
    g = torch.Generator().manual_seed(seed)
    pool_layer = nn.AdaptiveAvgPool2d(1) if pool == "gap" else nn.AdaptiveMaxPool2d(1)
    trunk = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), pool_layer, nn.Flatten())
    embedder = nn.Linear(channels, out_dim)
    for p in list(trunk.parameters()) + list(embedder.parameters()):
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return trunk.to(dtype), embedder.to(dtype)


def images(n=2, size=(5, 6), seed=1, dtype=torch.float64):
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def hook_count(*models: nn.Module) -> int:
    """Forward, pre-forward and backward hooks left on any submodule."""
    total = 0
    for model in models:
        for m in model.modules():
            for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
                total += len(getattr(m, attr, {}) or {})
    return total


def training_flags(*models: nn.Module):
    return [m.training for model in models for m in model.modules()]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
