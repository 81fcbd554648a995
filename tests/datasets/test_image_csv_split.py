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
        (["label", "path", "split"], [(0, "a.png", "val")], r"table.csv:2: split 'val' is not one of train"),
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
