"""PNG overlays of explanation maps (matplotlib, Agg backend; files written atomically)."""

import itertools
import math
import textwrap
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..utils.atomic_io import atomic_savefig
from .map_utils import maps_on_image


def to_display_image(
    image, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None
) -> np.ndarray:
    """``[3, H, W]`` (or ``[1, H, W]``, shown grey) tensor → ``[H, W, 3]`` float64 array in [0, 1], de-normalised with
    ``mean``/``std`` (one value per channel) or else min–max scaled when outside [0, 1]; ``ValueError`` otherwise."""
    if not torch.is_tensor(image) or image.ndim != 3 or image.shape[0] not in (1, 3):
        got = tuple(image.shape) if torch.is_tensor(image) else type(image).__name__
        raise ValueError(f"image tensor must be [3, H, W] or [1, H, W], got {got}")
    x = image.detach().to("cpu", torch.float64)
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


#: what every overall and point-specific map measures with ``scale="cosine"`` (the colour bars' label)
COSINE_QUANTITY = "contribution to cosine similarity"
#: Decomposition+Bias panels are shown when they differ from Decomposition by more than this fraction of its largest
#: |value| (:func:`explanation_panels`)
BIAS_RTOL = 0.01
#: under every figure: how to read the colours
LEGEND = (
    "red: raises the similarity · blue: lowers it · clear: no contribution (colour and opacity grow with |value|); "
    "symmetric scales: one for the overall maps of each image, one for the point-specific map"
)


def _panel(panel):
    """``(label, side, map, point[, mark_max[, scale_group]])`` -> all six entries."""
    if len(panel) not in (4, 5, 6):
        raise ValueError(
            f"panel must be (label, side, map, point[, mark_max[, scale_group]]), got {len(panel)} entries"
        )
    label, side, heatmap, point = panel[:4]
    if side not in ("query", "reference"):
        raise ValueError(f"panel side must be 'query' or 'reference', got {side!r}")
    mark_max = bool(panel[4]) if len(panel) > 4 else False
    group = panel[5] if len(panel) > 5 else ("point" if mark_max else side)
    return label, side, heatmap, point, mark_max, group


def format_cosines(values: Sequence[float], decimals: int = 4, max_decimals: int = 6) -> List[str]:
    """Cosines as text with ``decimals`` decimals, more (up to ``max_decimals``) while two different values would print
    the same or a value below 1 would print as 1."""
    values = [float(v) for v in values]
    for d in range(decimals, max_decimals + 1):
        text = [f"{v:.{d}f}" for v in values]
        one = f"{1:.{d}f}"
        distinct = all(a != b or x == y for (a, x), (b, y) in itertools.combinations(zip(text, values), 2))
        if distinct and not any(t == one and v < 1 for t, v in zip(text, values)):
            return text
    # still "1.000000" below 1: cut instead of rounding
    return [
        f"{math.floor(v * 10**max_decimals) / 10**max_decimals:.{max_decimals}f}" if v < 1 else t
        for t, v in zip(text, values)
    ]


def explanation_panels(
    query_map,
    reference_map,
    query_bias_map,
    reference_bias_map,
    point,
    point_map,
    *,
    reference_name: str = "reference",
    rtol: float = BIAS_RTOL,
    show_bias: Optional[bool] = None,
) -> Tuple[List[tuple], Optional[str]]:
    """The panels of one (query, reference) row (Zhu et al., TIP 2021, Sec. III): Decomposition maps on both images (the
    query point marked ×), the Decomposition+Bias maps (+ each cell's match ``(W_ij A_ij)·B`` with the other image's
    head bias) only when they differ by more than ``rtol`` of the largest |value| (:func:`bias_difference`; else a
    note says why; ``show_bias`` forces the choice), and the point-specific map of the ×.

    Args:
        query_map, reference_map: Decomposition maps ``[h, w]`` / ``[h', w']``; ``*_bias_map``: the +Bias maps.
        point: the query pixel ``(y, x)`` of the point-specific map; point_map: its map on the reference.
        reference_name: how the titles call the reference (e.g. ``"retrieved"``).

    Returns:
        ``(panels, note)``: panels for :func:`save_pair_overlay`, and the note (``None`` when +Bias is shown).

    Example::

        >>> import torch
        >>> m = torch.ones(2, 2)
        >>> panels, note = explanation_panels(m, m, m, m, (0.5, 0.5), m)
        >>> [p[0] for p in panels]
        ['Decomposition (query)', 'Decomposition (reference)', 'point-specific: match of ×']
        >>> note.split(":")[0]
        'Decomposition+Bias not shown'
    """
    q, r = torch.as_tensor(query_map), torch.as_tensor(reference_map)
    qb, rb = torch.as_tensor(query_bias_map), torch.as_tensor(reference_bias_map)
    diff = bias_difference(q, r, qb, rb)
    if show_bias is None:
        show_bias = diff > rtol
    panels = [("Decomposition (query)", "query", q, point)]
    if show_bias:
        panels += [
            ("Decomposition+Bias (query):\n+ match with the reference's bias", "query", qb, None),
            (f"Decomposition ({reference_name})", "reference", r, None),
            (f"Decomposition+Bias ({reference_name}):\n+ match with the query's bias", "reference", rb, None),
        ]
    else:
        panels.append((f"Decomposition ({reference_name})", "reference", r, None))
    panels.append(("point-specific: match of ×", "reference", torch.as_tensor(point_map), None, True))
    return panels, None if show_bias else bias_note(diff)


def bias_difference(query_map, reference_map, query_bias_map, reference_bias_map) -> float:
    """Largest |Decomposition+Bias − Decomposition| of a pair's maps over the largest |Decomposition| (0: no bias)."""
    q, r = torch.as_tensor(query_map), torch.as_tensor(reference_map)
    top = max(float(q.abs().max()), float(r.abs().max()), 1e-30)
    diff = max(
        float((torch.as_tensor(query_bias_map) - q).abs().max()),
        float((torch.as_tensor(reference_bias_map) - r).abs().max()),
    )
    return diff / top


def bias_note(difference: float) -> str:
    """Why the Decomposition+Bias panels are left out (``difference``: :func:`bias_difference`, over the rows)."""
    if difference == 0:
        return "Decomposition+Bias not shown: equal to Decomposition (the head adds no bias)"
    return (
        f"Decomposition+Bias not shown: within {100 * difference:.2g} % of Decomposition (the head's bias is "
        "small next to the features)"
    )


def max_point(m: np.ndarray) -> Tuple[float, float]:
    """``(row, column)`` of the centre of the region of maximal pixels of ``m`` ``[H, W]`` that holds the first one (an
    upsampled map is flat over each cell: ``argmax`` alone would mark a cell's top-left corner)."""
    from scipy import ndimage

    m = np.asarray(m, dtype=np.float64)
    top = m.max()
    regions, _ = ndimage.label(m >= top - 1e-9 * max(abs(top), 1.0))
    y, x = np.unravel_index(int(np.argmax(m)), m.shape)
    ys, xs = np.nonzero(regions == regions[y, x])
    return float(ys.mean()), float(xs.mean())


def pair_figure(
    query_image: np.ndarray,
    reference_images: Sequence[np.ndarray],
    panels: Sequence[Sequence[tuple]],
    title: Optional[str] = None,
    alpha: float = 0.8,
    *,
    similarities: Optional[Sequence[float]] = None,
    ranks: Optional[Sequence[int]] = None,
    reference_labels: Optional[Sequence[Optional[str]]] = None,
    same_class: Optional[Sequence[Optional[bool]]] = None,
    query_label: Optional[str] = None,
    colorbar_label: str = COSINE_QUANTITY,
    note: Optional[str] = None,
    panel_width: float = 3.0,
):
    """The matplotlib ``Figure`` of :func:`save_pair_overlay` (arguments as there; ``plt.close`` it when done)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    rows = len(reference_images)
    if len(panels) != rows:
        raise ValueError(f"panels must have one list per reference ({rows}), got {len(panels)}")
    for name, values in (
        ("similarities", similarities),
        ("ranks", ranks),
        ("reference_labels", reference_labels),
        ("same_class", same_class),
    ):
        if values is not None and len(values) != rows:
            raise ValueError(f"{name} must have one entry per reference ({rows}), got {len(values)}")
    entries = [[_panel(p) for p in row] for row in panels]  # checked before the figure opens

    def on_image(r, side, heatmap):
        image = query_image if side == "query" else reference_images[r]
        return maps_on_image(torch.as_tensor(heatmap).detach().to("cpu", torch.float64), image.shape[:2]).numpy()

    # every row's maps at image size: the colour bars read in one power of ten for the whole figure
    row_maps = [[on_image(r, side, heatmap) for _, side, heatmap, *_ in row] for r, row in enumerate(entries)]
    cmap = plt.get_cmap("RdBu_r")
    cols = 2 + max(len(p) for p in panels)
    aspect = max([query_image.shape[0] / query_image.shape[1]] + [r.shape[0] / r.shape[1] for r in reference_images])
    height = min(max(panel_width * aspect, 1.6), 3 * panel_width) + 0.75
    footer = 0.35 + (0.25 if note else 0.0)
    fig, axes = plt.subplots(rows, cols, figsize=(panel_width * cols, height * rows + footer), squeeze=False)
    cosines = format_cosines(similarities) if similarities is not None else None
    largest = max([float(np.abs(m).max()) for maps in row_maps for m in maps] + [0.0]) or 1.0
    exp10 = int(np.floor(np.log10(largest)))
    unit = 10.0**exp10 if abs(exp10) >= 2 else 1.0  # every colour bar reads in units of 10^exp10
    try:
        for r in range(rows):
            ref = reference_images[r]
            axes[r, 0].imshow(query_image, aspect="equal")
            axes[r, 0].set_title("query" + (f"\nclass {query_label}" if query_label is not None else ""), fontsize=10)
            axes[r, 1].imshow(ref, aspect="equal")
            head = f"rank {ranks[r] if ranks is not None else r + 1}"
            if cosines is not None:
                head += f" · cos {cosines[r]}"
            if reference_labels is not None and reference_labels[r] is not None:
                head += f"\nclass {reference_labels[r]}"
            colour = "black"
            if same_class is not None and same_class[r] is not None:
                head += " · same class" if same_class[r] else " · other class"
                colour = "#1a7f37" if same_class[r] else "#c62828"
                for spine in axes[r, 1].spines.values():
                    spine.set_edgecolor(colour)
                    spine.set_linewidth(4)
            axes[r, 1].set_title(head, fontsize=10, color=colour)
            maps = row_maps[r]
            limits = {}
            for (_, _, _, _, _, group), m in zip(entries[r], maps):
                limits[group] = max(limits.get(group, 0.0), float(np.abs(m).max()))
            for c, ((label, side, _, point, mark_max, group), m) in enumerate(zip(entries[r], maps)):
                base = query_image if side == "query" else ref
                ax = axes[r, 2 + c]
                top = limits[group] or 1.0
                # the drawing lightened to [0.5, 1] so that colours read true on dark drawings too, then the map
                # as a layer whose opacity grows with |value|: where the map is ~0 the drawing shows unchanged
                ax.imshow(0.5 + 0.5 * base.mean(axis=2), cmap="gray", vmin=0, vmax=1, aspect="equal")
                layer = cmap(Normalize(-top, top)(m))
                layer[..., 3] = alpha * np.clip(np.abs(m) / top, 0, 1)
                ax.imshow(layer, aspect="equal")
                cax = make_axes_locatable(ax).append_axes("right", size="5%", pad=0.05)  # as tall as the image
                cax.set_label("<colorbar>")  # matplotlib's name for a colour bar's axes, as with colorbar(ax=...)
                bar = fig.colorbar(ScalarMappable(Normalize(-top / unit, top / unit), cmap), cax=cax)
                bar.ax.tick_params(labelsize=7)
                text = colorbar_label + (f" (× 1e{exp10})" if unit != 1.0 else "")
                bar.set_label(textwrap.fill(text, 26), fontsize=7)  # two short lines fit beside a flat image
                if point is not None:
                    ax.plot([point[1]], [point[0]], marker="X", color="yellow", markeredgecolor="black", markersize=13)
                if mark_max:
                    y, x = max_point(m)
                    ax.plot([x], [y], marker="*", color="yellow", markeredgecolor="black", markersize=14)
                ax.set_title(label, fontsize=9)
            for c in range(2 + len(panels[r]), cols):
                axes[r, c].axis("off")
            for ax in axes[r]:
                ax.set_xticks([])
                ax.set_yticks([])
        if title:
            fig.suptitle(title, fontsize=11)
        fig.text(0.5, 0.004, LEGEND, ha="center", va="bottom", fontsize=8, color="#333333")
        if note:
            fig.text(0.5, 0.004 + 0.25 / fig.get_figheight(), note, ha="center", va="bottom", fontsize=8)
        fig.tight_layout(rect=(0, footer / fig.get_figheight(), 1, 1))
    except Exception:
        plt.close(fig)
        raise
    return fig


def save_pair_overlay(path: str, *args, dpi: int = 100, **kwargs) -> str:
    """Save :func:`pair_figure` ``(*args, **kwargs)`` as ``path`` at ``dpi``: one row per reference (rank order),
    columns = the query, the reference, each map panel.

    Each map is a layer over a lightened grey copy of its image: red > 0, blue < 0, opacity growing with |value|.
    Scales are symmetric (±L) and shared within a row by a group (default: the overall maps of one image; the
    point-specific map alone); colour bars name ``colorbar_label`` times the power of ten shown; a legend follows.

    Args:
        path: output ``.png`` (written atomically).
        query_image / reference_images: ``[H, W, 3]`` float arrays in [0, 1] (:func:`to_display_image`).
        panels: per reference, ``(label, side, map [h, w], point or None[, mark_max[, scale_group]])`` tuples
            (:func:`explanation_panels`), ``side`` in ``{"query", "reference"}``; ``point`` (y, x) pixels gets a yellow
            cross, ``mark_max=True`` a star at the map's maximum.
        title: figure title. alpha: opacity of the strongest values (default 0.8).
        similarities: per reference, its cosine, shown as "rank r · cos s" (:func:`format_cosines`).
        ranks: per reference, its true rank (default 1, 2, ...).
        reference_labels, query_label: class names above the images (``None``: unknown).
        same_class: per reference, ``True`` / ``False``: green "same class" / red "other class" frame.
        colorbar_label: the maps' quantity (e.g. "contribution to dot product" for ``scale="dot"``).
        note: one line under the figure. panel_width: inches per panel (default 3.0); dpi: default 100.

    Raises:
        ValueError: a map larger than its image, a bad side or panel, per-reference lists of the wrong length.
    """
    import matplotlib.pyplot as plt

    fig = pair_figure(*args, **kwargs)
    try:
        atomic_savefig(fig, path, dpi=dpi)
    finally:
        plt.close(fig)
    return path
