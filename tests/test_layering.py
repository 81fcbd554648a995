"""The package's floors: ``utils/`` imports nothing above it."""

import ast
import os

import pml_extensions

PKG = os.path.dirname(os.path.abspath(pml_extensions.__file__))
ABOVE_UTILS = ("trainers", "testers", "runner", "datasets")


def _modules(folder):
    for dirpath, _, files in os.walk(folder):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def _imported_subpackages(path, root=PKG):
    """First component below ``pml_extensions`` (= ``root``) of every import in the file (relative imports
    resolved)."""
    rel = os.path.relpath(path, root).split(os.sep)[:-1]  # the module's package inside pml_extensions
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "pml_extensions" and len(parts) > 1:
                    out.add(parts[1])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "pml_extensions":
                    out.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
            else:
                base = rel[: len(rel) - (node.level - 1)] if node.level > 1 else list(rel)
                parts = base + ((node.module or "").split(".") if node.module else [])
                if parts:
                    out.add(parts[0])
                else:  # from .. import x at the package root
                    out.update(a.name for a in node.names)
    return out


def test_the_import_resolver_sees_relative_and_absolute_imports(tmp_path):
    # the check below can fail: a file in utils/ importing ..runner, ..datasets or pml_extensions.trainers is seen
    (tmp_path / "utils").mkdir()
    probe = tmp_path / "utils" / "probe.py"
    probe.write_text(
        "from ..runner import factory\nfrom . import ridge\nimport pml_extensions.trainers\n"
        "from ..datasets.glyph_dataset import GlyphDataset\nfrom pml_extensions import testers\n"
    )
    got = _imported_subpackages(str(probe), root=str(tmp_path))
    assert got == {"runner", "utils", "trainers", "datasets", "testers"}


def test_utils_imports_nothing_above_it():
    offenders = {}
    for path in _modules(os.path.join(PKG, "utils")):
        bad = sorted(_imported_subpackages(path) & set(ABOVE_UTILS))
        if bad:
            offenders[os.path.relpath(path, PKG)] = bad
    assert offenders == {}
