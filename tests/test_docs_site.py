"""The documentation site (mkdocs.yml, docs/, the build hook docs/_hooks/site.py): what it generates from the code
cannot drift from the code.

* the hook reads the protocols' settings, the protocols' lookup and the runner's key tables from the source without
  importing it: what it reads equals what the code holds at run time, and every key a protocol accepts (the package's
  and the plugins' in benchmarks/protocols/) is in a table of the site, with a description;
* the generated tables are committed between their markers and equal what the hook generates; a results block holds
  the line that names its file; no page read in the repository shows an empty generated block;
* every public module has an API page, every benchmark result file and every README results block is on the site;
* the ``docs`` extra of pyproject.toml is what ``tox -e docs`` installs;
* the griffe extension keeps the project's docstring layout readable.

``tox -e docs`` (CI) builds the site with ``mkdocs build --strict``; the slow test here does the same when mkdocs is
installed.
"""

import configparser
import dataclasses
import importlib
import importlib.util
import logging
import os
import pkgutil
import re
import subprocess
import sys
import types

import pytest

import pml_extensions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


site = _load("docs_site_hook", "docs/_hooks/site.py")


def _settings_classes():
    """The block name -> the Settings dataclass it documents, imported (the same list as the hook's SETTINGS)."""
    from benchmarks.protocols.localization.protocol import Localization
    from benchmarks.protocols.resolution_distillation.protocol import ResolutionDistillation
    from benchmarks.protocols.template_block.protocol import TemplateBlock
    from pml_extensions.runner.protocols import get_protocol
    from pml_extensions.runner.protocols.base import SearchSettings
    from pml_extensions.runner.protocols.paired_protocol import GridSettings

    return {
        "grid": GridSettings,
        "search": SearchSettings,
        "paired": get_protocol("paired").Settings,
        "mlrc": get_protocol("mlrc").Settings,
        "template_block": TemplateBlock.Settings,
        "localization": Localization.Settings,
        "resolution_distillation": ResolutionDistillation.Settings,
    }


def _fields(cls):
    from pml_extensions.runner.protocols.base import REQUIRED

    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        default = site.REQUIRED if default is REQUIRED else default
        out.append({"name": f.name, "default": default, "doc": f.metadata["doc"]})
    return out


def test_the_hook_reads_what_the_code_holds():
    from benchmarks import protocols as plugins
    from benchmarks.protocols.resolution_distillation import settings as raml
    from pml_extensions.runner.config import pb_keys
    from pml_extensions.runner.objects import builder
    from pml_extensions.runner.protocols import DEFAULT_PROTOCOLS, PROTOCOLS, get_protocol
    from pml_extensions.runner.protocols.mlrc import old_keys
    from pml_extensions.trunks import histogram_pooling

    t = site.code_tables()
    assert t["protocols"] == PROTOCOLS and t["default_protocols"] == DEFAULT_PROTOCOLS
    assert t["protocol_descriptions"] == {name: get_protocol(name).description for name in PROTOCOLS}
    expected = {}
    for name in plugins.PLUGINS:
        cls = importlib.import_module(f"benchmarks.protocols.{name}").PROTOCOL
        expected[f"benchmarks.protocols.{name}"] = (f"benchmarks.protocols.{name}:{cls.__name__}", cls.description)
    assert {n: (t["plugins"][n], t["plugin_descriptions"][n]) for n in t["plugins"]} == expected
    classes = _settings_classes()
    assert set(classes) == set(site.SETTINGS) == set(t["settings"])
    for name, cls in classes.items():
        assert t["settings"][name] == _fields(cls), name
        path, cls_name = site.SETTINGS[name]
        assert (os.path.relpath(sys.modules[cls.__module__].__file__, ROOT), cls.__qualname__) == (path, cls_name)
    assert t["flags"] == pb_keys._FLAGS
    assert t["split_manager"] == pb_keys._DEFAULT_SPLIT and t["hook_container"] == pb_keys._DEFAULT_HOOKS
    assert t["ensemble"] == pb_keys._DEFAULT_ENSEMBLE and t["tester"] == pb_keys._TESTER
    assert t["pb_only"] == pb_keys._PB_ONLY
    assert t["old_keys"] == old_keys.OLD_KEYS and t["old_refused"] == old_keys._OLD_REFUSED
    assert t["resolution_dataset_keys"] == raml.DATASET_KEYS
    assert t["prototype_init_keys"] == histogram_pooling.PROTOTYPE_INIT_KEYS
    assert t["param_group_keys"] == builder.PARAM_GROUP_KEYS


def test_the_hook_reads_a_setting_through_a_helper_and_a_base_class(tmp_path):
    """``_doc(text)`` returning ``setting(None, text)`` (the mlrc settings' helper) and a dataclass base of the same
    file read as the dataclass machinery reads them."""
    (tmp_path / "s.py").write_text(
        "from pml_extensions.runner.protocols.base import REQUIRED, setting\n"
        "LIMIT = 3\n"
        "def _doc(text, default=None):\n    return setting(default, text)\n"
        "class Base:\n    a: int = setting(REQUIRED, doc='first')\n"
        "class Settings(Base):\n    b: int = _doc('second', LIMIT)\n"
        "    c: list = setting(list((1, 2)), 'third', 'list')\n"
    )
    assert site.settings_fields(str(tmp_path / "s.py"), "Settings") == [
        {"name": "a", "default": site.REQUIRED, "doc": "first"},
        {"name": "b", "default": 3, "doc": "second"},
        {"name": "c", "default": [1, 2], "doc": "third"},
    ]


def test_every_marker_on_the_page_is_one_the_parser_reads():
    from pml_extensions.runner.config.loader import _MARKER, split_marker

    ops = site.marker_ops()
    assert set(ops) == set(re.search(r"\(\?P<op>([A-Z_|]+)\)", _MARKER.pattern).group(1).split("|"))
    for op in ops:
        key = f"lr~{op}~2" if op in ("APPLY", "SWAP") else f"lr~{op}~"
        assert split_marker(key)[1] == op


def _first_column(table):
    """The code in the first cell of each row of a Markdown table (the header row left out)."""
    lines = table.splitlines()
    rows = lines[next(i for i, line in enumerate(lines) if line.startswith("|---")) + 1 :]
    return {m.group(1) for m in (re.match(r"\| `([^`]+)`", line) for line in rows) if m}


def test_every_key_a_protocol_accepts_is_in_its_tables():
    """Each protocol's keys (``Protocol.keys()``) are the first column of the tables the site shows for it."""
    from benchmarks.protocols.localization.protocol import Localization
    from benchmarks.protocols.resolution_distillation.protocol import ResolutionDistillation
    from benchmarks.protocols.template_block.protocol import TemplateBlock
    from pml_extensions.runner.protocols import get_protocol

    blocks, problems = site.generated_blocks()
    assert problems == []  # every key described, no description of a key the code does not read
    shown = {
        get_protocol("mlrc"): ("search", "mlrc", "old-keys"),
        get_protocol("paired"): ("search", "grid", "paired"),
        TemplateBlock: ("search", "grid", "template_block"),
        Localization: ("search", "grid", "localization"),
        ResolutionDistillation: ("search", "resolution_distillation"),
    }
    for protocol, names in shown.items():
        listed = set().union(*(_first_column(blocks[n]) for n in names)) | {"protocol"}
        assert sorted(set(protocol.keys()) - listed) == [], protocol.name
    assert _first_column(blocks["protocols"]) == {"mlrc", "paired"}


def test_every_argument_and_marker_the_code_accepts_is_on_the_config_page():
    from benchmarks.protocols.resolution_distillation import settings as raml
    from pml_extensions.runner.config import pb_keys
    from pml_extensions.runner.config.loader import _SEARCH_OPS
    from pml_extensions.runner.objects import builder
    from pml_extensions.trunks import histogram_pooling

    blocks, _ = site.generated_blocks()
    page = "\n".join(blocks.values())
    accepted = set(pb_keys._FLAGS) | set(pb_keys._DEFAULT_SPLIT) | set(pb_keys._DEFAULT_HOOKS)
    accepted |= set(pb_keys._DEFAULT_ENSEMBLE) | {"split_to_aggregate", pb_keys._TESTER}
    accepted |= set(raml.DATASET_KEYS) | set(histogram_pooling.PROTOTYPE_INIT_KEYS) | set(builder.PARAM_GROUP_KEYS)
    accepted |= {"class_fraction", "seed"}  # validation's
    missing = sorted(k for k in accepted if f"`{k}`" not in page and f"{{{k}:" not in page and f"`{k}:" not in page)
    assert missing == []
    for op in ("OVERRIDE", "DELETE", "APPLY", "SWAP") + _SEARCH_OPS:
        assert f"`~{op}~`" in page
    assert "resolution_job" not in page


def test_a_setting_without_a_doc_or_a_stale_description_is_reported():
    tables = site.code_tables()
    tables["settings"] = dict(tables["settings"])
    tables["settings"]["paired"] = tables["settings"]["paired"] + [{"name": "brand_new_key", "default": 1, "doc": ""}]
    descriptions = site.load_descriptions()
    descriptions["split_manager"] = dict(descriptions["split_manager"], retired_key="gone")
    _, problems = site.generated_blocks(tables, descriptions)
    assert problems == [
        "pml_extensions/runner/protocols/paired/protocol.py: Settings.brand_new_key has no doc (the doc argument of "
        "its setting(...))",
        "docs/_hooks/config_keys.yaml describes split_manager argument 'retired_key', which the code does not read",
    ]


def test_the_generated_tables_are_committed_and_current():
    """Every config block of docs/ holds what the hook generates (``python docs/_hooks/site.py`` rewrites them), each
    block is on one page once, and every results block holds the line naming its file, whose link leads to it."""
    blocks, _ = site.generated_blocks()
    used = []
    for page, text in site.pages().items():
        new, unknown = site.fill_committed(text, page, blocks)
        assert unknown == [], page
        assert new == text, f"docs/{page}: run python docs/_hooks/site.py"
        used += [m.group(1) for m in site.CONFIG_MARKER.finditer(text)]
        for _, body in site.RESULTS_BLOCK.findall(text):
            link = re.search(r"\]\(([^)]+)\)", body).group(1)
            assert os.path.isfile(os.path.normpath(os.path.join(ROOT, "docs", os.path.dirname(page), link))), link
    assert sorted(used) == sorted(blocks)


def test_no_page_read_in_the_repository_shows_an_empty_generated_block():
    """Issue 30 item 7: a page read on GitHub has no empty table or placeholder."""
    marker = re.compile(r"<!-- (results|headline|summary|config):([A-Za-z0-9_.-]+) -->\n(.*?)<!-- /\1:\2 -->", re.S)
    for page, text in site.pages().items():
        opened = re.findall(r"<!-- (?:results|headline|summary|config):", text)
        found = marker.findall(text)
        assert len(found) == len(opened), f"docs/{page}: a generated block without its closing marker"
        assert [f"{kind}:{name}" for kind, name, body in found if not body.strip()] == [], page


def test_a_stale_committed_table_is_a_build_warning(caplog):
    blocks, _ = site.generated_blocks()
    text = open(os.path.join(ROOT, "docs", "configs.md"), encoding="utf-8").read()
    stale = text.replace("| `seeds` | `[0, 1, 2]` |", "| `seeds` | `[0]` |")
    assert stale != text
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_path="configs.md"))
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.pml_extensions"):
        assert site.on_page_markdown(text, page, {}, None) == site.on_page_markdown(stale, page, {}, None)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "docs/configs.md: the committed config:grid table differs from what the code gives; run python "
        "docs/_hooks/site.py"
    ]
    assert "<!-- config:" not in site.on_page_markdown(text, page, {}, None)  # the site shows the tables alone


def test_the_command_line_checks_the_committed_tables(capsys):
    assert site.main(["--check"]) == 0
    assert capsys.readouterr().out.strip() == "the generated blocks of docs/ equal what the code gives"


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
    assert "num_epochs_train" in html and "~OVERRIDE~" in html and "<!-- config:" not in html
    with open(tmp_path / "site" / "feature_cache" / "index.html", encoding="utf-8") as f:
        html = f.read()
    assert "the site shows it here" not in html and "<table>" in html  # the table, not the pointer
