"""Weakly supervised localisation accuracy of explanation maps (Zhu et al., IEEE TIP 2021, Sec. VI-A, after CAM, Zhou
et al. CVPR 2016). Boxes are half-open ``(x0, y0, x1, y1)`` pixels (``mask[y0:y1, x0:x1]``; CUB's ``x y w h`` is
``(x, y, x + w, y + h)``)."""

from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from scipy import ndimage
from torchvision.ops import box_iou

from .map_utils import maps_on_image, normalize_maps

DEFAULT_THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.05, 1.0, 0.05))
Box = Tuple[int, int, int, int]


def _check_box(box, arg="box") -> Box:
    try:
        x0, y0, x1, y1 = (int(v) for v in box)
    except (TypeError, ValueError):
        raise ValueError(f"{arg} must be (x0, y0, x1, y1), got {box!r}") from None
    if x1 <= x0 or y1 <= y0:
        raise ValueError(f"{arg} must have x1 > x0 and y1 > y0, got {(x0, y0, x1, y1)}")
    return x0, y0, x1, y1


class LocalizationEvaluator:
    """Localisation accuracy per threshold of explanation maps against ground-truth boxes: min–max normalise the map,
    resize it bilinearly to the image, threshold, take the largest 8-connected component (as CAM's OpenCV contour) and
    its bounding box, correct when IoU > ``iou_threshold`` with the ground truth.

    Args:
        thresholds: on the min–max normalised map, in [0, 1]; foreground is ``>= threshold``. Default 0.05, 0.10,
            …, 0.95 (the paper grid-searches an unstated grid).
        iou_threshold: a box is correct when IoU ``>`` this. Default 0.5 (paper).

    Raises:
        ValueError: thresholds outside [0, 1] or empty, an iou_threshold outside [0, 1).
    """

    def __init__(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, iou_threshold: float = 0.5):
        thr = np.asarray(list(thresholds), dtype=np.float64)
        if thr.ndim != 1 or thr.size == 0 or (thr < 0).any() or (thr > 1).any():
            raise ValueError(f"thresholds must be a non-empty list of values in [0, 1], got {thresholds!r}")
        if not 0 <= iou_threshold < 1:
            raise ValueError(f"iou_threshold must be in [0, 1), got {iou_threshold}")
        self.thresholds = thr
        self.iou_threshold = float(iou_threshold)

    @staticmethod
    def iou(box_a: Sequence[int], box_b: Sequence[int]) -> float:
        """Intersection over union of two half-open boxes ``(x0, y0, x1, y1)``."""
        a, b = (
            torch.tensor([_check_box(box, arg)], dtype=torch.float64, device="cpu")
            for box, arg in ((box_a, "box_a"), (box_b, "box_b"))
        )
        return float(box_iou(a, b)[0, 0])

    @staticmethod
    def largest_component(mask: np.ndarray) -> np.ndarray:
        """The largest 8-connected component of a boolean ``[H, W]`` mask (ties: the first in raster order; all False
        for an empty mask)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.ndim != 2:
            raise ValueError(f"mask must be 2-D [H, W], got shape {mask.shape}")
        labels, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=int))
        if n == 0:
            return np.zeros_like(mask)
        sizes = np.bincount(labels.ravel())[1:]
        return labels == (int(np.argmax(sizes)) + 1)

    @staticmethod
    def mask_to_box(mask: np.ndarray) -> Optional[Box]:
        """Tight half-open box ``(x0, y0, x1, y1)`` of a boolean mask, ``None`` when empty."""
        mask = np.asarray(mask, dtype=bool)
        if not mask.any():
            return None
        ys, xs = np.nonzero(mask)
        return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1

    def resized_map(self, heatmap, image_size: Sequence[int]) -> np.ndarray:
        """``heatmap [h, w]`` min–max normalised, then resized bilinearly to ``image_size (H, W)``; float64 numpy.

        Raises:
            ValueError: a map that is not 2-D or does not fit the image (:func:`check_map_matches_image`).
        """
        m = torch.as_tensor(heatmap).detach().to("cpu", torch.float64)
        if m.ndim != 2:
            raise ValueError(f"map must be 2-D [h, w], got shape {tuple(m.shape)}")
        return maps_on_image(normalize_maps(m, "minmax"), image_size).numpy()

    def predict_boxes(self, heatmap, image_size: Sequence[int]):
        """One predicted box per threshold (``None`` where the thresholded map is empty)."""
        m = self.resized_map(heatmap, image_size)
        return [self.mask_to_box(self.largest_component(m >= t)) for t in self.thresholds]

    def correct(self, heatmap, box: Sequence[int], image_size: Sequence[int]) -> np.ndarray:
        """``[T]`` bool: is the predicted box at each threshold correct (IoU > ``iou_threshold``)?"""
        box = _check_box(box)
        preds = self.predict_boxes(heatmap, image_size)
        return np.array([p is not None and self.iou(p, box) > self.iou_threshold for p in preds])

    def evaluate(self, maps: Sequence, boxes: Sequence[Sequence[int]], image_sizes) -> Dict[str, object]:
        """Accuracy per threshold over a set of maps.

        Args:
            maps: sequence (or ``[N, h, w]`` tensor) of 2-D maps, any sign or scale.
            boxes: ``N`` ground-truth boxes ``(x0, y0, x1, y1)``; image_sizes: one ``(H, W)`` for all, or ``N``.

        Returns:
            ``"thresholds"`` ``[T]``, ``"accuracy"`` ``[T]`` (fractions), ``"best_accuracy"``, ``"best_threshold"``,
            ``"n"``.

        Raises:
            ValueError: length mismatch, empty input, malformed boxes or sizes, a map that does not match its image.
        """
        n = len(maps)
        if n == 0:
            raise ValueError("maps is empty")
        if len(boxes) != n:
            raise ValueError(f"got {n} maps but {len(boxes)} boxes")
        sizes = _sizes(image_sizes, n)
        if sizes.shape != (n, 2):
            raise ValueError(f"image_sizes must be (H, W) or [N, 2], got shape {sizes.shape}")
        hits = np.stack([self.correct(maps[i], boxes[i], sizes[i]) for i in range(n)])
        return {**_best(self.thresholds.copy(), hits.mean(axis=0), "threshold"), "n": n}

    def evaluate_methods(self, maps_by_method: Mapping[str, Sequence], boxes, image_sizes) -> Dict[str, Dict]:
        """:meth:`evaluate` for each method name → maps."""
        return {name: self.evaluate(maps, boxes, image_sizes) for name, maps in maps_by_method.items()}

    @staticmethod
    def centre_box_accuracy(
        boxes, image_sizes, fractions: Sequence[float] = tuple(np.arange(0.3, 1.01, 0.05)), iou_threshold=0.5
    ):
        """Baseline: a centred box covering ``fraction`` of each side; accuracy per fraction and the best.

        Returns dict with ``"fractions"``, ``"accuracy"``, ``"best_accuracy"``, ``"best_fraction"``.
        """
        acc = []
        for f in fractions:
            hits = []
            for (H, W), box in zip(_sizes(image_sizes, len(boxes)), boxes):
                h, w = max(1, int(round(H * f))), max(1, int(round(W * f)))
                y0, x0 = (H - h) // 2, (W - w) // 2
                hits.append(LocalizationEvaluator.iou((x0, y0, x0 + w, y0 + h), box) > iou_threshold)
            acc.append(float(np.mean(hits)))
        return _best(np.asarray(fractions), np.array(acc), "fraction")


def _sizes(image_sizes, n: int) -> np.ndarray:
    sizes = np.asarray(image_sizes)
    return np.tile(sizes, (n, 1)) if sizes.shape == (2,) else sizes


def _best(grid: np.ndarray, acc: np.ndarray, name: str) -> Dict[str, object]:
    best = int(np.argmax(acc))
    return {f"{name}s": grid, "accuracy": acc, "best_accuracy": float(acc[best]), f"best_{name}": float(grid[best])}
