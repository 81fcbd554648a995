"""Reference images for an explanation: a folder read recursively with class labels from folder names (torchvision's
``ImageFolder`` layout) or a CSV table of files (:class:`pml_extensions.datasets.ImageCSVSplit`), the query's own
file left out, transparent drawings shown on white.
"""

import hashlib
import os
import warnings
from typing import List, NamedTuple, Optional, Sequence, Tuple

from PIL import Image

#: torchvision's ImageFolder extensions (what a run trains on: .ppm and .pgm too) and .gif
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


class ReferenceImage(NamedTuple):
    """One reference file: its ``path`` and ``label``: the first folder under the root (``None`` for a file in the root,
    as ``ImageFolder`` assigns classes) or a table's label.
    """

    path: str
    label: Optional[str]


def read_image(path: str, mode: str = "RGB") -> Image.Image:
    """Open ``path`` as a PIL image in ``mode`` (``"RGB"`` or ``"L"``), transparent pixels composited on white as the
    package's datasets do.

    Raises:
        ValueError: the file cannot be read or decoded (one line naming the file).

    Example::

        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "clear.png")
        >>> Image.new("RGBA", (2, 2), (0, 0, 0, 0)).save(path)
        >>> read_image(path).getpixel((0, 0))
        (255, 255, 255)
    """
    try:
        with warnings.catch_warnings():  # a large drawing is slow to decode, not an attack: no two-line warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im.load()
                if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                    im = im.convert("RGBA")
                    im = Image.alpha_composite(Image.new("RGBA", im.size, (255, 255, 255, 255)), im)
                return im.convert(mode)
    except (OSError, Image.UnidentifiedImageError, Image.DecompressionBombError) as e:
        raise ValueError(f"cannot read image {path}: {e}") from None


def list_reference_images(folder: str) -> List[ReferenceImage]:
    """Every image file under ``folder``, recursively (hidden entries skipped, links to folders not followed), sorted by
    path, labelled as :class:`ReferenceImage`.

    Raises:
        ValueError: ``folder`` is not a folder, or holds no image file (the message names the extensions).

    Example::

        >>> import tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> for name in ("birds/a.png", "birds/b.png", "fish/deep/c.png", "d.png"):
        ...     os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        ...     Image.new("RGB", (4, 4)).save(os.path.join(root, name))
        >>> [(os.path.relpath(r.path, root), r.label) for r in list_reference_images(root)]
        [('birds/a.png', 'birds'), ('birds/b.png', 'birds'), ('d.png', None), ('fish/deep/c.png', 'fish')]
    """
    if not os.path.isdir(folder):
        raise ValueError(f"reference folder {folder} is not a folder")
    found = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(here, folder)
        label = None if rel == os.curdir else rel.split(os.sep)[0]
        for name in files:
            if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS):
                found.append(ReferenceImage(os.path.join(here, name), label))
    if not found:
        raise ValueError(f"no images in {folder} or its subfolders (looked for {', '.join(IMAGE_EXTENSIONS)})")
    return sorted(found, key=lambda r: r.path)


def list_table_images(csv_file: str, columns=None, split: str = "all") -> List[ReferenceImage]:
    """The ``split`` rows of a CSV table of images (:class:`pml_extensions.datasets.ImageCSVSplit`; ``columns`` maps
    other column names: ``"label=category,path=image"``) as :class:`ReferenceImage`, label as written, in order.

    Raises:
        FileNotFoundError, ValueError: as :class:`pml_extensions.datasets.ImageCSVSplit`.

    Example::

        >>> import tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> Image.new("RGB", (4, 4)).save(os.path.join(root, "tee 1.png"))
        >>> _ = open(os.path.join(root, "t.csv"), "w").write("image,category\\ntee 1.png,T-Shirts / Tops\\n")
        >>> refs = list_table_images(os.path.join(root, "t.csv"), "path=image,label=category")
        >>> [(os.path.basename(r.path), r.label) for r in refs]
        [('tee 1.png', 'T-Shirts / Tops')]
    """
    from ..datasets.image_csv_split import ImageCSVSplit

    table = ImageCSVSplit(csv_file, split, columns=columns)
    return [ReferenceImage(p, table.classes[int(y)]) for p, y in zip(table.paths, table.labels)]


def _digest(path: str) -> str:
    h = hashlib.sha256()  # hashlib.file_digest is Python 3.11+; the package supports 3.9
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def exclude_query(
    query: str, references: Sequence[ReferenceImage]
) -> Tuple[List[ReferenceImage], List[Tuple[ReferenceImage, str]]]:
    """Leave the query's own file out of its references: the same file (path or link) or the same bytes (a copy).

    Returns:
        ``(kept, excluded)``: the other references in order, and ``(reference, reason)`` pairs, ``reason`` ``"same file
        as the query"`` or ``"same bytes as the query"``.

    Example::

        >>> import tempfile, os, shutil
        >>> root = tempfile.mkdtemp()
        >>> Image.new("RGB", (4, 4)).save(os.path.join(root, "q.png"))
        >>> _ = shutil.copy(os.path.join(root, "q.png"), os.path.join(root, "copy.png"))
        >>> Image.new("RGB", (4, 4), (9, 9, 9)).save(os.path.join(root, "other.png"))
        >>> kept, excluded = exclude_query(os.path.join(root, "q.png"), list_reference_images(root))
        >>> [os.path.basename(r.path) for r in kept], [(os.path.basename(r.path), why) for r, why in excluded]
        (['other.png'], [('copy.png', 'same bytes as the query'), ('q.png', 'same file as the query')])
    """
    size = os.path.getsize(query)
    query_digest = None
    kept, excluded = [], []
    for ref in references:
        if os.path.exists(ref.path) and os.path.samefile(query, ref.path):
            excluded.append((ref, "same file as the query"))
            continue
        if os.path.getsize(ref.path) == size:
            query_digest = query_digest or _digest(query)
            if _digest(ref.path) == query_digest:
                excluded.append((ref, "same bytes as the query"))
                continue
        kept.append(ref)
    return kept, excluded
