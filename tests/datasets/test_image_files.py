"""datasets/image_files.py: one decode pass that names every file that does not decode, and dropping them."""

import os

from PIL import Image

from pml_extensions.datasets import ImageFolderSplit, find_unreadable_images
from pml_extensions.datasets.image_files import image_problem, large_images, load_rgb


def test_truncated_corrupt_and_missing_files_are_all_named(tmp_path):
    good = str(tmp_path / "good.png")
    Image.new("RGB", (64, 64), (1, 2, 3)).save(good)
    truncated = str(tmp_path / "truncated.png")
    with open(good, "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    junk = str(tmp_path / "junk.jpg")
    with open(junk, "wb") as f:
        f.write(b"\x00" * 100)
    missing = str(tmp_path / "missing.png")
    bad = find_unreadable_images([good, truncated, junk, missing])
    assert [p for p, _ in bad] == [truncated, junk, missing]
    assert dict(bad)[junk] == "cannot identify image file" and dict(bad)[missing] == "missing"
    assert image_problem(good) is None and str(tmp_path) not in dict(bad)[truncated]


def test_transparency_is_composited_on_white(tmp_path):
    path = str(tmp_path / "a.png")
    Image.new("RGBA", (2, 2), (255, 0, 0, 0)).save(path)
    assert load_rgb(path).getpixel((0, 0)) == (255, 255, 255)


def test_drop_leaves_the_named_files_out_and_keeps_the_labels(tmp_path):
    for c in ("a", "b"):
        os.makedirs(tmp_path / c)
        for k in range(2):
            Image.new("L", (4, 4)).save(tmp_path / c / f"{k}.png")
    data = ImageFolderSplit(str(tmp_path), split="all")
    assert data.unreadable_images() == []
    assert data.drop([str(tmp_path / "b" / "0.png")]) == 1
    assert data.labels.tolist() == [0, 0, 1] and len(data) == 3 and data[2][1] == 1


def test_large_images_are_read_from_headers_and_load_without_pils_warning(tmp_path, monkeypatch, recwarn):
    small, wide, junk = str(tmp_path / "small.png"), str(tmp_path / "wide.png"), str(tmp_path / "junk.png")
    Image.new("RGB", (10, 10)).save(small)
    Image.new("RGBA", (30, 5)).save(wide)
    with open(junk, "wb") as f:
        f.write(b"not an image")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    assert large_images([small, wide, junk]) == [(wide, (30, 5))]  # 150 > 100 pixels; junk is find_unreadable's
    assert large_images([small, wide], limit=1000) == []
    assert image_problem(wide) is None and load_rgb(wide).size == (30, 5)
    assert [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)] == []
