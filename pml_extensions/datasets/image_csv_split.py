"""A CSV table of image files (open-metric-learning's ``label``, ``path``, ``split`` columns, or any names mapped to
them) as a metric-learning dataset whose splits follow the table's split column, or named test classes, or a
class-disjoint rule."""

import csv
import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from .class_disjoint_dataset import SPLITS, select_split_classes
from .image_files import ImageFileDataset
from .image_folder_split import _near, named_test_classes

#: what a column can be mapped to (``columns=``); ``label`` and ``path`` are required
ROLES = ("label", "path", "split", "is_query", "is_gallery", "category")
#: values of the split column (case-insensitive): OML writes ``train`` / ``validation``
TRAIN_VALUES = ("train", "training")
VALIDATION_VALUES = ("validation", "val", "valid")
TESTING_VALUES = ("test", "testing")
#: every value of an evaluated (not training) row: OML's validation rows are its test set
TEST_VALUES = VALIDATION_VALUES + TESTING_VALUES
#: ``validation`` (a table with validation and test rows), ``query`` / ``gallery`` (OML's marks) added to SPLITS
CSV_SPLITS = SPLITS + ("validation", "query", "gallery")
#: OML's bounding-box columns (left, right, top, bottom), used to crop when a row fills them
BOX_COLUMNS = ("x_1", "x_2", "y_1", "y_2")
#: ``class_overlap``: refuse train and test rows that share a class, or allow them (same-class retrieval, declared)
CLASS_OVERLAP = ("refuse", "allowed")
_SIDES = ("train", "validation", "test")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
_LABEL_HINTS = ("label", "class", "categ", "target", "species", "breed", "identity", "type")
_TRUE, _FALSE = ("true", "1", "yes", "t", "y", "1.0"), ("false", "0", "no", "f", "n", "0.0")


def _label_order(values: List[str]) -> List[str]:
    distinct = sorted(set(values))
    try:
        return sorted(distinct, key=lambda v: int(v))
    except ValueError:
        return distinct


def parse_columns(columns: Union[None, str, Mapping[str, Optional[str]]]) -> Dict[str, Optional[str]]:
    """The column mapping ``{role: column}`` from a mapping or its string form ``"label=category,path=image"``; a role
    mapped to ``None`` (or nothing: ``"split="``) ignores the column of that name.

    Raises:
        ValueError: a role that is not one of :data:`ROLES` (with the nearest), or a string part without ``=``.

    Example::

        >>> parse_columns("label=category, path=image,split=")
        {'label': 'category', 'path': 'image', 'split': None}
    """
    if columns is None:
        return {}
    if isinstance(columns, str):
        parsed: Dict[str, Optional[str]] = {}
        for part in (p.strip() for p in columns.split(",")):
            if not part:
                continue
            if "=" not in part:
                raise ValueError(f"columns: {part!r} is not role=column (e.g. label=category,path=image)")
            role, column = (s.strip() for s in part.split("=", 1))
            parsed[role] = column or None
        columns = parsed
    if not isinstance(columns, Mapping):
        raise ValueError(f"columns must be a mapping {{role: column}} or 'role=column,...', got {columns!r}")
    out: Dict[str, Optional[str]] = {}
    for role, column in columns.items():
        if role not in ROLES:
            raise ValueError(f"columns: unknown role {role!r}{_near(role, ROLES)} (roles: {', '.join(ROLES)})")
        out[role] = None if column is None or str(column).strip() == "" else str(column)
    return out


def suggest_columns(header: Sequence[str], rows: List[Dict[str, str]], found: Dict[str, str]) -> str:
    """A ``role=column,...`` guess for a table whose label or path column was not found (``found``: the roles known)."""
    guess = dict(found)
    free = [h for h in header if h not in guess.values()]
    values_of = {h: [(r.get(h) or "").strip() for r in rows] for h in free}
    if "path" not in guess:
        scores = {h: np.mean([v.lower().endswith(_IMAGE_SUFFIXES) for v in values_of[h]] or [0]) for h in free}
        best = max(free, key=lambda h: scores[h], default=None)
        if best is not None and scores[best] >= 0.5:
            guess["path"] = best
    if "split" not in guess:
        known = set(TRAIN_VALUES + TEST_VALUES)
        for h in free:
            values = {v.lower() for v in values_of[h] if v}
            if h not in guess.values() and values and values <= known:
                guess["split"] = h
                break
    if "label" not in guess:
        n = len(rows)
        candidates = []
        for h in free:
            if h in guess.values():
                continue
            values = [v for v in values_of[h] if v]
            distinct = len(set(values))
            if 2 <= distinct <= max(2, n // 2) and len(values) == n:
                hinted = any(w in h.lower() for w in _LABEL_HINTS)
                candidates.append((not hinted, distinct, header.index(h), h))
        if candidates:
            guess["label"] = min(candidates)[3]
    order = [r for r in ("label", "path", "split") if r in guess or r in ("label", "path")]
    return ",".join(f"{r}={guess.get(r, '<column>')}" for r in order)


def _mark(value: str) -> Optional[bool]:
    v = value.strip().lower()
    return True if v in _TRUE else False if v in _FALSE else None


class ImageCSVSplit(ImageFileDataset):
    """Images listed in a CSV file, one row per image, in open-metric-learning's table format: ``label``, ``path``
    (required), ``split``, ``is_query`` / ``is_gallery``, the box ``x_1, x_2, y_1, y_2``, ``category`` (docs/own_data.md
    gives their meaning), each read from the column ``columns`` maps it to, else from the column of its name (any case).

    Without a split column ``test_classes`` are the test split, else the sorted classes are halved (``split_rule``);
    ``split="all"`` keeps every row. Train and test rows that share classes (``shared_classes``) are refused unless
    same-class retrieval is declared (``class_overlap="allowed"`` or OML's ``is_query`` / ``is_gallery`` columns).
    Items are ``(PIL RGB image, int label)``; ``labels`` index ``classes``, every label of the file sorted (as integers
    when they all are, else by code point), the same in every split.

    Args:
        csv_file: the table (UTF-8, a byte-order mark is fine; ``,`` ``;`` tab or ``|`` separated).
        split: one of :data:`CSV_SPLITS`.
        transform, target_transform: applied to the image / the label.
        root: the folder relative paths start from (default: the CSV file's folder).
        split_rule: ``"halves"`` or ``"alternate"``, for a table without split column and ``test_classes``.
        columns: ``{role: column}`` or ``"role=column,..."`` (:func:`parse_columns`); roles :data:`ROLES`.
        test_classes: the test classes, as written in the label column (a table without split column).
        class_overlap: ``"refuse"`` (default) or ``"allowed"``.

    Raises:
        FileNotFoundError: a missing CSV file.
        ValueError: a missing ``label`` / ``path`` column (the header and a suggested mapping), a mapped column that is
            not in the header, an empty table, an unknown ``split`` value, a row with an empty label or path,
            query/gallery marks this split cannot honour, a bad box, unknown ``test_classes`` (with "did you mean"),
            train and test rows sharing classes (the fixes); each names the file, and the row where one is at fault.

    Example::

        >>> import os, tempfile
        >>> from PIL import Image
        >>> folder = tempfile.mkdtemp()
        >>> rows = ["category,image,subset"]
        >>> for i, (label, split) in enumerate([("Bags & Luggage", "train")] * 2 + [("T-Shirts / Tops", "val")] * 2):
        ...     Image.new("RGB", (4, 4)).save(os.path.join(folder, f"{i}.png"))
        ...     rows.append(f"{label},{i}.png,{split}")
        >>> _ = open(os.path.join(folder, "table.csv"), "w").write("\\n".join(rows) + "\\n")
        >>> mapping = "label=category,path=image,split=subset"
        >>> test = ImageCSVSplit(os.path.join(folder, "table.csv"), "test", columns=mapping)
        >>> test.classes, test.labels.tolist(), [os.path.basename(p) for p in test.paths]
        (['Bags & Luggage', 'T-Shirts / Tops'], [1, 1], ['2.png', '3.png'])
    """

    def __init__(
        self,
        csv_file: str,
        split: str = "train",
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        root: Optional[str] = None,
        split_rule: str = "halves",
        columns: Union[None, str, Mapping[str, Optional[str]]] = None,
        test_classes: Optional[Sequence[str]] = None,
        class_overlap: str = "refuse",
    ):
        super().__init__(transform, target_transform)
        if split not in CSV_SPLITS:
            raise ValueError(f"split must be one of {CSV_SPLITS}, got {split!r}")
        if class_overlap not in CLASS_OVERLAP:
            raise ValueError(f"class_overlap must be one of {CLASS_OVERLAP}, got {class_overlap!r}")
        if not os.path.isfile(csv_file):
            raise FileNotFoundError(f"csv_file {csv_file!r} is not a file (a table with label and path columns)")
        mapping = parse_columns(columns)
        header, rows = _read_table(csv_file)
        col = self._columns(csv_file, header, rows, mapping)
        if not rows:
            raise ValueError(f"{csv_file}: no rows below the header ({', '.join(header)})")
        label_col, path_col, split_col = col["label"], col["path"], col.get("split")
        empty = [n for n, r in enumerate(rows, start=2) if not _get(r, label_col) or not _get(r, path_col)]
        if empty:  # line numbers as an editor shows them (header = 1)
            also = f" (also line(s) {', '.join(map(str, empty[1:6]))}{', ...' if len(empty) > 6 else ''})"
            raise ValueError(f"{csv_file}:{empty[0]}: empty label or path{also if len(empty) > 1 else ''}")
        row_labels = [_get(r, label_col) for r in rows]
        self.classes = _label_order(row_labels)
        index: Dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        side = self._sides(csv_file, rows, split_col)  # line -> train / validation / test, or None without split
        marks = self._marks(csv_file, rows, col, side, split)
        if test_classes is not None:
            if split_col is not None:
                raise ValueError(
                    f"{csv_file}: test_classes and the split column {split_col!r} both decide the test rows; drop "
                    f"test_classes, or ignore the column (columns={{'split': None}}, --columns split=)"
                )
            test_set = named_test_classes(test_classes, self.classes, csv_file)
        self.shared_classes: List[str] = []
        #: class names per value of the split column (``train`` / ``validation`` / ``test``), empty without one
        self.classes_by_split: Dict[str, List[str]] = {}
        if side is not None:
            for name in _SIDES:
                on_side = {c for c, s in zip(row_labels, side) if s == name}
                if on_side:
                    self.classes_by_split[name] = [c for c in self.classes if c in on_side]
            other_names = {c for c, s in zip(row_labels, side) if s != "train"}
            self.shared_classes = [c for c in self.classes_by_split.get("train", []) if c in other_names]
            declared = class_overlap == "allowed" or marks is not None
            if self.shared_classes and split != "all" and not declared:
                shown = ", ".join(self.shared_classes[:5]) + (", ..." if len(self.shared_classes) > 5 else "")
                raise ValueError(
                    f"{csv_file}: the train rows and the {'/'.join(sorted({s for s in side if s != 'train'}))} rows "
                    f"of column {split_col!r} share {len(self.shared_classes)} of {len(self.classes)} classes "
                    f"({shown}): that tests on classes seen in training; for unseen-class testing give each class "
                    "rows of one split only, or ignore the column and name the test classes (--columns split= with "
                    'test_classes); for same-class retrieval declare it: class_overlap="allowed" (a runner config: '
                    '--dataset "{kwargs: {class_overlap: allowed}}")'
                )
            evaluated = ("test",) if "test" in side else ("validation",)  # test, query, gallery
            wanted = {"train": ("train",), "validation": ("validation",), "all": _SIDES}.get(split, evaluated)
            keep = [s in wanted for s in side]
            if split in ("query", "gallery"):  # marks exist: _marks refused these splits without them
                keep = [k and m[0 if split == "query" else 1] for k, m in zip(keep, marks)]
        else:
            if split in ("validation", "query", "gallery"):
                raise ValueError(f"{csv_file}: split {split!r} needs a split column (header: {', '.join(header)})")
            if test_classes is not None:
                keep = [split == "all" or (c in test_set) == (split == "test") for c in row_labels]
            else:
                names = set(select_split_classes(self.classes, split, split_rule))
                keep = [c in names for c in row_labels]
        chosen_rows = [(n, r) for n, (r, k) in enumerate(zip(rows, keep), start=2) if k]
        self.csv_file, self.split, self.columns = csv_file, split, col
        self.root = root if root is not None else os.path.dirname(os.path.abspath(csv_file))
        self.paths = [os.path.join(self.root, _get(r, path_col)) for _, r in chosen_rows]
        self.labels = np.asarray([index[_get(r, label_col)] for _, r in chosen_rows], dtype=np.int64)
        category = col.get("category")
        self.categories = [r.get(category) for _, r in chosen_rows] if category else None
        self.boxes = [self._box(csv_file, n, r) for n, r in chosen_rows] if set(BOX_COLUMNS) <= set(header) else None

    @staticmethod
    def _columns(csv_file, header, rows, mapping) -> Dict[str, str]:
        """``{role: column}``: the mapping's, else a column named as the role (any case)."""
        found: Dict[str, str] = {}
        lower = {h.strip().lower(): h for h in header}
        wrong = []
        for role in ROLES:
            if role in mapping:
                column = mapping[role]
                if column is None:
                    continue
                if column not in header:
                    wrong.append(f"{role}={column}: no such column{_near(column, header)}")
                    continue
                found[role] = column
            elif role in lower and lower[role] not in found.values():
                found[role] = lower[role]
        known = {r: c for r, c in found.items() if r in ("label", "path", "split")}  # category: OML's own
        if wrong:  # every wrong entry at once, and a mapping that fits the table
            raise ValueError(
                f"{csv_file}: columns: {'; '.join(wrong)} (header: {', '.join(header)}); perhaps --columns "
                f"{suggest_columns(header, rows, known)}"
            )
        missing = [r for r in ("label", "path") if r not in found]
        if missing:
            raise ValueError(
                f"{csv_file}: no {' and no '.join(missing)} column (header: {', '.join(header)}); map them: "
                f"--columns {suggest_columns(header, rows, known)}"
            )
        return found

    @staticmethod
    def _sides(csv_file, rows, split_col) -> Optional[List[str]]:
        """``train`` / ``validation`` / ``test`` per row from the split column (None without one)."""
        if split_col is None:
            return None
        names = {v: s for s, vs in zip(_SIDES, (TRAIN_VALUES, VALIDATION_VALUES, TESTING_VALUES)) for v in vs}
        values = [_get(r, split_col) for r in rows]
        side = [names.get(v.lower()) for v in values]
        bad = [(n, v) for n, (v, s) in enumerate(zip(values, side), start=2) if s is None]
        if bad:
            others = sorted({v for _, v in bad[1:]} - {bad[0][1]})
            also = f" (also {', '.join(map(repr, others[:5]))} on other rows)" if others else ""
            raise ValueError(
                f"{csv_file}:{bad[0][0]}: split {bad[0][1]!r} is not one of train, validation, test (or training, "
                f"val, valid, testing; any case){also}"
            )
        return side

    @staticmethod
    def _marks(csv_file, rows, col, side, split):
        """``[(is_query, is_gallery)]`` per row, or None without OML's columns."""
        qc, gc = col.get("is_query"), col.get("is_gallery")
        if qc is None and gc is None:
            if split in ("query", "gallery"):
                raise ValueError(f"{csv_file}: split {split!r} needs OML's is_query / is_gallery columns")
            return None
        marks = []
        for n, r in enumerate(rows, start=2):
            q = _mark(_get(r, qc)) if qc else True
            g = _mark(_get(r, gc)) if gc else True
            evaluated = side is not None and side[n - 2] != "train"
            if evaluated and (q is None or g is None):
                raise ValueError(
                    f"{csv_file}:{n}: is_query/is_gallery {[_get(r, c) if c else '' for c in (qc, gc)]}: expected "
                    "true/false (or 1/0) on every validation or test row"
                )
            if evaluated and split in ("test", "all") and not (q and g):
                shown = [_get(r, c) if c else "" for c in (qc, gc)]
                raise ValueError(
                    f"{csv_file}:{n}: is_query/is_gallery {shown}: separate query and gallery sets are not supported "
                    f"by split={split!r} (every item is compared with the rest: mark both true, or drop the columns); "
                    "read them as split='query' and split='gallery'"
                )
            marks.append((bool(q), bool(g)))
        return marks

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


def _get(row: Dict[str, str], column: Optional[str]) -> str:
    return (row.get(column) or "").strip() if column else ""


def _read_table(csv_file: str):
    """``(header, rows)``; the separator (``,`` ``;`` tab ``|``) is sniffed from the header line."""
    with open(csv_file, newline="", encoding="utf-8-sig") as f:
        first = f.readline()
        f.seek(0)
        counts = {d: first.count(d) for d in (",", ";", "\t", "|")}
        delimiter = max(counts, key=lambda d: (counts[d], d == ","))
        reader = csv.DictReader(f, delimiter=delimiter)
        rows = list(reader)
        header = [h for h in (reader.fieldnames or []) if h is not None]
    return header, rows
