"""62 character classes (0-9, A-Z, a-z) rendered offline from installed fonts; one image per (font, character)."""

import functools
import glob
import hashlib
import os
import string
from typing import Callable, List, Optional, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..utils.checks import is_int
from .class_disjoint_dataset import ClassDisjointDataset, select_split_classes

CHARACTERS = string.digits + string.ascii_uppercase + string.ascii_lowercase
# Fonts that render placeholders (LastResort) or symbol/extension glyphs (TeX math extension and symbol fonts).
EXCLUDED_FONTS = ("LastResortHE", "cmex10", "cmsy10")
DEBIAN_FONT_DIRS = ("/usr/share/fonts",)
DEBIAN_HINT = "apt-get install fonts-dejavu-core fonts-liberation fonts-freefont-ttf fonts-noto-core"
SOURCES = ("matplotlib", "debian", "all")


def matplotlib_font_files(prefix: str = "") -> List[str]:
    """The TrueType files shipped inside matplotlib (``mpl-data/fonts/ttf``), sorted; with ``prefix`` only those whose
    file name starts with it (``"DejaVuSans"``: the DejaVu Sans faces, Mono included)."""
    import matplotlib

    folder = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf")
    return sorted(glob.glob(os.path.join(folder, glob.escape(prefix) + "*.ttf")))


def debian_font_files(dirs=DEBIAN_FONT_DIRS) -> List[str]:
    """TrueType/OpenType files installed by Debian ``fonts-*`` packages."""
    return sorted({f for d in dirs for e in ("ttf", "otf") for f in glob.glob(f"{d}/**/*.{e}", recursive=True)})


def _font_cmap(path):
    from fontTools.ttLib import TTFont

    try:
        with TTFont(path, lazy=True, fontNumber=0) as font:
            return set(font.getBestCmap() or {})
    except Exception:  # unreadable font file: treat as having no glyphs
        return set()


def render_glyph(font: ImageFont.FreeTypeFont, char: str, image_size: int) -> Optional[Image.Image]:
    """Black-on-white ``char``, centred on its ink box; ``None`` when nothing is drawn."""
    image = Image.new("L", (image_size, image_size), 255)
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), char, font=font)
    if right <= left or bottom <= top:
        return None
    x = (image_size - (right - left)) / 2 - left
    y = (image_size - (bottom - top)) / 2 - top
    draw.text((x, y), char, fill=0, font=font)
    if np.asarray(image).min() == 255:
        return None
    return image


@functools.lru_cache(maxsize=4)
def _render(font_files: Tuple[str, ...], wanted: Tuple[int, ...], image_size: int):
    """``(pixels, labels, fonts)`` of every usable, distinct rendering (cached: a run builds each split often)."""
    pixels, labels, fonts, seen = [], [], [], set()
    for path in font_files:
        cmap = _font_cmap(path)
        if not cmap:
            continue
        try:
            font = ImageFont.truetype(path, size=max(4, int(round(image_size * 0.7))))
        except OSError:
            continue
        for label in wanted:
            char = CHARACTERS[label]
            if ord(char) not in cmap or (image := render_glyph(font, char, image_size)) is None:
                continue
            data = image.tobytes()
            key = (label, hashlib.sha1(data).hexdigest())
            if key in seen:
                continue
            seen.add(key)
            pixels.append(data)
            labels.append(label)
            fonts.append(path)
    return tuple(pixels), tuple(labels), tuple(fonts)


class GlyphDataset(ClassDisjointDataset):
    """Character glyphs as a metric-learning dataset with 62 classes (digits, upper- and lower-case letters): one
    grayscale image per usable font and character (``EXCLUDED_FONTS``, characters missing from a font's character map
    and renderings identical to one already in the class are skipped).

    Args:
        split: ``"train"`` (first 31 classes: 0-9, A-U), ``"test"`` (the other 31: V-Z, a-z) or ``"all"``.
        image_size: side of the square image in pixels (the glyph is drawn at 0.7 of it).
        source: ``"matplotlib"`` (the ~30 fonts inside matplotlib; always available), ``"debian"`` (files under
            /usr/share/fonts from Debian ``fonts-*`` packages) or ``"all"``.
        transform, target_transform: applied to the PIL ``"L"`` image / the int label.
        font_files: explicit font paths (overrides ``source``).

    Items: ``(PIL.Image mode "L" [image_size × image_size], int label)``; ``labels`` [N] int64, ``classes`` the 62
    characters, ``fonts`` [N] the font file of each item.

    Raises:
        ValueError: on a bad split, source or image_size.
        FileNotFoundError: when ``source="debian"`` finds no fonts (names the packages to install).
    """

    def __init__(
        self,
        split: str = "train",
        image_size: int = 32,
        source: str = "matplotlib",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        font_files: Optional[List[str]] = None,
    ):
        super().__init__(transform, target_transform)
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        if not is_int(image_size) or image_size < 8:
            raise ValueError(f"image_size must be an int >= 8 (pixels), got {image_size!r}")
        if font_files is None:
            font_files = []
            if source in ("matplotlib", "all"):
                font_files += matplotlib_font_files()
            if source in ("debian", "all"):
                debian = debian_font_files()
                if not debian:
                    raise FileNotFoundError(f"no Debian fonts under {DEBIAN_FONT_DIRS}: {DEBIAN_HINT}")
                font_files += debian
        elif isinstance(font_files, (str, bytes)) or not all(isinstance(f, str) for f in font_files):
            raise TypeError(f"font_files must be a list of font file paths, got {font_files!r}")
        else:
            missing = [f for f in font_files if not os.path.isfile(f)]
            if missing:
                raise FileNotFoundError(f"font_files: no such font file {missing[0]!r}")
        font_files = [f for f in font_files if not os.path.basename(f).startswith(EXCLUDED_FONTS)]
        self.classes = list(CHARACTERS)
        wanted = set(select_split_classes(range(len(CHARACTERS)), split, "halves"))
        self.split, self.image_size = split, image_size
        pixels, labels, fonts = _render(tuple(font_files), tuple(sorted(wanted)), image_size)
        if not pixels:
            raise ValueError(f"no usable glyphs rendered from {len(font_files)} font file(s): {font_files[:3]}")
        self.images = [Image.frombytes("L", (image_size, image_size), p) for p in pixels]  # each dataset its own
        self.labels = np.asarray(labels, dtype=np.int64)
        self.fonts = list(fonts)

    def load_image(self, index: int) -> Image.Image:
        return self.images[index]
