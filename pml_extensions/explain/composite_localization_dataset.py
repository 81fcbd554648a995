"""Seeded composites with exact object boxes and masks, for offline weakly supervised localisation (standing in for
CUB's boxes, Zhu et al., TIP 2021, Sec. VI-A)."""

import functools
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from ..utils.checks import is_int
from .localization_evaluator import LocalizationEvaluator

DEFAULT_BACKGROUNDS = tuple(
    "astronaut brick camera chelsea coffee coins grass gravel moon rocket clock hubble_deep_field "
    "immunohistochemistry retina stereo_motorcycle page text".split()
)
SOURCES = ("clipart", "glyph")


@functools.lru_cache(maxsize=None)
def background_image(name: str) -> Image.Image:
    """A ``skimage.data`` image as RGB PIL (grey images replicated; stereo pairs: the left view)."""
    import skimage.data

    loader = getattr(skimage.data, name, None)
    if loader is None:
        raise ValueError(f"skimage.data has no image {name!r}")
    a = loader()
    if isinstance(a, tuple):
        a = a[0]
    a = np.asarray(a)
    if a.dtype == bool:
        a = a.astype(np.uint8) * 255
    if a.dtype != np.uint8:
        a = np.clip(a / max(float(a.max()), 1e-12) * 255, 0, 255).astype(np.uint8)
    return Image.fromarray(a if a.ndim == 2 else a[..., :3]).convert("RGB")  # grey: "L" -> RGB replicates it


def glyph_rgba(gray: Image.Image, colour: Tuple[int, int, int]) -> Image.Image:
    """Black-on-white glyph → RGBA ink of one colour, alpha = 255 − grey, cropped to the ink."""
    alpha = Image.eval(gray.convert("L"), lambda v: 255 - v)
    ink = Image.new("RGBA", gray.size, colour + (0,))
    ink.putalpha(alpha)
    box = alpha.getbbox()
    return ink.crop(box) if box else ink


class CompositeLocalizationDataset(torch.utils.data.Dataset):
    """Objects pasted on real backgrounds; items ``(image, label)`` with exact ``boxes`` and ``masks``.

    Each image is drawn from ``numpy.random.default_rng(seed)``: a class, an object of it, a background (random square
    crop of 50–100 % of the shorter side, resized to ``image_size``), the object's longer side (``object_scale`` ×
    ``image_size``), a position fully inside and (glyphs) an ink colour. Drawings whose alpha > 127 covers under 5 %
    of their canvas are redrawn; a class with 50 such draws in a row is dropped. Mask: the pasted alpha > 127; box:
    its tight half-open ``(x0, y0, x1, y1)`` in pixels.

    Args:
        split: ``"train"`` / ``"test"`` (class-disjoint classes of :class:`pml_extensions.datasets.OpenClipArt` /
            :class:`~pml_extensions.datasets.GlyphDataset`) or ``"all"``.
        n_images: number of composites (default 200); image_size: square side in pixels (default 320).
        source: ``"clipart"`` (default; needs ``openclipart-png``) or ``"glyph"`` (matplotlib's fonts).
        seed: integer seed (default 0); object_scale: longer side's range, fraction of ``image_size`` (0.3, 0.6).
        transform: applied to the RGB PIL image in ``__getitem__``.
        backgrounds: ``skimage.data`` names. Default :data:`DEFAULT_BACKGROUNDS`.
        min_images, max_classes, root: passed to ``OpenClipArt``.
        exclude_classes: class-name prefixes left out. Default ``("special",)`` (gradients and patterns).

    Attributes:
        labels ``[N]`` int64, classes (names), boxes ``[N, 4]`` int64, masks (``[H, W]`` bool), images (PIL RGB),
        background_names.

    Raises:
        FileNotFoundError: ``source="clipart"`` without the Debian package (names it).
        ValueError: bad split, source, sizes or scale range; no class with usable drawings.
    """

    def __init__(
        self,
        split: str = "test",
        n_images: int = 200,
        image_size: int = 320,
        source: str = "clipart",
        seed: int = 0,
        object_scale: Sequence[float] = (0.3, 0.6),
        transform: Optional[Callable] = None,
        backgrounds: Sequence[str] = DEFAULT_BACKGROUNDS,
        min_images: int = 20,
        max_classes: Optional[int] = None,
        root: Optional[str] = None,
        exclude_classes: Sequence[str] = ("special",),
    ):
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        if not is_int(n_images) or n_images < 1:
            raise ValueError(f"n_images must be a positive int, got {n_images!r}")
        if not is_int(image_size) or image_size < 16:
            raise ValueError(f"image_size must be an int >= 16 (pixels), got {image_size!r}")
        lo, hi = (float(v) for v in object_scale)
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"object_scale must satisfy 0 < low <= high <= 1, got {tuple(object_scale)}")
        if not backgrounds:
            raise ValueError("backgrounds must name at least one skimage.data image")
        self.transform = transform
        self.image_size = image_size
        rng = np.random.default_rng(seed)
        if source == "clipart":
            from pml_extensions.datasets.open_clip_art import OPENCLIPART_ROOT, OpenClipArt

            objects = OpenClipArt(
                split,
                rgba=True,
                max_side=image_size,
                min_images=min_images,
                max_classes=max_classes,
                root=root or OPENCLIPART_ROOT,
            )
        else:
            from pml_extensions.datasets.glyph_dataset import GlyphDataset

            objects = GlyphDataset(split, image_size=min(image_size, 128), source="matplotlib")
        self.classes = list(objects.classes)
        obj_labels = np.asarray(objects.labels)
        present = np.asarray(
            [c for c in np.unique(obj_labels) if not str(self.classes[c]).startswith(tuple(exclude_classes))]
        )
        if present.size == 0:
            raise ValueError("no object class left after exclude_classes")
        self.images, self.masks, self.background_names = [], [], []
        labels, boxes = [], []
        unusable = set()
        for _ in range(n_images):
            obj = None
            while obj is None:
                usable = np.asarray([c for c in present if c not in unusable])
                if usable.size == 0:
                    raise ValueError("no object class has drawings with a usable alpha channel")
                label = int(rng.choice(usable))
                members = np.flatnonzero(obj_labels == label)
                for _attempt in range(50):  # faint or transparent drawings: draw another of the class
                    index = int(members[rng.integers(len(members))])
                    if source == "clipart":
                        candidate = objects.load_image(index)
                    else:
                        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
                        candidate = glyph_rgba(objects.load_image(index), colour)
                    alpha_obj = np.asarray(candidate.convert("RGBA").getchannel("A"))
                    if (alpha_obj > 127).sum() >= 0.05 * alpha_obj.size:
                        obj = candidate
                        break
                else:
                    unusable.add(label)  # e.g. Open Clip Art's thin semi-transparent stars
            bg_name = str(backgrounds[rng.integers(len(backgrounds))])
            bg = background_image(bg_name)
            side = min(bg.size)
            crop = int(round(side * rng.uniform(0.5, 1.0)))
            cx = int(rng.integers(0, bg.size[0] - crop + 1))
            cy = int(rng.integers(0, bg.size[1] - crop + 1))
            canvas = bg.crop((cx, cy, cx + crop, cy + crop)).resize((image_size, image_size), Image.BILINEAR)
            longer = max(2, int(round(image_size * rng.uniform(lo, hi))))
            scale = longer / max(obj.size)
            ow, oh = max(1, int(round(obj.size[0] * scale))), max(1, int(round(obj.size[1] * scale)))
            obj = obj.convert("RGBA").resize((ow, oh), Image.BILINEAR)
            x = int(rng.integers(0, image_size - ow + 1))
            y = int(rng.integers(0, image_size - oh + 1))
            layer = Image.new("RGBA", (image_size, image_size), (0, 0, 0, 0))
            layer.paste(obj, (x, y))
            image = Image.alpha_composite(canvas.convert("RGBA"), layer).convert("RGB")
            alpha = np.asarray(layer.getchannel("A"))
            mask = alpha > 127
            if not mask.any():
                mask = alpha > 0
            boxes.append(LocalizationEvaluator.mask_to_box(mask))
            labels.append(label)
            self.images.append(image)
            self.masks.append(mask)
            self.background_names.append(bg_name)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])
