"""Any ImageFolder tree (``root/<class>/<image>``) as a class-disjoint metric-learning dataset."""

import difflib
import os
from typing import Callable, Optional, Sequence

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from .class_disjoint_dataset import select_split_classes
from .image_files import ImageFileDataset


class ImageFolderSplit(ImageFileDataset):
    """Class-disjoint split of an ImageFolder tree: one class per first-level folder (images may sit in sub-folders,
    listed by torchvision's ``make_dataset``), classes sorted by folder name, train = the first half, test = the rest
    (``split_rule``), or test = the folders named in ``test_classes``; ``"all"`` = every class. Items are ``(PIL RGB
    image, int label)``; ``labels`` index ``classes``, the same in every split.

    Args:
        root: the folder of class folders.
        split: ``"train"``, ``"test"`` or ``"all"``.
        transform, target_transform: applied to the image / the label.
        split_rule: ``"halves"`` or ``"alternate"`` (:func:`pml_extensions.datasets.select_split_classes`).
        test_classes: the test classes' folder names (instead of ``split_rule``).

    Raises:
        FileNotFoundError: if ``root`` is not a folder.
        ValueError: on a bad split, a tree with no class folders, class folders without images (all named), or a
            ``test_classes`` name that is not a class folder (with the nearest one).

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
        test_classes: Optional[Sequence[str]] = None,
    ):
        super().__init__(transform, target_transform)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"root {root!r} is not a folder of class sub-folders")
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise ValueError(f"root {root!r} has no class sub-folders (expected {root}/<class>/<image>)")
        walks = {c: os.walk(os.path.join(root, c), followlinks=True) for c in classes}
        empty = [c for c in classes if not any(f.lower().endswith(IMG_EXTENSIONS) for *_, fs in walks[c] for f in fs)]
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
        if test_classes is None:
            keep = set(select_split_classes(classes, split, split_rule))
        else:
            named = named_test_classes(test_classes, classes, f"root {root!r}")
            select_split_classes(classes, split)  # the split's name is checked here
            keep = set(classes) if split == "all" else {c for c in classes if (c in named) == (split == "test")}
        samples = make_dataset(root, {c: i for i, c in enumerate(classes)}, IMG_EXTENSIONS)
        samples = [(p, t) for p, t in samples if classes[t] in keep]
        self.paths = [p for p, _ in samples]
        self.labels = np.asarray([t for _, t in samples], dtype=np.int64)
        self.split = split


def _near(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def named_test_classes(names: Sequence[str], classes: Sequence[str], where: str) -> set:
    """``names`` as a set, each one of ``classes`` (ValueError: none, an unknown one, or every class named)."""
    names = [names] if isinstance(names, str) else [str(n) for n in names]
    if not names:
        raise ValueError(f"{where}: test_classes is empty; name at least one class")
    unknown = [n for n in names if n not in classes]
    if unknown:
        listed = ", ".join(classes[:8]) + (", ..." if len(classes) > 8 else "")
        raise ValueError(
            f"{where}: test_classes: {unknown[0]!r} is not a class{_near(unknown[0], classes)} ({len(classes)} "
            f"classes: {listed})"
        )
    if set(names) >= set(classes):
        raise ValueError(f"{where}: test_classes names every class: leave some for training")
    return set(names)
