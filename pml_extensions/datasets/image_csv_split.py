"""A CSV table of image files (``label``, ``path``, optional ``split``: open-metric-learning's columns) as a
class-disjoint metric-learning dataset."""

import csv
import os
from typing import Callable, Dict, List, Optional

import numpy as np

from .class_disjoint_dataset import SPLITS, select_split_classes
from .image_files import ImageFileDataset

#: values of the ``split`` column: OML writes ``train`` / ``validation``; ``test`` is read as ``validation``
TRAIN_VALUES = ("train",)
TEST_VALUES = ("validation", "test")
#: OML's bounding-box columns (left, right, top, bottom), used to crop when a row fills them
BOX_COLUMNS = ("x_1", "x_2", "y_1", "y_2")


def _label_order(values: List[str]) -> List[str]:
    """Distinct labels sorted as numbers when they all are integers, else as strings."""
    distinct = sorted(set(values))
    try:
        return sorted(distinct, key=lambda v: int(v))
    except ValueError:
        return distinct


class ImageCSVSplit(ImageFileDataset):
    """Images listed in a CSV file, one row per image: open-metric-learning's table format.

    Columns (a header row names them; other columns are left alone):

    - ``label``: the class (an integer or a name);
    - ``path``: the image file, absolute or relative to ``root`` (default: the CSV file's folder);
    - ``split`` (optional): ``train`` or ``validation`` (``test`` is read as ``validation``). With it, ``split="train"``
      is the rows marked ``train`` and ``split="test"`` the others; without it, the classes are split as
      :class:`pml_extensions.datasets.ImageFolderSplit` splits folders (sorted labels, first half = train);
    - ``is_query`` / ``is_gallery`` (optional, OML): every validation item must be both (each item is compared with
      the rest, as for CUB / Cars196 / SOP); other values are refused;
    - ``x_1, x_2, y_1, y_2`` (optional, OML's box: left, right, top, bottom): rows that fill them are cropped to it;
    - ``category`` (optional, OML): kept as ``categories`` (one per item), not used for training.

    Items are ``(PIL RGB image, int label)``; ``labels`` index ``classes`` (all labels of the file, in order).

    Raises:
        FileNotFoundError: a missing CSV file.
        ValueError: a missing ``label`` / ``path`` column, an empty table, an unknown ``split`` value, a row with an
            empty label or path, query/gallery marks this dataset cannot honour, a bad box (each names the row).

    Example::

        >>> import os, tempfile
        >>> from PIL import Image
        >>> folder = tempfile.mkdtemp()
        >>> rows = ["label,path,split"]
        >>> for i, (label, split) in enumerate([(0, "train"), (0, "train"), (1, "validation"), (1, "validation")]):
        ...     Image.new("RGB", (4, 4)).save(os.path.join(folder, f"{i}.png"))
        ...     rows.append(f"{label},{i}.png,{split}")
        >>> _ = open(os.path.join(folder, "table.csv"), "w").write("\\n".join(rows) + "\\n")
        >>> test = ImageCSVSplit(os.path.join(folder, "table.csv"), split="test")
        >>> test.classes, test.labels.tolist(), [os.path.basename(p) for p in test.paths]
        (['0', '1'], [1, 1], ['2.png', '3.png'])
    """

    def __init__(
        self,
        csv_file: str,
        split: str = "train",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        root: Optional[str] = None,
        split_rule: str = "halves",
    ):
        super().__init__(transform, target_transform)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not os.path.isfile(csv_file):
            raise FileNotFoundError(f"csv_file {csv_file!r} is not a file (a table with label and path columns)")
        with open(csv_file, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
        columns = set(rows[0]) if rows else set()
        missing = [c for c in ("label", "path") if c not in columns]
        if missing:
            raise ValueError(f"{csv_file}: no {' and no '.join(missing)} column (header: {sorted(columns)})")
        base = root if root is not None else os.path.dirname(os.path.abspath(csv_file))
        for n, row in enumerate(rows, start=2):  # line numbers as an editor shows them (header = 1)
            if not (row.get("label") or "").strip() or not (row.get("path") or "").strip():
                raise ValueError(f"{csv_file}:{n}: empty label or path")
            value = (row.get("split") or "").strip()
            if "split" in columns and value not in TRAIN_VALUES + TEST_VALUES:
                raise ValueError(f"{csv_file}:{n}: split {value!r} is not one of train, validation (or test)")
            marks = [(row.get(c) or "").strip().lower() for c in ("is_query", "is_gallery")]
            if value in TEST_VALUES and any(m in ("false", "0") for m in marks):
                raise ValueError(
                    f"{csv_file}:{n}: is_query/is_gallery {marks}: separate query and gallery sets are not supported "
                    "(every item is compared with the rest: mark both true, or drop the columns)"
                )
        self.classes = _label_order([r["label"].strip() for r in rows])
        index: Dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        if "split" in columns and split != "all":
            wanted = TRAIN_VALUES if split == "train" else TEST_VALUES
            chosen = [(n, r) for n, r in enumerate(rows, start=2) if r["split"].strip() in wanted]
        else:
            keep = set(select_split_classes(self.classes, split, split_rule)) if "split" not in columns else None
            chosen = [(n, r) for n, r in enumerate(rows, start=2) if keep is None or r["label"].strip() in keep]
        self.csv_file = csv_file
        self.root = base
        self.split = split
        self.paths = [os.path.join(base, r["path"].strip()) for _, r in chosen]
        self.labels = np.asarray([index[r["label"].strip()] for _, r in chosen], dtype=np.int64)
        self.categories = [r.get("category") for _, r in chosen] if "category" in columns else None
        self.boxes = [self._box(csv_file, n, r) for n, r in chosen] if set(BOX_COLUMNS) <= columns else None

    @staticmethod
    def _box(csv_file, line, row):
        values = [(row.get(c) or "").strip() for c in BOX_COLUMNS]
        if not any(values):
            return None
        try:
            x1, x2, y1, y2 = (int(float(v)) for v in values)
        except ValueError:
            raise ValueError(f"{csv_file}:{line}: box {values}: expected four integers x_1, x_2, y_1, y_2") from None
        if not (x1 < x2 and y1 < y2):
            raise ValueError(f"{csv_file}:{line}: box {values}: needs x_1 < x_2 and y_1 < y_2")
        return (x1, y1, x2, y2)

    def load_image(self, index: int):
        image = super().load_image(index)
        box = self.boxes[index] if self.boxes is not None else None
        return image.crop(box) if box is not None else image

    def drop(self, paths) -> int:
        gone = set(paths)
        keep = [i for i, p in enumerate(self.paths) if p not in gone]
        if self.categories is not None:
            self.categories = [self.categories[i] for i in keep]
        if self.boxes is not None:
            self.boxes = [self.boxes[i] for i in keep]
        return super().drop(paths)
