"""Checks that say when an explanation shows little: collapsed embeddings (every image looks the same to the model)
and feature maps too coarse for the images (a 3 × 3 grid paints near-uniform maps)."""

import math
from typing import Callable, Optional, Tuple

import torch

#: mean pairwise cosine above which the embeddings are called collapsed
COLLAPSE_COSINE = 0.999
#: the widest span of the query's cosines to its references still called a tie (float32 rounding)
TIE_SPREAD = 1e-6
#: the fewest feature-map cells per side for a map worth reading (MobileNetV2 at 224 px)
MIN_MAP_CELLS = 7


def mean_pairwise_cosine(embeddings: torch.Tensor) -> float:
    """Mean cosine over the ``N (N - 1) / 2`` distinct pairs of rows of ``embeddings`` ``[N, D]`` (float64; a zero row
    has cosine 0 with every other).

    Raises:
        ValueError: fewer than two rows, or not a 2-D tensor.

    Example::

        >>> round(mean_pairwise_cosine(torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])), 12)  # (2 / sqrt(2)) / 3
        0.471404520791
    """
    if not torch.is_tensor(embeddings) or embeddings.ndim != 2 or embeddings.shape[0] < 2:
        raise ValueError(f"embeddings must be [N, D] with N >= 2, got {getattr(embeddings, 'shape', embeddings)}")
    e = torch.nn.functional.normalize(embeddings.detach().to(torch.float64), dim=1)
    n = e.shape[0]
    # the sum over all ordered pairs of cosines is ||sum of the unit rows||^2: O(N D), no N x N matrix
    norms = (e * e).sum(dim=1)  # 1, or 0 for a zero row
    off = e.sum(dim=0).pow(2).sum() - norms.sum()
    return float(off / (n * (n - 1)))


def collapse_warning(
    embeddings: torch.Tensor, threshold: float = COLLAPSE_COSINE, what: str = "explained images"
) -> Optional[str]:
    """One line when the rows of ``embeddings`` ``[N, D]`` (row 0 the query, then every reference) have a
    :func:`mean_pairwise_cosine` above ``threshold``, else None; ``what`` names the rows. Two cases: the query's
    cosines to the references span at most :data:`TIE_SPREAD` (the model maps every image to one point: the ranking
    is a tie and the maps explain nothing), or they still order the references (a narrow cone: what every image
    shares dominates each similarity and each map, so the maps differ little between references).

    Example::

        >>> line = collapse_warning(torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]))
        >>> line.split(" (>")[0]
        'warning: the embeddings have collapsed: mean pairwise cosine 1.000000 over the 3 explained images'
        >>> line = collapse_warning(torch.tensor([[1.0, 0.0], [1.0, 0.01], [1.0, 0.02]]))
        >>> line.split(":")[1]
        ' the embeddings lie in a narrow cone'
    """
    if embeddings.shape[0] < 2:
        return None
    cosine = mean_pairwise_cosine(embeddings)
    if cosine <= threshold:
        return None
    unit = torch.nn.functional.normalize(embeddings.detach().to(torch.float64), dim=1)
    to_query = unit[1:] @ unit[0]
    spread = float(to_query.max() - to_query.min())
    measured = f"mean pairwise cosine {cosine:.6f} over the {embeddings.shape[0]} {what} (> {threshold:g})"
    if spread <= TIE_SPREAD:
        return (
            f"warning: the embeddings have collapsed: {measured}: the model maps them all to one point (the query's "
            f"cosines span {spread:.1e}), so the ranking is a tie and the maps explain nothing; explain a "
            "better-trained model (an epoch-0 model is untrained)"
        )
    return (
        f"warning: the embeddings lie in a narrow cone: {measured}: what every image shares dominates each "
        f"similarity and each map, so the maps differ little between references (the query's cosines span "
        f"{spread:.1e}, which still ranks them)"
    )


def size_for_cells(
    feature_side: Callable[[int], int], image_side: int, map_side: int, min_cells: int = MIN_MAP_CELLS, tries: int = 8
) -> Optional[int]:
    """The smallest image side (pixels) whose feature map has at least ``min_cells`` cells per side: ``ceil(min_cells ×
    stride)`` from the stride at ``image_side`` -> ``map_side``, checked with ``feature_side(side)`` (the model's map
    side) and raised one stride at a time; None when ``tries`` steps do not fit.

    Example::

        >>> size_for_cells(lambda side: math.ceil(side / 32), 96, 3)  # a stride-32 network
        224
    """
    stride = image_side / max(1, map_side)
    side = max(image_side, math.ceil(min_cells * stride))
    for _ in range(tries):
        if feature_side(side) >= min_cells:
            return side
        side += max(1, math.ceil(stride))
    return None


def coarse_map_warning(
    image_size: Tuple[int, int],
    feature_size: Tuple[int, int],
    feature_side: Optional[Callable[[int], int]] = None,
    min_cells: int = MIN_MAP_CELLS,
) -> Optional[str]:
    """One line when the feature map (``feature_size`` ``(h, w)`` cells for ``image_size`` ``(H, W)`` pixels) has fewer
    than ``min_cells`` cells on a side, naming the ``--image-size`` that gives enough (:func:`size_for_cells`, checked
    with ``feature_side`` when given); else None.

    Example::

        >>> line = coarse_map_warning((96, 96), (3, 3), lambda side: math.ceil(side / 32))
        >>> line.split(": ")[1]
        'the explained map is 3 × 3 cells for 96 × 96 px images (one cell per 32 px)'
        >>> line.split("; ")[-1]
        '--image-size 224 gives at least 7 × 7'
    """
    (H, W), (h, w) = image_size, feature_size
    if min(h, w) >= min_cells:
        return None
    short, cells = (H, h) if h <= w else (W, w)  # the side with the fewest cells (the shorter image side)
    if feature_side is not None:
        side = size_for_cells(feature_side, short, cells, min_cells)
    else:
        side = math.ceil(min_cells * short / max(1, cells))
    fix = f"--image-size {side} gives at least {min_cells} × {min_cells}" if side else "a larger --image-size"
    return (
        f"warning: the explained map is {h} × {w} cells for {H} × {W} px images (one cell per "
        f"{max(H / max(1, h), W / max(1, w)):.0f} px): the maps are near-uniform; {fix}"
    )
