"""datasets/image_csv_split.py: open-metric-learning's table (label, path, optional split) as a class-disjoint
dataset (issue 21, item 1)."""

import os

import pytest
from PIL import Image

from pml_extensions.datasets import ImageCSVSplit, get_dataset


def _table(tmp_path, header, rows):
    for row in rows:
        path = row[header.index("path") if "path" in header else 1]
        full = path if os.path.isabs(path) else os.path.join(tmp_path, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        Image.new("RGB", (10, 8), (200, 10, 10)).save(full)
    table = tmp_path / "table.csv"
    table.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return str(table)


def test_split_column_as_oml_writes_it(tmp_path):
    rows = [(c, f"img/{c}_{k}.png", "train" if c < 2 else "validation") for c in range(4) for k in range(3)]
    table = _table(tmp_path, ["label", "path", "split"], rows)
    train, test, whole = (ImageCSVSplit(table, split=s) for s in ("train", "test", "all"))
    assert train.classes == ["0", "1", "2", "3"]
    assert train.labels.tolist() == [0, 0, 0, 1, 1, 1] and test.labels.tolist() == [2, 2, 2, 3, 3, 3]
    assert len(whole) == 12 and whole.paths[0] == os.path.join(str(tmp_path), "img/0_0.png")
    image, label = test[0]
    assert (image.mode, image.size, label) == ("RGB", (10, 8), 2)
    assert get_dataset("csv", "test", root=table).paths == test.paths


def test_without_a_split_column_the_classes_are_halved_and_names_sort(tmp_path):
    rows = [(f"{name}/{k}.png", name) for name in ("owl", "cat", "emu", "bee") for k in range(2)]
    table = _table(tmp_path, ["path", "label"], rows)  # any column order
    train = ImageCSVSplit(table, split="train")
    assert train.classes == ["bee", "cat", "emu", "owl"] and train.split_classes == ["bee", "cat"]
    assert ImageCSVSplit(table, split="test").split_classes == ["emu", "owl"]


def test_boxes_crop_and_categories_are_kept(tmp_path):
    rows = [(0, "a.png", 1, 6, 2, 5, "shoes"), (0, "b.png", "", "", "", "", "shoes"), (1, "c.png", 0, 4, 0, 4, "hats")]
    table = _table(tmp_path, ["label", "path", "x_1", "x_2", "y_1", "y_2", "category"], rows)
    data = ImageCSVSplit(table, split="all")
    assert [data[i][0].size for i in range(3)] == [(5, 3), (10, 8), (4, 4)]
    assert data.categories == ["shoes", "shoes", "hats"]


@pytest.mark.parametrize(
    "header, rows, message",
    [
        (["label", "file"], [(0, "a.png")], "no path column"),
        (["label", "path", "split"], [(0, "a.png", "holdout")], r"table.csv:2: split 'holdout' is not one of train"),
        (["label", "path"], [(0, "a.png"), ("", "b.png")], r"table.csv:3: empty label or path"),
        (
            ["label", "path", "split", "is_query", "is_gallery"],
            [(0, "a.png", "validation", "True", "False")],
            "separate query and gallery sets are not supported",
        ),
        (["label", "path", "x_1", "x_2", "y_1", "y_2"], [(0, "a.png", 5, 2, 0, 4)], "needs x_1 < x_2"),
    ],
)
def test_refusals_name_the_row(tmp_path, header, rows, message):
    with pytest.raises(ValueError, match=message):
        ImageCSVSplit(_table(tmp_path, header, rows), split="all")


def test_a_missing_table(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a file"):
        ImageCSVSplit(str(tmp_path / "nope.csv"))


# ------------------------------------------------------------------------------------------------ a user's catalogue
CATALOGUE = [  # (sku, title, category, image, subset): class names with spaces, "/", "&" and non-ASCII letters
    ("s1", "red tee", "T-Shirts / Tops", "img/red tee.png", "train"),
    ("s2", "blue tee", "T-Shirts / Tops", "img/blue tee.png", "train"),
    ("s3", "tote", "Bags & Luggage", "img/tote.png", "train"),
    ("s4", "duffel", "Bags & Luggage", "img/duffel.png", "train"),
    ("s5", "clog", "Chaussures d'été", "img/clog.png", "val"),
    ("s6", "mule", "Chaussures d'été", "img/mule.png", "val"),
    ("s7", "cap", "Mützen", "img/cap.png", "test"),
    ("s8", "beanie", "Mützen", "img/beanie.png", "test"),
]
HEADER = ["sku", "title", "category", "image", "subset"]


def _catalogue(tmp_path, rows=CATALOGUE, header=HEADER, sep=","):
    for row in rows:
        full = tmp_path / row[header.index("image")]
        full.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (6, 5), (10, 200, 10)).save(full)
    table = tmp_path / "catalogue.csv"
    lines = [sep.join(header)] + [sep.join(r) for r in rows]
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(table)


MAPPING = {"label": "category", "path": "image", "split": "subset"}


def test_without_a_mapping_the_error_lists_the_header_and_suggests_one(tmp_path):
    table = _catalogue(tmp_path)
    with pytest.raises(ValueError) as e:
        ImageCSVSplit(table, "train")
    assert str(e.value) == (
        f"{table}: no label and no path column (header: sku, title, category, image, subset); map them: "
        "--columns label=category,path=image,split=subset"
    )


def test_a_partial_mapping_is_completed_in_the_suggestion(tmp_path):
    table = _catalogue(tmp_path)
    with pytest.raises(
        ValueError, match=r"no path column .* map them: --columns label=category,path=image,split=subset$"
    ):
        ImageCSVSplit(table, "train", columns={"label": "category"})


@pytest.mark.parametrize(
    "columns", [MAPPING, "label=category,path=image,split=subset", " label = category , path=image, split=subset "]
)
def test_mapped_columns_honour_the_split_column_and_keep_class_names(tmp_path, columns):
    table = _catalogue(tmp_path)
    train, val, test, whole = (ImageCSVSplit(table, s, columns=columns) for s in ("train", "validation", "test", "all"))
    assert train.classes == ["Bags & Luggage", "Chaussures d'été", "Mützen", "T-Shirts / Tops"]  # code-point order
    assert [os.path.basename(p) for p in train.paths] == ["red tee.png", "blue tee.png", "tote.png", "duffel.png"]
    assert train.labels.tolist() == [3, 3, 0, 0]
    assert val.labels.tolist() == [1, 1] and test.labels.tolist() == [2, 2]  # a table with test rows: val is its own
    assert test.split_classes == ["Mützen"] and len(whole) == 8 and whole.shared_classes == []
    assert test.paths[0] == os.path.join(str(tmp_path), "img", "cap.png")
    image, label = test[1]
    assert (image.mode, image.size, label) == ("RGB", (6, 5), 2)
    assert get_dataset("csv", "test", root=table, columns=columns).paths == test.paths


def test_oml_validation_rows_are_the_test_split_and_values_are_read_in_any_case(tmp_path):
    rows = [r[:4] + ({"train": "Train", "val": "VALIDATION", "test": "validation"}[r[4]],) for r in CATALOGUE]
    test = ImageCSVSplit(_catalogue(tmp_path, rows, sep=";"), "test", columns=MAPPING)  # ";" separated
    assert test.labels.tolist() == [1, 1, 2, 2]


def test_shared_classes_are_refused_with_the_fixes_unless_declared(tmp_path):
    rows = CATALOGUE + [("s9", "polo", "T-Shirts / Tops", "img/polo.png", "test")]
    table = _catalogue(tmp_path, rows)
    for split in ("train", "test"):
        with pytest.raises(ValueError) as e:
            ImageCSVSplit(table, split, columns=MAPPING)
        assert str(e.value).count("\n") == 0
        assert (
            "the train rows and the test/validation rows of column 'subset' share 1 of 4 classes (T-Shirts / Tops)"
            in str(e.value)
        )
        assert 'class_overlap="allowed"' in str(e.value) and "test_classes" in str(e.value)
    test = ImageCSVSplit(table, "test", columns=MAPPING, class_overlap="allowed")
    assert test.labels.tolist() == [2, 2, 3] and test.shared_classes == ["T-Shirts / Tops"]
    assert len(ImageCSVSplit(table, "all", columns=MAPPING)) == 9  # every row: the protocol splits


def test_test_classes_name_the_test_split_of_a_table_without_split_column(tmp_path):
    table = _catalogue(tmp_path)
    columns = {"label": "category", "path": "image", "split": None}  # the column is ignored
    train = ImageCSVSplit(table, "train", columns=columns, test_classes=["T-Shirts / Tops", "Mützen"])
    test = ImageCSVSplit(
        table, "test", columns="label=category,path=image,split=", test_classes=["T-Shirts / Tops", "Mützen"]
    )
    assert train.split_classes == ["Bags & Luggage", "Chaussures d'été"] and train.labels.tolist() == [0, 0, 1, 1]
    assert test.labels.tolist() == [3, 3, 2, 2]
    with pytest.raises(
        ValueError, match=r"test_classes: 'T-Shirts/Tops' is not a class; did you mean 'T-Shirts / Tops'\?"
    ):
        ImageCSVSplit(table, "test", columns=columns, test_classes=["T-Shirts/Tops"])
    with pytest.raises(ValueError, match="test_classes and the split column 'subset' both decide"):
        ImageCSVSplit(table, "test", columns=MAPPING, test_classes=["Mützen"])


def test_oml_query_and_gallery_marks(tmp_path):
    header = ["label", "path", "split", "is_query", "is_gallery"]
    rows = [
        ("a", "a0.png", "train", "", ""),
        ("a", "a1.png", "train", "", ""),
        ("b", "b0.png", "validation", "True", "False"),
        ("b", "b1.png", "validation", "False", "True"),
        ("b", "b2.png", "validation", "0", "1"),
        ("a", "a2.png", "validation", "1", "1"),  # a class seen in training: declared by OML's columns
    ]
    table = _table(tmp_path, header, rows)
    query, gallery = ImageCSVSplit(table, "query"), ImageCSVSplit(table, "gallery")
    assert [os.path.basename(p) for p in query.paths] == ["b0.png", "a2.png"]
    assert [os.path.basename(p) for p in gallery.paths] == ["b1.png", "b2.png", "a2.png"]
    assert query.shared_classes == ["a"]
    with pytest.raises(ValueError, match=r"table.csv:4: .*read them as split='query' and split='gallery'"):
        ImageCSVSplit(table, "test")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"columns": {"lable": "category"}}, r"columns: unknown role 'lable'; did you mean 'label'\?"),
        ({"columns": "label=categry,path=image"}, r"columns: label=categry: no such column; did you mean 'category'\?"),
        ({"columns": "label category"}, r"columns: 'label category' is not role=column"),
        ({"columns": MAPPING, "split": "query"}, r"split 'query' needs OML's is_query / is_gallery columns"),
        ({"columns": MAPPING, "class_overlap": "yes"}, r"class_overlap must be one of \('refuse', 'allowed'\)"),
    ],
)
def test_mapping_errors_are_one_line(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        ImageCSVSplit(_catalogue(tmp_path), **{"split": "train", **kwargs})
    assert "\n" not in str(e.value)


def test_every_wrong_column_of_a_mapping_is_named_with_a_mapping_that_fits(tmp_path):
    """A user's `--columns label=category,path=image,split=subset` on a table with other column names: only the first
    wrong entry was named, with no fix."""
    table = _catalogue(tmp_path)
    lines = open(table, encoding="utf-8").read().splitlines()
    open(table, "w", encoding="utf-8").write("\n".join(["sku,title,product_type,picture,subset"] + lines[1:]) + "\n")
    with pytest.raises(ValueError) as e:
        ImageCSVSplit(table, "train", columns="label=category,path=image,split=subset")
    assert str(e.value) == (
        f"{table}: columns: label=category: no such column; path=image: no such column (header: sku, title, "
        "product_type, picture, subset); perhaps --columns label=product_type,path=picture,split=subset"
    )


def test_an_empty_table_and_every_empty_row_named(tmp_path):
    (tmp_path / "head.csv").write_text("label,path\n")
    with pytest.raises(ValueError, match="no rows below the header"):
        ImageCSVSplit(str(tmp_path / "head.csv"))
    (tmp_path / "holes.csv").write_text("label,path\n,a.png\nb,\nc,c.png\n,d.png\n")
    with pytest.raises(ValueError, match=r"holes.csv:2: empty label or path \(also line\(s\) 3, 5\)"):
        ImageCSVSplit(str(tmp_path / "holes.csv"))


def test_bad_images_are_named_and_dropped_through_the_one_path(tmp_path):
    table = _catalogue(tmp_path)
    (tmp_path / "img" / "tote.png").write_bytes(b"<html>not an image</html>")
    data = ImageCSVSplit(table, "train", columns=MAPPING)
    bad = data.unreadable_images()
    assert [(os.path.basename(p), why) for p, why in bad] == [("tote.png", "cannot identify image file")]
    assert data.drop([p for p, _ in bad]) == 1 and data.labels.tolist() == [3, 3, 0]
