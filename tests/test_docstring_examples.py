"""Every ``>>>`` example in the package runs as written (the docstrings are the API reference's examples).

One parametrised case per module of ``pml_extensions`` (the runner and the command line included; this generalises
the runner's former collector): ``doctest.testmod`` with NORMALIZE_WHITESPACE and ELLIPSIS must report no failure,
and every ``>>>`` line in a module's source must belong to an example doctest finds — an example written where
doctest does not look (a comment, a string that is not a docstring) would otherwise never run.
"""

import doctest
import importlib
import os
import pkgutil
import re

import pytest

import pml_extensions

FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
#: a ``>>>`` prompt that opens an example (a prompt holding only a comment is not one, for doctest either)
_PROMPT = re.compile(r"^\s*>>>(?: (?!\s*#)|$)", re.M)


def _modules():
    yield pml_extensions.__name__
    for info in pkgutil.walk_packages(pml_extensions.__path__, pml_extensions.__name__ + "."):
        if info.name != "pml_extensions.__main__":
            yield info.name


MODULES = sorted(_modules())


def _source(module) -> str:
    with open(module.__file__, encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, verbose=False)
    assert result.failed == 0, name


@pytest.mark.parametrize("name", MODULES)
def test_every_example_is_collected(name):
    module = importlib.import_module(name)
    found = sum(len(t.examples) for t in doctest.DocTestFinder().find(module) if t.filename == module.__file__)
    assert found == len(_PROMPT.findall(_source(module))), f"{name}: a >>> example outside any docstring doctest reads"


def test_the_collector_sees_the_whole_package():
    files = [
        os.path.join(folder, f)
        for folder, _, names in os.walk(os.path.dirname(pml_extensions.__file__))
        for f in names
        if f.endswith(".py") and f != "__main__.py"
    ]
    assert len(MODULES) == len(files)
    with_examples = [n for n in MODULES if _PROMPT.search(_source(importlib.import_module(n)))]
    assert len(with_examples) >= 45  # 48 modules had examples when this test was written; none may drop out
