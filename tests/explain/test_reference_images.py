"""Reference folders of the explanation pictures (issue 23, item 3): read recursively with class labels from folder
names, the query's own file left out by path and by bytes, transparent drawings on white."""

import os
import shutil
import tempfile
import unittest

import pytest
from PIL import Image

from pml_extensions.explain.reference_images import (
    ReferenceImage,
    exclude_query,
    list_reference_images,
    read_image,
)


def _png(path, colour=(0, 0, 0), size=(4, 4), mode="RGB"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new(mode, size, colour).save(path)
    return path


class TestListReferenceImages(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_recursive_with_labels_from_the_first_folder(self):
        for name in ("birds/a.png", "birds/b.JPG", "fish/deep/c.png", "top.png", "fish/notes.txt", ".hidden/x.png"):
            if name.endswith("txt"):
                with open(os.path.join(self.root, name), "w") as f:
                    f.write("not an image")
            else:
                _png(os.path.join(self.root, name))
        found = [(os.path.relpath(r.path, self.root), r.label) for r in list_reference_images(self.root)]
        # ImageFolder's convention: the first folder level is the class, deeper folders belong to it; files
        # directly in the root have no class; hidden folders and non-images are skipped
        self.assertEqual(
            found,
            [("birds/a.png", "birds"), ("birds/b.JPG", "birds"), ("fish/deep/c.png", "fish"), ("top.png", None)],
        )

    def test_empty_tree_and_missing_folder_are_one_line(self):
        os.makedirs(os.path.join(self.root, "birds"))
        with self.assertRaisesRegex(ValueError, r"no images in .* or its subfolders \(looked for .png"):
            list_reference_images(self.root)
        with self.assertRaisesRegex(ValueError, "is not a folder"):
            list_reference_images(os.path.join(self.root, "missing"))


class TestExcludeQuery(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = self.tmp.name
        self.query = _png(os.path.join(root, "refs/birds/q.png"), (10, 20, 30))
        self.other = _png(os.path.join(root, "refs/birds/other.png"), (10, 20, 31))  # same size, other bytes
        self.refs = list_reference_images(os.path.join(root, "refs"))

    def tearDown(self):
        self.tmp.cleanup()

    def test_same_path_excluded(self):
        kept, excluded = exclude_query(self.query, self.refs)
        self.assertEqual([r.path for r in kept], [self.other])
        self.assertEqual(excluded, [(ReferenceImage(self.query, "birds"), "same file as the query")])
        # the same file through another spelling of its path, and through a symbolic link
        relative = os.path.relpath(self.query)
        self.assertEqual(len(exclude_query(relative, self.refs)[1]), 1)
        link = os.path.join(self.tmp.name, "link.png")
        os.symlink(self.query, link)
        self.assertEqual(exclude_query(link, self.refs)[1][0][1], "same file as the query")

    def test_same_bytes_excluded(self):
        copy = os.path.join(self.tmp.name, "copy_of_q.png")
        shutil.copy(self.query, copy)
        kept, excluded = exclude_query(copy, self.refs)
        self.assertEqual([r.path for r in kept], [self.other])
        self.assertEqual(excluded, [(ReferenceImage(self.query, "birds"), "same bytes as the query")])

    def test_other_images_kept(self):
        query = _png(os.path.join(self.tmp.name, "elsewhere.png"), (200, 0, 0))
        kept, excluded = exclude_query(query, self.refs)
        self.assertEqual((kept, excluded), (self.refs, []))


class TestReadImage(unittest.TestCase):
    def test_transparency_on_white_and_errors_name_the_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            # a black drawing on a transparent background: black pixel (0, 0), clear elsewhere
            drawing = Image.new("RGBA", (3, 3), (0, 0, 0, 0))
            drawing.putpixel((0, 0), (0, 0, 0, 255))
            drawing.putpixel((1, 0), (0, 0, 0, 128))  # half transparent: half way to white
            path = os.path.join(tmp, "drawing.png")
            drawing.save(path)
            rgb = read_image(path)
            self.assertEqual(rgb.mode, "RGB")
            self.assertEqual(rgb.getpixel((0, 0)), (0, 0, 0))
            self.assertEqual(rgb.getpixel((2, 2)), (255, 255, 255))
            self.assertIn(rgb.getpixel((1, 0))[0], (127, 128))
            self.assertEqual(read_image(path, "L").getpixel((2, 2)), 255)
            bad = os.path.join(tmp, "bad.png")
            with open(bad, "wb") as f:
                f.write(b"not a png")
            with self.assertRaisesRegex(ValueError, "cannot read image .*bad.png"):
                read_image(bad)


if __name__ == "__main__":
    unittest.main()


def test_every_extension_a_run_trains_on_is_a_reference(tmp_path):
    """A folder of .ppm / .pgm images trained (torchvision's ImageFolder reads them) but `explain` said 'no images in
    ...': the two lists are one."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from pml_extensions.explain.reference_images import IMAGE_EXTENSIONS

    assert set(IMG_EXTENSIONS) <= set(IMAGE_EXTENSIONS)
    os.makedirs(tmp_path / "a")
    Image.new("RGB", (4, 4)).save(tmp_path / "a" / "x.ppm")
    Image.new("L", (4, 4)).save(tmp_path / "a" / "y.pgm")
    assert [os.path.basename(r.path) for r in list_reference_images(str(tmp_path))] == ["x.ppm", "y.pgm"]


def test_a_table_gives_its_labels_as_written(tmp_path):
    from pml_extensions.explain.reference_images import list_table_images

    for name in ("a 1.png", "b.png"):
        Image.new("RGB", (4, 4)).save(tmp_path / name)
    (tmp_path / "t.csv").write_text("image,category\nb.png,Mützen\na 1.png,T-Shirts / Tops\n", encoding="utf-8")
    refs = list_table_images(str(tmp_path / "t.csv"), {"path": "image", "label": "category"})
    assert [(os.path.basename(r.path), r.label) for r in refs] == [("b.png", "Mützen"), ("a 1.png", "T-Shirts / Tops")]
    with pytest.raises(ValueError, match=r"no label and no path column \(header: image, category\)"):
        list_table_images(str(tmp_path / "t.csv"))
