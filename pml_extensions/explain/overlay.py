"""PNG overlays of explanation maps (matplotlib, Agg backend; files written atomically)."""

from typing import Optional, Sequence

import numpy as np
import torch

from ..utils.atomic_io import atomic_savefig, atomic_torch_save
from .map_utils import check_map_matches_image, resize_maps


def to_display_image(
    image, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None
) -> np.ndarray:
    """``[3, H, W]`` tensor (or ``[H, W, 3]`` array / PIL image) → ``[H, W, 3]`` float array in [0, 1].

    With ``mean``/``std`` (one value per channel) the tensor is de-normalised; otherwise a tensor outside
    [0, 1] is min–max scaled. One-channel images (``[1, H, W]``, spectrograms, MNIST) become grey RGB.

    Raises:
        ValueError: not ``[C, H, W]`` with C in {1, 3}; ``mean``/``std`` whose length is not C.
    """
    if torch.is_tensor(image):
        x = image.detach().to("cpu", torch.float64)
        if x.ndim != 3 or x.shape[0] not in (1, 3):
            raise ValueError(f"image tensor must be [3, H, W] or [1, H, W], got {tuple(x.shape)}")
        if mean is not None and std is not None:
            if len(mean) != x.shape[0] or len(std) != x.shape[0]:
                raise ValueError(
                    f"mean and std must have one value per channel ({x.shape[0]}), got {len(mean)} and {len(std)}"
                )
            std_, mean_ = (torch.tensor(v, dtype=x.dtype, device=x.device).view(-1, 1, 1) for v in (std, mean))
            x = x * std_ + mean_
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
    """Signed map ``[h, w]`` resized (per axis) to the image ``size``; values unchanged in scale."""
    m = torch.as_tensor(heatmap).detach().to("cpu", torch.float64)
    check_map_matches_image(m.shape, size, "map")
    if tuple(m.shape) != tuple(size):
        m = resize_maps(m, size)
    return m.numpy()


def _panel(panel):
    if len(panel) == 4:
        return (*panel, False)
    if len(panel) == 5:
        return tuple(panel)
    raise ValueError(f"panel must be (label, side, map, point[, mark_max]), got {len(panel)} entries")


def save_pair_overlay(
    path: str,
    query_image: np.ndarray,
    reference_images: Sequence[np.ndarray],
    panels: Sequence[Sequence[tuple]],
    title: Optional[str] = None,
    alpha: float = 0.55,
    *,
    similarities: Optional[Sequence[float]] = None,
    panel_width: float = 3.0,
    dpi: int = 100,
) -> str:
    """Save a grid: one row per reference (rank order), columns = the query, the reference, each map panel.

    Every image keeps its aspect ratio (non-square images and spectrograms are not squashed); each map is
    drawn over its image with a diverging colour map centred at 0 (red > 0, blue < 0, symmetric limits
    ±max|map|) and its own colour bar in the map's units (signed cosine contributions for
    ``scale="cosine"``).

    Args:
        path: output ``.png`` (written to a temporary file, then ``os.replace``).
        query_image / reference_images: ``[H, W, 3]`` float arrays in [0, 1] (:func:`to_display_image`).
        panels: per reference, a list of ``(label, side, map [h, w], point or None[, mark_max])`` tuples,
            ``side`` in ``{"query", "reference"}``; ``point`` (y, x) pixels is marked with a yellow cross;
            ``mark_max=True`` marks the map's maximum (e.g. the strongest match of a point-specific map) with
            a yellow star.
        title: figure title; similarities: per reference, shown as "rank r · cos s" above the reference.
        panel_width: inches per panel (default 3.0); dpi: default 100 (a 7-panel row is 2100 px wide).

    Raises:
        ValueError: a map larger than its image, a bad side or panel.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = len(reference_images)
    if len(panels) != rows:
        raise ValueError(f"panels must have one list per reference ({rows}), got {len(panels)}")
    cols = 2 + max(len(p) for p in panels)
    aspect = max([query_image.shape[0] / query_image.shape[1]] + [r.shape[0] / r.shape[1] for r in reference_images])
    height = min(max(panel_width * aspect, 1.6), 3 * panel_width) + 0.7
    fig, axes = plt.subplots(rows, cols, figsize=(panel_width * cols, height * rows), squeeze=False)
    try:
        for r in range(rows):
            ref = reference_images[r]
            axes[r, 0].imshow(query_image, aspect="equal")
            axes[r, 0].set_title("query", fontsize=10)
            axes[r, 1].imshow(ref, aspect="equal")
            rank = f"rank {r + 1}"
            if similarities is not None:
                rank += f" · cos {float(similarities[r]):.3f}"
            axes[r, 1].set_title(rank, fontsize=10)
            for c, panel in enumerate(panels[r]):
                label, side, heatmap, point, mark_max = _panel(panel)
                if side not in ("query", "reference"):
                    raise ValueError(f"panel side must be 'query' or 'reference', got {side!r}")
                base = query_image if side == "query" else ref
                ax = axes[r, 2 + c]
                m = _map_on_image(heatmap, base.shape[:2])
                top = float(np.abs(m).max()) or 1.0
                exp10 = int(np.floor(np.log10(top))) if top > 0 else 0
                unit = 10.0**exp10 if abs(exp10) >= 2 else 1.0  # the colour bar reads in units of 10^exp10
                ax.imshow(base.mean(axis=2), cmap="gray", vmin=0, vmax=1, aspect="equal")
                im = ax.imshow(m / unit, cmap="RdBu_r", vmin=-top / unit, vmax=top / unit, alpha=alpha, aspect="equal")
                bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
                bar.ax.tick_params(labelsize=7)
                if unit != 1.0:
                    bar.set_label(f"× 1e{exp10}", fontsize=7)
                if point is not None:
                    ax.plot([point[1]], [point[0]], marker="x", color="yellow", markersize=11, mew=3)
                if mark_max:
                    y, x = np.unravel_index(int(np.argmax(m)), m.shape)
                    ax.plot([x], [y], marker="*", color="yellow", markeredgecolor="black", markersize=14)
                ax.set_title(label, fontsize=9)
            for c in range(2 + len(panels[r]), cols):
                axes[r, c].axis("off")
            for ax in axes[r]:
                ax.set_xticks([])
                ax.set_yticks([])
        if title:
            fig.suptitle(title, fontsize=11)
        fig.tight_layout()
        atomic_savefig(fig, path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


def save_tensors(path: str, tensors: dict) -> str:
    """``torch.save`` a dict of tensors atomically (temporary file + ``os.replace``)."""
    atomic_torch_save(tensors, path)
    return path
