"""Open Clip Art drawings (Debian package ``openclipart-png``) as a class-disjoint metric-learning dataset."""

import os
from collections import defaultdict
from typing import Callable, Optional

import numpy as np
from PIL import Image

from .class_disjoint_dataset import ClassDisjointDataset, select_split_classes
from .image_files import composite_on_white

OPENCLIPART_ROOT = "/usr/share/openclipart/png"
OPENCLIPART_HINT = "apt-get install openclipart-png"


def pixel_count(path: str) -> int:
    """Width × height from the PNG IHDR chunk (no decoding, no decompression-bomb limit)."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        return int.from_bytes(head[16:20], "big") * int.from_bytes(head[20:24], "big")
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(path) as image:
            return image.size[0] * image.size[1]
    finally:
        Image.MAX_IMAGE_PIXELS = old


class OpenClipArt(ClassDisjointDataset):
    """Public-domain drawings; class = the first two folder levels (``animals/birds``; files directly under a top folder
    belong to that folder), classes with at least ``min_images`` images kept, sorted by name, split alternately (train =
    even positions: sorted names group related topics). Each image is cropped to its alpha bounding box, shrunk to
    ``max_side`` pixels on its longer side and composited on white (RGB).

    Args:
        split: ``"train"``, ``"test"`` or ``"all"``.
        transform, target_transform: applied to the PIL RGB image / the int label.
        min_images: minimum images per class.
        max_classes: keep the classes with the most images (ties by name; before the split); ``None`` keeps all.
        max_side: longer side in pixels of the cached drawing.
        root: the package's PNG folder.
        rgba: return the cropped RGBA drawing instead of the white composite (for pasting onto photos).
        max_pixels: drawings larger than this (width × height, from the header) are left out before classes are
            counted, their paths kept in ``excluded_paths``.

    Raises:
        FileNotFoundError: if ``root`` does not exist (names the Debian package to install).
        ValueError: on a bad split or when no class has ``min_images`` images.
    """

    def __init__(
        self,
        split: str = "train",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        min_images: int = 20,
        max_classes: Optional[int] = None,
        max_side: int = 128,
        root: str = OPENCLIPART_ROOT,
        rgba: bool = False,
        max_pixels: int = 25_000_000,
    ):
        super().__init__(transform, target_transform)
        select_split_classes([], split)  # validates split before the folder scan
        if not isinstance(root, str):
            raise TypeError(f"root must be a folder path (str), got {root!r}")
        if not os.path.isdir(root):
            raise FileNotFoundError(f"Open Clip Art not found at {root}: {OPENCLIPART_HINT}")
        by_class = defaultdict(list)
        self.excluded_paths = []
        for dirpath, _, files in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            if rel == ".":
                continue
            name = "/".join(rel.split(os.sep)[:2])
            for f in files:
                if f.lower().endswith(".png"):
                    path = os.path.join(dirpath, f)
                    if pixel_count(path) > max_pixels:
                        self.excluded_paths.append(path)
                    else:
                        by_class[name].append(path)
        eligible = sorted(c for c, paths in by_class.items() if len(paths) >= min_images)
        if not eligible:
            raise ValueError(f"no Open Clip Art class under {root} has min_images={min_images} images")
        if max_classes is not None:
            eligible = sorted(sorted(eligible, key=lambda c: (-len(by_class[c]), c))[:max_classes])
        self.classes = eligible
        chosen = select_split_classes(range(len(eligible)), split, "alternate")
        self.paths, labels = [], []
        for label in chosen:
            paths = sorted(by_class[eligible[label]])
            self.paths += paths
            labels += [label] * len(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.split, self.max_side, self.rgba = split, max_side, rgba
        self._cache = {}

    def load_image(self, index: int) -> Image.Image:
        if index not in self._cache:  # the drawing cropped to its alpha box, shrunk to max_side
            with Image.open(self.paths[index]) as raw:
                image = raw.convert("RGBA")
            image = image.crop(image.getchannel("A").getbbox() or (0, 0, *image.size))
            image.thumbnail((self.max_side, self.max_side), Image.BILINEAR)
            self._cache[index] = image
        image = self._cache[index]
        return image.copy() if self.rgba else composite_on_white(image)
