"""docs/runner.md's "Writing a protocol": the plugin, its config and its command run as written, in an empty folder
(the module and the config written where the page names them), and the page's Protocols section names what the
code has."""

import json
import os
import re
import shlex
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = open(os.path.join(ROOT, "docs", "runner.md"), encoding="utf-8").read()
SECTION = PAGE[PAGE.index("### Writing a protocol") :]


def _block(language):
    (block,) = re.findall(rf"```{language}\n(.*?)```", SECTION.split("\n## ")[0], flags=re.S)
    return block


def _write_example(folder):
    """The page's module and config, at the paths their first comment line names."""
    for language in ("python", "yaml"):
        block = _block(language)
        path = re.match(r"# (\S+)\n", block).group(1)
        os.makedirs(os.path.join(folder, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(folder, path), "w", encoding="utf-8") as f:
            f.write(block)


def test_the_example_is_a_plugin_the_loader_checks(tmp_path, monkeypatch):
    from pml_extensions.runner import PairedProtocol, find_config, load_config

    _write_example(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    config, _ = load_config(find_config("toy"))
    from my_protocols import Toy

    assert issubclass(Toy, PairedProtocol) and config["protocol"] == "my_protocols:Toy"
    assert {"gain", "seeds", "variants", "comparisons", "bayes_opt_iters"} <= set(Toy.keys())
    assert yaml.safe_load(_block("yaml"))["comparisons"] == [["boosted", "plain"]]


@pytest.mark.slow
def test_the_command_runs_the_plugin_as_written(tmp_path, monkeypatch, capsys):
    """The command through ``python -m pml_extensions``'s entry point (``pml_extensions.cli.main``) in this process,
    as ``python -m`` runs it: from the folder that holds the example, that folder first on ``sys.path`` (a fresh
    process of the ``run`` shape is tests/docs/test_commands.py's)."""
    from pml_extensions.cli import main

    _write_example(tmp_path)
    (command,) = [line.split("  #")[0].strip() for line in _block("bash").splitlines() if line.strip()]
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "pml_extensions"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_protocols", raising=False)  # this folder's, not another test's
    monkeypatch.setenv("MPLBACKEND", "Agg")
    code = main(argv[3:])
    assert code == 0, capsys.readouterr().err[-3000:]
    folder = tmp_path / "runs" / "toy"
    results = json.loads((folder / "results.json").read_text())
    (comparison,) = results["comparisons"]
    assert (comparison["variant"], comparison["baseline"]) == ("boosted", "plain")
    assert [round(d, 10) for d in comparison["differences"]] == [0.05, 0.05]  # the page's "+0.05"
    assert "+0.0500" in (folder / "results.md").read_text() and (folder / "report.html").is_file()


def test_the_protocols_section_names_what_the_code_has():
    from pml_extensions.runner.protocols import ENTRY_POINT_GROUP, PROTOCOLS

    section = PAGE[PAGE.index("## Protocols") : PAGE.index("## Configs, objects")]
    for name in PROTOCOLS:
        assert f"- `{name}` — " in section
    assert f'"{ENTRY_POINT_GROUP}"' in section and "register_protocol(" in section
    for method in ("unit", "test", "examples", "plots", "header", "extra_results", "run_units"):
        assert f"`{method}`" in section
