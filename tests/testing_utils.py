"""Shared tiny models and inputs for the tests (CPU, no downloads, no image files)."""

import math

import torch


def angle_to_coord(angles_deg, dtype=torch.float64):
    """Unit 2-D vectors at the given angles (degrees): exact hand-checkable embeddings, as in PML's tests."""
    a = torch.tensor([math.radians(x) for x in angles_deg], dtype=dtype)
    return torch.stack([torch.cos(a), torch.sin(a)], dim=1)


def simplex_rows(n, m, seed=0, dtype=torch.float64):
    """``[n, m]`` rows on the probability simplex (Dirichlet(1) draws)."""
    g = torch.Generator().manual_seed(seed)
    x = -torch.log(torch.rand(n, m, generator=g, dtype=dtype))
    return x / x.sum(dim=1, keepdim=True)


def tiny_trunk(in_channels=3, width=8, num_prototypes=4, seed=0):
    """A 2-stage ConvNetBody followed by HistogramPooling, as a Sequential trunk."""
    from pml_extensions.trunks import ConvNetBody, HistogramPooling

    torch.manual_seed(seed)
    body = ConvNetBody(in_channels, widths=(width, width), blocks_per_stage=1)
    pool = HistogramPooling(width, num_prototypes)
    return torch.nn.Sequential(body, pool), pool
