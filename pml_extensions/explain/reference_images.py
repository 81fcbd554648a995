"""Reference images for an explanation: a folder (torchvision's ``ImageFolder`` layout) or a CSV table of files, the
query's own file left out, transparent drawings shown on white."""

import hashlib
import os
import warnings
from typing import List, NamedTuple, Optional, Sequence, Tuple

from PIL import Image

#: torchvision's ImageFolder extensions (what a run trains on: .ppm and .pgm too) and .gif
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


class ReferenceImage(NamedTuple):
    """One reference file: its ``path`` and ``label``: the first folder under the root (``None`` for a file in the root,
    as ``ImageFolder`` assigns classes) or a table's label."""

    path: str
    label: Optional[str]


def read_image(path: str, mode: str = "RGB") -> Image.Image:
    """Open ``path`` as a PIL image in ``mode`` (``"RGB"`` or ``"L"``), transparent pixels composited on white as the
    package's datasets do; ``ValueError`` naming the file when it cannot be read."""
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


def load_image(path: str, size: int, channels: int = 3, keep_aspect: bool = False, stats=None):
    """Image file → float ``[channels, size, size]`` tensor (no crop, as the authors' demo), or with ``keep_aspect`` its
    shorter side ``size``; normalised with ``stats = (mean, std)``, else :func:`default_stats`; ``ValueError`` naming
    the file when it cannot be read (:func:`read_image`)."""
    from torchvision.transforms import functional as TF

    im = read_image(path, "RGB" if channels == 3 else "L")  # transparency on white, as the datasets
    if keep_aspect:
        w, h = im.size
        new = (size, max(1, round(h * size / w))) if w <= h else (max(1, round(w * size / h)), size)
    else:
        new = (size, size)
    im = im.resize(new, Image.BILINEAR)
    x = TF.to_tensor(im)
    mean, std = stats if stats is not None else default_stats(channels)
    return x if mean is None else TF.normalize(x, mean, std)


def default_stats(channels: int):
    """``(mean, std)`` of an image without its run's: ImageNet's for 3 channels, ``(None, None)`` (none) for grey."""
    from ..datasets.normalization import IMAGENET_MEAN, IMAGENET_STD

    return (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else (None, None)


def list_reference_images(folder: str) -> List[ReferenceImage]:
    """Every image file under ``folder``, recursively (hidden entries skipped, links to folders not followed), sorted by
    path, labelled as :class:`ReferenceImage`; ``ValueError`` for a missing folder or one without images."""
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
    """The ``split`` rows of a CSV table of images (:class:`pml_extensions.datasets.ImageCSVSplit`, which raises;
    ``columns`` maps other column names: ``"label=category,path=image"``) as :class:`ReferenceImage`, in order."""
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
    """``(kept, excluded)``: the references other than the query's own file (the same path or link, or the same bytes),
    and ``(reference, "same file as the query" | "same bytes as the query")`` pairs."""
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
