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
    trunk = nn.Sequential(body, nn.AdaptiveMaxPool2d(1) if pool == "gmp" else nn.AdaptiveAvgPool2d(1), nn.Flatten())
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


def _tied_gmp_model():
    """A GMP head over ReLU6 features that saturate: several positions of a channel reach the maximum 6."""
    g = torch.Generator().manual_seed(5)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 4)
        conv.bias.copy_(torch.tensor([6.0, 1.0, 3.0, -1.0]))
    trunk = nn.Sequential(nn.Sequential(conv, nn.ReLU6()), nn.AdaptiveMaxPool2d(1), nn.Flatten()).double()
    embedder = nn.Linear(4, 3).double()
    with torch.no_grad():
        embedder.weight.copy_(torch.randn(3, 4, generator=g, dtype=torch.float64))
        embedder.bias.copy_(torch.randn(3, generator=g, dtype=torch.float64))
    return trunk, embedder


def test_gmp_ties_first_keeps_the_rectified_identity_where_shared_ties_do_not():
    """Saturated ReLU6 channels tie at 6: the default fold shares a tied maximum equally, autograd gives it to
    the first position. Both folds are exact (Σ F + B = E); only gmp_ties="first" reproduces rectified Grad-CAM.
    """
    trunk, embedder = _tied_gmp_model()
    q, r = _images(0, 2), _images(1, 2)
    A = trunk[0](q).reshape(2, 4, -1)
    assert ((A == 6.0).sum(dim=2) > 1).any()  # the input really has tied maxima
    rect = SimilarityGradCAM(trunk, embedder).maps(q, r, variant="rectified", relu=False)["query"]
    first = ActivationDecomposition(trunk, embedder, gmp_ties="first")
    share = ActivationDecomposition(trunk, embedder)
    torch.testing.assert_close(first.overall_maps(q, r, bias=True, scale="dot")["query"], rect, rtol=0, atol=1e-12)
    shared = share.overall_maps(q, r, bias=True, scale="dot")["query"]
    assert (shared - rect).abs().max() > 1e-3
    for dec in (first, share):  # both exact folds of the same embedding
        f = dec.fold_query(q)
        torch.testing.assert_close(f.features.sum(dim=(1, 2)) + f.bias, embedder(trunk(q)), rtol=0, atol=1e-12)


def test_shared_gmp_tie_gives_each_tied_position_an_equal_share():
    """Hand check: one ReLU6 channel saturated at k positions, Linear(1, 2) head: F_ij = w · 6 / k at the tied
    positions and 0 elsewhere; gmp_ties="first" puts w · 6 at the first tied position (raster order)."""
    conv = nn.Conv2d(1, 1, 1)
    with torch.no_grad():
        conv.weight.fill_(1.0)
        conv.bias.zero_()
    trunk = nn.Sequential(nn.Sequential(conv, nn.ReLU6()), nn.AdaptiveMaxPool2d(1), nn.Flatten()).double()
    embedder = nn.Linear(1, 2).double()
    with torch.no_grad():
        embedder.weight.copy_(torch.tensor([[0.5], [-2.0]]))
        embedder.bias.copy_(torch.tensor([0.25, 1.0]))
    x = torch.tensor([[[[1.0, 7.0, 2.0], [9.0, 0.5, 6.0]]]], dtype=torch.float64)  # 3 positions reach 6
    share = ActivationDecomposition(trunk, embedder).fold_query(x)
    first = ActivationDecomposition(trunk, embedder, gmp_ties="first").fold_query(x)
    w = torch.tensor([0.5, -2.0], dtype=torch.float64)
    expect_share = torch.zeros(1, 2, 3, 2, dtype=torch.float64)
    for i, j in ((0, 1), (1, 0), (1, 2)):
        expect_share[0, i, j] = w * 6.0 / 3
    expect_first = torch.zeros(1, 2, 3, 2, dtype=torch.float64)
    expect_first[0, 0, 1] = w * 6.0
    torch.testing.assert_close(share.features, expect_share, rtol=0, atol=0)
    torch.testing.assert_close(first.features, expect_first, rtol=0, atol=0)
    for f in (share, first):
        torch.testing.assert_close(f.bias, torch.tensor([[0.25, 1.0]], dtype=torch.float64), rtol=0, atol=0)


def test_gmp_ties_is_checked():
    trunk, embedder = _tied_gmp_model()
    with pytest.raises(ValueError, match="gmp_ties must be one of"):
        ActivationDecomposition(trunk, embedder, gmp_ties="last")
