"""Every README results block equals the table its benchmark wrote (no typed numbers)."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module():
    spec = importlib.util.spec_from_file_location("readme_tables", os.path.join(ROOT, "benchmarks", "readme_tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_blocks_match_results_files():
    mod = _module()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert mod.render(text) == text, "run python benchmarks/readme_tables.py"


def test_render_replaces_block_and_refuses_missing_file(tmp_path):
    mod = _module()
    (tmp_path / "t.md").write_text("| a |\n|---|\n| 1 |\n")
    text = "x\n<!-- results:t -->\nold\n<!-- /results:t -->\ny\n"
    assert mod.render(text, str(tmp_path)) == "x\n<!-- results:t -->\n| a |\n|---|\n| 1 |\n<!-- /results:t -->\ny\n"
    assert mod.block_names(text) == ["t"]
    with pytest.raises(FileNotFoundError, match="results:u"):
        mod.render("<!-- results:u -->\n<!-- /results:u -->", str(tmp_path))
