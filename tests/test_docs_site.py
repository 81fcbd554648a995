"""The documentation site (mkdocs.yml, docs/, the build hook docs/_hooks/site.py): what it generates from the code
cannot drift from the code.

* the hook reads the runner's key tables from the source without importing it: what it reads equals what the code
  holds at run time, and every key, flag, argument, marker and protocol the code accepts is on the config page, with a
  description;
* every public module has an API page, every benchmark result file and every README results block is on the site;
* the ``docs`` extra of pyproject.toml is what ``tox -e docs`` installs;
* the griffe extension keeps the project's docstring layout readable.

``tox -e docs`` (CI) builds the site with ``mkdocs build --strict``; the slow test here does the same when mkdocs is
installed.
"""

import configparser
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys

import pytest

import pml_extensions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


site = _load("docs_site_hook", "docs/_hooks/site.py")


def test_the_hook_reads_what_the_code_holds():
    from benchmarks.protocols.resolution_distillation import settings
    from pml_extensions.runner.config import eval_keys, keys, old_keys, pb_keys
    from pml_extensions.runner.objects import builder
    from pml_extensions.runner.protocols import DEFAULT_PROTOCOL, DESCRIPTIONS, PROTOCOLS

    t = site.code_tables()
    assert t["protocols"] == PROTOCOLS and t["protocol_descriptions"] == DESCRIPTIONS
    assert t["default_protocol"] == DEFAULT_PROTOCOL
    assert t["protocol_keys"] == keys.PROTOCOL_KEYS
    assert t["flags"] == pb_keys._FLAGS
    assert t["split_manager"] == pb_keys._DEFAULT_SPLIT and t["hook_container"] == pb_keys._DEFAULT_HOOKS
    assert t["ensemble"] == eval_keys._DEFAULT_ENSEMBLE and t["tester"] == eval_keys._TESTER
    assert t["pb_only"] == eval_keys._PB_ONLY
    assert t["old_keys"] == old_keys.OLD_KEYS and t["old_refused"] == old_keys._OLD_REFUSED
    assert t["resolution_job_keys"] == old_keys.RESOLUTION_JOB_KEYS
    assert t["old_top_level_keys"] == old_keys.OLD_TOP_LEVEL_KEYS
    assert t["resolution_defaults"] == settings.JOB_DEFAULTS
    assert t["resolution_dataset_keys"] == settings.DATASET_KEYS and t["validation_keys"] == settings.VALIDATION_KEYS
    assert t["prototype_init_keys"] == builder.PROTOTYPE_INIT_KEYS
    assert t["param_group_keys"] == builder.PARAM_GROUP_KEYS


def test_every_marker_on_the_page_is_one_the_parser_reads():
    from pml_extensions.runner.config.syntax import _MARKER, split_marker

    ops = site.marker_ops()
    assert set(ops) == set(re.search(r"\(\?P<op>([A-Z_|]+)\)", _MARKER.pattern).group(1).split("|"))
    for op in ops:
        key = f"lr~{op}~2" if op in ("APPLY", "SWAP") else f"lr~{op}~"
        assert split_marker(key)[1] == op


def _page():
    blocks, problems = site.config_tables()
    assert problems == []  # every key described, no description of a key the code does not read
    with open(os.path.join(ROOT, "docs", "configs.md"), encoding="utf-8") as f:
        page = f.read()
    used = re.findall(r"<!-- config:([a-z_-]+) -->", page)
    assert sorted(used) == sorted(blocks), "docs/configs.md shows every generated table once"
    return "\n".join(blocks.values())


def test_every_key_the_code_accepts_is_on_the_config_page():
    from benchmarks.protocols.resolution_distillation import settings
    from pml_extensions.runner.config import eval_keys, keys, old_keys, pb_keys
    from pml_extensions.runner.config.syntax import _SEARCH_OPS
    from pml_extensions.runner.objects import builder
    from pml_extensions.runner.protocols import PROTOCOLS

    page = _page()
    accepted = set(PROTOCOLS)
    accepted |= {k for ks in keys.PROTOCOL_KEYS.values() for k in ks}
    accepted |= {k for ks in old_keys.OLD_TOP_LEVEL_KEYS.values() for k in ks if k != "resolution_job"}
    accepted |= set(pb_keys._FLAGS) | set(pb_keys._DEFAULT_SPLIT) | set(pb_keys._DEFAULT_HOOKS)
    accepted |= set(eval_keys._DEFAULT_ENSEMBLE) | {"split_to_aggregate", eval_keys._TESTER}
    accepted |= set(old_keys.RESOLUTION_JOB_KEYS) | set(settings.JOB_DEFAULTS) | set(settings.DATASET_KEYS)
    accepted |= set(settings.VALIDATION_KEYS) | set(builder.PROTOTYPE_INIT_KEYS) | set(builder.PARAM_GROUP_KEYS)
    missing = sorted(k for k in accepted if f"`{k}`" not in page and f"{{{k}:" not in page and f"`{k}:" not in page)
    assert missing == []
    for op in ("OVERRIDE", "DELETE", "APPLY", "SWAP") + _SEARCH_OPS:
        assert f"`~{op}~`" in page
    assert "`resolution_job: {seeds: ...}`" in page


def test_a_key_without_a_description_is_reported():
    tables = site.code_tables()
    tables["protocol_keys"] = dict(tables["protocol_keys"], mlrc=tables["protocol_keys"]["mlrc"] + ("brand_new_key",))
    descriptions = site.load_descriptions()
    descriptions["top_level"] = dict(descriptions["top_level"], retired_key="gone")
    _, problems = site.config_tables(tables, descriptions)
    assert problems == [
        "top-level key 'brand_new_key' has no description in docs/_hooks/config_keys.yaml",
        "docs/_hooks/config_keys.yaml describes top-level key 'retired_key', which the code does not read",
    ]


def test_every_public_module_has_an_api_page():
    expected = {pml_extensions.__name__} | {
        m.name
        for m in pkgutil.walk_packages(pml_extensions.__path__, "pml_extensions.")
        if not any(part.startswith("_") for part in m.name.split("."))
    }
    assert set(site.public_modules()) == expected
    page = site.api_page("pml_extensions.runner.protocols")
    assert "::: pml_extensions.runner.protocols\n" in page and "run_protocol" in page  # its own definitions
    assert "members: false" in site.api_page("pml_extensions.losses")  # re-exports only: documented where defined


def test_every_result_table_is_on_the_site():
    readme_tables = _load("readme_tables", "benchmarks/readme_tables.py")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = readme_tables.block_names(f.read())
    with open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8") as f:
        bench = readme_tables.block_names(f.read())
    results = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, "benchmarks", "results")) if n.endswith(".md"))
    assert sorted(set(readme) - set(bench)) == []
    assert sorted(set(results) - set(bench)) == []
    assert readme_tables.render("<!-- results:xml_overhead -->\n<!-- /results:xml_overhead -->").count("|") > 10


def test_the_docs_extra_is_what_tox_installs():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        extra = re.search(r"^docs = \[(.*)\]$", f.read(), re.M).group(1)
    extra = re.findall(r'"([^"]+)"', extra)
    tox = configparser.ConfigParser()
    tox.read(os.path.join(ROOT, "tox.ini"), encoding="utf-8")
    deps = [line.strip() for line in tox["testenv:docs"]["deps"].splitlines() if line.strip()]
    assert deps == extra


def _nav_files(nav):
    for item in nav:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for value in item.values():
                yield from _nav_files(value if isinstance(value, list) else [value])


def test_every_page_is_in_the_navigation():
    import yaml

    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    nav = set(_nav_files(config["nav"]))
    docs = os.path.join(ROOT, "docs")
    pages = {
        os.path.relpath(os.path.join(folder, n), docs).replace(os.sep, "/")
        for folder, _, names in os.walk(docs)
        if "_hooks" not in folder
        for n in names
        if n.endswith(".md")
    }
    assert pages - nav == set()
    assert set(site.PENDING) <= nav  # pages other branches write: in the nav, with a placeholder until merged
    assert config["theme"]["font"] is False  # Material would fetch Google fonts


def test_site_loads_nothing_from_other_hosts(tmp_path):
    (tmp_path / "a.html").write_text(
        "<a href='https://example.org'>a link is fine</a><script src=\"https://cdn.example/x.js\"></script>"
    )
    (tmp_path / "b.css").write_text("@import url('https://fonts.example/css');")
    assert [p.split(":")[0] for p in site.external_loads(str(tmp_path))] == ["a.html", "b.css"]


def test_griffe_extension_keeps_continuation_lines_in_their_item():
    ext = _load("griffe_docstrings", "docs/_hooks/griffe_docstrings.py") if _has("griffe") else None
    if ext is None:
        pytest.skip("griffe is not installed (pip install .[docs])")
    text = (
        "Do it.\n\nRaises:\n    ConfigError: a bad key, or a value\n    out of range.\n    ValueError / TypeError: x\n"
    )
    assert ext.rewrite(text) == (
        "Do it.\n\nRaises:\n    ConfigError: a bad key, or a value\n        out of range.\n"
        "    ValueError / TypeError: x\n"
    )
    assert ext.rewrite("See :func:`pml_extensions.runner.find`.\n\nExample::\n\n    >>> 1\n    1\n") == (
        "See ``pml_extensions.runner.find``.\n\nExamples:\n\n    >>> 1\n    1\n"
    )
    assert ext.rewrite("Attributes:\n    labels ``[N]`` int64, classes\n    (names).\n") == (
        "**Attributes:**\nlabels ``[N]`` int64, classes\n(names).\n"
    )
    assert ext.rewrite("usage: x [--a B]\n", is_module=True) == "```text\nusage: x [--a B]\n```"


def _has(name):
    return importlib.util.find_spec(name) is not None


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    if not _has("mkdocs") or not _has("mkdocstrings"):
        pytest.skip("mkdocs is not installed (pip install .[docs]; CI builds the site with tox -e docs)")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "site" / "configs" / "index.html", encoding="utf-8") as f:
        html = f.read()
    assert "num_epochs_train" in html and "~OVERRIDE~" in html
