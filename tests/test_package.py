"""The drop-in promise: pml_extensions.losses / trainers / testers re-export PML's classes as the same objects."""

import unittest

import pytorch_metric_learning.losses as pml_losses
import pytorch_metric_learning.testers as pml_testers
import pytorch_metric_learning.trainers as pml_trainers

import pml_extensions
from pml_extensions import losses, testers, trainers


class TestReExports(unittest.TestCase):
    def check(self, ours, theirs, at_least):
        names = [n for n, o in vars(theirs).items() if isinstance(o, type) and not n.startswith("_")]
        self.assertGreaterEqual(len(names), at_least)
        for name in names:
            self.assertIs(getattr(ours, name), getattr(theirs, name), name)
            self.assertIn(name, ours.__all__)

    def test_losses(self):
        self.check(losses, pml_losses, 30)
        self.assertIn("XMLWrapper", losses.__all__)

    def test_trainers_and_testers(self):
        self.check(trainers, pml_trainers, 5)
        self.check(testers, pml_testers, 2)

    def test_version(self):
        self.assertRegex(pml_extensions.__version__, r"^\d+\.\d+\.\d+")


def test_top_level_help_has_a_usage_line_and_no_rst(capsys):
    from pml_extensions.__main__ import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("usage: python -m pml_extensions {job,run,explain}")
    assert "``" not in out and ":mod:" not in out and ":func:" not in out


def test_no_merge_conflict_markers_in_the_repository():
    """A merge once committed its conflict markers into CHANGELOG.md; every text file of the repository is free of
    them."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("site", "runs", "experiments", "build")]
        for name in files:
            if not name.endswith((".py", ".md", ".yaml", ".yml", ".toml", ".ini", ".txt", ".cfg")):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if line.startswith(("<<<<<<< ", ">>>>>>> ")):
                        found.append(f"{os.path.relpath(path, root)}:{number}")
    assert found == []
