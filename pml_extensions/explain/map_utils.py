"""Helpers shared by the explanation maps: opt-in normalisation, resizing, image-to-feature coordinates."""

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as nnf

NORMALISATIONS = (None, "minmax", "max_abs")


def normalize_maps(maps: torch.Tensor, mode: Optional[str] = "minmax") -> torch.Tensor:
    """Normalise each map over its last two dimensions.

    Args:
        maps: ``[..., h, w]`` float tensor.
        mode: ``None`` (unchanged), ``"minmax"`` ((m - min) / (max - min), in [0, 1]; a constant map becomes
            0; the sign is lost, as in pytorch-grad-cam's ``scale_cam_image``) or ``"max_abs"`` (m / max|m|,
            in [-1, 1], sign kept; an all-zero map stays 0).

    Raises:
        ValueError: unknown ``mode`` or a map with fewer than 2 dimensions.
    """
    if mode not in NORMALISATIONS:
        raise ValueError(f"normalize must be one of {NORMALISATIONS}, got {mode!r}")
    if not torch.is_tensor(maps) or maps.ndim < 2:
        raise ValueError(f"maps must be a tensor [..., h, w], got {getattr(maps, 'shape', type(maps))}")
    if mode is None:
        return maps
    flat = maps.flatten(-2)
    if mode == "minmax":
        lo, hi = torch.aminmax(flat, dim=-1, keepdim=True)
        span = hi - lo
        out = torch.where(span > 0, (flat - lo) / torch.where(span > 0, span, torch.ones_like(span)), 0 * flat)
    else:
        top = flat.abs().max(dim=-1, keepdim=True).values
        out = flat / torch.where(top > 0, top, torch.ones_like(top))
    return out.view_as(maps)


def resize_maps(maps: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Bilinear resize ``[..., h, w] -> [..., H, W]`` (``align_corners=False``, i.e. half-pixel centres)."""
    if not torch.is_tensor(maps) or maps.ndim < 2:
        raise ValueError(f"maps must be a tensor [..., h, w], got {getattr(maps, 'shape', type(maps))}")
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"size must be (H, W) with positive entries, got {size}")
    lead = maps.shape[:-2]
    x = maps.reshape(-1, 1, *maps.shape[-2:])
    out = nnf.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return out.view(*lead, *size)


def output_maps(maps: torch.Tensor, output_size, image_size: Sequence[int]) -> torch.Tensor:
    """``maps`` at ``output_size``: ``None`` (unchanged), ``"image"`` (``image_size``) or ``(H, W)``."""
    if output_size is None:
        return maps
    size = image_size if (isinstance(output_size, str) and output_size == "image") else output_size
    if isinstance(size, str):
        raise ValueError(f"output_size must be None, 'image' or (H, W), got {output_size!r}")
    return resize_maps(maps, size)


def maps_on_image(maps: torch.Tensor, image_size: Sequence[int]) -> torch.Tensor:
    """``maps [..., h, w]`` resized per axis to ``image_size (H, W)`` (:func:`check_map_matches_image` first)."""
    check_map_matches_image(maps.shape[-2:], image_size, "map")
    return maps if tuple(maps.shape[-2:]) == tuple(int(s) for s in image_size) else resize_maps(maps, image_size)


def check_map_matches_image(map_size: Sequence[int], image_size: Sequence[int], arg: str = "map") -> None:
    """``ValueError`` for a map that cannot belong to the image: an empty size, or larger than the image along an axis
    (the axes may have different strides: a ``16 × 431`` map of a ``1 × 128 × 431`` spectrogram)."""
    h, w = int(map_size[0]), int(map_size[1])
    H, W = int(image_size[0]), int(image_size[1])
    if h < 1 or w < 1 or H < 1 or W < 1:
        raise ValueError(f"{arg} size {(h, w)} and image size {(H, W)} must be positive")
    if h > H or w > W:
        raise ValueError(f"{arg} size {(h, w)} is larger than the image size {(H, W)}")


def map_strides(map_size: Sequence[int], image_size: Sequence[int]) -> Tuple[float, float]:
    """Pixels per map cell along (y, x): ``(H / h, W / w)``."""
    check_map_matches_image(map_size, image_size)
    return image_size[0] / map_size[0], image_size[1] / map_size[1]


def point_weights(
    points,
    image_size: Tuple[int, int],
    feature_size: Tuple[int, int],
    coordinates: str = "image",
    dtype=torch.float32,
    device=None,
) -> torch.Tensor:
    """Bilinear weights that map query points to feature-map positions (the authors' ``Point_Specific`` demo mapping).

    Image pixel (y, x) (pixel centres at integer coordinates) maps to u = (y + 0.5)·h/H − 0.5, v = (x + 0.5)·w/W −
    0.5, clamped to [0, h−1] × [0, w−1], spread over the four neighbouring positions; with ``coordinates="feature"``
    the points are integer feature positions (i, j) and the weights one-hot.

    Args:
        points: ``[P, 2]`` (y, x) pairs (sequence or tensor); image_size: ``(H, W)`` pixels; feature_size: ``(h, w)``.

    Returns:
        ``[P, h * w]`` weights (``dtype``, ``device``), each row summing to 1.

    Raises:
        ValueError: a point outside the image (or feature map), a malformed ``points``, an unknown ``coordinates``.
    """
    if coordinates not in ("image", "feature"):
        raise ValueError(f"coordinates must be 'image' or 'feature', got {coordinates!r}")
    pts = torch.as_tensor(points, dtype=torch.float64)
    if pts.ndim == 1 and pts.numel() == 2:
        pts = pts.view(1, 2)
    if pts.ndim != 2 or pts.shape[1] != 2 or pts.shape[0] == 0:
        raise ValueError(f"points must be a non-empty [P, 2] list of (y, x) pairs, got shape {tuple(pts.shape)}")
    if not bool(torch.isfinite(pts).all()):
        raise ValueError(f"points must be finite (y, x) pairs, got {pts.tolist()}")
    H, W = image_size
    h, w = feature_size
    lim_y, lim_x = (H, W) if coordinates == "image" else (h, w)
    bad = (pts[:, 0] < 0) | (pts[:, 0] > lim_y - 1) | (pts[:, 1] < 0) | (pts[:, 1] > lim_x - 1)
    if bool(bad.any()):
        first = pts[bad][0].tolist()
        raise ValueError(
            f"point (y, x) = {tuple(first)} lies outside the "
            f"{'image' if coordinates == 'image' else 'feature map'} of size {(lim_y, lim_x)}"
        )
    out = torch.zeros(pts.shape[0], h * w, dtype=torch.float64)
    if coordinates == "feature":
        if not torch.equal(pts, pts.round()):
            raise ValueError("feature coordinates must be integers")
        out[torch.arange(pts.shape[0]), (pts[:, 0] * w + pts[:, 1]).long()] = 1.0
        return out.to(dtype=dtype, device=device)
    u = ((pts[:, 0] + 0.5) * h / H - 0.5).clamp(0, h - 1)
    v = ((pts[:, 1] + 0.5) * w / W - 0.5).clamp(0, w - 1)
    u0, v0 = u.floor().long(), v.floor().long()
    u1, v1 = (u0 + 1).clamp(max=h - 1), (v0 + 1).clamp(max=w - 1)
    du, dv = u - u0, v - v0
    rows = torch.arange(pts.shape[0])
    for uu, vv, wt in (
        (u0, v0, (1 - du) * (1 - dv)),
        (u0, v1, (1 - du) * dv),
        (u1, v0, du * (1 - dv)),
        (u1, v1, du * dv),
    ):
        out.index_put_((rows, uu * w + vv), wt, accumulate=True)
    return out.to(dtype=dtype, device=device)
