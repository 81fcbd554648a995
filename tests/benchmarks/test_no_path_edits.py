"""Benchmark scripts import the installed package: none puts the checkout on ``sys.path`` (issue 20, item 4)."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py"))


def path_edits(source: str):
    """Line numbers of ``sys.path.<method>(...)`` calls and ``sys.path = ...`` / ``sys.path += ...`` assignments."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t for t in targets if isinstance(t, ast.Attribute)), None)
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "path"
            and isinstance(target.value, ast.Name)
            and target.value.id == "sys"
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_check_finds_each_form():
    src = "import sys\nsys.path.insert(0, 'x')\nsys.path.append('y')\nsys.path += ['z']\nsys.path = []\n"
    src += "os.path.join('a')\n"
    assert path_edits(src) == [2, 3, 4, 5]


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_benchmark_edits_sys_path(script):
    with open(os.path.join(ROOT, "benchmarks", script), encoding="utf-8") as f:
        assert path_edits(f.read()) == [], f"benchmarks/{script} edits sys.path; import the installed package"
