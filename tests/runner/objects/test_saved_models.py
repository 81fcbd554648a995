"""Issue 13 item 6: ``explain --checkpoint`` on what our runs write (round trips through the CLI)."""

import contextlib
import io
import json
import os
import tempfile
import unittest

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from torch import nn

from pml_extensions.cli.explain import main
from pml_extensions.explain.reference_images import load_image
from pml_extensions.runner.errors import OutputError
from pml_extensions.runner.objects.saved_models import load_models, pml_model_files
from pml_extensions.trunks import ConvNetBody, HistogramPooling


def write_image(path, size=(40, 48), channels=3, seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.random((size[0], size[1], channels)) * 255).astype(np.uint8)
    Image.fromarray(a[..., 0] if channels == 1 else a).save(path)
    return path


def run_cli(args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(args)
    return rc, err.getvalue()


def cosine(trunk, embedder, q, r, ref=None):
    ref = ref or (trunk, embedder)
    with torch.no_grad():
        eq = embedder.eval()(trunk.eval()(q[None]))
        er = ref[1].eval()(ref[0].eval()(r[None]))
    return float(torch.nn.functional.cosine_similarity(eq, er)[0])


class TestCheckpoints(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.q = write_image(os.path.join(self.dir, "q.png"), seed=1)
        self.r = write_image(os.path.join(self.dir, "r.png"), seed=2)
        self.out = os.path.join(self.dir, "out")

    def tearDown(self):
        self.tmp.cleanup()

    def _similarity(self):
        with open(os.path.join(self.out, "similarity.json")) as f:
            return json.load(f)["results"][0]["cosine_similarity"]

    def test_mlrc_fold_best_pth_and_fold_folder(self):
        exp = os.path.join(self.dir, "exp")
        os.makedirs(os.path.join(exp, "fold_0"))
        cfg = {
            "models": {
                "trunk": [
                    {"Conv2d": {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "padding": 1}},
                    {"ReLU": {}},
                    {"AdaptiveAvgPool2d": [1]},
                    {"Flatten": None},
                ],
                "embedder": {"Linear": {"in_features": 4, "out_features": 5}},
            }
        }
        with open(os.path.join(exp, "config.yaml"), "w") as f:
            yaml.safe_dump(cfg, f)
        torch.manual_seed(3)
        trunk = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        emb = nn.Linear(4, 5)
        torch.save(
            {"trunk": trunk.state_dict(), "embedder": emb.state_dict()},
            os.path.join(exp, "fold_0", "best.pth"),
        )
        expected = cosine(
            trunk, emb, load_image(self.q, 32, keep_aspect=True), load_image(self.r, 32, keep_aspect=True)
        )
        for ckpt in (os.path.join(exp, "fold_0", "best.pth"), os.path.join(exp, "fold_0")):
            with self.subTest(checkpoint=ckpt):
                rc, err = run_cli([self.q, self.r, "--checkpoint", ckpt, "--image-size", "32", "--out", self.out])
                self.assertEqual(rc, 0, err)
                self.assertAlmostEqual(self._similarity(), expected, places=5)
        rc, err = run_cli([self.q, self.r, "--checkpoint", exp, "--image-size", "32", "--out", self.out])
        self.assertEqual(rc, 2)
        self.assertIn("fold_0", err)
        self.assertEqual(len(err.strip().splitlines()), 1)

    def test_xml_job_model_folder_skips_optimizer_files(self):
        exp = os.path.join(self.dir, "xml_glyphs")
        body = {"ConvNetBody": {"in_channels": 1, "widths": [4, 8], "blocks_per_stage": 1}}
        cfg = {
            "models": {
                "trunk": {"Sequential": [body, {"HistogramPooling": {"in_channels": 8, "num_prototypes": 4}}]},
                "embedder": {"Linear": {"in_features": 8, "out_features": 6}},
            },
            "variants": {
                "contrastive_xml": {},
                "contrastive_gap": {
                    "models": {
                        "trunk": {"Sequential": [body, {"AdaptiveAvgPool2d": {"output_size": 1}}, {"Flatten": {}}]}
                    }
                },
            },
        }
        os.makedirs(exp)
        with open(os.path.join(exp, "config.yaml"), "w") as f:
            yaml.safe_dump(cfg, f)
        q = write_image(os.path.join(self.dir, "gq.png"), channels=1, seed=4)
        r = write_image(os.path.join(self.dir, "gr.png"), channels=1, seed=5)
        for variant, pool in (("contrastive_xml", HistogramPooling(8, 4)), ("contrastive_gap", None)):
            with self.subTest(variant=variant):
                folder = os.path.join(exp, variant, "models")
                os.makedirs(folder)
                torch.manual_seed(6)
                tail = [pool] if pool is not None else [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
                trunk = nn.Sequential(ConvNetBody(1, (4, 8), 1), *tail)
                emb = nn.Linear(8, 6)
                opt = torch.optim.SGD(trunk.parameters(), lr=0.1)
                torch.save(trunk.state_dict(), os.path.join(folder, "trunk_best2.pth"))
                torch.save(emb.state_dict(), os.path.join(folder, "embedder_best2.pth"))
                torch.save(opt.state_dict(), os.path.join(folder, "trunk_optimizer_best2.pth"))
                torch.save(opt.state_dict(), os.path.join(folder, "trunk_optimizer_best10.pth"))
                self.assertEqual(os.path.basename(pml_model_files(folder)[0]), "trunk_best2.pth")
                expected = cosine(trunk, emb, load_image(q, 32, 1, True), load_image(r, 32, 1, True))
                rc, err = run_cli([q, r, "--checkpoint", folder, "--image-size", "32", "--out", self.out])
                self.assertEqual(rc, 0, err)
                self.assertAlmostEqual(self._similarity(), expected, places=5)

    def test_resolution_student_query_against_teacher_database(self):
        from benchmarks.protocols.resolution_distillation.recipe import build_model, resolution_models

        exp = os.path.join(self.dir, "raml")
        os.makedirs(exp)
        with open(os.path.join(exp, "config.yaml"), "w") as f:
            config = {"protocol": "benchmarks.protocols.resolution_distillation", "models": resolution_models(8)}
            yaml.safe_dump(config, f)
        models = {}
        for seed, name in ((7, "student_32"), (8, "teacher")):
            torch.manual_seed(seed)
            trunk, emb = build_model(8, pretrained=False)
            torch.save({"trunk": trunk.state_dict(), "embedder": emb.state_dict()}, os.path.join(exp, name + ".pth"))
            models[name] = (trunk, emb)
        q32, r64 = load_image(self.q, 32, keep_aspect=True), load_image(self.r, 64, keep_aspect=True)
        expected = cosine(*models["student_32"], q32, r64, models["teacher"])
        rc, err = run_cli(
            [
                self.q,
                self.r,
                "--checkpoint",
                os.path.join(exp, "student_32.pth"),
                "--image-size",
                "32",
                "--reference-checkpoint",
                os.path.join(exp, "teacher.pth"),
                "--reference-image-size",
                "64",
                "--out",
                self.out,
            ]
        )
        self.assertEqual(rc, 0, err)
        self.assertAlmostEqual(self._similarity(), expected, places=4)  # RetrievalHead's L2N +1e-6

    def test_one_line_errors(self):
        path = os.path.join(self.dir, "module.pth")
        torch.save({"trunk": nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4))}, path)
        rc, err = run_cli([self.q, self.r, "--checkpoint", path, "--image-size", "32", "--out", self.out])
        self.assertEqual(rc, 2)
        self.assertIn("--trust-checkpoint", err)
        self.assertEqual(len(err.strip().splitlines()), 1)
        rc, err = run_cli(
            [
                self.q,
                self.r,
                "--checkpoint",
                path,
                "--trust-checkpoint",
                "--image-size",
                "32",
                "--square",
                "--out",
                self.out,
            ]
        )
        self.assertEqual(rc, 2)
        self.assertIn("--layer", err)
        self.assertEqual(len(err.strip().splitlines()), 1)
        # without --square the 32 x 38 image does not fit the Linear layer: still one line, exit 2
        rc, err = run_cli(
            [
                self.q,
                self.r,
                "--checkpoint",
                path,
                "--trust-checkpoint",
                "--image-size",
                "32",
                "--out",
                self.out,
            ]
        )
        self.assertEqual(rc, 2)
        self.assertEqual(len(err.strip().splitlines()), 1)
        rc, err = run_cli(
            [self.q, self.r, "--checkpoint", path, "--trust-checkpoint", "--layer", "nope", "--out", self.out]
        )
        self.assertEqual(rc, 2)
        self.assertIn("'nope'", err)

    def test_load_models_returns_trunk_not_optimizer(self):
        folder = os.path.join(self.dir, "models")
        os.makedirs(folder)
        trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        torch.save(trunk, os.path.join(folder, "trunk_best1.pth"))
        torch.save({"state": {}}, os.path.join(folder, "trunk_optimizer_best1.pth"))
        loaded, emb = load_models(folder, trust=True)
        self.assertIsInstance(loaded, nn.Sequential)
        self.assertIsInstance(emb, nn.Identity)


if __name__ == "__main__":
    unittest.main()


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    return path


def test_selected_model_of_a_paired_run(tmp_path):
    from pml_extensions.runner.objects.saved_models import checkpoint_epoch, selected_model

    run = str(tmp_path)
    with open(os.path.join(run, "config.yaml"), "w") as f:
        yaml.safe_dump({"variants": {"gap": {}, "xml": {}}}, f)
    for unit in ("gap/seed_1", "gap/seed_0", "xml/seed_0"):
        _touch(os.path.join(run, unit, "best_models.pth"))
    _touch(os.path.join(run, "xml", "seed_0", "selected_models.pth"))
    units = {"gap": {"0": {"best_epoch": 2}}, "xml": {"0": {"best_epoch": 3, "selected_epoch": 1}}}
    with open(os.path.join(run, "results.json"), "w") as f:
        json.dump({"units": units}, f)
    with open(os.path.join(run, "gap", "seed_1", "result.json"), "w") as f:
        json.dump({"best_epoch": 4}, f)  # a unit finished after results.json was written
    with open(os.path.join(run, "xml", "seed_0", "result.json"), "w") as f:
        json.dump({"best_epoch": 3}, f)
    pick = selected_model(run)
    assert (pick["unit"], pick["epoch"], pick["others"]) == ("gap/seed_0", 2, ["gap/seed_1", "xml/seed_0"])
    assert pick["checkpoint"] == os.path.join(run, "gap", "seed_0", "best_models.pth")
    assert selected_model(run, seed=1)["epoch"] == 4
    xml = selected_model(run, "xml")
    assert (xml["checkpoint"], xml["epoch"]) == (os.path.join(run, "xml", "seed_0", "selected_models.pth"), 1)
    assert checkpoint_epoch(xml["checkpoint"]) == 1
    assert checkpoint_epoch(os.path.join(run, "xml", "seed_0", "best_models.pth")) == 3  # not the tested one
    assert checkpoint_epoch(os.path.join(run, "xml", "seed_0", "epochs", "epoch_7.pth")) == 7
    with pytest.raises(ValueError, match=r"no model for --variant xml --seed 1; models: gap seed 0, gap seed 1, xml"):
        selected_model(run, "xml", 1)
    with open(os.path.join(run, "results.json"), "w") as f:
        f.write('{"units": {"gap": {"0": {"best_ep')  # cut short: named, not read as "epoch not recorded"
    with pytest.raises(OutputError) as e:
        checkpoint_epoch(os.path.join(run, "gap", "seed_0"))
    assert str(e.value) == (
        f"{os.path.join(run, 'results.json')}: truncated or corrupt (Unterminated string starting at: line 1 column "
        "26 (char 25)); remove it and rerun: the run's command writes it again"
    )


def test_selected_model_of_an_mlrc_run_and_refusals(tmp_path):
    from pml_extensions.runner.objects.saved_models import checkpoint_epoch, selected_model

    run = str(tmp_path / "exp")
    _touch(os.path.join(run, "config.yaml"))
    with open(os.path.join(run, "config.yaml"), "w") as f:
        f.write("protocol: mlrc\n")
    with pytest.raises(ValueError, match="no trained model yet"):
        selected_model(run)
    for k in (0, 1):
        _touch(os.path.join(run, f"fold_{k}", "best.pth"))
    with open(os.path.join(run, "results.json"), "w") as f:
        json.dump({"folds": [{"best_epoch": 5}, {"best_epoch": 1}]}, f)
    assert (selected_model(run)["unit"], selected_model(run)["epoch"]) == ("fold_0", 5)
    assert selected_model(run, fold=1)["epoch"] == checkpoint_epoch(os.path.join(run, "fold_1")) == 1
    with pytest.raises(ValueError, match=r"no fold_2/best.pth; folds with a model: 0, 1"):
        selected_model(run, fold=2)
    with pytest.raises(ValueError, match="an mlrc run has folds .*pass --fold K"):
        selected_model(run, variant="xml")
    with pytest.raises(ValueError, match="has no config.yaml"):
        selected_model(str(tmp_path))


def test_a_rebuilt_model_asks_for_no_pretrained_weights():
    from pml_extensions.runner.objects.saved_models import _not_pretrained

    spec = [
        {"resnet50": {"weights": "DEFAULT", "weights_path": "/x.pth"}},
        {"mobilenet_v2_features": {"pretrained": True}},
    ]
    assert _not_pretrained(spec) == [{"resnet50": {"weights": None}}, {"mobilenet_v2_features": {"pretrained": False}}]


def test_a_paired_units_folder_as_checkpoint_reads_its_selected_model_else_its_best(tmp_path):
    from pml_extensions.runner.objects.saved_models import load_models

    cfg = {"models": {"trunk": [{"Conv2d": {"in_channels": 3, "out_channels": 2, "kernel_size": 1}},
                                {"AdaptiveAvgPool2d": [1]}, {"Flatten": None}],
                      "embedder": {"Linear": {"in_features": 2, "out_features": 2}}}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    unit = tmp_path / "xml" / "seed_0"
    unit.mkdir(parents=True)

    def save(name, value):
        trunk = nn.Sequential(nn.Conv2d(3, 2, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        emb = nn.Linear(2, 2)
        for p in list(trunk.parameters()) + list(emb.parameters()):
            nn.init.constant_(p, value)
        torch.save({"trunk": trunk.state_dict(), "embedder": emb.state_dict()}, unit / name)

    save("best_models.pth", 1.0)
    trunk, _ = load_models(str(unit))
    assert float(trunk[0].weight[0, 0, 0, 0]) == 1.0
    save("selected_models.pth", 2.0)
    trunk, emb = load_models(str(unit))
    assert float(trunk[0].weight[0, 0, 0, 0]) == 2.0 and float(emb.bias[1]) == 2.0
    with pytest.raises(ValueError, match=r"no model file \(best.pth, selected_models.pth, best_models.pth or PML"):
        load_models(str(tmp_path / "xml"))
