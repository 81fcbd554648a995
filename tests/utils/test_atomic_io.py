import json
import os
import tempfile
import unittest

import torch

from pml_extensions.utils.atomic_io import atomic_path, atomic_torch_save, atomic_write_json, atomic_write_text


class TestAtomicIO(unittest.TestCase):
    def test_writes_and_replaces(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "sub", "a.txt")
            atomic_write_text(p, "one")
            atomic_write_text(p, "two")
            with open(p) as f:
                self.assertEqual(f.read(), "two")
            atomic_write_json(os.path.join(d, "b.json"), {"x": [1, 2]})
            with open(os.path.join(d, "b.json")) as f:
                self.assertEqual(json.load(f), {"x": [1, 2]})
            atomic_torch_save({"w": torch.arange(3)}, os.path.join(d, "c.pt"))
            self.assertTrue(torch.equal(torch.load(os.path.join(d, "c.pt"), weights_only=True)["w"], torch.arange(3)))
            self.assertEqual(sorted(os.listdir(d)), ["b.json", "c.pt", "sub"])  # no temporary files left

    def test_failure_keeps_the_old_file_and_leaves_no_temporary(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "a.txt")
            atomic_write_text(p, "old")
            with self.assertRaises(RuntimeError):
                with atomic_path(p) as tmp:
                    with open(tmp, "w") as f:
                        f.write("half")
                    raise RuntimeError("killed mid-write")
            with open(p) as f:
                self.assertEqual(f.read(), "old")
            self.assertEqual(os.listdir(d), ["a.txt"])
            with atomic_path(os.path.join(d, "fig.png")) as tmp:
                self.assertTrue(tmp.endswith(".png"))  # the extension survives (matplotlib picks the format from it)
