"""datasets/image_folder_split.py: a folder per class; the test classes named by the user."""

import pytest
from PIL import Image

from pml_extensions.datasets import ImageFolderSplit, get_dataset

NAMES = ["Bags & Luggage", "Chaussures d'été", "Mützen", "Tops"]


def _tree(tmp_path):
    for name in NAMES:
        (tmp_path / name).mkdir()
        for k in range(2):
            Image.new("L", (5, 4)).save(tmp_path / name / f"{k}.png")
    return str(tmp_path)


def test_test_classes_name_the_test_folders(tmp_path):
    root = _tree(tmp_path)
    train = ImageFolderSplit(root, "train", test_classes=["Mützen", "Bags & Luggage"])
    test = get_dataset("imagefolder", "test", root=root, test_classes=["Mützen", "Bags & Luggage"])
    assert train.classes == NAMES
    assert train.split_classes == ["Chaussures d'été", "Tops"] and train.labels.tolist() == [1, 1, 3, 3]
    assert test.labels.tolist() == [0, 0, 2, 2]
    assert len(ImageFolderSplit(root, "all", test_classes=["Tops"])) == 8


@pytest.mark.parametrize(
    "names, message",
    [
        (["Mutzen"], r"test_classes: 'Mutzen' is not a class; did you mean 'Mützen'\? \(4 classes: Bags & Luggage, "),
        ([], "test_classes is empty"),
        (NAMES, "test_classes names every class: leave some for training"),
    ],
)
def test_bad_test_classes_are_one_line(tmp_path, names, message):
    with pytest.raises(ValueError, match=message) as e:
        ImageFolderSplit(_tree(tmp_path), "test", test_classes=names)
    assert "\n" not in str(e.value)
