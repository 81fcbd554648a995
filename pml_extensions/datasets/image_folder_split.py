"""Any ImageFolder tree (``root/<class>/<image>``) as a class-disjoint metric-learning dataset."""

import os
from typing import Callable, Optional

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from .class_disjoint_dataset import select_split_classes
from .image_files import ImageFileDataset, scan_class_folders


class ImageFolderSplit(ImageFileDataset):
    """Class-disjoint split of an ImageFolder tree: one class per first-level folder (images may sit in sub-folders),
    classes sorted by folder name, train = the first half, test = the rest (``split_rule``), ``"all"`` = every class.

    Uses torchvision's ``make_dataset`` to list images (extensions ``IMG_EXTENSIONS``: .jpg .jpeg .png .ppm .bmp .pgm
    .tif .tiff .webp). Items are ``(PIL RGB image, int label)``: grey images become RGB, transparency is composited on
    white; ``labels`` are the class indices of ``classes`` (the same in every split). Files are decoded when read;
    :meth:`unreadable_images` decodes them all once and names the bad ones.

    Args:
        root: the folder of class folders.
        split: ``"train"``, ``"test"`` or ``"all"``.
        transform, target_transform: applied to the image / the label.
        split_rule: ``"halves"`` or ``"alternate"`` (:func:`pml_extensions.datasets.select_split_classes`).

    Raises:
        FileNotFoundError: if ``root`` is not a folder.
        ValueError: on a bad split, a tree with no class folders, or class folders without images (all named).

    Example::

        >>> import os, tempfile
        >>> from PIL import Image
        >>> root = tempfile.mkdtemp()
        >>> for name in ("ant", "bee", "cat", "dog"):
        ...     os.makedirs(os.path.join(root, name))
        ...     Image.new("L", (6, 4)).save(os.path.join(root, name, "1.png"))
        >>> train = ImageFolderSplit(root, "train")
        >>> train.split_classes, train[0][0].mode, ImageFolderSplit(root, "test").labels.tolist()
        (['ant', 'bee'], 'RGB', [2, 3])
    """

    def __init__(
        self,
        root: str,
        split: str = "train",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        split_rule: str = "halves",
    ):
        super().__init__(transform, target_transform)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"root {root!r} is not a folder of class sub-folders")
        classes, empty = scan_class_folders(root, IMG_EXTENSIONS)
        if not classes:
            raise ValueError(f"root {root!r} has no class sub-folders (expected {root}/<class>/<image>)")
        if empty:
            shown = ", ".join(os.path.join(root, c) for c in empty[:10]) + (
                f" (+{len(empty) - 10} more)" if len(empty) > 10 else ""
            )
            raise ValueError(
                f"{len(empty)} class folder(s) of {root!r} hold no image ({', '.join(IMG_EXTENSIONS)}): {shown}; "
                "add images or remove the folders"
            )
        self.root = root
        self.classes = classes
        keep = set(select_split_classes(classes, split, split_rule))
        samples = make_dataset(root, {c: i for i, c in enumerate(classes)}, IMG_EXTENSIONS)
        samples = [(p, t) for p, t in samples if classes[t] in keep]
        self.paths = [p for p, _ in samples]
        self.labels = np.asarray([t for _, t in samples], dtype=np.int64)
        self.split = split
