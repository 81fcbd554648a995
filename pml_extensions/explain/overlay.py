"""PNG overlays of explanation maps (matplotlib, Agg backend; files written atomically)."""

from typing import Optional, Sequence

import numpy as np
import torch

from ..utils.atomic_io import atomic_savefig, atomic_torch_save
from .map_utils import check_map_matches_image, normalize_maps, resize_maps


def to_display_image(
    image, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None
) -> np.ndarray:
    """``[3, H, W]`` tensor (or ``[H, W, 3]`` array / PIL image) → ``[H, W, 3]`` float array in [0, 1].

    With ``mean``/``std`` the tensor is de-normalised; otherwise a tensor outside [0, 1] is min–max scaled.
    """
    if torch.is_tensor(image):
        x = image.detach().to("cpu", torch.float64)
        if x.ndim != 3:
            raise ValueError(f"image tensor must be [3, H, W], got {tuple(x.shape)}")
        if mean is not None and std is not None:
            x = x * torch.tensor(std, dtype=x.dtype).view(-1, 1, 1) + torch.tensor(mean, dtype=x.dtype).view(
                -1, 1, 1
            )
        elif x.min() < 0 or x.max() > 1:
            x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
        x = x.permute(1, 2, 0).numpy()
        if x.shape[2] == 1:
            x = np.repeat(x, 3, axis=2)
        return np.clip(x, 0, 1)
    a = np.asarray(image)
    if a.ndim == 2:
        a = np.stack([a] * 3, axis=-1)
    a = a[..., :3].astype(np.float64)
    return np.clip(a / 255.0 if a.max() > 1 else a, 0, 1)


def _map_on_image(heatmap: torch.Tensor, size) -> np.ndarray:
    m = torch.as_tensor(heatmap).detach().to("cpu", torch.float64)
    check_map_matches_image(m.shape, size, "map")
    m = normalize_maps(m, "max_abs")
    if tuple(m.shape) != tuple(size):
        m = resize_maps(m, size)
    return m.numpy()


def save_pair_overlay(
    path: str,
    query_image: np.ndarray,
    reference_images: Sequence[np.ndarray],
    panels: Sequence[dict],
    title: Optional[str] = None,
    alpha: float = 0.5,
) -> str:
    """Save a grid: one row per reference, columns = the query, each map panel, the reference.

    Args:
        path: output ``.png`` (written to a temporary file, then ``os.replace``).
        query_image / reference_images: ``[H, W, 3]`` float arrays in [0, 1] (:func:`to_display_image`).
        panels: per reference, a list of ``(label, side, map [h, w], point or None)`` tuples, ``side`` in
            ``{"query", "reference"}``: the signed map is scaled by its max |value| and drawn with a diverging
            colour map (red > 0, blue < 0) over the image; ``point`` (y, x) pixels is marked with a cross.

    Raises:
        ValueError: a map whose size does not match its image, a bad side.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = len(reference_images)
    cols = 2 + max(len(p) for p in panels)
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.3 * rows), squeeze=False)
    try:
        for r in range(rows):
            ref = reference_images[r]
            axes[r, 0].imshow(query_image)
            axes[r, 0].set_title("query", fontsize=7)
            axes[r, 1].imshow(ref)
            axes[r, 1].set_title(f"retrieved #{r + 1}", fontsize=7)
            for c, (label, side, heatmap, point) in enumerate(panels[r]):
                if side not in ("query", "reference"):
                    raise ValueError(f"panel side must be 'query' or 'reference', got {side!r}")
                base = query_image if side == "query" else ref
                ax = axes[r, 2 + c]
                ax.imshow(base)
                ax.imshow(_map_on_image(heatmap, base.shape[:2]), cmap="RdBu_r", vmin=-1, vmax=1, alpha=alpha)
                if point is not None:
                    ax.plot([point[1]], [point[0]], marker="x", color="yellow", markersize=8, mew=2)
                ax.set_title(label, fontsize=7)
            for c in range(2 + len(panels[r]), cols):
                axes[r, c].axis("off")
            for ax in axes[r]:
                ax.set_xticks([])
                ax.set_yticks([])
        if title:
            fig.suptitle(title, fontsize=8)
        fig.tight_layout()
        atomic_savefig(fig, path, dpi=80)
    finally:
        plt.close(fig)
    return path


def save_tensors(path: str, tensors: dict) -> str:
    """``torch.save`` a dict of tensors atomically (temporary file + ``os.replace``)."""
    atomic_torch_save(tensors, path)
    return path
