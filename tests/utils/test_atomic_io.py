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


class TestAtomicIOFileModes(unittest.TestCase):
    """Every writer gets the mode an ordinary open() gives under the process umask (issue 12, item 5)."""

    def _write_all(self, d):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from pml_extensions.utils.atomic_io import atomic_savefig

        atomic_write_text(os.path.join(d, "a.txt"), "x")
        atomic_write_json(os.path.join(d, "b.json"), {"x": 1})
        atomic_torch_save({"w": torch.zeros(1)}, os.path.join(d, "c.pt"))
        fig = plt.figure()
        atomic_savefig(fig, os.path.join(d, "d.png"))
        plt.close(fig)
        with open(os.path.join(d, "plain.txt"), "w") as f:  # the reference: an ordinary open()
            f.write("x")
        return ["a.txt", "b.json", "c.pt", "d.png"]

    def test_new_files_follow_the_umask(self):
        for umask, expected in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
            old = os.umask(umask)
            try:
                with tempfile.TemporaryDirectory() as d:
                    names = self._write_all(d)
                    self.assertEqual(os.stat(os.path.join(d, "plain.txt")).st_mode & 0o777, expected)
                    for name in names:
                        mode = os.stat(os.path.join(d, name)).st_mode & 0o777
                        self.assertEqual(mode, expected, f"{name} under umask {umask:03o}: {mode:03o}")
            finally:
                os.umask(old)

    def test_replacing_keeps_the_existing_mode(self):
        old = os.umask(0o022)
        try:
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, "a.txt")
                atomic_write_text(p, "one")
                os.chmod(p, 0o640)
                atomic_write_text(p, "two")
                self.assertEqual(os.stat(p).st_mode & 0o777, 0o640)
        finally:
            os.umask(old)


class TestFileModesOfARealRun(unittest.TestCase):
    def test_every_file_of_an_mlrc_run_follows_umask_022(self):
        # results, report.html, config copies, CSV logs, records.db, checkpoints, plots: all -rw-r--r-- under
        # umask 022 (what an ordinary open() gives), none -rw------- as mkstemp's files were.
        # ``python -m pml_extensions run ...`` in this process (``cli.main``), under umask 022 set here
        import matplotlib

        from pml_extensions.cli import main

        matplotlib.use("Agg")
        with tempfile.TemporaryDirectory() as d:
            cmd = ["run", "contrastive_xml", "--variant", "quick"]
            cmd += ["--device", "cpu", "--root_experiment_folder", d, "--num_epochs_train", "1"]
            cmd += ["--num_training_sets", "1", "--check_untrained_accuracy", "false"]
            cmd += ["--trainer~APPLY~2", "{iterations_per_epoch: 2, dataloader_num_workers: 0}"]
            old = os.umask(0o022)
            try:
                status = main(cmd)
            finally:
                os.umask(old)
            self.assertEqual(status, 0)
            files = [os.path.join(root, f) for root, _, names in os.walk(d) for f in names]
            kinds = {os.path.splitext(f)[1] for f in files}
            self.assertTrue({".json", ".html", ".yaml", ".csv", ".pth"} <= kinds, kinds)
            wrong = {f: oct(os.stat(f).st_mode & 0o777) for f in files if os.stat(f).st_mode & 0o777 != 0o644}
            self.assertEqual(wrong, {})
