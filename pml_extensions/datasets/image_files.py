"""Datasets of image files (an ImageFolder tree, a CSV table): one way to open an image, and one pass that names
every file that does not decode (PIL's ``image file is truncated`` names no file, and would surface only when that
file is read)."""

import warnings
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from .class_disjoint_dataset import ClassDisjointDataset


@contextmanager
def _open(path: str) -> Iterator[Image.Image]:
    """``Image.open(path)`` without PIL's decompression-bomb warning (large_images names a large image once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            yield image


def image_problem(path: str) -> Optional[str]:
    """Why ``path`` does not decode (PIL's reason), or None: a PNG ``verify``-ed (every CRC), others decoded (JPEG at
    1/8 scale)."""
    try:
        with _open(path) as image:
            if image.format == "PNG":
                image.verify()
            else:
                if image.format == "JPEG":
                    image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
                image.load()
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:  # PIL's decoder errors
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        reason = reason.replace(repr(path), "").replace(str(path), "").strip(" :")
        if "runcated" in reason:  # PIL says "Truncated File Read" (verify) or "image file is truncated" (load)
            reason = "image file is truncated"
        return reason or type(e).__name__
    return None


def find_unreadable_images(paths: Iterable[str], progress: Optional[Callable[[int], None]] = None):
    """``[(path, reason)]`` of the files among ``paths`` that do not decode (:func:`image_problem`), in order.

    Args:
        paths: image files.
        progress: called with the number of files checked so far, every 500 files.

    Example::

        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> Image.new("RGB", (8, 8)).save(os.path.join(folder, "good.png"))
        >>> _ = open(os.path.join(folder, "bad.png"), "wb").write(b"not an image")
        >>> [(os.path.basename(p), why) for p, why in find_unreadable_images([os.path.join(folder, f)
        ...                                                                  for f in ("good.png", "bad.png")])]
        [('bad.png', 'cannot identify image file')]
    """
    bad = []
    for i, path in enumerate(paths):
        reason = image_problem(path)
        if reason is not None:
            bad.append((path, reason))
        if progress is not None and (i + 1) % 500 == 0:
            progress(i + 1)
    return bad


def large_images(paths: Iterable[str], limit: Optional[int] = None) -> List[Tuple[str, Tuple[int, int]]]:
    """``[(path, (width, height))]`` of the files with more than ``limit`` pixels (default PIL's decompression-bomb
    limit, about 89 megapixels; up to twice it they load, decoded in full every epoch), read from their headers; files
    that do not open are skipped."""
    limit = Image.MAX_IMAGE_PIXELS if limit is None else limit
    if limit is None:
        return []
    found = []
    for path in paths:
        try:
            with _open(path) as image:
                size = image.size
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            continue
        if size[0] * size[1] > limit:
            found.append((path, size))
    return found


def composite_on_white(image: Image.Image) -> Image.Image:
    """An RGBA image composited on white, as RGB."""
    background = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, image).convert("RGB")


def load_rgb(path: str) -> Image.Image:
    """The image at ``path`` as RGB, transparency composited on white (OSError naming ``path`` if undecodable)."""
    try:
        with _open(path) as image:
            image.load()
            if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
                return composite_on_white(image.convert("RGBA"))
            return image.convert("RGB")
    except OSError as e:
        raise OSError(f"{path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


class ImageFileDataset(ClassDisjointDataset):
    """A :class:`ClassDisjointDataset` whose items are image files: ``paths`` (one per item) beside ``labels``;
    items are ``(PIL RGB image, int label)``."""

    def __init__(self, transform: Optional[Callable] = None, target_transform: Optional[Callable] = None):
        super().__init__(transform, target_transform)
        self.paths: List[str] = []

    def load_image(self, index: int) -> Image.Image:
        return load_rgb(self.paths[index])

    def unreadable_images(self) -> List[Tuple[str, str]]:
        """``[(path, reason)]`` of the files that do not decode (one full decode of every file)."""
        return find_unreadable_images(self.paths)

    def drop(self, paths: Sequence[str]) -> int:
        """Leave the items of ``paths`` out; returns how many. Labels keep their values (a class keeps its index)."""
        gone = set(paths)
        keep = np.asarray([i for i, p in enumerate(self.paths) if p not in gone], dtype=np.int64)
        dropped = len(self.paths) - len(keep)
        self.paths = [self.paths[int(i)] for i in keep]
        self.labels = self.labels[keep]
        return dropped
