"""The identity the localisation benchmark relies on: rectified Grad-CAM (RGrad-CAM with ReLU) equals
ReLU(Decomposition+Bias) for a linear head, GMP included (Zhu et al. 2021, Sec. V); plain "no norm" Grad-CAM
equals it only with GAP."""

import pytest
import torch
from torch import nn

from pml_extensions.explain.activation_decomposition import ActivationDecomposition
from pml_extensions.explain.similarity_grad_cam import SimilarityGradCAM


def _model(pool):
    g = torch.Generator().manual_seed(3)
    body = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU())
    trunk = nn.Sequential(
        body, nn.AdaptiveMaxPool2d(1) if pool == "gmp" else nn.AdaptiveAvgPool2d(1), nn.Flatten()
    )
    embedder = nn.Linear(5, 4)
    for p in list(trunk.parameters()) + list(embedder.parameters()):
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=g))
    return trunk.double(), embedder.double()


def _images(seed, n=3):
    return torch.randn(n, 3, 6, 7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("pool", ["gmp", "gap"])
def test_rectified_grad_cam_is_relu_of_decomposition_plus_bias(pool):
    trunk, embedder = _model(pool)
    q, r = _images(0), _images(1)
    dec = ActivationDecomposition(trunk, embedder).overall_maps(q, r, bias=True, scale="dot")
    cam = SimilarityGradCAM(trunk, embedder)
    rect = cam.maps(q, r, variant="rectified", relu=True)
    signed = cam.maps(q, r, variant="rectified", relu=False)
    for side in ("query", "reference"):
        assert (dec[side] < 0).any() and (dec[side] > 0).any()  # the ReLU matters on this model
        torch.testing.assert_close(rect[side], torch.relu(dec[side]), rtol=0, atol=1e-12)
        torch.testing.assert_close(signed[side], dec[side], rtol=0, atol=1e-12)
    # the cosine-scaled Decomposition+Bias is the same map divided by ‖E^q‖‖E^r‖ > 0: ReLU commutes with it
    cos = ActivationDecomposition(trunk, embedder).overall_maps(q, r, bias=True)
    z = (dec["dot"] / cos["similarity"]).view(-1, 1, 1)
    torch.testing.assert_close(torch.relu(cos["query"]) * z, rect["query"], rtol=1e-10, atol=1e-12)


def test_no_norm_grad_cam_equals_decomposition_plus_bias_only_with_gap():
    q, r = _images(0), _images(1)
    for pool, equal in (("gap", True), ("gmp", False)):
        trunk, embedder = _model(pool)
        dec = ActivationDecomposition(trunk, embedder).overall_maps(q, r, bias=True, scale="dot")["query"]
        dot = SimilarityGradCAM(trunk, embedder).maps(q, r, variant="dot", relu=False)["query"]
        assert torch.allclose(dot, dec, rtol=0, atol=1e-12) is equal, pool
